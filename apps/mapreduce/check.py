"""The answer of a word count or an inverted index, checked against one process's (``--check``).

Why a second count: the engine splits files at byte ranges, combines, hashes
keys to ranks and spills; one process counting the same files with the same
tokenizer (:func:`.wordcount.count_files`, a ``collections.Counter``) does none
of that, so the two agreeing on every key says the distribution lost, doubled
or misplaced nothing. Every result pair is compared, not only the top list:
the engine's results are gathered on rank 0, which then holds every key, as
the one process does anyway.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .wordcount import count_files

__all__ = ["reference", "difference", "check"]


def reference(command: str, paths: Sequence[str], lowercase: bool = False, errors: str = "strict") -> dict:
    """One process's answer: ``{word: count}`` (wordcount) or ``{word: [file numbers]}`` (invindex)."""
    if command == "wordcount":
        return dict(count_files(paths, lowercase, errors))
    index: dict[str, list[int]] = {}
    for number, path in enumerate(paths):
        for word in count_files([path], lowercase, errors):
            index.setdefault(word, []).append(number)
    return index


def difference(got: dict, want: dict, shown: int = 3) -> str | None:
    """None when *got* equals *want*; else what differs, in words (how many keys, and the first few)."""
    missing = sorted(want.keys() - got.keys())
    extra = sorted(got.keys() - want.keys())
    wrong = sorted(k for k in want.keys() & got.keys() if _plain(got[k]) != _plain(want[k]))
    if not (missing or extra or wrong):
        return None
    parts = []
    if wrong:
        examples = ", ".join(f"{k!r}: {_plain(got[k])} against {_plain(want[k])}" for k in wrong[:shown])
        parts.append(f"{len(wrong)} word(s) with another value ({examples})")
    if missing:
        parts.append(f"{len(missing)} word(s) missing ({', '.join(map(repr, missing[:shown]))})")
    if extra:
        parts.append(f"{len(extra)} word(s) one process does not find ({', '.join(map(repr, extra[:shown]))})")
    return (f"the engine's answer differs from one process's count of the same files ({len(want)} words): "
            + "; ".join(parts))


def _plain(value: Any) -> Any:
    """A count as it is, a file list as a sorted list (the union combiner's sets and lists alike)."""
    return sorted(value) if isinstance(value, (list, tuple, set, frozenset)) else value


def check(comm: Any, command: str, mr: Any, paths: Sequence[str], lowercase: bool = False,
          errors: str = "strict") -> str | None:
    """:func:`difference` of the finished job *mr* and one process's answer, the same on every rank; collective.

    Rank 0 gathers the results and counts the files again while the others
    wait asleep (they take no core from it).
    """
    from .bench import idle_barrier

    got = mr.gather(root=0)
    problem = None
    if comm.rank == 0:
        problem = difference(got, reference(command, paths, lowercase, errors))
    idle_barrier(comm)
    found: str | None = comm.bcast(problem, root=0)
    return found
