"""Allgather algorithms: every rank ends with every rank's block, in rank order.

Signature: ``algorithm(s, send, recv, counts, displs)``: *s* is the
:class:`~mpicomm.schedule.Builder` the algorithm describes its rounds to;
rank r's block of ``counts[r]`` elements lands at ``recv[displs[r]:]`` on
every rank. One function serves allgather and allgatherv: the block sizes
come from *counts*, which every rank knows, so uneven blocks, empty blocks
and displacements in any order (with gaps) need no extra messages. In place,
*send* is this rank's own block of *recv* (the same memory: the copy into
place drops out). n = bytes gathered in total (all blocks), p = ranks.

``linear`` and ``ring`` move single blocks, straight to and from their place in
*recv*. ``recursive_doubling`` and ``bruck`` move ranges of consecutive blocks;
they work in a packed buffer (blocks back to back in rank order, resp. in
rotated order) - *recv* itself when *displs* are the packed prefix sums of
*counts*, else scratch space copied out to *displs* at the end.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..model import Machine, ceil_lg, direct_exchange, folded, node_layout, pof2
from ..registry import cheapest, cost, register
from ..schedule import Builder, View
from .gather import block
from .patterns import bruck_allgather, doubling_partners, fold, ring_allgather

__all__ = ["linear", "ring", "recursive_doubling", "bruck", "shm", "hierarchical"]


def _offsets(counts: Sequence[int]) -> list[int]:
    """Packed offsets: ``[0, c0, c0 + c1, …, sum(counts)]`` (p + 1 entries)."""
    out = [0]
    for c in counts:
        out.append(out[-1] + c)
    return out


def _packed_workspace(s: Builder, recv: View, counts: Sequence[int], displs: Sequence[int]) -> tuple[View, list[int]]:
    """The buffer to gather into in rank order, and its block offsets.

    *recv* itself when *displs* are the packed prefix sums of *counts*;
    otherwise scratch space for ``sum(counts)`` elements (see :func:`_unpack`).
    """
    offsets = _offsets(counts)
    if list(displs) == offsets[:-1]:
        return recv.part(0, offsets[-1]), offsets
    return s.empty(offsets[-1]), offsets


def _unpack(s: Builder, work: View, offsets: list[int], recv: View, counts: Sequence[int],
            displs: Sequence[int]) -> None:
    """Copy the packed blocks of *work* to their displacements in *recv* (nothing when *work* is *recv*)."""
    if work.buf == recv.buf:
        return
    for r in range(len(counts)):
        s.copy(block(recv, counts, displs, r), work.part(offsets[r], offsets[r + 1]))


@register("allgather", "linear")
@register("allgatherv", "linear")
def linear(s: Builder, send: View, recv: View, counts: Sequence[int], displs: Sequence[int]) -> None:
    """Linear: every rank sends its block to every other rank, all at once.

    Steps: copy the own block into place; then one round posts p − 1 receives,
    each straight into its sender's block of *recv* (from r − 1, r − 2, …),
    and p − 1 sends of the own block (to r + 1, r + 2, …, so that not every
    rank starts with rank 0).
    Restrictions: none (any p, any counts and displacements; works in place).
    """
    p, rank = s.p, s.rank
    s.copy(block(recv, counts, displs, rank), send)
    if p == 1:
        return
    sources = [(rank - k) % p for k in range(1, p)]
    s.exchange(
        sends=[((rank + k) % p, send) for k in range(1, p)],
        recvs=[(r, block(recv, counts, displs, r)) for r in sources],
    )


@register("allgather", "ring")
@register("allgatherv", "ring")
def ring(s: Builder, send: View, recv: View, counts: Sequence[int], displs: Sequence[int]) -> None:
    """Ring: p − 1 steps, each forwarding to the right the block received from the left.

    Steps: copy the own block into place; in step k = 0 … p−2 rank r sends
    block (r − k) mod p to r + 1 and receives block (r − k − 1) mod p from
    r − 1 (:func:`~mpicomm.coll.patterns.ring_allgather`), each straight
    from and into its place in *recv*.
    Restrictions: none (any p, any counts and displacements; works in place).
    """
    p, rank = s.p, s.rank
    s.copy(block(recv, counts, displs, rank), send)
    right, left = (rank + 1) % p, (rank - 1) % p
    for send_block, recv_block in ring_allgather(rank, p):
        s.sendrecv(right, block(recv, counts, displs, send_block), left, block(recv, counts, displs, recv_block))


@register("allgather", "recursive_doubling")
@register("allgatherv", "recursive_doubling")
def recursive_doubling(s: Builder, send: View, recv: View, counts: Sequence[int], displs: Sequence[int]) -> None:
    """Recursive doubling: lg p rounds, each swapping all blocks gathered so far with the rank 2^k away.

    Steps: gather in rank order into a packed buffer (*recv* itself when
    *displs* are packed). Fold a non-power-of-two p onto the largest power of
    two p' (:func:`~mpicomm.coll.patterns.fold`): each even rank below
    2·(p − p') sends its block to the odd rank above, which then stands for
    both. In round k each remaining rank holds the blocks of 2^k consecutive
    newranks - one contiguous range of the packed buffer, since newrank order
    is rank order - and swaps that range with the partner whose newrank
    differs in bit k. Finally each odd folded rank sends the whole buffer to
    its even partner, and blocks are copied out to *displs* if they are not
    packed.
    Restrictions: none (any p, any counts and displacements; works in place).
    """
    p, rank = s.p, s.rank
    work, offsets = _packed_workspace(s, recv, counts, displs)
    total = offsets[-1]

    def ranks(first: int, last: int) -> View:
        """The packed blocks of ranks first … last − 1."""
        return work.part(offsets[first], offsets[last])

    s.copy(ranks(rank, rank + 1), send)
    f = fold(rank, p)
    if f.newrank is None:  # folded away: hand the block up, wait for everything
        assert f.partner is not None  # a folded-away rank always has its proxy
        s.send(f.partner, ranks(rank, rank + 1))
        s.recv(f.partner, work.part(0, total))
    else:

        def lowest(newrank: int) -> int:
            """The lowest real rank whose block newrank holds (folded pairs hold two)."""
            return 2 * newrank if newrank < f.rem else newrank + f.rem

        if f.partner is not None:  # the even rank below folded onto this one
            s.recv(f.partner, ranks(f.partner, f.partner + 1))
        for mask, partner in doubling_partners(f.newrank, f.pof2, f.rem):
            mine = f.newrank & ~(mask - 1)  # newranks mine … mine + mask − 1 gathered so far
            theirs = mine ^ mask
            s.sendrecv(partner, ranks(lowest(mine), lowest(mine + mask)),
                       partner, ranks(lowest(theirs), lowest(theirs + mask)))
        if f.partner is not None:
            s.send(f.partner, work.part(0, total))
    _unpack(s, work, offsets, recv, counts, displs)


@register("allgather", "bruck")
@register("allgatherv", "bruck")
def bruck(s: Builder, send: View, recv: View, counts: Sequence[int], displs: Sequence[int]) -> None:
    """Bruck et al. (1997): ⌈lg p⌉ rounds on a buffer rotated so that this rank's block comes first.

    Steps: a scratch buffer holds blocks r, r + 1, …, r − 1 (mod p) packed in
    that order, the own block copied in first. In round k rank r sends its
    first min(2^k, p − 2^k) blocks to r − 2^k and appends as many received
    from r + 2^k (:func:`~mpicomm.coll.patterns.bruck_allgather`): the
    sender's first blocks are blocks r + 2^k, … - exactly the next ones in
    this rank's order, and every rank knows their sizes from *counts*. After
    the last round all p blocks are there; undo the rotation into *recv* at
    *displs* (two copies when *displs* are packed, else one per block).
    Restrictions: none (any p, any counts and displacements; works in place).
    """
    p, rank = s.p, s.rank
    order = [(rank + i) % p for i in range(p)]
    offsets = _offsets([counts[r] for r in order])  # rotated: position i holds rank (r + i) mod p
    total = offsets[-1]
    tmp = s.empty(total)
    s.copy(tmp.part(0, offsets[1]), send)
    for to, frm, blocks in bruck_allgather(rank, p):
        distance = (rank - to) % p
        s.sendrecv(to, tmp.part(0, offsets[blocks]), frm, tmp.part(offsets[distance], offsets[distance + blocks]))
    packed = _offsets(counts)
    if list(displs) == packed[:-1]:  # rotate back with two copies
        tail = total - packed[rank]  # ranks r … p − 1 come first in tmp
        s.copy(recv.part(packed[rank], total), tmp.part(0, tail))
        s.copy(recv.part(0, packed[rank]), tmp.part(tail))
    else:
        for i, r in enumerate(order):
            s.copy(block(recv, counts, displs, r), tmp.part(offsets[i], offsets[i + 1]))


@register("allgather", "shm", single_node=True, host_only=True)
@register("allgatherv", "shm", single_node=True, host_only=True)
def shm(s: Builder, send: View, recv: View, counts: Sequence[int], displs: Sequence[int]) -> None:
    """Shared memory: every rank publishes its block, then copies every block straight from the peers' memory.

    Steps: (see :func:`mpicomm.coll.node_memory.allgather`) publish the block
    (a :class:`mpicomm.shm.Pool` array where it is, another copied once into
    scratch) and raise this rank's counter; copy the own block into place, then
    each peer's block (from rank r − 1 down, so the ranks do not all read one
    peer at once) as soon as that peer's counter is up - no barrier. No barrier
    at the end either: the next shared-memory call waits until every rank has
    read this one's blocks (a pool block waits at the end).
    Restrictions: every rank on one node; host buffers.
    """
    from .node_memory import allgather as shm_allgather

    shm_allgather(s, send, recv, counts, displs)


@register("allgather", "hierarchical", composite=True)
@register("allgatherv", "hierarchical", composite=True)
def hierarchical(s: Builder, send: View, recv: View, counts: Sequence[int], displs: Sequence[int]) -> None:
    """Hierarchical: gather on each node, allgather the nodes' blocks among the leaders, broadcast on each node.

    Steps: (1) gatherv of the node's blocks to its leader, packed node after
    node in local-rank order; (2) allgatherv of the node packs among the
    leaders; (3) broadcast of everything over each node; (4) every rank moves
    the blocks from node order to their places in *recv*. Each level is a
    nested call, so each runs the algorithm chosen for it.
    Restrictions: none.
    """
    from .hierarchy import levels

    lv = levels(s)
    members: list[list[int]] = [[] for _ in range(lv.nodes)]  # each node's ranks in local-rank order
    for r in sorted(range(s.p), key=lambda r: (lv.node_of[r], lv.local_of[r])):
        members[lv.node_of[r]].append(r)
    order = [r for node in members for r in node]  # ranks in node-major order
    where = _offsets([counts[r] for r in order])
    start = {r: where[i] for i, r in enumerate(order)}
    node_index = lv.node_of[s.rank]
    mine = members[node_index]
    node_counts = [sum(counts[r] for r in node) for node in members]
    node_starts = [start[node[0]] if node else 0 for node in members]
    packed = s.empty(where[-1])
    base = node_starts[node_index]
    local_counts = [counts[r] for r in mine]
    local_displs = [start[r] - base for r in mine]
    node_pack = packed.part(base, base + node_counts[node_index])
    s.nested(lv.node, "gatherv", send=send, recv=node_pack if lv.leader else None, root=0,
             recvcounts=local_counts if lv.leader else None, recvdispls=local_displs if lv.leader else None)
    if lv.leader:
        s.nested(lv.leaders, "allgatherv", send=node_pack, recv=packed, recvcounts=node_counts,
                 recvdispls=node_starts)
    s.nested(lv.node, "bcast", recv=packed, root=0, count=packed.size)
    for r in range(s.p):
        s.copy(block(recv, counts, displs, r), packed.part(start[r], start[r] + counts[r]))


# ---------------------------------------------------------------- cost functions (n: the catalogue's size)


@cost("allgather", "linear", "ring")
def _allgather_linear(m: Machine, n: float, p: int) -> float:
    """(p−1)α + n(p−1)/p·β  (linear: all p − 1 messages in flight at once; ring: p − 1 steps of one message)"""
    return direct_exchange(m, n, p)


@cost("allgather", "recursive_doubling")
def _allgather_recursive_doubling(m: Machine, n: float, p: int) -> float:
    """lg p'·α + n(p'−1)/p'·β; p ≠ p': + 2α + n·β for the fold"""
    a, b = m.link(p).alpha, m.link(p).beta
    q = pof2(p)
    t = math.log2(q) * a + n * (q - 1) / q * b
    if folded(p):
        t += 2 * a + n * b
    return t


@cost("allgather", "bruck")
def _allgather_bruck(m: Machine, n: float, p: int) -> float:
    """⌈lg p⌉·α + n(p−1)/p·β + 2n·δ  (two local copies of n: the rotation in and out)"""
    a, b = m.link(p).alpha, m.link(p).beta
    return ceil_lg(p) * a + n * (p - 1) / p * b + 2 * n * m.copy


@cost("allgather", "shm")
def _allgather_shm(m: Machine, n: float, p: int) -> float:
    """α + n(p+1)/p·δ  (a pool block skips its copy in; α of the intra-node link)"""
    return m.intra.alpha + n * (p + 1) / p * m.copy


@cost("allgather", "hierarchical")
def _allgather_hierarchical(m: Machine, n: float, p: int) -> float:
    """T(gather, n/p, ppn, intra) + T(allgatherv, n, nodes, inter) + T(bcast, n, ppn, intra) + n·δ"""
    ppn, nodes = node_layout(m, p)
    return (cheapest(m, "gather", n / p, ppn, m.intra, False) + cheapest(m, "allgatherv", n, nodes, m.inter, True)
            + cheapest(m, "bcast", n, ppn, m.intra, False) + n * m.copy)
