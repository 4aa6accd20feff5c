"""Alltoall algorithms: rank r's block for rank s ends up as rank s's block from rank r.

Signature: ``algorithm(s, send, sendcounts, senddispls, recv, recvcounts,
recvdispls)``: *s* is the :class:`~mpicomm.schedule.Builder` the algorithm
describes its rounds to; rank r sends ``send[senddispls[s]:]``
(``sendcounts[s]`` elements) to rank s, which receives it at
``recv[recvdispls[r]:]`` (``recvcounts[r]`` elements); *send* and *recv* are
views of the call's buffers. One function serves alltoall and alltoallv.
Every algorithm is registered ``in_place=False``: for ``MPI.IN_PLACE`` the
plan copies *recv* to a fresh *send* first, so *send* and *recv* never
share memory here. n = bytes each rank sends in total, p = ranks. alltoallw
runs them on bytes (a datatype per block: counts and displacements in bytes).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..model import Machine, ceil_lg, direct_exchange
from ..registry import cost, register
from ..schedule import Builder, View
from .patterns import pairwise as pairwise_schedule

__all__ = ["linear", "pairwise", "bruck", "shm"]


def _block(buf: View, counts: Sequence[int], displs: Sequence[int], r: int) -> View:
    """Rank *r*'s block of *buf*: elements ``displs[r] … displs[r] + counts[r] − 1``."""
    return buf.part(displs[r], displs[r] + counts[r])


@register("alltoall", "linear", in_place=False)
@register("alltoallv", "linear", in_place=False)
@register("alltoallw", "linear", in_place=False)
def linear(s: Builder, send: View, sendcounts: Sequence[int], senddispls: Sequence[int],
           recv: View, recvcounts: Sequence[int], recvdispls: Sequence[int]) -> None:
    """Linear (scattered nonblocking): all p − 1 receives and p − 1 sends posted in one round.

    Steps: copy the own block locally; then one round posts a receive from
    every other rank straight into its block of *recv* (from r − 1, r − 2, …)
    and a send of every other rank's block of *send* (to r + 1, r + 2, …, so
    that not every rank sends to rank 0 first).
    Restrictions: none (any p, any counts); not in place (the plan copies).
    """
    p, rank = s.p, s.rank
    s.copy(_block(recv, recvcounts, recvdispls, rank), _block(send, sendcounts, senddispls, rank))
    if p == 1:
        return
    dests = [(rank + k) % p for k in range(1, p)]
    sources = [(rank - k) % p for k in range(1, p)]
    s.exchange(
        sends=[(d, _block(send, sendcounts, senddispls, d)) for d in dests],
        recvs=[(r, _block(recv, recvcounts, recvdispls, r)) for r in sources],
    )


@register("alltoall", "pairwise", in_place=False)
@register("alltoallv", "pairwise", in_place=False)
@register("alltoallw", "pairwise", in_place=False)
def pairwise(s: Builder, send: View, sendcounts: Sequence[int], senddispls: Sequence[int],
             recv: View, recvcounts: Sequence[int], recvdispls: Sequence[int]) -> None:
    """Pairwise exchange: p − 1 rounds, one send and one receive each.

    Steps: copy the own block locally; in round k = 1 … p−1 rank r sends its
    block for r + k and receives the block from r − k (mod p;
    :func:`~mpicomm.coll.patterns.pairwise`), straight from *send* into
    *recv*. Each round has one message in flight each way, so large blocks do
    not flood the network the way the linear algorithm's do.
    Restrictions: none (any p, any counts); not in place (the plan copies).
    """
    rank = s.rank
    s.copy(_block(recv, recvcounts, recvdispls, rank), _block(send, sendcounts, senddispls, rank))
    for to, frm in pairwise_schedule(rank, s.p):
        s.sendrecv(to, _block(send, sendcounts, senddispls, to), frm, _block(recv, recvcounts, recvdispls, frm))


def _distances(p: int) -> list[int]:
    """Bruck's round distances 1, 2, 4, … below p (⌈lg p⌉ of them)."""
    out, d = [], 1
    while d < p:
        out.append(d)
        d *= 2
    return out


def _moving(p: int, distance: int) -> list[int]:
    """Positions 1 … p−1 whose bit *distance* is set: the blocks forwarded in that round."""
    return [i for i in range(1, p) if i & distance]


def _joined(views: Sequence[View]) -> View | None:
    """The one view that is *views* one after another in one buffer (empty ones ignored), or None."""
    full = [v for v in views if v.size]
    if not full:
        return views[0].part(0, 0)
    for a, b in zip(full, full[1:]):
        if b.buf != a.buf or b.start != a.stop:
            return None
    return View(full[0].buf, full[0].start, full[-1].stop)


def _bruck_rounds(s: Builder, held: list[View], arriving: Sequence[Sequence[int]], dtype: Any = None,
                  land: Callable[[int, View], None] | None = None,
                  target: Callable[[int, int], View | None] | None = None) -> View | None:
    """Bruck's rounds over blocks in place: *held[i]* is where the block at position i is now.

    In round k (distance d = 2^k) the blocks at the positions with bit k set
    go to r + d as one message - packed into scratch by one copy per block,
    unless they already lie one after another - and as many arrive from
    r − d, of the sizes *arriving[k]* (in position order), into a scratch
    inbox (one region per round, so a block waits there until a later round
    forwards it). A block with no higher bit set has arrived for good:
    ``land(i, view)`` places it (copies in the same round). A round that
    moves a single such block receives it straight into ``target(i, size)``
    where that gives a view. Returns the inbox (arrivals in round order).
    """
    p, rank = s.p, s.rank
    sizes = [v.size for v in held]
    rounds = []
    pack = inbox_size = 0
    for k, d in enumerate(_distances(p)):
        moving = _moving(p, d)
        pack = max(pack, sum(sizes[i] for i in moving)) if len(moving) > 1 else pack
        incoming = [int(n) for n in arriving[k]]
        for i, n in zip(moving, incoming):
            sizes[i] = n
        direct = None
        if len(moving) == 1 and moving[0] < 2 * d and target is not None:
            direct = target(moving[0], incoming[0])
        if direct is None:
            inbox_size += sum(incoming)
        rounds.append((d, moving, incoming, direct))
    inbox = s.empty(inbox_size, dtype) if any(r[3] is None for r in rounds) else None
    out: View | None = None
    at = 0
    for d, moving, incoming, direct in rounds:
        views = [held[i] for i in moving]
        outgoing = _joined(views)
        if outgoing is None:  # pack, once the previous round has delivered what it forwards
            if out is None:
                out = s.empty(pack, dtype)
            o = 0
            for v in views:
                s.copy(out.part(o, o + v.size), v)
                o += v.size
            outgoing = out.part(0, o)
        if direct is not None:
            into = direct
        else:
            assert inbox is not None
            into = inbox.part(at, at + sum(incoming))
            at += sum(incoming)
        s.sendrecv((rank + d) % p, outgoing, (rank - d) % p, into)
        o = 0
        for i, n in zip(moving, incoming):
            held[i] = into.part(o, o + n)
            o += n
            if i < 2 * d and direct is None and land is not None:  # no higher bit: it has arrived
                land(i, held[i])
    return inbox


def _assign(x: Any, values: Sequence[int]) -> None:
    """``x[...] = values`` for a host or device array."""
    xp = sys.modules.get(type(x).__module__.split(".")[0], np)
    x[...] = xp.asarray(np.asarray(values, dtype=x.dtype))


def _check(s: Builder, mismatched: list[str]) -> None:
    """A last local step that raises the mismatches found (the other ranks needed this one's forwarding)."""
    if not mismatched:
        return
    rank = s.rank

    def fail(run: Any) -> None:
        raise ValueError(f"{run} on rank {rank}: " + "; ".join(mismatched) + " - sendcounts and recvcounts "
                         "must match pairwise")

    s.local(fail, "raise: " + "; ".join(mismatched))


@register("alltoall", "bruck", in_place=False)
@register("alltoallv", "bruck", in_place=False)
@register("alltoallw", "bruck", in_place=False)
def bruck(s: Builder, send: View, sendcounts: Sequence[int], senddispls: Sequence[int],
          recv: View, recvcounts: Sequence[int], recvdispls: Sequence[int]) -> None:
    """Bruck et al. (1997): ⌈lg p⌉ rounds, each forwarding about half the blocks 2^k ranks onward.

    Steps: position i holds the block for rank (r + i) mod p (the rotation:
    the blocks are addressed where they lie, nothing is copied). In round k
    rank r sends every block whose position has bit k set to r + 2^k, packed
    into one message (one copy per block into scratch), and receives as many
    from r − 2^k, which then take those positions. A block at position i thus
    travels i ranks in all - to its destination; there, position i holds the
    block from rank (r − i) mod p, copied to its place in *recv* (the inverse
    rotation) as soon as no later round forwards it (no bit above k set).
    For alltoall the blocks all have one size. For alltoallv the ranks that
    forward a block do not know its size, so the sizes go first: the same
    ⌈lg p⌉ rounds route every block's size (one ``int64`` per block, rotated
    into scratch by a local step), and the data's rounds are built at run
    time from the sizes received (``Schedule.then``). Sizes rather than
    exchanging the whole p × p count matrix first: about p/2 numbers per round
    instead of p² numbers on every rank. A block whose size differs from
    *recvcounts* raises ValueError once the exchange is over (the other ranks
    still need this one's forwarding).
    Restrictions: none (any p, any counts); not in place (the plan copies).
    """
    p, rank = s.p, s.rank
    held = [_block(send, sendcounts, senddispls, (rank + i) % p) for i in range(p)]  # rotated views
    sizes = [int(sendcounts[(rank + i) % p]) for i in range(p)]

    def placer(b: Builder, mismatched: list[str]) -> Callable[[int, View], None]:
        """Place the block at position i (from rank r − i) in *recv* (rounds of *b*), or note its mismatch."""

        def place(i: int, v: View) -> None:
            r = (rank - i) % p
            if v.size == recvcounts[r]:
                b.copy(_block(recv, recvcounts, recvdispls, r), v)
            else:
                mismatched.append(f"rank {r} sent {v.size} elements, recvcounts[{r}] = {recvcounts[r]}")

        return place

    def target(i: int, size: int) -> View | None:
        r = (rank - i) % p
        return _block(recv, recvcounts, recvdispls, r) if size == recvcounts[r] else None

    own: list[str] = []
    placer(s, own)(0, held[0])
    distances = _distances(p)
    if s.collective == "alltoall" or not distances:  # every block's size is known here
        if distances:
            arriving = [[recvcounts[0]] * len(_moving(p, d)) for d in distances]
            _bruck_rounds(s, held, arriving, land=placer(s, own), target=target)
        _check(s, own)
        return

    # alltoallv: route the sizes first (one int64 per block), then build the data's rounds from them
    table = s.empty(p, np.int64)

    def fill(run: Any) -> None:
        _assign(run.program.buffers[table.buf][table.start : table.stop], sizes)

    s.local(fill, "write the blocks' sizes, rotated (position i: the block for rank r + i)", reads=(), writes=(table,))
    inbox = _bruck_rounds(s, [table.part(i, i + 1) for i in range(p)], [[1] * len(_moving(p, d)) for d in distances],
                          np.int64)
    assert inbox is not None
    got: dict[str, list[int]] = {}

    def keep(run: Any) -> None:
        got["sizes"] = [int(n) for n in run.program.buffers[inbox.buf][inbox.start : inbox.stop].tolist()]

    s.local(keep, "read the sizes received", reads=(inbox,), writes=())

    def data(b: Builder) -> None:
        """The data's rounds, from the sizes this run received (built at run time)."""
        received = got.pop("sizes")
        arriving, at = [], 0
        for d in distances:
            m = len(_moving(p, d))
            arriving.append(received[at : at + m])
            at += m
        mismatched = list(own)
        _bruck_rounds(b, list(held), arriving, land=placer(b, mismatched), target=target)
        _check(b, mismatched)

    s.then = data


@register("alltoall", "shm", single_node=True, host_only=True, in_place=False)
@register("alltoallv", "shm", single_node=True, host_only=True, in_place=False)
@register("alltoallw", "shm", single_node=True, host_only=True, in_place=False)
def shm(s: Builder, send: View, sendcounts: Sequence[int], senddispls: Sequence[int],
        recv: View, recvcounts: Sequence[int], recvdispls: Sequence[int]) -> None:
    """Shared memory: every rank publishes its blocks, then copies its own block out of every peer's memory.

    Steps: (see :func:`mpicomm.coll.node_memory.alltoall`) copy the own block
    locally; publish a header in the scratch (each destination's block offset
    and count) and the blocks - a :class:`mpicomm.shm.Pool` send array where it
    is, another packed into scratch in destination order (one copy per run of
    adjacent blocks, the own block left out) - and raise this rank's counter;
    then, from rank r − 1 down, copy the block for r out of each peer's memory
    as soon as that peer's counter is up (no barrier). No barrier at the end:
    the next shared-memory call waits until every rank has read this one's
    blocks (a pool send array waits at the end). alltoallv first agrees on the
    largest scratch any rank needs (+ α). A sender's count that differs from
    *recvcounts* raises ValueError on the receiver once the call is over.
    Restrictions: every rank on one node; host buffers; not in place (the plan copies).
    """
    from .node_memory import alltoall as shm_alltoall

    shm_alltoall(s, send, sendcounts, senddispls, recv, recvcounts, recvdispls)


# ---------------------------------------------------------------- cost functions (n: the catalogue's size)


@cost("alltoall", "linear", "pairwise")
def _alltoall_linear(m: Machine, n: float, p: int) -> float:
    """(p−1)α + n(p−1)/p·β  (linear: all p − 1 messages in flight at once; pairwise: p − 1 rounds of one message
    each way)"""
    return direct_exchange(m, n, p)


@cost("alltoall", "bruck")
def _alltoall_bruck(m: Machine, n: float, p: int) -> float:
    """⌈lg p⌉·α + (n/2)·⌈lg p⌉·β"""
    a, b = m.link(p).alpha, m.link(p).beta
    lg = ceil_lg(p)
    return lg * a + n / 2 * lg * b


@cost("alltoallv", "bruck")
def _alltoallv_bruck(m: Machine, n: float, p: int) -> float:
    """⌈lg p⌉·α + (n/2)·⌈lg p⌉·β, + ⌈lg p⌉·α and (p/2)·8 size bytes per round  (the sizes go first)"""
    a, b = m.link(p).alpha, m.link(p).beta
    lg = ceil_lg(p)
    return _alltoall_bruck(m, n, p) + lg * a + lg * (p / 2) * 8 * b


@cost("alltoall", "shm")
def _alltoall_shm(m: Machine, n: float, p: int) -> float:
    """α + 2n(p−1)/p·δ  (copy in all but the own block, copy the p − 1 others' blocks out; a pool send array skips
    the copy in: α + n(p−1)/p·δ; α of the intra-node link)"""
    return m.intra.alpha + 2 * n * (p - 1) / p * m.copy


@cost("alltoallv", "shm")
def _alltoallv_shm(m: Machine, n: float, p: int) -> float:
    """α + 2n(p−1)/p·δ, + α to agree on the scratch size  (as alltoall's otherwise: a pool send array skips the
    copy in)"""
    return _alltoall_shm(m, n, p) + m.intra.alpha
