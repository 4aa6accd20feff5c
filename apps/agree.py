"""The same error on every rank: a problem that one rank finds stops every rank, in the same words.

An application that checks something on each rank (an input file, a
checkpoint directory, a data set) must not let the rank that found a problem
raise alone while the others go on into a collective and wait for it forever.
So every check ends in one collective that tells every rank what any rank
found, and every rank raises the same exception with the same message:

* :func:`agree` - each rank's own problem (or None), gathered: each problem
  once, with the ranks that found it when not all did;
* :func:`from_root` - work that one rank does for all (reading a checkpoint's
  manifest, writing a file): its value on every rank, or its error on every
  rank; :func:`verdict` - a problem that only one rank can find (it opened the
  log file), on every rank.

*comm* is anything with mpi4py's lower-case ``allgather``/``bcast`` and
``Get_size``/``Get_rank``: an ``mpi4py`` communicator or an ``mpicomm.Comm``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

__all__ = ["gather", "ranks_text", "describe", "agree", "verdict", "from_root"]

T = TypeVar("T")


def gather(comm: Any, problems: str | Sequence[str] | None) -> dict[str, list[int]]:
    """Every rank's problems (collective): each distinct problem once, with the ranks that found it, in rank order."""
    mine = [problems] if isinstance(problems, str) else list(problems or ())
    found: dict[str, list[int]] = {}
    for rank, theirs in enumerate(comm.allgather(mine)):
        for problem in theirs:
            ranks = found.setdefault(problem, [])
            if rank not in ranks:
                ranks.append(rank)
    return found


def ranks_text(ranks: Sequence[int]) -> str:
    """``rank 2`` or ``ranks 0, 3``."""
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def describe(found: dict[str, list[int]], size: int) -> str:
    """The problems of :func:`gather` as one message: a problem every rank found is said once as it is; one that only
    some ranks found names them (``'b.txt' cannot be read (rank 1); ...``)."""
    return "; ".join(problem if len(ranks) == size else f"{problem} ({ranks_text(ranks)})"
                     for problem, ranks in found.items())


def agree(comm: Any, problems: str | Sequence[str] | None, error: Callable[[str], BaseException] = ValueError,
          prefix: str = "") -> None:
    """Raise ``error(prefix + message)`` on every rank if any rank has a problem (collective); return otherwise."""
    found = gather(comm, problems)
    if found:
        raise error(prefix + describe(found, comm.Get_size()))


def verdict(comm: Any, problem: str | None, error: Callable[[str], BaseException] = ValueError, root: int = 0) -> None:
    """Raise ``error(problem)`` on every rank if rank *root*'s *problem* is not None (collective; the others' is
    ignored)."""
    problem = comm.bcast(problem, root=root)
    if problem:
        raise error(problem)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror + (f" ({exc.filename})" if exc.filename else "")
    return str(exc)


def from_root(comm: Any, work: Callable[[], T], error: type[BaseException] = ValueError,
              catch: tuple[type[BaseException], ...] = (OSError, ValueError), what: str = "", root: int = 0) -> T:
    """``work()`` on rank *root*; its value on every rank, or the error it raised on every rank (collective).

    An exception of type *error* keeps its message; one of *catch* becomes
    ``error("what: reason")``. Anything else propagates on *root* alone (a bug,
    not a verdict).
    """
    outcome: tuple[bool, Any] = (True, None)
    if comm.Get_rank() == root:
        try:
            outcome = (True, work())
        except error as exc:
            outcome = (False, str(exc))
        except catch as exc:
            outcome = (False, f"{what}: {_reason(exc)}" if what else _reason(exc))
    ok, value = comm.bcast(outcome, root=root)
    if not ok:
        raise error(value)
    return value
