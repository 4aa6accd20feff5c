"""Alltoall algorithms: rank r's block for rank s ends up as rank s's block from rank r.

Signature: ``algorithm(call, send, sendcounts, senddispls, recv, recvcounts,
recvdispls)``; rank r sends ``send[senddispls[s]:]`` (``sendcounts[s]``
elements) to rank s, which receives it at ``recv[recvdispls[r]:]``
(``recvcounts[r]`` elements). One function serves alltoall and alltoallv.
Every algorithm is registered ``in_place=False``: for ``MPI.IN_PLACE`` the
dispatcher copies *recv* to a fresh *send* first, so *send* and *recv* never
share memory here. n = bytes each rank sends in total, p = ranks.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..model import Machine, ceil_lg, direct_exchange
from ..registry import cost, register
from ..requests import Steps
from .call import Call, block
from .schedules import pairwise as pairwise_schedule

__all__ = ["linear", "pairwise", "bruck", "shm"]



@register("alltoall", "linear", in_place=False)
@register("alltoallv", "linear", in_place=False)
def linear(call: Call, send: Any, sendcounts: Sequence[int], senddispls: Sequence[int],
           recv: Any, recvcounts: Sequence[int], recvdispls: Sequence[int]) -> Steps:
    """Linear (scattered nonblocking): all p − 1 receives and p − 1 sends posted in one step.

    Steps: copy the own block locally; then one step posts a receive from
    every other rank straight into its block of *recv* (from r − 1, r − 2, …)
    and a send of every other rank's block of *send* (to r + 1, r + 2, …, so
    that not every rank sends to rank 0 first).
    Restrictions: none (any p, any counts); not in place (the dispatcher copies).
    Cost: (p−1)α + n(p−1)/p·β  (all p − 1 messages in flight at once)
    """
    p, rank = call.p, call.rank
    call.copy(block(recv, recvcounts, recvdispls, rank), block(send, sendcounts, senddispls, rank))
    if p == 1:
        return
    dests = [(rank + k) % p for k in range(1, p)]
    sources = [(rank - k) % p for k in range(1, p)]
    yield call.exchange(
        sends=[(d, block(send, sendcounts, senddispls, d)) for d in dests],
        recvs=[(s, block(recv, recvcounts, recvdispls, s)) for s in sources],
    )


@register("alltoall", "pairwise", in_place=False)
@register("alltoallv", "pairwise", in_place=False)
def pairwise(call: Call, send: Any, sendcounts: Sequence[int], senddispls: Sequence[int],
             recv: Any, recvcounts: Sequence[int], recvdispls: Sequence[int]) -> Steps:
    """Pairwise exchange: p − 1 steps, one send and one receive each.

    Steps: copy the own block locally; in step k = 1 … p−1 rank r sends its
    block for r + k and receives the block from r − k (mod p;
    :func:`~mpicomm.coll.schedules.pairwise`), straight from *send* into
    *recv*. Each step has one message in flight each way, so large blocks do
    not flood the network the way the linear algorithm's do.
    Restrictions: none (any p, any counts); not in place (the dispatcher copies).
    Cost: (p−1)α + n(p−1)/p·β
    """
    rank = call.rank
    call.copy(block(recv, recvcounts, recvdispls, rank), block(send, sendcounts, senddispls, rank))
    for to, frm in pairwise_schedule(rank, call.p):
        yield call.sendrecv(to, block(send, sendcounts, senddispls, to),
                            frm, block(recv, recvcounts, recvdispls, frm))


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


@register("alltoall", "bruck", in_place=False)
@register("alltoallv", "bruck", in_place=False)
def bruck(call: Call, send: Any, sendcounts: Sequence[int], senddispls: Sequence[int],
          recv: Any, recvcounts: Sequence[int], recvdispls: Sequence[int]) -> Steps:
    """Bruck et al. (1997): ⌈lg p⌉ rounds, each forwarding about half the blocks 2^k ranks onward.

    Steps: rotate, so that position i holds the block for rank (r + i) mod p.
    In round k rank r sends every block whose position has bit k set to
    r + 2^k, packed into one message, and receives as many from r − 2^k into
    the same positions. A block at position i thus travels i ranks in all -
    to its destination; there, position i holds the block from rank
    (r − i) mod p, and the inverse rotation puts it in place.
    For alltoall the blocks all have one size. For alltoallv the ranks that
    forward a block do not know its size, so each round's data is preceded by
    a header: ``int64`` sizes of the blocks being forwarded, in position
    order. The header of round k + 1 depends only on header k, so it travels
    in the same step as the data of round k (⌈lg p⌉ + 1 steps in all, headers
    and data between a pair of ranks posted in the same order on both sides).
    Headers rather than exchanging the whole p × p count matrix first: about
    p/2 sizes per round instead of p² numbers on every rank, for one extra α.
    A received block goes to *recv* as soon as no later round forwards it
    (no bit above k set), so the buffers of earlier rounds are freed early;
    a block whose size differs from *recvcounts* raises ValueError once the
    exchange is over (the other ranks still need this one's forwarding).
    Restrictions: none (any p, any counts); not in place (the dispatcher copies).
    Cost: ⌈lg p⌉·α + (n/2)·⌈lg p⌉·β  (alltoallv: + α, and (p/2)·8 header bytes per round)
    """
    if call.collective == "alltoall":  # one block size on every rank
        yield from _bruck_uniform(call, send, recv, recvcounts[0])
    else:
        yield from _bruck_sized(call, send, sendcounts, senddispls, recv, recvcounts, recvdispls)


def _bruck_uniform(call: Call, send: Any, recv: Any, count: int) -> Steps:
    """Bruck's alltoall when every block has *count* elements: rotation and rounds on a (p, count) array."""
    p, rank, xp = call.p, call.rank, call.xp
    blocks_in = send[: p * count].reshape(p, count)
    blocks_out = recv[: p * count].reshape(p, count)
    tmp = call.empty(p * count).reshape(p, count)
    call.copy(tmp[: p - rank], blocks_in[rank:])  # position i: the block for rank (r + i) mod p
    call.copy(tmp[p - rank :], blocks_in[:rank])
    for distance in _distances(p):
        with call.on_device():
            index = xp.asarray(np.array(_moving(p, distance), np.intp))
            outgoing = tmp[index]  # a packed copy
        incoming = call.empty(outgoing.size).reshape(outgoing.shape)
        yield call.sendrecv((rank + distance) % p, outgoing, (rank - distance) % p, incoming)
        with call.on_device():
            tmp[index] = incoming
    call.copy(blocks_out[: rank + 1], tmp[rank::-1])  # block from rank s sits at position (r − s) mod p
    call.copy(blocks_out[rank + 1 :], tmp[:rank:-1])


def _bruck_sized(call: Call, send: Any, sendcounts: Sequence[int], senddispls: Sequence[int],
                 recv: Any, recvcounts: Sequence[int], recvdispls: Sequence[int]) -> Steps:
    """Bruck's alltoallv: blocks travel as views, their sizes announced one round ahead in headers."""
    p, rank = call.p, call.rank
    held: list[Any] = [block(send, sendcounts, senddispls, (rank + i) % p) for i in range(p)]  # rotated views
    sizes = [int(b.size) for b in held]  # sizes once the headers so far are applied

    mismatched: list[str] = []  # raised at the end: the other ranks still need this one's forwarding

    def place(i: int) -> None:
        source = (rank - i) % p
        if held[i].size == recvcounts[source]:
            call.copy(block(recv, recvcounts, recvdispls, source), held[i])
        else:
            mismatched.append(f"rank {source} sent {held[i].size} elements, "
                              f"recvcounts[{source}] = {recvcounts[source]}")
        held[i] = None

    def header(positions: list[int]) -> Any:
        out = call.empty(len(positions), dtype=np.int64)
        with call.on_device():
            out[...] = call.xp.asarray(np.array([sizes[i] for i in positions], np.int64))
        return out

    place(0)
    distances = _distances(p)
    if distances:
        first = _moving(p, distances[0])
        announced = call.empty(len(first), dtype=np.int64)
        yield call.sendrecv((rank + 1) % p, header(first), (rank - 1) % p, announced)
    for k, distance in enumerate(distances):
        moving = _moving(p, distance)
        incoming = [int(s) for s in announced.tolist()]
        with call.on_device():
            outgoing = call.xp.concatenate([held[i] for i in moving])
        arriving = call.empty(sum(incoming))
        for i, size in zip(moving, incoming):
            sizes[i] = size
        sends = [((rank + distance) % p, outgoing)]
        recvs = [((rank - distance) % p, arriving)]
        if k + 1 < len(distances):  # next round's header rides along with this round's data
            ahead = distances[k + 1]
            following = _moving(p, ahead)
            announced = call.empty(len(following), dtype=np.int64)
            sends.append(((rank + ahead) % p, header(following)))
            recvs.append(((rank - ahead) % p, announced))
        yield call.exchange(sends=sends, recvs=recvs)
        offset = 0
        for i, size in zip(moving, incoming):
            held[i] = arriving[offset : offset + size]
            offset += size
            if i < 2 * distance:  # no higher bit: it has arrived
                place(i)
    if mismatched:
        raise ValueError(f"{call.label} on rank {rank}: " + "; ".join(mismatched) + " - sendcounts and recvcounts "
                         "must match pairwise")


@register("alltoall", "shm", single_node=True, host_only=True, blocking_only=True, in_place=False)
@register("alltoallv", "shm", single_node=True, host_only=True, blocking_only=True, in_place=False)
def shm(call: Call, send: Any, sendcounts: Sequence[int], senddispls: Sequence[int],
        recv: Any, recvcounts: Sequence[int], recvdispls: Sequence[int]) -> Steps:
    """Shared memory: every rank publishes its blocks, then copies its own block out of every peer's memory.

    Steps: (see :func:`mpicomm.shm.alltoall_steps`) copy the own block locally;
    publish a header in the scratch (each destination's block offset and
    count) and the blocks - a :class:`mpicomm.shm.Pool` send array where it
    is, another packed into scratch in destination order (one copy per run of
    adjacent blocks, the own block left out) - and raise this rank's counter;
    then, from rank r − 1 down, copy the block for r out of each peer's memory
    as soon as that peer's counter is up (no barrier). No barrier at the end:
    the next shared-memory call waits until every rank has read this one's
    blocks (a pool send array waits at the end). alltoallv first agrees on
    the largest scratch any rank needs (+ α). A sender's count that differs
    from *recvcounts* raises ValueError on the receiver once the call is over.
    Restrictions: every rank on one node; host buffers; not in place (the dispatcher copies).
    Cost: α + 2n(p−1)/p·δ  (alltoallv: + α; a pool send array skips the copy in: α + n(p−1)/p·δ)
    """
    from ..shm import alltoall_steps

    yield from alltoall_steps(call, send, sendcounts, senddispls, recv, recvcounts, recvdispls)


# ---------------------------------------------------------------- cost functions (n: the catalogue's size)


@cost("alltoall", "linear", "pairwise")
def _alltoall_linear(m: Machine, n: float, p: int) -> float:
    """(p−1)α + n(p−1)/p·β"""
    return direct_exchange(m, n, p)


@cost("alltoall", "bruck")
def _alltoall_bruck(m: Machine, n: float, p: int) -> float:
    """⌈lg p⌉·α + (n/2)·⌈lg p⌉·β"""
    a, b = m.link(p).alpha, m.link(p).beta
    lg = ceil_lg(p)
    return lg * a + n / 2 * lg * b


@cost("alltoallv", "bruck")
def _alltoallv_bruck(m: Machine, n: float, p: int) -> float:
    """⌈lg p⌉·α + (n/2)·⌈lg p⌉·β, + α and (p/2)·8 header bytes per round"""
    a, b = m.link(p).alpha, m.link(p).beta
    lg = ceil_lg(p)
    return _alltoall_bruck(m, n, p) + a + lg * (p / 2) * 8 * b


@cost("alltoall", "shm")
def _alltoall_shm(m: Machine, n: float, p: int) -> float:
    """α + 2n(p−1)/p·δ: copy in all but the own block, copy the p − 1 others' blocks out (α of the intra-node link)"""
    return m.intra.alpha + 2 * n * (p - 1) / p * m.copy


@cost("alltoallv", "shm")
def _alltoallv_shm(m: Machine, n: float, p: int) -> float:
    """α + 2n(p−1)/p·δ, + α to agree on the scratch size"""
    return _alltoall_shm(m, n, p) + m.intra.alpha
