"""Scatter algorithms: every rank ends with its block of the root's buffer.

Signature: ``algorithm(call, send, recv, counts, displs)`` for scatter and
scatterv alike. *recv* is this rank's block; *send*, *counts* and *displs*
(elements, per rank) matter on the root only (for scatter the counts are
known everywhere, all equal; for scatterv they are None off the root). In
place, the root's *recv* is its own block of *send*. n = bytes scattered by
the root (all p blocks), p = ranks; relative ranks ``vrank = (rank − root)
mod p`` make any root look like rank 0.

Where counts are unknown off the root (the v-variant), parents announce their
children's counts in int64 headers: small NumPy arrays on the host whatever
the buffers' module, read at once without a device round trip.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..registry import register
from ..requests import Steps
from .call import Call, block
from .gather import span
from .schedules import binomial as binomial_tree

__all__ = ["linear", "binomial"]






@register("scatter", "linear")
@register("scatterv", "linear")
def linear(call: Call, send: Any, recv: Any, counts: Sequence[int] | None, displs: Sequence[int] | None) -> Steps:
    """Linear: the root sends every rank its block directly.

    Steps: the root copies its own block into *recv* and posts p − 1 sends,
    each straight from the receiver's block of *send*; every other rank
    receives its block into *recv*.
    Restrictions: none (any p, any counts and displacements); works in place.
    Cost: (p−1)α + N(p−1)/p·β  (N = n·p, every block; at the root)
    """
    if call.rank != call.root:
        yield call.recv(call.root, recv)
        return
    call.copy(recv, block(send, counts, displs, call.root))
    sends = [(r, block(send, counts, displs, r)) for r in range(call.p) if r != call.root]
    if sends:
        yield call.exchange(sends=sends)


@register("scatter", "binomial")
@register("scatterv", "binomial")
def binomial(call: Call, send: Any, recv: Any, counts: Sequence[int] | None, displs: Sequence[int] | None) -> Steps:
    """Binomial tree: each rank receives its subtree's blocks in one message and passes each child its share.

    Steps: the root sends each child c (:func:`~mpicomm.coll.schedules.binomial`)
    the blocks of relative ranks c … c + subtree − 1 back to back (a slice of
    *send* when they lie so there, else packed in scratch). A rank with
    children receives its subtree's blocks, keeps the first (its own) and
    forwards the rest the same way; a leaf receives straight into *recv*. For
    scatterv the counts are unknown off the root, so before the data a child
    with a subtree of more than one rank gets the counts of its subtree's
    ranks (an int64 header) to size its receive and split what it forwards.
    Restrictions: none (any p, root, counts, displacements in any order with
    gaps); works in place.
    Cost: lg p·α + N(p−1)/p·β  (N = n·p, every block; scatterv: + lg p·α for the count headers)
    """
    p = call.p
    vrank = (call.rank - call.root) % p
    node = binomial_tree(vrank, p)
    headers = call.collective == "scatterv"  # off the root nobody knows the counts: parents send them

    if node.parent is None:  # the root: each child its subtree's blocks, in relative-rank order
        call.copy(recv, block(send, counts, displs, call.root))
        sends = []
        for child, size in node.children:
            ranks = [call.real_rank(v) for v in range(child, child + size)]
            if headers and size > 1:
                sends.append((call.real_rank(child), np.array([counts[r] for r in ranks], np.int64)))
            sends.append((call.real_rank(child), _pack(call, send, ranks, counts, displs)))
        if sends:
            yield call.exchange(sends=sends)
        return

    parent = call.real_rank(node.parent)
    if not node.children:  # a leaf: its own block only
        yield call.recv(parent, recv)
        return
    if headers:
        mine = np.empty(node.subtree, np.int64)  # counts of relative ranks vrank … vrank + subtree − 1
        yield call.recv(parent, mine)
        sub = [int(c) for c in mine]
    else:
        mine = None
        sub = [counts[call.real_rank(v)] for v in range(vrank, vrank + node.subtree)]
    offsets = np.cumsum([0] + sub).tolist()
    held = call.empty(offsets[-1])
    yield call.recv(parent, held)
    call.copy(recv, held[: sub[0]])
    sends = []
    for child, size in node.children:
        first, last = child - vrank, child - vrank + size
        if mine is not None and size > 1:
            sends.append((call.real_rank(child), mine[first:last]))
        sends.append((call.real_rank(child), held[offsets[first] : offsets[last]]))
    yield call.exchange(sends=sends)


def _pack(call: Call, send: Any, ranks: list[int], counts: Sequence[int], displs: Sequence[int]) -> Any:
    """The blocks of *ranks* back to back: a slice of *send* where they lie so, else a packed copy."""
    run = span(ranks, counts, displs)
    if run is not None:
        return send[run[0] : run[1]]
    packed = call.empty(sum(counts[r] for r in ranks))
    offset = 0
    for r in ranks:
        call.copy(packed[offset : offset + counts[r]], block(send, counts, displs, r))
        offset += counts[r]
    return packed
