"""The block split every application uses: *n* items in *parts* contiguous, near-equal blocks, in order.

``q, r = divmod(n, parts)``: the first ``r`` blocks hold ``q + 1`` items, the
others ``q`` (possibly 0); block ``i`` starts at ``i·q + min(i, r)``. The blocks
are in order and cover ``0 .. n`` exactly, so they are the counts and
displacements of an ``Allgatherv``/``Reduce_scatter`` too (:func:`blocks`).
The stencil splits its grid with it, the SGD and torch applications a global
batch over the ranks (and a rank's share into micro-batches), ZeRO and the
parameter servers a flat parameter vector into shards, the pipeline a replica's
batch into micro-batches.
"""

from __future__ import annotations

import operator

__all__ = ["block", "blocks", "grouped"]


def block(n: int, parts: int, index: int) -> tuple[int, int]:
    """``(start, stop)`` of block *index* when *n* items are split into *parts* near-equal contiguous blocks.

    ValueError for ``n < 0``, ``parts < 1`` or an *index* outside ``0 .. parts - 1``.
    """
    n, parts, index = operator.index(n), operator.index(parts), operator.index(index)
    if n < 0:
        raise ValueError(f"cannot split {n} items into blocks; the count must be >= 0")
    if parts < 1:
        raise ValueError(f"cannot split {n} items into {parts} blocks; use at least 1")
    if not 0 <= index < parts:
        raise ValueError(f"block {index} is out of range for {parts} blocks; use 0 <= index < {parts}")
    q, r = divmod(n, parts)
    start = index * q + min(index, r)
    return start, start + q + (1 if index < r else 0)


def blocks(n: int, parts: int) -> tuple[list[int], list[int]]:
    """``(counts, displacements)`` of the *parts* blocks of :func:`block`."""
    bounds = [block(n, parts, i) for i in range(parts)]
    return [stop - start for start, stop in bounds], [start for start, _ in bounds]


def grouped(n: int, parts: int, groups: int, index: int) -> tuple[tuple[int, int], list[tuple[int, int]]]:
    """Group *index* when the *parts* blocks of *n* items are dealt, in order, into *groups* near-equal groups
    of whole blocks (group g holds blocks ``block(parts, groups, g)``): ``(start, stop)`` of the group's items
    within ``0 .. n``, and each of its blocks' ``(start, stop)`` relative to that start. A rank's fixed
    micro-batches of a global batch: the sampler takes the span, the training step the blocks."""
    first, last = block(parts, groups, index)
    bounds = [block(n, parts, i) for i in range(first, last)]
    start, stop = (bounds[0][0], bounds[-1][1]) if bounds else (n, n)  # (an empty group: more groups than blocks)
    return (start, stop), [(a - start, b - start) for a, b in bounds]
