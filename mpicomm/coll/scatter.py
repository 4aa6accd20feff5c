"""Scatter algorithms: every rank ends with its block of the root's buffer.

Signature: ``algorithm(s, send, recv, counts, displs)`` for scatter and
scatterv alike: *s* is the :class:`~mpicomm.schedule.Builder` the algorithm
describes its rounds to, *recv* this rank's block (a view); *send*, *counts*
and *displs* (elements, per rank) matter on the root only (for scatter the
counts are known everywhere, all equal; for scatterv they are None off the
root). In place, the root's *recv* is its own block of *send* (the same
memory: the copy out drops out). n = bytes scattered by the root (all p
blocks), p = ranks; relative ranks ``vrank = (rank − root) mod p`` make any
root look like rank 0.

Where counts are unknown off the root (the v-variant), parents announce their
children's counts in int64 headers; a rank that has to size a receive from
them describes the rest of its schedule once they are in
(:attr:`~mpicomm.schedule.Schedule.then`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..registry import register
from ..schedule import Builder, View
from .gather import block, constants, read_ints, span
from .patterns import binomial as binomial_tree

__all__ = ["linear", "binomial"]

_INT64 = np.dtype(np.int64)


@register("scatter", "linear")
@register("scatterv", "linear")
def linear(s: Builder, send: View, recv: View, counts: Sequence[int] | None, displs: Sequence[int] | None) -> None:
    """Linear: the root sends every rank its block directly.

    Steps: the root copies its own block into *recv* and posts p − 1 sends,
    each straight from the receiver's block of *send*; every other rank
    receives its block into *recv*.
    Restrictions: none (any p, any counts and displacements); works in place.
    """
    if s.rank != s.root:
        s.recv(s.root, recv)
        return
    assert counts is not None and displs is not None  # known at the root, scatterv too
    s.copy(recv, block(send, counts, displs, s.root))
    sends = [(r, block(send, counts, displs, r)) for r in range(s.p) if r != s.root]
    if sends:
        s.exchange(sends=sends)


@register("scatter", "binomial")
@register("scatterv", "binomial")
def binomial(s: Builder, send: View, recv: View, counts: Sequence[int] | None, displs: Sequence[int] | None) -> None:
    """Binomial tree: each rank receives its subtree's blocks in one message and passes each child its share.

    Steps: the root sends each child c (:func:`~mpicomm.coll.patterns.binomial`)
    the blocks of relative ranks c … c + subtree − 1 back to back (a slice of
    *send* when they lie so there, else packed in scratch). A rank with
    children receives its subtree's blocks, keeps the first (its own) and
    forwards the rest the same way; a leaf receives straight into *recv*. For
    scatterv the counts are unknown off the root, so before the data a child
    with a subtree of more than one rank gets the counts of its subtree's
    ranks (an int64 header) to size its receive and split what it forwards:
    it receives the header, then describes the rest of its schedule from its
    values.
    Restrictions: none (any p, root, counts, displacements in any order with
    gaps); works in place.
    """
    vrank = s.vrank
    node = binomial_tree(vrank, s.p)
    headers = s.collective == "scatterv"  # off the root nobody knows the counts: parents send them

    if node.parent is None:  # the root: each child its subtree's blocks, in relative-rank order
        assert counts is not None and displs is not None
        s.copy(recv, block(send, counts, displs, s.rank))
        subtrees = [[s.real_rank(v) for v in range(child, child + size)] for child, size in node.children]
        told = [ranks for ranks in subtrees if headers and len(ranks) > 1]
        table = constants(s, [counts[r] for ranks in told for r in ranks], "the children's counts") if told else None
        sends, at = [], 0
        for (child, size), ranks in zip(node.children, subtrees):
            if table is not None and size > 1:
                sends.append((s.real_rank(child), table.part(at, at + size)))
                at += size
            sends.append((s.real_rank(child), _pack(s, send, ranks, counts, displs)))
        if sends:
            s.exchange(sends=sends)
        return

    parent = s.real_rank(node.parent)
    if not node.children:  # a leaf: its own block only
        s.recv(parent, recv)
        return
    if not headers:  # scatter: every count is known
        assert counts is not None
        _forward(s, parent, recv, node, [counts[s.real_rank(v)] for v in range(vrank, vrank + node.subtree)], None)
        return
    # scatterv off the root: the counts of this subtree's ranks arrive first (relative ranks vrank … vrank +
    # subtree − 1); the rest is described once they are known
    mine = s.empty(node.subtree, _INT64)
    s.recv(parent, mine)
    heard: list[int] = []  # filled in when the header is in (one plan's runs never overlap)

    def hear(run: Any) -> None:
        heard[:] = read_ints(run, mine)

    s.local(hear, f"read the subtree's counts from {mine}", reads=(mine,), writes=())
    s.then = lambda b: _forward(b, parent, recv, node, heard, mine)


def _forward(s: Builder, parent: int, recv: View, node: Any, sub: Sequence[int], mine: View | None) -> None:
    """An inner rank of the tree: receive the subtree's blocks (counts *sub*), keep the first, pass each child
    its share (after its part of the counts header *mine*, if given and the child has children)."""
    vrank = s.vrank
    offsets = [0]
    for c in sub:
        offsets.append(offsets[-1] + c)
    held = s.empty(offsets[-1])
    s.recv(parent, held)
    s.copy(recv, held.part(0, sub[0]))
    sends = []
    for child, size in node.children:
        first, last = child - vrank, child - vrank + size
        if mine is not None and size > 1:
            sends.append((s.real_rank(child), mine.part(first, last)))
        sends.append((s.real_rank(child), held.part(offsets[first], offsets[last])))
    s.exchange(sends=sends)


def _pack(s: Builder, send: View, ranks: list[int], counts: Sequence[int], displs: Sequence[int]) -> View:
    """The blocks of *ranks* back to back: a slice of *send* where they lie so, else a packed copy (made
    before the first message)."""
    run = span(ranks, counts, displs)
    if run is not None:
        return send.part(run[0], run[1])
    packed = s.empty(sum(counts[r] for r in ranks))
    offset = 0
    for r in ranks:
        s.copy(packed.part(offset, offset + counts[r]), block(send, counts, displs, r))
        offset += counts[r]
    return packed
