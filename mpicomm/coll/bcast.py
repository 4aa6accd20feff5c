"""Broadcast algorithms: every rank ends with the root's vector.

Signature: ``algorithm(call, buf)``; *buf* is the root's input and every
other rank's output. n = bytes of the vector, p = ranks. Every algorithm
works on relative ranks ``vrank = (rank − root) mod p``, so any root looks
like rank 0.
"""

from __future__ import annotations

from typing import Any

from ..registry import register
from ..requests import Steps
from .call import Call
from .schedules import binomial as binomial_tree
from .schedules import block_partition, ring_allgather

__all__ = ["SEGMENT_BYTES", "linear", "binomial", "scatter_allgather", "pipeline"]

#: Segment size of the pipelined chain: small enough that the chain fills in a few
#: segments, large enough that α stays small next to the segment's n/S·β.
SEGMENT_BYTES = 128 * 1024




@register("bcast", "linear")
def linear(call: Call, buf: Any) -> Steps:
    """Linear: the root sends the whole vector to every other rank.

    Steps: the root posts p − 1 sends of *buf* at once; every other rank
    receives it straight into *buf*.
    Restrictions: none (any p, any count).
    Cost: (p−1)α + (p−1)n·β  (at the root; the others wait α + nβ)
    """
    if call.rank == call.root:
        if call.p > 1:
            yield call.exchange(sends=[(call.real_rank(v), buf) for v in range(1, call.p)])
    else:
        yield call.recv(call.root, buf)


@register("bcast", "binomial")
def binomial(call: Call, buf: Any) -> Steps:
    """Binomial tree (MPICH's): receive from the parent, then send to each child.

    Steps: relative rank v receives *buf* from its parent (v with its lowest
    set bit cleared), then sends it to its children v + 2^k for every 2^k
    below its lowest set bit, the largest subtree first
    (:func:`~mpicomm.coll.schedules.binomial`). After round k the 2^k lowest
    relative ranks hold the vector.
    Restrictions: none (any p, any count).
    Cost: lg p·α + n·lg p·β
    """
    node = binomial_tree((call.rank - call.root) % call.p, call.p)
    if node.parent is not None:
        yield call.recv(call.real_rank(node.parent), buf)
    if node.children:
        yield call.exchange(sends=[(call.real_rank(child), buf) for child, _ in node.children])


@register("bcast", "scatter_allgather")
def scatter_allgather(call: Call, buf: Any) -> Steps:
    """Van de Geijn: binomial scatter of p blocks, then a ring allgather of the blocks.

    Steps: cut *buf* into p blocks (:func:`~mpicomm.coll.schedules.block_partition`,
    block v for relative rank v; with count < p some are empty). Scatter down
    the binomial tree: relative rank v receives blocks v … v + subtree − 1
    (contiguous in *buf*) from its parent and passes each child c the blocks
    of c's subtree. Then p − 1 ring steps over relative ranks: in step k rank v
    sends block (v − k) mod p to v + 1 and receives block (v − k − 1) mod p
    from v − 1 (:func:`~mpicomm.coll.schedules.ring_allgather`).
    Restrictions: none (any p, any count; empty blocks travel as empty messages).
    Cost: (lg p + p − 1)α + 2n(p−1)/p·β
    """
    p = call.p
    vrank = (call.rank - call.root) % p
    counts, displs = block_partition(buf.size, p)

    def blocks(first: int, number: int) -> Any:  # blocks first … first + number − 1, contiguous
        start = displs[first]
        return buf[start : start + sum(counts[first : first + number])]

    node = binomial_tree(vrank, p)
    if node.parent is not None:
        yield call.recv(call.real_rank(node.parent), blocks(vrank, node.subtree))
    if node.children:
        yield call.exchange(sends=[(call.real_rank(child), blocks(child, size)) for child, size in node.children])
    right, left = call.real_rank(vrank + 1), call.real_rank(vrank - 1)
    for send_block, recv_block in ring_allgather(vrank, p):
        yield call.sendrecv(right, blocks(send_block, 1), left, blocks(recv_block, 1))


@register("bcast", "pipeline")
def pipeline(call: Call, buf: Any) -> Steps:
    """Pipelined chain: relative ranks 0 → 1 → … → p−1 pass the vector on in segments.

    Steps: *buf* is cut into S segments of :data:`SEGMENT_BYTES`. In step k the
    root sends segment k to relative rank 1; every other rank receives
    segment k from its predecessor while forwarding segment k − 1 to its
    successor (the receive is posted first), so all links of the chain carry
    a segment at once once the pipeline has filled.
    Restrictions: none (any p, any count; count 0 sends nothing).
    Cost: (p − 2 + S)·(α + n/S·β)  (S = ⌈n / SEGMENT_BYTES⌉ segments)
    """
    p = call.p
    vrank = (call.rank - call.root) % p
    seg = max(1, SEGMENT_BYTES // buf.itemsize)
    nseg = -(-buf.size // seg)
    prev = call.real_rank(vrank - 1) if vrank > 0 else None
    nxt = call.real_rank(vrank + 1) if vrank < p - 1 else None
    lag = 0 if prev is None else 1  # the root forwards segment k in step k, the others one step later
    for k in range(nseg + lag):
        recvs = [(prev, buf[k * seg : (k + 1) * seg])] if prev is not None and k < nseg else []
        s = k - lag
        sends = [(nxt, buf[s * seg : (s + 1) * seg])] if nxt is not None and 0 <= s < nseg else []
        if recvs or sends:
            yield call.exchange(sends=sends, recvs=recvs)
