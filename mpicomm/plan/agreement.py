"""The agreement: every rank checks that every other was given the same collective call, inside the call.

Validation is on by default (``MPICOMM_VALIDATE=0`` turns it off) and costs no
round of its own. Each plan carries four 64-bit *words*, made once when the
plan is made:

``[d, ~d, suspect, cross]``

* ``d`` - a digest of everything every rank must give alike (collective,
  algorithm, element type, count, op and its commutativity, root, the counts
  every rank must share, a persistent request's creation number);
* ``suspect`` - −1 when this rank has a problem with its own arguments (or
  its communicator refuses calls), else 0;
* ``cross`` - for the v-collectives, a sum of hashes that is 0 over all
  ranks exactly when the per-rank counts fit together (each rank adds
  h(rank, peer, count) for what it sends and subtracts it for what it
  expects to receive; a mismatch leaves it non-zero but with probability
  2⁻⁶⁴).

The words are combined over all ranks by a butterfly (recursive doubling,
non-powers of two folded like MPICH's): MIN of the first three, SUM of the
last. Afterwards every rank holds the same four words: the ranks agree
exactly when ``min d == max d`` (``d == ~word 1``), nobody is suspect and
the cross sum is 0.

Where the algorithm's own first rounds are that butterfly (recursive
doubling on small vectors), the words ride in front of its data in the same
messages: zero extra messages (a *fused* plan). Otherwise the butterfly runs
beside the data as 32-byte messages of its own, advancing independently, so
a rank whose peers run another schedule learns of it and stops waiting for
data that will never come.

When the ranks do not agree - on any rank alike, since all hold the same
words - each abandons its messages, the communicator moves to fresh tags
(what was in flight can never be matched by a later call), and one
allgather of every rank's full description (the MPI library's, on the
communicator's private duplicate) finds what differs, so every rank raises
the same :class:`ArgumentError` naming it. The descriptions carry each
rank's count of the call's messages per peer and tag (sent, and received
before it gave up: :meth:`~mpicomm.engine.executor.Run.abandon`), so each
rank then receives exactly those sent to it that nothing matched
(:func:`drain`): none stays in MPI's queue of unexpected messages.
"""

from __future__ import annotations

import hashlib
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from mpi4py import MPI

from ..catalogue import COLLECTIVES, NEIGHBORHOOD, REDUCING, ROOTED
from ..engine import executor
from .args import Args, ArgumentError, sending_order

__all__ = ["WORDS", "digest", "butterfly", "agrees", "describe", "disagreements", "cross_sum", "settle", "combiner",
           "owed", "drain", "DRAIN_SECONDS"]

WORDS = 4  #: int64 words of the agreement
_INDEX = {c: i for i, c in enumerate(COLLECTIVES)}
_CROSS = frozenset({"gatherv", "scatterv", "alltoallv", "alltoallw"}) | NEIGHBORHOOD  # per-rank counts that must fit across ranks
_MASK = (1 << 64) - 1
_DIGESTS: dict[tuple, int] = {}


def _dtype_name(dtype: np.dtype | None) -> str:
    return "" if dtype is None else dtype.str + str(dtype.descr)


def _mix(x: int) -> int:
    """splitmix64: a 64-bit hash of an integer."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def _h(sender: int, receiver: int, count: int) -> int:
    return _mix(_mix(_mix(sender) ^ receiver) ^ count)


def _edge_counts(args: Args) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
    """A neighbourhood collective's edges as ``(peer, k, count)``: the k-th block to (from) that peer, for the
    blocks sent and received (MPI.PROC_NULL edges move nothing and are left out)."""

    def numbered(peers: tuple[int, ...], counts: tuple[int, ...] | None) -> list[tuple[int, int, int]]:
        if counts is None or len(counts) != len(peers):
            return []
        seen: dict[int, int] = {}
        out = []
        for peer, n in zip(peers, counts):
            if peer >= 0:
                k = seen[peer] = seen.get(peer, -1) + 1
                out.append((peer, k, int(n)))
        return out

    destinations, sendcounts, _ = sending_order(args)
    return numbered(destinations, sendcounts), numbered(args.sources, args.recvcounts)


def cross_sum(args: Args, p: int, rank: int) -> int:
    """This rank's share of the cross word (see the module docstring), as a signed int64."""
    c = args.collective
    total = 0
    if c == "gatherv":
        if args.send is not None:
            total += _h(rank, args.root, int(args.send.size))
        if rank == args.root and args.recvcounts is not None and len(args.recvcounts) == p:
            total -= sum(_h(r, rank, int(n)) for r, n in enumerate(args.recvcounts))
    elif c == "scatterv":
        if args.recv is not None:
            total -= _h(args.root, rank, int(args.recv.size))
        if rank == args.root and args.sendcounts is not None and len(args.sendcounts) == p:
            total += sum(_h(rank, r, int(n)) for r, n in enumerate(args.sendcounts))
    elif c in NEIGHBORHOOD:  # the k-th block from s to r: + on s, − on r (its k-th from s), same count
        out, into = _edge_counts(args)
        total += sum(_h(rank, _mix(peer) ^ k, n) for peer, k, n in out)
        total -= sum(_h(peer, _mix(rank) ^ k, n) for peer, k, n in into)
    elif c in ("alltoallv", "alltoallw"):
        if args.sendcounts is not None and len(args.sendcounts) == p:
            total += sum(_h(rank, s, int(n)) for s, n in enumerate(args.sendcounts))
        if args.recvcounts is not None and len(args.recvcounts) == p:
            total -= sum(_h(s, rank, int(n)) for s, n in enumerate(args.recvcounts))
    total &= _MASK
    return total - (1 << 64) if total >= 1 << 63 else total


def _shared_counts(args: Args) -> tuple:
    """The per-rank counts every rank must give alike (in the digest)."""
    c = args.collective
    if c in ("allgatherv", "reduce_scatter"):
        return tuple(args.recvcounts or ())
    return ()


def _local_problem(args: Args, p: int, rank: int) -> str | None:
    """A v-count check only this rank can make (its own block against its own counts)."""
    if args.collective == "allgatherv" and args.recvcounts is not None and len(args.recvcounts) == p:
        mine = int(args.send.size) if args.send is not None else -1
        if mine != args.recvcounts[rank]:
            return f"sends {mine} elements but the receive counts say {args.recvcounts[rank]}"
    if args.collective in ("alltoallv", "alltoallw") and args.sendcounts is not None and args.recvcounts is not None \
            and len(args.sendcounts) == p == len(args.recvcounts) and args.sendcounts[rank] != args.recvcounts[rank]:
        unit = "bytes" if args.collective == "alltoallw" else "elements"
        return (f"sends {args.sendcounts[rank]} {unit} to itself, but its receive counts say "
                f"{args.recvcounts[rank]}")
    return None


def digest(args: Args, algorithm: str, p: int, rank: int, persistent: int | None = None,
           suspect: bool = False) -> np.ndarray:
    """The agreement's words for this rank's call (a new array; see the module docstring)."""
    op = args.op
    key = (_INDEX[args.collective], algorithm, 0 if op is None else op.code,
           -1 if op is None else int(op.commutative), _dtype_name(args.dtype), args.count, args.root,
           args.unsupported is not None, args.native is not None, _shared_counts(args), persistent)
    d = _DIGESTS.get(key)
    if d is None:
        d = int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "little", signed=True)
        if len(_DIGESTS) > 4096:
            _DIGESTS.clear()
        _DIGESTS[key] = d
    cross = cross_sum(args, p, rank) if args.collective in _CROSS else 0
    bad = suspect or args.problem is not None or (args.unsupported is not None and args.native is None) \
        or _local_problem(args, p, rank) is not None
    return np.array([d, ~d, -1 if bad else 0, cross], np.int64)


def agrees(words: np.ndarray) -> bool:
    """Whether the combined words say every rank was given the same call."""
    return int(words[0]) == ~int(words[1]) and int(words[2]) == 0 and int(words[3]) == 0


def butterfly(rank: int, p: int) -> list[tuple[str, int]]:
    """The agreement's rounds for *rank* of *p*: ``(kind, peer)``, kind ``send``, ``recv`` (take the result),
    ``fold`` (receive and combine) or ``both`` (exchange and combine). Recursive doubling over the largest
    power of two p' ≤ p; each even rank below 2(p − p') first hands its words to the odd rank above and
    receives the result from it at the end (as :func:`mpicomm.coll.patterns.fold`)."""
    if p <= 1:
        return []
    pof2 = 1 << (p.bit_length() - 1)
    rem = p - pof2
    if rank < 2 * rem and rank % 2 == 0:
        return [("send", rank + 1), ("recv", rank + 1)]
    rounds: list[tuple[str, int]] = []
    if rank < 2 * rem:
        rounds.append(("fold", rank - 1))
        newrank = rank // 2
    else:
        newrank = rank - rem
    mask = 1
    while mask < pof2:
        partner = newrank ^ mask
        rounds.append(("both", partner * 2 + 1 if partner < rem else partner + rem))
        mask <<= 1
    if rank < 2 * rem:
        rounds.append(("send", rank - 1))
    return rounds


def combiner(working: np.ndarray, got: np.ndarray, kind: str, flag: list[bool]) -> Callable[[Any], None]:
    """A callable that folds received words *got* into *working* (kind ``fold``/``both``: MIN, MIN, MIN, SUM;
    ``recv``: take them; ``send``: nothing). *flag*[0] is set when *working* changed."""
    w_bytes, g_bytes = memoryview(working.view(np.uint8)), memoryview(got.view(np.uint8))  # type: ignore[arg-type]  # ndarray is a buffer (numpy's stub: Python 3.12+)
    wu, gu = working.view(np.uint64)[3:4], got.view(np.uint64)[3:4]
    head_w, head_g = working[:3], got[:3]
    minimum, add, copyto = np.minimum, np.add, np.copyto

    if kind == "send":
        return _nothing
    if kind == "recv":
        def take(run: Any) -> None:
            if w_bytes != g_bytes:
                copyto(working, got)
                flag[0] = True
        return take

    def combine(run: Any) -> None:
        if w_bytes == g_bytes and not got[3]:
            return
        minimum(head_w, head_g, out=head_w)
        add(wu, gu, out=wu)
        flag[0] = True

    return combine


def _nothing(run: Any) -> None:
    return None


# ---------------------------------------------------------------- what went wrong, named alike on every rank


def describe(args: Args, algorithm: str, p: int, rank: int, persistent: int | None) -> dict:
    """This rank's full description of its call, for the error path's exchange."""
    op = args.op
    return {
        "collective": args.collective,
        "algorithm": algorithm,
        "dtype": "" if args.dtype is None else str(args.dtype),
        "dtype_key": _dtype_name(args.dtype),
        "op": "" if op is None else op.name,
        "op_code": 0 if op is None else op.code,
        "commutative": -1 if op is None else int(op.commutative),
        "count": args.count,
        "root": args.root,
        "problem": None if args.problem is None else str(args.problem),
        "native": args.unsupported is not None,
        "can_native": args.native is not None,
        "unsupported": args.unsupported,
        "vector": _vector(args, p, rank),
        "local": _local_problem(args, p, rank),
        "persistent": persistent,
    }


def _vector(args: Args, p: int, rank: int) -> list[int]:
    c = args.collective
    zeros = [0] * p

    def mine(counts: tuple[int, ...] | None) -> list[int]:
        return [int(v) for v in counts] if counts is not None and len(counts) == p else zeros

    if c == "gatherv":
        return [args.send.size if args.send is not None else -1] + (mine(args.recvcounts) if rank == args.root else zeros)
    if c == "scatterv":
        return [args.recv.size if args.recv is not None else -1] + (mine(args.sendcounts) if rank == args.root else zeros)
    if c == "allgatherv":
        return [args.send.size if args.send is not None else -1] + mine(args.recvcounts)
    if c in ("alltoallv", "alltoallw"):
        return mine(args.sendcounts) + mine(args.recvcounts)
    if c == "reduce_scatter":
        return mine(args.recvcounts)
    if c in NEIGHBORHOOD:  # [peer, k, count] of each block sent, then -1, then of each block received
        out, into = _edge_counts(args)
        return [x for e in out for x in e] + [-1] + [x for e in into for x in e]
    return []


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks)) if len(ranks) <= 8 else f"{', '.join(map(str, ranks[:8]))}, …"


_NONE = object()  # a value no description holds: nothing is left out


def _differ(rows: list[dict], key: str, what: str, show: Callable[[int, Any], str], unknown: Any = _NONE) -> str | None:
    values = [row[key] for row in rows]
    if len({repr(v) for v in values if v != unknown}) <= 1:
        return None
    groups: dict[str, list[int]] = {}
    firsts: dict[str, Any] = {}
    for r, v in enumerate(values):
        if v != unknown:
            groups.setdefault(repr(v), []).append(r)
            firsts.setdefault(repr(v), v)
    parts = [f"{show(ranks[0], firsts[k])} on rank(s) {_ranks(ranks)}" for k, ranks in groups.items()]
    return f"ranks disagree on {what}: " + ", ".join(parts)


def disagreements(rows: list[dict]) -> list[str]:
    """What differs between the ranks' descriptions (the same list on every rank: they all have all rows)."""
    having: dict[str, list[int]] = {}
    for r, row in enumerate(rows):
        if row["problem"]:
            having.setdefault(row["problem"], []).append(r)
    if having:  # one line per distinct problem, naming every rank that has it
        return [f"rank {ranks[0]}: {text}" + (f" (the same on rank(s) {_ranks(ranks[1:])})" if ranks[1:] else "")
                for text, ranks in having.items()]
    first = _differ(rows, "collective", "the collective", lambda r, v: v)
    if first:
        return [first + " (every rank must call the same collectives in the same order)"]
    c = rows[0]["collective"]
    out: list[str] = []
    native = any(row["native"] for row in rows)
    if native:
        unable = [r for r, row in enumerate(rows) if not row["can_native"]]
        needing = [r for r, row in enumerate(rows) if row["native"]]
        if unable:
            out.append(f"rank(s) {_ranks(needing)} passed buffer specs only the MPI library runs, but rank(s) "
                       f"{_ranks(unable)} called an array function, which cannot hand the call to the library; "
                       f"use plain arrays everywhere, or Comm methods everywhere")
    checks: list[tuple[str, str, Callable[[int, Any], str]]] = [
        ("dtype_key", "the element type", lambda r, v: rows[r]["dtype"]),
    ]
    if not native:
        checks.append(("algorithm", "the algorithm", lambda r, v: repr(v)))
    if c in ROOTED:
        checks.append(("root", "the root", lambda r, v: f"root {v}"))
    if c in REDUCING:
        checks.append(("op_code", "the op", lambda r, v: rows[r]["op"] + (f" (user function #{v})" if v >= 1000 else "")))
        checks.append(("commutative", "the op's commutativity",
                       lambda r, v: "commutative" if v else "non-commutative"))
    if not native:
        checks.append(("count", "the count", lambda r, v: f"{v} elements"))
    for key, what, show in checks:
        message = _differ(rows, key, what, show, "" if native and key == "dtype_key" else _NONE)
        if message:
            out.append(message)
    if not out and not native:
        out.extend(_check_vectors(c, [np.asarray(row["vector"], np.int64) for row in rows], rows[0]["root"]))
        locals_ = [f"rank {r} {row['local']}" for r, row in enumerate(rows) if row["local"]]
        if not out:
            out.extend(locals_)
    if not out:
        persistent = _differ(rows, "persistent", "which persistent request this is",
                             lambda r, v: "a blocking or nonblocking call" if v is None else f"request #{v}")
        if persistent:
            out.append(persistent + " (start persistent requests in the same order on every rank)")
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
                bad.append(f"rank {r}'s receive counts {vectors[r][1:].tolist()} differ from rank 0's "
                           f"{vectors[0][1:].tolist()}")
        for r in range(p):
            if vectors[r][0] != vectors[0][1 + r]:
                bad.append(f"rank {r} sends {vectors[r][0]} elements but the receive counts say {vectors[0][1 + r]}")
    elif c in ("alltoallv", "alltoallw"):
        unit = "bytes" if c == "alltoallw" else "elements"
        for r in range(p):
            for s in range(p):
                if vectors[r][s] != vectors[s][p + r]:
                    bad.append(f"rank {r} sends {vectors[r][s]} {unit} to rank {s}, which expects {vectors[s][p + r]}")
    elif c in NEIGHBORHOOD:
        bad.extend(_check_edges(vectors))
    elif c == "reduce_scatter":
        for r in range(p):
            if not np.array_equal(vectors[r], vectors[0]):
                bad.append(f"rank {r}'s receive counts {vectors[r].tolist()} differ from rank 0's {vectors[0].tolist()}")
    if len(bad) > 6:
        bad = bad[:6] + [f"and {len(bad) - 6} more"]
    return bad


def _check_edges(vectors: list[np.ndarray]) -> list[str]:
    """Each rank's blocks sent against what their receivers expect (see :func:`_vector`), named."""
    sent: dict[tuple[int, int, int], int] = {}
    expected: dict[tuple[int, int, int], int] = {}
    for r, vector in enumerate(vectors):
        values = vector.tolist()
        cut = values.index(-1)
        for i in range(0, cut, 3):
            peer, k, n = values[i : i + 3]
            sent[(r, peer, k)] = n
        for i in range(cut + 1, len(values), 3):
            peer, k, n = values[i : i + 3]
            expected[(peer, r, k)] = n
    bad = []
    for (r, q, k), n in sorted(sent.items()):
        if (r, q, k) not in expected:
            bad.append(f"rank {r} sends rank {q} a block #{k + 1}, which rank {q} does not expect (its topology has "
                       f"fewer edges from rank {r})")
        elif expected[(r, q, k)] != n:
            bad.append(f"rank {r} sends rank {q} {n} elements (its block #{k + 1} for it), which expects "
                       f"{expected[(r, q, k)]}")
    for (r, q, k) in sorted(set(expected) - set(sent)):
        bad.append(f"rank {q} expects a block #{k + 1} from rank {r}, which sends it none")
    return bad


#: How long a disagreement's drain waits for the messages it is owed before it warns and leaves them.
DRAIN_SECONDS = 30.0


def owed(rows: list[dict], rank: int) -> dict[tuple[int, int], int]:
    """The messages of an abandoned call that were sent to *rank* and that none of its receives matched, per
    ``(source, tag)``: what the senders' ledgers (:meth:`mpicomm.engine.executor.Run.abandon`, the rows'
    ``traffic``) say they sent it, less what its own says it received."""
    out: dict[tuple[int, int], int] = {}
    for source, row in enumerate(rows):
        for (peer, tag), (sent, _) in row.get("traffic", {}).items():
            if peer == rank and sent:
                out[(source, tag)] = out.get((source, tag), 0) + sent
    for (peer, tag), (_, got) in rows[rank].get("traffic", {}).items():
        if got:
            out[(peer, tag)] = out.get((peer, tag), 0) - got
    return {key: n for key, n in out.items() if n > 0}


def drain(comm: Any, debts: dict[tuple[int, int], int], seconds: float = DRAIN_SECONDS) -> int:
    """Receive the messages :func:`owed` names (on *comm*, the private duplicate; their tags are the abandoned
    epoch's, which no later call uses), then a barrier: every rank stays in MPI until every drain is done, so a
    large message's sender is there to send it. Returns how many were left after *seconds* (0; else a warning
    names them: a miscount, which is a bug in mpicomm)."""
    left = dict(debts)
    status = MPI.Status()
    receiving: list[Any] = []
    deadline = time.monotonic() + seconds
    pause = 1e-5
    while left and time.monotonic() < deadline:
        found = False
        for key in list(left):
            message = comm.Improbe(key[0], key[1], status)
            if message is None:
                continue
            found = True
            buf = bytearray(status.Get_count(MPI.BYTE))
            receiving.append(message.Irecv([buf, MPI.BYTE]))
            left[key] -= 1
            if not left[key]:
                del left[key]
        if not found:
            time.sleep(pause)
            pause = min(2 * pause, 1e-3)
    while receiving and not MPI.Request.Testall(receiving):
        if time.monotonic() >= deadline:
            for r in receiving:
                executor.bury(r)
            break
        time.sleep(1e-4)
    comm.Barrier()
    executor.prune()
    missing = sum(left.values())
    if missing:
        warnings.warn(f"mpicomm: {missing} message(s) of a call that failed on a disagreement did not arrive within "
                      f"{seconds:g} s (from (rank, tag) {sorted(left)}); they stay in MPI's queue. This is a bug in "
                      f"mpicomm's count of them: please report it", RuntimeWarning, stacklevel=2)
    return missing


def settle(comm: Any, label: str, row: dict) -> str:
    """The ranks' words differ: exchange every rank's description (*comm*: the private duplicate; every rank
    calls this alike), receive the abandoned call's messages that nothing matched (:func:`drain`, from the
    descriptions' ``traffic``), and raise the :class:`ArgumentError` that names what differs - or return
    ``"library"`` when nothing differs but that some rank passed a buffer spec only the MPI library takes, and
    every rank can hand the call to the library (then all do)."""
    rows = comm.allgather(row)
    drain(comm, owed(rows, comm.Get_rank()))
    messages = disagreements(rows)
    if not messages and any(r["native"] for r in rows) and all(r["can_native"] for r in rows):
        return "library"
    if not messages:
        messages = ["the ranks' calls differ in a way the descriptions do not show (the same call on every rank, "
                    "but not in the same order? or a program's own message on comm.library_comm with a "
                    "collective's tag, read as this call's: take tags from comm.collective_tag() there)"]
    raise ArgumentError(f"{label}: " + "; ".join(messages))


def rounds_of(kind_peers: list[tuple[str, int]]) -> Iterator[tuple[list[int], list[int]]]:
    """``(send peers, receive peers)`` of each butterfly round (for aligning it with a schedule)."""
    for kind, peer in kind_peers:
        sends = [peer] if kind in ("send", "both") else []
        recvs = [peer] if kind in ("recv", "fold", "both") else []
        yield sends, recvs
