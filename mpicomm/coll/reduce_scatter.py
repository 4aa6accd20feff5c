"""Reduce-scatter algorithms: rank r ends with block r of the elementwise reduction of all ranks' vectors.

Signature: ``algorithm(s, send, recv, counts)``: *s* is the
:class:`~mpicomm.schedule.Builder` the algorithm describes its rounds to;
*send* is a view of sum(counts) elements, block r is the counts[r] elements
at offset counts[0] + … + counts[r−1], and rank r's reduced block goes to the
view *recv*. The same functions serve ``reduce_scatter_block`` (all counts
equal). All are registered with ``in_place=False``: for an in-place call the
plan copies the input first. n = bytes of the whole input vector, p = ranks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import accumulate

from ..model import Machine, folded, pof2
from ..registry import cost, register
from ..schedule import Builder, View
from .patterns import fold, ring_reduce_scatter, unfold
from .patterns import pairwise as pairwise_schedule

__all__ = ["ring", "recursive_halving", "pairwise", "shm"]


def _displs(counts: Sequence[int]) -> list[int]:
    """Offsets of the blocks: prefix sums of *counts* (one more entry: the total)."""
    return [0, *accumulate(counts)]


@register("reduce_scatter", "ring", commutative_only=True, in_place=False)
@register("reduce_scatter_block", "ring", commutative_only=True, in_place=False)
def ring(s: Builder, send: View, recv: View, counts: Sequence[int]) -> None:
    """Ring: p − 1 steps; each passes one partially reduced block to the right and reduces one from the left.

    Steps: in step k rank r sends its partial of block (r − k − 1) mod p to
    rank r + 1 and receives the left neighbour's partial of block
    (r − k − 2) mod p, which it combines with its own input of that block
    (:func:`~.patterns.ring_reduce_scatter`); after p − 1 steps the block it
    received last, block r, holds every rank's contribution.
    Restrictions: commutative ops only (the ring combines in ring order, not
    rank order); any p and counts (zeros too); not in place (the plan copies).
    """
    p, rank = s.p, s.rank
    at = _displs(counts)

    def block(x: View, b: int) -> View:
        return x.part(at[b], at[b + 1])

    if p == 1:
        s.copy(recv, block(send, 0))
        return
    width = max(counts)
    incoming, partial = s.empty(width), s.empty(width)  # partial: what the next step sends
    right, left = (rank + 1) % p, (rank - 1) % p
    for k, (send_block, recv_block) in enumerate(ring_reduce_scatter(rank, p)):
        outgoing = block(send, send_block) if k == 0 else partial.part(0, counts[send_block])
        tmp = incoming.part(0, counts[recv_block])
        s.sendrecv(right, outgoing, left, tmp)
        out = recv if k == p - 2 else partial.part(0, counts[recv_block])  # the last step's block is this rank's
        s.combine(tmp, block(send, recv_block), out)


@register("reduce_scatter", "recursive_halving", commutative_only=True, in_place=False)
@register("reduce_scatter_block", "recursive_halving", commutative_only=True, in_place=False)
def recursive_halving(s: Builder, send: View, recv: View, counts: Sequence[int]) -> None:
    """Recursive halving: lg p rounds; each halves the range of blocks a rank is responsible for.

    Steps: fold a non-power-of-two p onto the largest power of two p' (each
    even rank below 2·(p − p') sends its whole vector to the odd rank above,
    which combines them; newrank i then owns the blocks of both). Newranks
    own ranges of newrank blocks (newrank i's block is its real ranks'
    blocks, so uneven counts stay exact); in the round at distance 2^k
    (k = lg p' − 1 … 0) each rank keeps the half of its range on its side of
    bit k, sends the other half to newrank ⊕ 2^k, and combines the half it
    receives into its own. After lg p' rounds newrank i holds newrank block
    i; an odd folded rank sends the even rank below its block.
    Restrictions: commutative ops only (partners are combined out of rank
    order); any p and counts (zeros too); not in place (the plan copies).
    """
    p, rank = s.p, s.rank
    at = _displs(counts)
    f = fold(rank, p)
    if f.newrank is None:  # folded away: hand the whole vector up, receive this rank's block at the end
        assert f.partner is not None  # a folded-away rank always has its proxy
        s.send(f.partner, send)
        s.recv(f.partner, recv)
        return
    # newrank i's block: elements new_at[i] … new_at[i + 1] (real ranks unfold(i) − 1 and unfold(i) when folded)
    new_at = [at[unfold(i, f.rem) - 1] if i < f.rem else at[unfold(i, f.rem)] for i in range(f.pof2)] + [at[p]]
    partials = send  # where this rank's partial results are: its input until the first combine
    acc: View | None = None
    tmp: View | None = None
    if f.partner is not None:  # the even rank below folded onto this one: x_{r-1} ⊕ x_r
        tmp, acc = s.empty(at[p]), s.empty(at[p])
        s.recv(f.partner, tmp)
        s.combine(tmp, send, acc)
        partials = acc
    lo, hi = 0, f.pof2  # the newrank blocks this rank is still responsible for
    mask = f.pof2 >> 1
    while mask > 0:
        partner = unfold(f.newrank ^ mask, f.rem)
        if f.newrank & mask:
            give, lo = partials.part(new_at[lo], new_at[lo + mask]), lo + mask
        else:
            give, hi = partials.part(new_at[lo + mask], new_at[hi]), lo + mask
        a, b = new_at[lo], new_at[hi]
        if tmp is None:  # the first round receives the most: later ranges lie inside this one
            tmp = s.empty(b - a)
        incoming = tmp.part(0, b - a)
        s.sendrecv(partner, give, partner, incoming)
        if acc is None:
            acc = s.empty(at[p])
        if partner < rank:
            s.combine(incoming, partials.part(a, b), acc.part(a, b))
        else:
            s.combine(partials.part(a, b), incoming, acc.part(a, b))
        partials = acc
        mask >>= 1
    if f.partner is not None:  # hand the even rank below its block, keep this one's
        s.send(f.partner, partials.part(at[rank - 1], at[rank]))
    s.copy(recv, partials.part(at[rank], at[rank + 1]))


@register("reduce_scatter", "pairwise", in_place=False)
@register("reduce_scatter_block", "pairwise", in_place=False)
def pairwise(s: Builder, send: View, recv: View, counts: Sequence[int]) -> None:
    """Pairwise exchange: p − 1 steps; in step k rank r sends its input's block r + k to rank r + k.

    Steps: in step k = 1 … p − 1 rank r sends block (r + k) mod p of its input
    to rank r + k and receives x_{r−k}'s block r from rank r − k
    (:func:`~.patterns.pairwise`), so it receives x_{r−1}, x_{r−2} … x_0, then
    x_{p−1} … x_{r+1}. Two accumulators keep rank order: ``left`` (in *recv*)
    becomes x_s ⊕ left for s = r−1 … 0 and ``right`` becomes x_s ⊕ right for
    s = p−1 … r+1; the result is left ⊕ x_r ⊕ right. The blocks arrive in two
    alternating buffers, so the compiler posts step k + 1 before step k's
    block is combined.
    Restrictions: none - operands are combined in rank order, so
    non-commutative ops are fine; any p and counts (zeros too); not in place
    (the plan copies).
    """
    p, rank = s.p, s.rank
    at = _displs(counts)
    mine = send.part(at[rank], at[rank + 1])
    if p == 1:
        s.copy(recv, mine)
        return
    n = counts[rank]
    buffers = (s.empty(n), s.empty(n))
    right = s.empty(n)
    for k, (dest, source) in enumerate(pairwise_schedule(rank, p)):
        x = buffers[k % 2]
        s.sendrecv(dest, send.part(at[dest], at[dest + 1]), source, x)
        if source < rank:  # x_{r-1} first, then lower ranks: prepend
            if source == rank - 1:
                s.copy(recv, x)
            else:
                s.combine(x, recv, recv)
        else:  # x_{p-1} first, then lower ranks down to r + 1: prepend
            if source == p - 1:
                s.copy(right, x)
            else:
                s.combine(x, right, right)
    if rank > 0:
        s.combine(recv, mine, recv)
    else:
        s.copy(recv, mine)
    if rank < p - 1:
        s.combine(recv, right, recv)


@register("reduce_scatter", "shm", single_node=True, host_only=True, in_place=False)
@register("reduce_scatter_block", "shm", single_node=True, host_only=True, in_place=False)
def shm(s: Builder, send: View, recv: View, counts: Sequence[int]) -> None:
    """Shared memory: each rank reduces its own block straight from the peers' inputs.

    Steps: (see :func:`mpicomm.coll.node_memory.reduce_scatter`) publish the
    input (a :class:`mpicomm.shm.Pool` array where it is, another copied into
    scratch - all but the own block, which only this rank reads) and raise this
    rank's counter; once every peer's counter is up, rank r reduces block r of
    all p inputs in rank order into *recv*. No barrier at the end: the next
    shared-memory call waits until every rank has read this one's inputs (a
    pool input waits at the end).
    Restrictions: every rank on one node; host buffers; any op (rank order
    kept); not in place (the plan copies).
    """
    from .node_memory import reduce_scatter as shm_reduce_scatter

    shm_reduce_scatter(s, send, recv, counts)


# ---------------------------------------------------------------- cost functions (n: the catalogue's size)


@cost("reduce_scatter", "ring", "pairwise")
def _reduce_scatter_ring(m: Machine, n: float, p: int) -> float:
    """(p−1)·α + n(p−1)/p·β + n(p−1)/p·γ"""
    a, b = m.link(p).alpha, m.link(p).beta
    return (p - 1) * a + n * (p - 1) / p * b + n * (p - 1) / p * m.gamma


@cost("reduce_scatter", "recursive_halving")
def _reduce_scatter_recursive_halving(m: Machine, n: float, p: int) -> float:
    """lg p'·α + n(p'−1)/p'·β + n(p'−1)/p'·γ; p ≠ p': + 2α + n·β + n·γ for the fold"""
    a, b = m.link(p).alpha, m.link(p).beta
    q = pof2(p)
    t = math.log2(q) * a + n * (q - 1) / q * (b + m.gamma)
    if folded(p):
        t += 2 * a + n * b + n * m.gamma
    return t


@cost("reduce_scatter", "shm")
def _reduce_scatter_shm(m: Machine, n: float, p: int) -> float:
    """α + n(p−1)/p·δ + n(p−1)/p·γ  (a pool input skips the copy in; α of the intra-node link)"""
    return m.intra.alpha + n * (p - 1) / p * (m.copy + m.gamma)
