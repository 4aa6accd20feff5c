"""Broadcast algorithms: every rank ends with the root's vector.

Signature: ``algorithm(s, buf)``: *s* is the :class:`~mpicomm.schedule.Builder`
the algorithm describes its rounds to; *buf* is a view of the root's input
and every other rank's output. n = bytes of the vector, p = ranks. Every
algorithm works on relative ranks ``s.vrank = (rank − root) mod p``, so any
root looks like rank 0.
"""

from __future__ import annotations

from ..model import Machine, ceil_lg, node_layout, segments
from ..registry import cheapest, cost, register
from ..schedule import Builder, View
from .patterns import binomial as binomial_tree
from .patterns import block_partition, ring_allgather

__all__ = ["SEGMENT_BYTES", "linear", "binomial", "scatter_allgather", "pipeline", "shm", "hierarchical"]

#: Segment size of the pipelined chain: small enough that the chain fills in a few
#: segments, large enough that α stays small next to the segment's n/S·β.
SEGMENT_BYTES = 128 * 1024


@register("bcast", "linear")
def linear(s: Builder, buf: View) -> None:
    """Linear: the root sends the whole vector to every other rank.

    Steps: the root posts p − 1 sends of *buf* at once; every other rank
    receives it straight into *buf*.
    Restrictions: none (any p, any count).
    """
    if s.rank == s.root:
        if s.p > 1:
            s.exchange(sends=[(s.real_rank(v), buf) for v in range(1, s.p)])
    else:
        s.recv(s.root, buf)


@register("bcast", "binomial")
def binomial(s: Builder, buf: View) -> None:
    """Binomial tree (MPICH's): receive from the parent, then send to each child.

    Steps: relative rank v receives *buf* from its parent (v with its lowest
    set bit cleared), then sends it to its children v + 2^k for every 2^k
    below its lowest set bit, the largest subtree first
    (:func:`~mpicomm.coll.patterns.binomial`). After round k the 2^k lowest
    relative ranks hold the vector.
    Restrictions: none (any p, any count).
    """
    node = binomial_tree(s.vrank, s.p)
    if node.parent is not None:
        s.recv(s.real_rank(node.parent), buf)
    if node.children:
        s.exchange(sends=[(s.real_rank(child), buf) for child, _ in node.children])


@register("bcast", "scatter_allgather")
def scatter_allgather(s: Builder, buf: View) -> None:
    """Van de Geijn: binomial scatter of p blocks, then a ring allgather of the blocks.

    Steps: cut *buf* into p blocks (:func:`~mpicomm.coll.patterns.block_partition`,
    block v for relative rank v; with count < p some are empty). Scatter down
    the binomial tree: relative rank v receives blocks v … v + subtree − 1
    (contiguous in *buf*) from its parent and passes each child c the blocks
    of c's subtree. Then p − 1 ring steps over relative ranks: in step k rank v
    sends block (v − k) mod p to v + 1 and receives block (v − k − 1) mod p
    from v − 1 (:func:`~mpicomm.coll.patterns.ring_allgather`).
    Restrictions: none (any p, any count; empty blocks travel as empty messages).
    """
    p, vrank = s.p, s.vrank
    counts, displs = block_partition(buf.size, p)

    def blocks(first: int, number: int) -> View:  # blocks first … first + number − 1, contiguous
        start = displs[first]
        return buf.part(start, start + sum(counts[first : first + number]))

    node = binomial_tree(vrank, p)
    if node.parent is not None:
        s.recv(s.real_rank(node.parent), blocks(vrank, node.subtree))
    if node.children:
        s.exchange(sends=[(s.real_rank(child), blocks(child, size)) for child, size in node.children])
    right, left = s.real_rank(vrank + 1), s.real_rank(vrank - 1)
    for send_block, recv_block in ring_allgather(vrank, p):
        s.sendrecv(right, blocks(send_block, 1), left, blocks(recv_block, 1))


@register("bcast", "pipeline")
def pipeline(s: Builder, buf: View) -> None:
    """Pipelined chain: relative ranks 0 → 1 → … → p−1 pass the vector on in segments.

    Steps: *buf* is cut into S segments of :data:`SEGMENT_BYTES`. In step k the
    root sends segment k to relative rank 1; every other rank receives
    segment k from its predecessor while forwarding segment k − 1 to its
    successor (both in one round, the receive posted first), so all links of
    the chain carry a segment at once once the pipeline has filled.
    Restrictions: none (any p, any count; count 0 sends nothing).
    """
    p, vrank = s.p, s.vrank
    seg = max(1, SEGMENT_BYTES // s.dtype.itemsize)
    nseg = -(-buf.size // seg)
    prev = s.real_rank(vrank - 1) if vrank > 0 else None
    nxt = s.real_rank(vrank + 1) if vrank < p - 1 else None
    lag = 0 if prev is None else 1  # the root forwards segment k in step k, the others one step later
    for k in range(nseg + lag):
        recvs = [(prev, buf.part(k * seg, (k + 1) * seg))] if prev is not None and k < nseg else []
        j = k - lag
        sends = [(nxt, buf.part(j * seg, (j + 1) * seg))] if nxt is not None and 0 <= j < nseg else []
        if recvs or sends:
            s.exchange(sends=sends, recvs=recvs)


@register("bcast", "shm", single_node=True, host_only=True)
def shm(s: Builder, buf: View) -> None:
    """Shared memory: the root publishes its vector chunk by chunk, every other rank copies each chunk from there.

    Steps: (see :func:`mpicomm.coll.node_memory.bcast`) the root publishes
    where its buffer lives (a :class:`mpicomm.shm.Pool` array where it is) and
    copies a plain one into its scratch in chunks of about
    :data:`mpicomm.coll.node_memory.CHUNK_BYTES`, raising its counter after
    each; every other rank waits for that counter (the root's only: no barrier)
    and copies each chunk as soon as it is there, while the root copies the
    next. No barrier at the end either: the root's next shared-memory call
    waits until every rank has read this one (a pool buffer at the root waits
    at the end).
    Restrictions: every rank on one node; host buffers.
    """
    from .node_memory import bcast as shm_bcast

    shm_bcast(s, buf)


@register("bcast", "hierarchical", composite=True)
def hierarchical(s: Builder, buf: View) -> None:
    """Hierarchical: broadcast on the root's node, among the node leaders, then on every other node.

    Steps: (1) when the root is not its node's leader, broadcast over the
    root's node (its leader now has the vector); (2) broadcast among the
    leaders from the root's node; (3) broadcast over every node that has not
    got it yet. Each step is a nested call, so each level runs the algorithm
    chosen for it (shared memory on a node, any message-passing algorithm
    between nodes).
    Restrictions: none.
    """
    from .hierarchy import levels

    lv = levels(s)
    root_node, root_local = lv.node_of[s.root], lv.local_of[s.root]
    mine = lv.node_of[s.rank]
    count = buf.size
    if root_local != 0 and mine == root_node:
        s.nested(lv.node, "bcast", recv=buf, root=root_local, count=count)
    if lv.leaders is not None:
        s.nested(lv.leaders, "bcast", recv=buf, root=root_node, count=count)
    if mine != root_node or root_local == 0:
        s.nested(lv.node, "bcast", recv=buf, root=0, count=count)


# ---------------------------------------------------------------- cost functions (n: the catalogue's size)


@cost("bcast", "linear")
def _bcast_linear(m: Machine, n: float, p: int) -> float:
    """(p−1)α + (p−1)n·β  (at the root; the others wait α + nβ)"""
    a, b = m.link(p).alpha, m.link(p).beta
    return (p - 1) * a + (p - 1) * n * b


@cost("bcast", "binomial")
def _bcast_binomial(m: Machine, n: float, p: int) -> float:
    """lg p·α + n·lg p·β"""
    a, b = m.link(p).alpha, m.link(p).beta
    return ceil_lg(p) * (a + n * b)


@cost("bcast", "scatter_allgather")
def _bcast_scatter_allgather(m: Machine, n: float, p: int) -> float:
    """(lg p + p − 1)α + 2n(p−1)/p·β"""
    a, b = m.link(p).alpha, m.link(p).beta
    return (ceil_lg(p) + p - 1) * a + 2 * n * (p - 1) / p * b


@cost("bcast", "pipeline")
def _bcast_pipeline(m: Machine, n: float, p: int) -> float:
    """(p − 2 + S)·(α + n/S·β)  (S = ⌈n / SEGMENT_BYTES⌉ segments)"""

    a, b = m.link(p).alpha, m.link(p).beta
    s = segments(n, SEGMENT_BYTES)
    return (p - 2 + s) * (a + n / s * b)


@cost("bcast", "shm")
def _bcast_shm(m: Machine, n: float, p: int) -> float:
    """α + n·δ + c·δ  (c = min(n, CHUNK_BYTES): the copy out trails the copy in by one chunk; a pool buffer at the
    root: α + n·δ; α of the intra-node link)"""
    from .node_memory import CHUNK_BYTES

    return m.intra.alpha + (n + min(n, CHUNK_BYTES)) * m.copy


@cost("bcast", "hierarchical")
def _bcast_hierarchical(m: Machine, n: float, p: int) -> float:
    """2·T(bcast, n, ppn, intra) + T(bcast, n, nodes, inter)"""
    ppn, nodes = node_layout(m, p)
    return 2 * cheapest(m, "bcast", n, ppn, m.intra, False) + cheapest(m, "bcast", n, nodes, m.inter, True)
