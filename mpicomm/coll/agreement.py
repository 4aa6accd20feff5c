"""The agreement: every rank checks that every other was given the same collective call, at the cost of
one 32-byte allreduce (validation mode, on by default; ``MPICOMM_VALIDATE=0`` turns it off).

Any local problem or disagreement raises the same :class:`~.args.ArgumentError`
on every rank, before any data moves. See :func:`agreement`.
"""

from __future__ import annotations

import hashlib
import zlib
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from .. import registry
from ..catalogue import COLLECTIVES, REDUCING, ROOTED, VECTORED
from ..requests import Step, Steps
from .args import Args, ArgumentError
from .call import Call

__all__ = ["agreement"]

_INDEX = {c: i for i, c in enumerate(COLLECTIVES)}

_MAGIC = 0x6D7069636F6D6D  # "mpicomm"
_WORDS = 13
_NAME = 32  # bytes for each of: algorithm name, dtype, op name
_TEXT = 400  # bytes of this rank's problem, if any
_HEAD = 3 * _NAME + _TEXT  # a row: the names and the problem text, then the words (int64)
(_W_MAGIC, _W_COLL, _W_ALG, _W_OP, _W_COMM, _W_DTYPE, _W_ITEM, _W_COUNT, _W_ROOT, _W_PROBLEM, _W_NATIVE, _W_VLEN,
 _W_CAN_NATIVE) = range(_WORDS)
_CROSS = frozenset({"gatherv", "scatterv", "alltoallv"})  # counts checked across ranks: always the full rows
_DIGESTS: dict[tuple, np.ndarray] = {}  # what a rank sends in the first round, by what it describes
_DTYPE_NAMES: dict[np.dtype, str] = {}


def _code(text: str) -> int:
    return zlib.crc32(text.encode())


def _dtype_name(dtype: np.dtype | None) -> str:
    if dtype is None:
        return ""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = dtype.str + str(dtype.descr)
    return name


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


def _digest(call: Call, args: Args, vector: list[int], suspect: bool) -> np.ndarray:
    """This rank's first-round words: ``[d, ~d, -suspect, ~row bytes]`` (d: a 64-bit digest of the call).

    d covers everything the full comparison looks at that must be equal on
    every rank; what may differ between correct ranks (an allgatherv rank's
    own send size) is checked locally instead, and a failed local check, a
    problem or a cross-rank count check sets *suspect*. The MIN-allreduce of
    the words then says, on every rank alike, whether all digests are equal
    (min d == max d), whether anyone is suspect, and how long the longest row
    of the second round is.
    """
    c = call.collective
    op = args.op
    shared = vector[1:] if c == "allgatherv" else vector  # the own send size is checked locally
    key = (_INDEX[c], call.algorithm, 0 if op is None else op.code, -1 if op is None else int(op.commutative),
           _dtype_name(args.dtype), args.count, args.root, args.unsupported is not None, args.native is not None,
           tuple(shared))
    words = _DIGESTS.get(key)
    if words is None:
        d = int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "little", signed=True)
        words = np.array([d, ~d, 0, ~(_HEAD + 8 * (_WORDS + len(vector)))], np.int64)
        words.flags.writeable = False
        if len(_DIGESTS) >= 1024:
            _DIGESTS.clear()
        _DIGESTS[key] = words
    if suspect:
        words = words.copy()
        words[2] = -1
    return words


def agreement(call: Call, args: Args) -> Steps:
    """Steps: make sure every rank was given the same call; raise :class:`ArgumentError` on all ranks if not.

    Returns True when some rank's buffer spec needs the MPI library (then all
    ranks hand the call to it). Cost: one allreduce of 32 bytes. Only when
    the digests differ, a rank has a problem or the collective's counts must
    be checked across ranks (gatherv, scatterv, alltoallv), a second round
    exchanges every rank's full description (about 560 bytes, + 16·p for the
    v-variants; an allgather by point-to-point messages with this call's tag)
    and compares them to name what is wrong.
    """
    p, rank = call.p, call.rank
    c = call.collective
    vector = _vector(args, p, rank) if c in _VECTORED else []
    suspect = (args.problem is not None or c in _CROSS or (args.unsupported is not None and args.native is None)
               or (c == "allgatherv" and vector[0] != vector[1 + rank]))
    mine = _digest(call, args, vector, suspect)
    every = np.empty(4, np.int64)
    yield Step([call.lib.Iallreduce(mine, every, MPI.MIN)], peers=[("all", -1)])
    low, not_high, unsuspect, not_size = every.tolist()
    if low == ~not_high and unsuspect == 0:
        return args.unsupported is not None  # the same on every rank: it is part of the digest
    rows = yield from _exchange_rows(call, args, vector, ~not_size)
    messages = _disagreements(call, args, rows)
    if messages:
        raise ArgumentError(f"{call.collective} #{call.seq}: " + "; ".join(messages))
    return any(words[_W_NATIVE] for words, _, _ in rows)


_VECTORED = VECTORED


def _pack(call: Call, args: Args, vector: list[int], size: int) -> np.ndarray:
    """This rank's full description: the names and problem text, then the words; *size* bytes."""
    row = np.zeros(size, np.uint8)
    names = [call.algorithm, "" if args.dtype is None else str(args.dtype), "" if args.op is None else args.op.name]
    for i, name in enumerate(names):
        raw = name.encode()[:_NAME]
        row[i * _NAME : i * _NAME + len(raw)] = np.frombuffer(raw, np.uint8)
    if args.problem is not None:
        raw = str(args.problem).encode()[: _TEXT - 4]
        row[3 * _NAME : 3 * _NAME + len(raw)] = np.frombuffer(raw, np.uint8)
    words = row[_HEAD : _HEAD + 8 * (_WORDS + len(vector))].view(np.int64)
    words[_W_MAGIC] = _MAGIC
    words[_W_COLL] = _INDEX[call.collective]
    words[_W_ALG] = _code(call.algorithm)
    words[_W_OP] = 0 if args.op is None else args.op.code
    words[_W_COMM] = -1 if args.op is None else int(args.op.commutative)
    words[_W_DTYPE] = -1 if args.dtype is None else _code(_dtype_name(args.dtype))
    words[_W_ITEM] = -1 if args.dtype is None else args.dtype.itemsize
    words[_W_COUNT] = args.count
    words[_W_ROOT] = args.root
    words[_W_PROBLEM] = args.problem is not None
    words[_W_NATIVE] = args.unsupported is not None
    words[_W_VLEN] = len(vector)
    words[_W_CAN_NATIVE] = args.native is not None
    words[_WORDS:] = vector
    return row


def _unpack(row: np.ndarray) -> tuple[np.ndarray, list[str], str]:
    text = row[:_HEAD].tobytes()
    vlen = int(row[_HEAD + 8 * _W_VLEN : _HEAD + 8 * (_W_VLEN + 1)].view(np.int64)[0])
    words = row[_HEAD : _HEAD + 8 * (_WORDS + vlen)].view(np.int64)
    names = [text[i * _NAME : (i + 1) * _NAME].rstrip(b"\0").decode(errors="replace") for i in range(3)]
    return words, names, text[3 * _NAME :].rstrip(b"\0").decode(errors="replace")


def _exchange_rows(call: Call, args: Args, vector: list[int], size: int) -> Steps:
    """Steps: every rank's full description (padded to *size* bytes), as unpacked rows in rank order.

    Point-to-point messages with the call's own tag (an allgather algorithm
    from the table), so the exchange never has to be ordered with other
    collectives on the communicator: the ranks only know they need it once the
    first round has completed, which happens at different times.
    """
    p = call.p
    mine = _pack(call, args, vector, size)
    every = np.zeros(p * size, np.uint8)
    counts = (size,) * p
    displs = tuple(r * size for r in range(p))
    gather = registry.lookup("allgather", "bruck").steps
    yield from gather(call.for_bytes(), mine, every, counts, displs)
    return [_unpack(every[r * size : (r + 1) * size]) for r in range(p)]


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
        checks.append((_W_OP, "the op", lambda r, v: rows[r][1][2] + (f" (user function #{v})" if v >= 1000 else "")))
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

