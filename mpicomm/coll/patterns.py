"""Communication patterns as pure functions and generators: who talks to whom, in which step.

They know nothing of MPI or arrays, so they are tested against literal tables
(``tests/coll/test_patterns.py``) and reused by every algorithm built on the
same pattern. Vocabulary: ``p`` ranks, ``rank`` this one, ``root``, and the
*relative rank* ``vrank = (rank - root) mod p`` that makes any root look like 0.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

__all__ = [
    "block_partition",
    "dissemination",
    "ring_reduce_scatter",
    "ring_allgather",
    "pairwise",
    "BinomialNode",
    "binomial",
    "Fold",
    "fold",
    "unfold",
    "doubling_partners",
    "bruck_allgather",
]


def block_partition(count: int, p: int) -> tuple[list[int], list[int]]:
    """Split *count* elements into *p* blocks, the first ``count % p`` one larger: (counts, displs)."""
    q, r = divmod(count, p)
    counts = [q + (1 if i < r else 0) for i in range(p)]
    displs = [i * q + min(i, r) for i in range(p)]
    return counts, displs


def dissemination(rank: int, p: int) -> Iterator[tuple[int, int]]:
    """``(send_to, receive_from)`` for each of the ⌈lg p⌉ rounds: r + 2^k and r − 2^k, modulo p."""
    distance = 1
    while distance < p:
        yield (rank + distance) % p, (rank - distance) % p
        distance *= 2


def ring_reduce_scatter(rank: int, p: int) -> Iterator[tuple[int, int]]:
    """``(send_block, recv_block)`` for the p − 1 steps of a ring reduce-scatter (send right, receive left).

    Step k sends the partial sum of block (r − k − 1) mod p and receives, to
    combine into its own, block (r − k − 2) mod p; after the last step rank r
    holds block r reduced over all ranks.
    """
    for k in range(p - 1):
        yield (rank - k - 1) % p, (rank - k - 2) % p


def ring_allgather(rank: int, p: int) -> Iterator[tuple[int, int]]:
    """``(send_block, recv_block)`` for the p − 1 steps of a ring allgather (send right, receive left).

    Step k forwards block (r − k) mod p and receives block (r − k − 1) mod p.
    """
    for k in range(p - 1):
        yield (rank - k) % p, (rank - k - 1) % p


def pairwise(rank: int, p: int) -> Iterator[tuple[int, int]]:
    """``(send_to, receive_from)`` for the p − 1 steps of a pairwise exchange: r + k and r − k (mod p)."""
    for k in range(1, p):
        yield (rank + k) % p, (rank - k) % p


class BinomialNode(NamedTuple):
    """A rank's place in the binomial tree rooted at relative rank 0.

    ``parent``: relative rank of the parent (None at the root).
    ``children``: ``(child, subtree_size)`` from the farthest child to the
    nearest (distances 2^k decreasing; sizes need not decrease when p is not a
    power of two) - the order a broadcast sends in; a child's subtree is the
    relative ranks ``child … child + subtree_size − 1``.
    ``subtree``: ranks in this node's own subtree (itself included).
    """

    parent: int | None
    children: list[tuple[int, int]]
    subtree: int


def binomial(vrank: int, p: int) -> BinomialNode:
    """The binomial tree over relative ranks 0 … p−1 (MPICH's): parent = vrank with its lowest set bit cleared."""
    mask = 1
    parent = None
    while mask < p:
        if vrank & mask:
            parent = vrank - mask
            break
        mask <<= 1
    children = []
    mask >>= 1
    while mask > 0:
        child = vrank + mask
        if child < p:
            children.append((child, min(mask, p - child)))
        mask >>= 1
    subtree = 1 + sum(size for _, size in children)
    return BinomialNode(parent, children, subtree)


class Fold(NamedTuple):
    """How a rank takes part in a power-of-two algorithm when p is not a power of two.

    The standard fold (MPICH): with p' the largest power of two ≤ p and
    rem = p − p', among ranks 0 … 2·rem−1 each even rank hands its data to the
    odd rank above it and sits out (``newrank`` None, ``partner`` that odd
    rank); odd rank r becomes newrank r // 2 (``partner`` the even rank
    below). Ranks ≥ 2·rem become newrank r − rem. Newrank order is rank order,
    so combining in newrank order keeps rank order for non-commutative ops.
    """

    newrank: int | None
    partner: int | None  # the rank folded onto this one (odd ranks), or this one's proxy (even ranks)
    pof2: int
    rem: int


def fold(rank: int, p: int) -> Fold:
    """This rank's :class:`Fold` for *p* ranks."""
    pof2 = 1 << (p.bit_length() - 1) if p > 0 else 0
    rem = p - pof2
    if rank < 2 * rem:
        if rank % 2 == 0:
            return Fold(None, rank + 1, pof2, rem)
        return Fold(rank // 2, rank - 1, pof2, rem)
    return Fold(rank - rem, None, pof2, rem)


def unfold(newrank: int, rem: int) -> int:
    """The real rank of *newrank* (inverse of :func:`fold`)."""
    return newrank * 2 + 1 if newrank < rem else newrank + rem


def doubling_partners(newrank: int, pof2: int, rem: int) -> Iterator[tuple[int, int]]:
    """``(mask, partner's real rank)`` for the lg p' rounds of recursive doubling among newranks."""
    mask = 1
    while mask < pof2:
        yield mask, unfold(newrank ^ mask, rem)
        mask <<= 1


def bruck_allgather(rank: int, p: int) -> Iterator[tuple[int, int, int]]:
    """``(send_to, receive_from, blocks)`` for the ⌈lg p⌉ rounds of Bruck's allgather.

    Round k sends the first min(2^k, p − 2^k) blocks of the rotated buffer to
    r − 2^k and receives as many from r + 2^k (mod p), appending them.
    """
    distance = 1
    while distance < p:
        yield (rank - distance) % p, (rank + distance) % p, min(distance, p - distance)
        distance *= 2
