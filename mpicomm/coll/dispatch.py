"""The dispatcher: from one collective call's arguments to a running algorithm.

Every entry point - ``Comm.Allreduce``, ``Comm.Iallreduce``, ``mpicomm.allreduce``
- reads its arguments into an :class:`Args` (flat arrays, counts, op, root,
or the local problem that makes them unusable) and calls :func:`start`, which

1. selects the algorithm (:func:`mpicomm.registry.select`: the call, the
   communicator, ``MPICOMM_<COLLECTIVE>_ALGORITHM``, then the table);
2. unless validation is off (``MPICOMM_VALIDATE=0``), makes the ranks agree
   (:func:`agreement`): one small allgather of what each rank was given; any
   local problem or disagreement raises the same :class:`ArgumentError` on
   every rank, before any data moves;
3. runs the algorithm's step generator - to completion for a blocking call, or
   as an :class:`mpicomm.Request` for a nonblocking one.

The algorithms' signatures, one per collective (arrays are flat, contiguous,
of one dtype; counts and displacements are in elements)::

    barrier(call)
    bcast(call, buf)                                  # root: call.root
    reduce(call, send, recv)                          # recv None off the root
    allreduce(call, send, recv)
    scan(call, send, recv), exscan(call, send, recv)
    gather(call, send, recv, counts, displs)          # gatherv too (its counts/displs are None off the root)
    scatter(call, send, recv, counts, displs)         # scatterv too (its send/counts/displs: None off the root)
    allgather(call, send, recv, counts, displs)       # allgatherv too
    alltoall(call, send, sendcounts, senddispls, recv, recvcounts, recvdispls)   # alltoallv too
    reduce_scatter(call, send, recv, counts)          # reduce_scatter_block: counts all equal

gather and scatter (not the v-forms) pass the equal counts on every rank.
In place: for reductions ``send is recv`` when the caller asked for in place;
for gather/scatter/allgather the own block of the big buffer *is* the small
one. An algorithm registered with ``in_place=False`` never sees an alias: the
dispatcher copies the input first.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
from mpi4py import MPI

from .. import config, registry
from ..ops import Op
from ..requests import Request, Step, Steps, run
from .call import Call

if TYPE_CHECKING:
    from ..comm import Comm

__all__ = ["COLLECTIVES", "ArgumentError", "Args", "start", "agreement", "selection_bytes"]

COLLECTIVES = (
    "barrier", "bcast", "reduce", "allreduce", "gather", "gatherv", "scatter", "scatterv", "allgather",
    "allgatherv", "alltoall", "alltoallv", "reduce_scatter", "reduce_scatter_block", "scan", "exscan",
)
ROOTED = frozenset({"bcast", "reduce", "gather", "gatherv", "scatter", "scatterv"})
REDUCING = frozenset({"reduce", "allreduce", "reduce_scatter", "reduce_scatter_block", "scan", "exscan"})
_FAMILY = {"gatherv": "gather", "scatterv": "scatter", "allgatherv": "allgather", "alltoallv": "alltoall",
           "reduce_scatter_block": "reduce_scatter"}


class ArgumentError(ValueError, TypeError):
    """Bad or mismatched collective arguments, raised with the same message on every rank.

    It is both a ValueError and a TypeError, so code catching either (as for
    a local argument error) catches it.
    """


@dataclass
class Args:
    """One rank's arguments to one collective, read and checked locally."""

    collective: str
    xp: ModuleType | None = None
    dtype: np.dtype | None = None
    send: Any = None
    recv: Any = None
    count: int = -1  # the count all ranks must give alike (-1: none, as for v-variants)
    root: int = 0
    op: Op | None = None
    in_place: bool = False
    sendcounts: tuple[int, ...] | None = None
    senddispls: tuple[int, ...] | None = None
    recvcounts: tuple[int, ...] | None = None
    recvdispls: tuple[int, ...] | None = None
    problem: BaseException | None = None  # what is wrong with this rank's arguments
    unsupported: str | None = None  # why the MPI library must run this call instead
    native: Callable[[], MPI.Request] | None = field(default=None, repr=False)  # start the library's own
    result: Callable[[], Any] = field(default=lambda: None, repr=False)  # what the call returns
    device: Any = None

    def fail(self, problem: BaseException) -> "Args":
        """Record *problem* (the first one wins); returns self."""
        if self.problem is None:
            self.problem = problem
        return self

    def check_op(self) -> "Args":
        """Record a problem if the op is not defined on the element type."""
        if self.problem is None and self.op is not None and self.dtype is not None:
            message = self.op.check_dtype(self.dtype)
            if message:
                self.fail(TypeError(message))
        return self


# ---------------------------------------------------------------- selection


def selection_bytes(args: Args, p: int) -> int | None:
    """The message size the selection table compares (None where ranks cannot know it alike).

    Whole vector for bcast/reduce/allreduce/scan; the block for gather/scatter;
    everything gathered for allgather(v); each rank's whole send for alltoall;
    the whole input for reduce_scatter(_block).
    """
    if args.dtype is None:
        return None
    item = args.dtype.itemsize
    c = args.collective
    if c in ("bcast", "reduce", "allreduce", "scan", "exscan", "gather", "scatter"):
        return args.count * item
    if c in ("allgather", "alltoall", "reduce_scatter_block"):
        return args.count * item * p
    if c in ("allgatherv", "reduce_scatter") and args.recvcounts is not None:
        return sum(args.recvcounts) * item
    return None


def _facts(args: Args, p: int) -> dict:
    return {
        "p": p,
        "bytes": selection_bytes(args, p),
        "count": args.count if args.count >= 0 else None,
        "commutative": args.op is None or args.op.commutative,
        "op": args.op.name if args.op is not None else None,
    }


# ---------------------------------------------------------------- start


def start(comm: "Comm", args: Args, algorithm: str | None, blocking: bool) -> Any:
    """Run the collective *args* describes (blocking: return its result; else return a Request)."""
    collective = args.collective
    chosen: registry.Algorithm | None = None
    try:
        chosen = registry.select(collective, algorithm, comm._state.defaults.get(collective), _facts(args, comm.Get_size()))
    except ValueError as exc:
        args.fail(exc)
    xp = args.xp or np
    call = Call(comm, collective, xp, args.dtype if args.dtype is not None else np.uint8, args.op, args.root,
                args.device)
    call.algorithm = chosen.name if chosen is not None else str(algorithm)
    validate = config.validate() and collective != "barrier"
    if not validate and args.problem is not None:
        raise args.problem
    if not validate and args.unsupported is not None:
        return _native_now(args, blocking)
    steps = _steps(call, args, chosen, validate)
    if blocking:
        run(steps, label=call.label)
        return args.result()
    return Request(_then(steps, args.result), call.label)


def _then(steps: Steps, result: Callable[[], Any]) -> Steps:
    yield from steps
    return result()


def _native_now(args: Args, blocking: bool) -> Any:
    if args.native is None:
        raise TypeError(f"{args.collective}: {args.unsupported}, and this call has no MPI library form")
    request = args.native()
    if blocking:
        request.Wait()
        return None
    return request


def _steps(call: Call, args: Args, chosen: registry.Algorithm | None, validate: bool) -> Steps:
    if validate:
        native = yield from agreement(call, args)
        if native:
            yield Step([args.native()])  # every rank has one: the agreement checked
            return
    if chosen is None:  # the selection failed: recorded as this rank's problem, raised by the agreement above
        raise args.problem or ValueError(f"{call.label}: no algorithm selected")
    yield from _run(call, args, chosen)


def _copy(call: Call, x: Any) -> Any:
    with call.on_device():
        return x.copy()


def _run(call: Call, args: Args, algorithm: registry.Algorithm) -> Steps:
    """Bind the arguments to the collective's algorithm signature and run it."""
    c = call.collective
    family = _FAMILY.get(c, c)
    send, recv = args.send, args.recv
    if args.in_place and not algorithm.in_place and send is not None:
        send = _copy(call, send)  # the algorithm may not read from what it writes
    fn = algorithm.steps
    if family == "barrier":
        return (yield from fn(call))
    if family == "bcast":
        return (yield from fn(call, recv))
    if family in ("reduce", "allreduce", "scan", "exscan"):
        return (yield from fn(call, send, recv))
    if family in ("gather", "allgather"):
        return (yield from fn(call, send, recv, args.recvcounts, args.recvdispls))
    if family == "scatter":
        return (yield from fn(call, send, recv, args.sendcounts, args.senddispls))
    if family == "alltoall":
        return (yield from fn(call, send, args.sendcounts, args.senddispls, recv, args.recvcounts, args.recvdispls))
    if family == "reduce_scatter":
        return (yield from fn(call, send, recv, args.recvcounts))
    raise ValueError(f"unknown collective {c!r}")


# ---------------------------------------------------------------- agreement (validation mode)

_MAGIC = 0x6D7069636F6D6D  # "mpicomm"
_WORDS = 13
_NAME = 32  # bytes for each of: algorithm name, dtype, op name
_TEXT = 400  # bytes of this rank's problem, if any
(_W_MAGIC, _W_COLL, _W_ALG, _W_OP, _W_COMM, _W_DTYPE, _W_ITEM, _W_COUNT, _W_ROOT, _W_PROBLEM, _W_NATIVE, _W_VLEN,
 _W_CAN_NATIVE) = range(_WORDS)


def _code(text: str) -> int:
    return zlib.crc32(text.encode())


def _vector(args: Args, p: int, rank: int) -> list[int]:
    """The per-rank counts a v-variant must agree on (see :func:`_check_vectors`)."""
    c = args.collective
    zeros = [0] * p

    def mine(counts: tuple[int, ...] | None) -> list[int]:
        return list(counts) if counts is not None and len(counts) == p else zeros

    if c == "gatherv":
        return [args.send.size if args.send is not None else -1] + (mine(args.recvcounts) if rank == args.root else zeros)
    if c == "scatterv":
        return [args.recv.size if args.recv is not None else -1] + (mine(args.sendcounts) if rank == args.root else zeros)
    if c == "allgatherv":
        return [args.send.size if args.send is not None else -1] + mine(args.recvcounts)
    if c == "alltoallv":
        return mine(args.sendcounts) + mine(args.recvcounts)
    if c == "reduce_scatter":
        return mine(args.recvcounts)
    return []


def _pack(call: Call, args: Args, vector: list[int]) -> np.ndarray:
    words = np.zeros(_WORDS + len(vector), np.int64)
    names = [call.algorithm, "" if args.dtype is None else str(args.dtype), "" if args.op is None else args.op.name]
    words[_W_MAGIC] = _MAGIC
    words[_W_COLL] = COLLECTIVES.index(call.collective)
    words[_W_ALG] = _code(call.algorithm)
    words[_W_OP] = 0 if args.op is None else args.op.code
    words[_W_COMM] = -1 if args.op is None else int(args.op.commutative)
    words[_W_DTYPE] = -1 if args.dtype is None else _code(args.dtype.str + str(args.dtype.descr))
    words[_W_ITEM] = -1 if args.dtype is None else args.dtype.itemsize
    words[_W_COUNT] = args.count
    words[_W_ROOT] = args.root
    words[_W_PROBLEM] = args.problem is not None
    words[_W_NATIVE] = args.unsupported is not None
    words[_W_VLEN] = len(vector)
    words[_W_CAN_NATIVE] = args.native is not None
    words[_WORDS:] = vector
    text = np.zeros(3 * _NAME + _TEXT, np.uint8)
    for i, name in enumerate(names):
        raw = name.encode()[:_NAME]
        text[i * _NAME : i * _NAME + len(raw)] = np.frombuffer(raw, np.uint8)
    if args.problem is not None:
        raw = str(args.problem).encode()[: _TEXT - 4]
        text[3 * _NAME : 3 * _NAME + len(raw)] = np.frombuffer(raw, np.uint8)
    return np.concatenate([words.view(np.uint8), text])


def _unpack(row: np.ndarray, nwords: int) -> tuple[np.ndarray, list[str], str]:
    words = row[: 8 * nwords].view(np.int64)
    text = row[8 * nwords :].tobytes()
    names = [text[i * _NAME : (i + 1) * _NAME].rstrip(b"\0").decode(errors="replace") for i in range(3)]
    return words, names, text[3 * _NAME :].rstrip(b"\0").decode(errors="replace")


def agreement(call: Call, args: Args) -> Steps:
    """Steps: share every rank's view of the call; raise :class:`ArgumentError` on all ranks if any is wrong.

    Returns True when some rank's buffer spec needs the MPI library (then all
    ranks hand the call to it). Cost: one allgather of about
    (560 + 16·p for v-variants) bytes per rank.
    """
    p, rank = call.p, call.rank
    vector = _vector(args, p, rank)
    mine = _pack(call, args, vector)
    every = np.empty((p, mine.size), np.uint8)
    yield Step([call.lib.Iallgather([mine, MPI.BYTE], [every, MPI.BYTE])], peers=[("all", -1)])
    rows = [_unpack(every[r], _WORDS + len(vector)) for r in range(p)]
    messages = _disagreements(call, args, rows)
    if messages:
        raise ArgumentError(f"{call.collective} #{call.seq}: " + "; ".join(messages))
    return any(words[_W_NATIVE] for words, _, _ in rows)


def _differ(rows: list, index: int, what: str, show: Callable[[int, Any], str],
            unknown: int | None = None) -> str | None:
    values = [words[index] for words, _, _ in rows]
    if len({v for v in values if v != unknown}) <= 1:
        return None
    groups: dict[int, list[int]] = {}
    for r, v in enumerate(values):
        if v != unknown:
            groups.setdefault(int(v), []).append(r)
    parts = [f"{show(ranks[0], v)} on rank(s) {_ranks(ranks)}" for v, ranks in groups.items()]
    return f"ranks disagree on {what}: " + ", ".join(parts)


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks)) if len(ranks) <= 8 else f"{', '.join(map(str, ranks[:8]))}, …"


def _disagreements(call: Call, args: Args, rows: list) -> list[str]:
    c = call.collective
    problems = [f"rank {r}: {text}" for r, (words, _, text) in enumerate(rows) if words[_W_PROBLEM]]
    if problems:
        return problems
    out = []
    first = _differ(rows, _W_COLL, "the collective", lambda r, v: COLLECTIVES[v])
    if first:
        return [first + " (every rank must call the same collectives in the same order)"]
    native = any(words[_W_NATIVE] for words, _, _ in rows)
    checks: list[tuple[int, str, Callable[[int, Any], str]]] = [
        (_W_DTYPE, "the element type", lambda r, v: rows[r][1][1]),
    ]
    if not native:  # the library runs it: no algorithm runs, and a rank whose spec it takes may know no dtype
        checks.append((_W_ALG, "the algorithm", lambda r, v: repr(rows[r][1][0])))
    if c in ROOTED:
        checks.append((_W_ROOT, "the root", lambda r, v: f"root {v}"))
    if c in REDUCING:
        checks.append((_W_OP, "the op", lambda r, v: rows[r][1][2]))
        checks.append((_W_COMM, "the op's commutativity", lambda r, v: "commutative" if v else "non-commutative"))
    if native:
        unable = [r for r, (words, _, _) in enumerate(rows) if not words[_W_CAN_NATIVE]]
        needing = [r for r, (words, _, _) in enumerate(rows) if words[_W_NATIVE]]
        if unable:
            out.append(f"rank(s) {_ranks(needing)} passed buffer specs only the MPI library runs, but rank(s) "
                       f"{_ranks(unable)} called an array function, which cannot hand the call to the library; "
                       f"use plain arrays everywhere, or Comm methods everywhere")
    else:
        checks.append((_W_COUNT, "the count", lambda r, v: f"{v} elements"))
    for index, what, show in checks:
        message = _differ(rows, index, what, show, -1 if native and index == _W_DTYPE else None)
        if message:
            out.append(message)
    if not out and not native:
        out.extend(_check_vectors(c, [words[_WORDS:] for words, _, _ in rows], rows[0][0][_W_ROOT]))
    return out


def _check_vectors(c: str, vectors: list[np.ndarray], root: int) -> list[str]:
    p = len(vectors)
    bad: list[str] = []
    if c in ("gatherv", "scatterv"):
        counts = vectors[root][1:]
        side = "receive" if c == "gatherv" else "send"
        mine = "sends" if c == "gatherv" else "receives"
        for r in range(p):
            if vectors[r][0] != counts[r]:
                bad.append(f"rank {r} {mine} {vectors[r][0]} elements but the root's {side} counts say {counts[r]}")
    elif c == "allgatherv":
        for r in range(p):
            if not np.array_equal(vectors[r][1:], vectors[0][1:]):
                bad.append(f"rank {r}'s receive counts {vectors[r][1:].tolist()} differ from rank 0's {vectors[0][1:].tolist()}")
        for r in range(p):
            if vectors[r][0] != vectors[0][1 + r]:
                bad.append(f"rank {r} sends {vectors[r][0]} elements but the receive counts say {vectors[0][1 + r]}")
    elif c == "alltoallv":
        for r in range(p):
            for s in range(p):
                if vectors[r][s] != vectors[s][p + r]:
                    bad.append(f"rank {r} sends {vectors[r][s]} elements to rank {s}, which expects {vectors[s][p + r]}")
    elif c == "reduce_scatter":
        for r in range(p):
            if not np.array_equal(vectors[r], vectors[0]):
                bad.append(f"rank {r}'s receive counts {vectors[r].tolist()} differ from rank 0's {vectors[0].tolist()}")
    if len(bad) > 6:
        bad = bad[:6] + [f"and {len(bad) - 6} more"]
    return bad
