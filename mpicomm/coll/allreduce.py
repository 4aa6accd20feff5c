"""Allreduce algorithms: every rank ends with the elementwise reduction of all ranks' vectors.

Signature: ``algorithm(s, send, recv)``: *s* is the :class:`~mpicomm.schedule.Builder`
the algorithm describes its rounds to; *send* and *recv* are views of the
input and output (*send* may be *recv*: in place). n = bytes of the vector,
p = ranks.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import NamedTuple

from ..model import Machine, ceil_lg, folded, halving_doubling, node_layout, pof2, segments
from ..registry import cheapest, cost, register
from ..schedule import Builder, View
from .patterns import binomial, block_partition, doubling_partners, fold, ring_allgather, ring_reduce_scatter, unfold

__all__ = ["SEGMENT_BYTES", "naive", "tree", "recursive_doubling", "ring", "rabenseifner", "shm", "hierarchical"]

#: Largest message of the segmented ring: each block travels in pieces of at most this many bytes,
#: so the reduction of one piece overlaps the transfer of the next (and scratch space stays small).
SEGMENT_BYTES = 1 << 20


def _folded_away(s: Builder, partner: int, recv: View) -> None:
    """A rank the fold removes: its vector goes to *partner*, the result comes back from it."""
    s.send(partner, recv)
    s.recv(partner, recv)


@register("allreduce", "recursive_doubling", butterfly=True)
def recursive_doubling(s: Builder, send: View, recv: View) -> None:
    """Recursive doubling: lg p rounds of whole-vector exchange with the rank 2^k away.

    Steps: fold a non-power-of-two p onto the largest power of two p' (each
    even rank below 2·(p − p') sends its vector to the odd rank above, which
    combines x_{r−1} ⊕ x_r); in round k each remaining rank swaps its partial
    result with the rank whose newrank differs in bit k and combines, lower
    ranks' data on the left; finally odd folded ranks send the result back.
    Its rounds are the agreement's butterfly, so on small vectors the ranks'
    digests travel in the same messages (no extra message for validation).
    Restrictions: none - operands are combined in rank order, so
    non-commutative ops are fine; works in place.
    """
    f = fold(s.rank, s.p)
    if f.newrank is None:  # folded away: hand the vector up, wait for the result
        assert f.partner is not None  # a folded-away rank always has its proxy
        s.send(f.partner, send)
        s.recv(f.partner, recv)
        return
    tmp = s.empty(recv.size)
    partial = send  # the running result: the input itself until the first combine (no copy)
    if f.partner is not None:  # the even rank below folded onto this one: x_{r-1} ⊕ x_r
        s.recv(f.partner, tmp)
        s.combine(tmp, send, recv)
        partial = recv
    for _, partner in doubling_partners(f.newrank, f.pof2, f.rem):
        s.sendrecv(partner, partial, partner, tmp)
        if partner < s.rank:
            s.combine(tmp, partial, recv)
        else:
            s.combine(partial, tmp, recv)
        partial = recv
    if partial is send:  # one rank
        s.copy(recv, send)
    if f.partner is not None:
        s.send(f.partner, recv)


@register("allreduce", "naive")
def naive(s: Builder, send: View, recv: View) -> None:
    """Naive: every rank sends its vector to rank 0, which reduces them in rank order and sends the result back.

    Steps: rank 0 receives x_1 … x_{p−1} one after another into two
    alternating buffers (the receive of x_{s+1} is in flight while x_s is
    combined) and forms ((x_0 ⊕ x_1) ⊕ x_2) ⊕ …; then it sends the result to
    every other rank.
    Restrictions: none - operands are combined in rank order, so
    non-commutative ops are fine; works in place.
    """
    p = s.p
    if s.rank != 0:
        s.send(0, send)
        s.recv(0, recv)
        return
    s.copy(recv, send)
    if p == 1:
        return
    buffers = (s.empty(recv.size), s.empty(recv.size)) if p > 2 else (s.empty(recv.size),)
    for source in range(1, p):
        incoming = buffers[(source - 1) % len(buffers)]
        s.recv(source, incoming)
        s.combine(recv, incoming, recv)
    s.exchange(sends=[(dest, recv) for dest in range(1, p)])


def _binomial_reduce(s: Builder, recv: View) -> None:
    """Reduce every rank's *recv* into rank 0's along the binomial tree, in rank order (the rest is scratch)."""
    node = binomial(s.rank, s.p)
    children = [child for child, _ in reversed(node.children)]  # nearest first: x_r ⊕ [r+1] ⊕ [r+2, r+3] ⊕ …
    if children:
        buffers = [s.empty(recv.size) for _ in range(min(2, len(children)))]
        for i, child in enumerate(children):
            incoming = buffers[i % len(buffers)]
            s.recv(child, incoming)
            s.combine(recv, incoming, recv)  # the child's subtree holds higher ranks
    if node.parent is not None:
        s.send(node.parent, recv)


def _binomial_bcast(s: Builder, buf: View) -> None:
    """Broadcast rank 0's *buf* along the binomial tree (largest subtree first)."""
    node = binomial(s.rank, s.p)
    if node.parent is not None:
        s.recv(node.parent, buf)
    if node.children:
        s.exchange(sends=[(child, buf) for child, _ in node.children])


@register("allreduce", "tree")
def tree(s: Builder, send: View, recv: View) -> None:
    """Tree: binomial reduce to rank 0 in rank order, then binomial broadcast of the result.

    Steps: each rank r combines x_r with the partial results of its binomial
    children r + 1, r + 2, r + 4 … (nearest first, so a child's subtree - the
    higher ranks - is always on the right: the partial covers ranks r … r +
    subtree − 1 in order) and sends it to its parent r − lowbit(r); rank 0
    then holds x_0 ⊕ … ⊕ x_{p−1} and broadcasts it down the same tree,
    largest subtree first. The next child's receive is in flight while the
    previous child's partial is combined.
    Restrictions: none - operands are combined in rank order, so
    non-commutative ops are fine; works in place.
    """
    s.copy(recv, send)
    _binomial_reduce(s, recv)
    _binomial_bcast(s, recv)


class _Piece(NamedTuple):
    """One message of the segmented ring: a segment to send right and one to receive from the left.

    ``send``/``recv``: element ranges of the result vector (None: nothing that
    way this time); ``combine``: the received segment goes through scratch
    space and is reduced into ``recv`` (reduce-scatter) rather than received in
    place (allgather).
    """

    send: tuple[int, int] | None
    recv: tuple[int, int] | None
    combine: bool


def _segments(start: int, count: int, size: int) -> list[tuple[int, int]]:
    """A block ``start … start + count`` cut into ranges of at most *size* elements (none if empty)."""
    return [(at, min(at + size, start + count)) for at in range(start, start + count, size)]


def _ring_pieces(rank: int, p: int, count: int, segment: int) -> Iterator[_Piece]:
    """Every message of a segmented ring allreduce, in order: reduce-scatter steps, then allgather steps."""
    counts, displs = block_partition(count, p)
    for schedule, combine in ((ring_reduce_scatter, True), (ring_allgather, False)):
        for send_block, recv_block in schedule(rank, p):
            sends = _segments(displs[send_block], counts[send_block], segment)
            recvs = _segments(displs[recv_block], counts[recv_block], segment)
            for j in range(max(len(sends), len(recvs))):
                yield _Piece(sends[j] if j < len(sends) else None, recvs[j] if j < len(recvs) else None, combine)


@register("allreduce", "ring", commutative_only=True)
def ring(s: Builder, send: View, recv: View) -> None:
    """Segmented ring: a ring reduce-scatter of p blocks, then a ring allgather of the reduced blocks.

    Steps: split the vector into p blocks (:func:`~.patterns.block_partition`;
    count < p leaves some empty). Reduce-scatter: in step k rank r sends block
    (r − k − 1) mod p to rank r + 1 and reduces block (r − k − 2) mod p from
    rank r − 1 into its own (:func:`~.patterns.ring_reduce_scatter`); after
    p − 1 steps it holds block r fully reduced. Allgather: p − 1
    more steps forward the reduced blocks around the ring
    (:func:`~.patterns.ring_allgather`). Every block travels in segments of
    at most :data:`SEGMENT_BYTES` through two alternating buffers, so the next
    segment is in flight while the current one is reduced, also across steps.
    Restrictions: commutative ops only (the ring combines in ring order);
    any p and count (count < p too); works in place.
    """
    s.copy(recv, send)
    p, rank = s.p, s.rank
    if p == 1 or recv.size == 0:
        return
    segment = max(1, SEGMENT_BYTES // s.dtype.itemsize)
    pieces = list(_ring_pieces(rank, p, recv.size, segment))
    if not pieces:
        return
    width = min(segment, -(-recv.size // p))
    buffers = (s.empty(width), s.empty(width))
    right, left = (rank + 1) % p, (rank - 1) % p
    for i, piece in enumerate(pieces):
        sends = [(right, recv.part(piece.send[0], piece.send[1]))] if piece.send else []
        recvs = []
        if piece.recv:
            a, b = piece.recv
            recvs = [(left, buffers[i % 2].part(0, b - a) if piece.combine else recv.part(a, b))]
        s.exchange(sends, recvs)
        if piece.combine and piece.recv is not None:
            a, b = piece.recv
            s.combine(buffers[i % 2].part(0, b - a), recv.part(a, b), recv.part(a, b))


@register("allreduce", "rabenseifner", commutative_only=True)
def rabenseifner(s: Builder, send: View, recv: View) -> None:
    """Rabenseifner: reduce-scatter by recursive halving, then allgather by recursive doubling.

    Steps: fold a non-power-of-two p onto the largest power of two p' (each
    even rank below 2·(p − p') sends its vector to the odd rank above, which
    combines them, and waits for the result). Split the vector into p' blocks
    (:func:`~.patterns.block_partition`). Reduce-scatter: in the round at
    distance 2^k (k = lg p' − 1 … 0) each newrank keeps the half of its range
    of blocks on its side of bit k, sends the other half to newrank ⊕ 2^k and
    combines the half it receives; newrank i ends with block i reduced.
    Allgather: the same rounds in reverse (k = 0 … lg p' − 1) swap the ranges
    whole, doubling them, so every newrank ends with the whole result; the
    odd folded ranks send it to the even rank below.
    Restrictions: commutative ops only (partners are combined out of rank
    order); any p and count (count < p' leaves some blocks empty); works in place.
    """
    s.copy(recv, send)
    f = fold(s.rank, s.p)
    if f.newrank is None:  # folded away: hand the vector up, wait for the result
        assert f.partner is not None  # a folded-away rank always has its proxy
        _folded_away(s, f.partner, recv)
        return
    tmp = None
    if f.partner is not None:  # the even rank below folded onto this one: x_{r-1} ⊕ x_r
        tmp = s.empty(recv.size)
        s.recv(f.partner, tmp)
        s.combine(tmp, recv, recv)
    _, displs = block_partition(recv.size, f.pof2)
    at = displs + [recv.size]  # block i: elements at[i] … at[i + 1]
    lo, hi = 0, f.pof2  # the blocks this rank is responsible for
    rounds = []  # (lo, hi, partner) of each halving round, for the allgather to retrace
    mask = f.pof2 >> 1
    while mask > 0:
        partner = unfold(f.newrank ^ mask, f.rem)
        rounds.append((lo, hi, partner))
        if f.newrank & mask:
            give, lo = (lo, lo + mask), lo + mask
        else:
            give, hi = (lo + mask, hi), lo + mask
        if tmp is None:  # the first round receives the most: later ranges lie inside this one
            tmp = s.empty(at[hi] - at[lo])
        incoming = tmp.part(0, at[hi] - at[lo])
        s.sendrecv(partner, recv.part(at[give[0]], at[give[1]]), partner, incoming)
        if partner < s.rank:
            s.combine(incoming, recv.part(at[lo], at[hi]), recv.part(at[lo], at[hi]))
        else:
            s.combine(recv.part(at[lo], at[hi]), incoming, recv.part(at[lo], at[hi]))
        mask >>= 1
    for outer_lo, outer_hi, partner in reversed(rounds):  # allgather: swap ranges, doubling them
        other = (outer_lo, lo) if lo > outer_lo else (hi, outer_hi)
        s.sendrecv(partner, recv.part(at[lo], at[hi]), partner, recv.part(at[other[0]], at[other[1]]))
        lo, hi = outer_lo, outer_hi
    if f.partner is not None:
        s.send(f.partner, recv)


@register("allreduce", "shm", single_node=True, host_only=True)
def shm(s: Builder, send: View, recv: View) -> None:
    """Shared memory: each rank reduces its slice straight from the peers' memory, then all copy the reduced slices.

    Steps: (see :func:`mpicomm.coll.node_memory.reduce`) publish where the
    input and the output live (arrays from a :class:`mpicomm.shm.Pool` where
    they are, others copied into the rank's scratch but for its own slice);
    rank r reduces slice r of all p inputs in rank order and writes it into its
    scratch or every pool output; ranks whose output is not in a pool copy the
    p reduced slices. The vector is pipelined in chunks of
    :data:`mpicomm.coll.node_memory.CHUNK_BYTES`, the ranks synchronised by
    counters in shared memory (no MPI barrier; no barrier at the end: the next
    call waits for the peers to be done).
    Restrictions: every rank on one node; host buffers; any op (rank order kept).
    """
    from .node_memory import reduce

    reduce(s, send, recv, None)


@register("allreduce", "hierarchical", commutative_only=True, composite=True)
def hierarchical(s: Builder, send: View, recv: View) -> None:
    """Hierarchical: reduce on each node, allreduce among the node leaders, broadcast on each node.

    Steps: (1) reduce to the node's leader over the node communicator, (2)
    allreduce among the leaders, (3) broadcast from the leader over the node -
    each a nested call, so each level runs the algorithm chosen for it
    (shared memory on a node, a message-passing one between nodes).
    Restrictions: commutative ops (ranks meet in node order, not rank order).
    """
    from .hierarchy import levels

    lv = levels(s)
    count = recv.size
    s.nested(lv.node, "reduce", send=send, recv=recv if lv.leader else None, root=0, count=count)
    if lv.leader:
        s.nested(lv.leaders, "allreduce", send=recv, recv=recv, count=count)
    s.nested(lv.node, "bcast", recv=recv, root=0, count=count)


# ---------------------------------------------------------------- cost functions (n: the catalogue's size)


@cost("allreduce", "recursive_doubling")
def _allreduce_recursive_doubling(m: Machine, n: float, p: int) -> float:
    """lg p'·α + n·lg p'·β + n·lg p'·γ; p ≠ p': + 2α + 2n·β + n·γ for the fold"""
    a, b = m.link(p).alpha, m.link(p).beta
    t = math.log2(pof2(p)) * (a + n * b + n * m.gamma)
    if folded(p):
        t += 2 * a + 2 * n * b + n * m.gamma
    return t


@cost("allreduce", "naive")
def _allreduce_naive(m: Machine, n: float, p: int) -> float:
    """2(p−1)·α + 2(p−1)·n·β + (p−1)·n·γ"""
    a, b = m.link(p).alpha, m.link(p).beta
    return 2 * (p - 1) * a + 2 * (p - 1) * n * b + (p - 1) * n * m.gamma


@cost("allreduce", "tree")
def _allreduce_tree(m: Machine, n: float, p: int) -> float:
    """2lg p·α + 2n·lg p·β + n·lg p·γ"""
    a, b = m.link(p).alpha, m.link(p).beta
    lg = ceil_lg(p)
    return 2 * lg * a + 2 * n * lg * b + n * lg * m.gamma


@cost("allreduce", "ring")
def _allreduce_ring(m: Machine, n: float, p: int) -> float:
    """2(p−1)·α + 2n(p−1)/p·β + n(p−1)/p·γ, + one α per extra segment: each of the 2(p−1) steps sends
    ⌈(n/p) / SEGMENT_BYTES⌉ messages"""

    a, b = m.link(p).alpha, m.link(p).beta
    messages = segments(n / p, SEGMENT_BYTES)
    return 2 * (p - 1) * messages * a + 2 * n * (p - 1) / p * b + n * (p - 1) / p * m.gamma


@cost("allreduce", "rabenseifner")
def _allreduce_rabenseifner(m: Machine, n: float, p: int) -> float:
    """2lg p'·α + 2n(p'−1)/p'·β + n(p'−1)/p'·γ; p ≠ p': + 2α + 2n·β + n·γ for the fold"""
    t = halving_doubling(m, n, p)
    if folded(p):
        a, b = m.link(p).alpha, m.link(p).beta
        t += 2 * a + 2 * n * b + n * m.gamma
    return t


@cost("allreduce", "shm")
def _allreduce_shm(m: Machine, n: float, p: int) -> float:
    """2α + n(2p−1)/p·δ + n(p−1)/p·γ  (δ, seconds per byte copied: the copy in of all but the own slice and the
    copy out of everything, both skipped for pool buffers; α of the intra-node link)"""
    return 2 * m.intra.alpha + n * (2 * p - 1) / p * m.copy + n * (p - 1) / p * m.gamma


@cost("allreduce", "hierarchical")
def _allreduce_hierarchical(m: Machine, n: float, p: int) -> float:
    """T(reduce, n, ppn, intra) + T(allreduce, n, nodes, inter) + T(bcast, n, ppn, intra)"""
    ppn, nodes = node_layout(m, p)
    return (cheapest(m, "reduce", n, ppn, m.intra, False) + cheapest(m, "allreduce", n, nodes, m.inter, True)
            + cheapest(m, "bcast", n, ppn, m.intra, False))
