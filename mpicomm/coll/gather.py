"""Gather algorithms: the root ends with every rank's block, each at its displacement.

Signature: ``algorithm(call, send, recv, counts, displs)`` for gather and
gatherv alike. *send* is this rank's block; *recv*, *counts* and *displs*
(elements, per rank) matter on the root only. For gather the counts are
known everywhere (all equal); for gatherv they are None off the root. In
place, the root's *send* is its own block of *recv*. n = bytes gathered at
the root (all p blocks), p = ranks; relative ranks ``vrank = (rank − root)
mod p`` make any root look like rank 0.

Where counts are unknown off the root (the v-variant), children announce their
subtrees' sizes in int64 headers: small NumPy arrays on the host whatever the
buffers' module, read at once without a device round trip.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..model import Machine, ceil_lg, direct_exchange
from ..registry import cost, register
from ..requests import Steps
from .call import Call, block
from .schedules import binomial as binomial_tree

__all__ = ["linear", "binomial", "span"]






def span(ranks: Sequence[int], counts: Sequence[int], displs: Sequence[int]) -> tuple[int, int] | None:
    """``(start, stop)`` when the blocks of *ranks* lie back to back in this order, else None.

    Empty blocks are ignored wherever their displacement points, so a subtree
    whose blocks are packed can be moved as one slice of the root's buffer.
    """
    full = [r for r in ranks if counts[r]]
    if not full:
        return 0, 0
    for a, b in zip(full, full[1:]):
        if displs[b] != displs[a] + counts[a]:
            return None
    return displs[full[0]], displs[full[-1]] + counts[full[-1]]


@register("gather", "linear")
@register("gatherv", "linear")
def linear(call: Call, send: Any, recv: Any, counts: Sequence[int] | None, displs: Sequence[int] | None) -> Steps:
    """Linear: every rank sends its block straight to the root.

    Steps: the root copies its own block into place and posts p − 1 receives,
    each straight into the sender's block of *recv* at its displacement;
    every other rank sends its block to the root.
    Restrictions: none (any p, any counts and displacements); works in place.
    Cost: (p−1)α + N(p−1)/p·β  (N = n·p, every block; at the root)
    """
    if call.rank != call.root:
        yield call.send(call.root, send)
        return
    call.copy(block(recv, counts, displs, call.root), send)
    recvs = [(r, block(recv, counts, displs, r)) for r in range(call.p) if r != call.root]
    if recvs:
        yield call.exchange(recvs=recvs)


@register("gather", "binomial")
@register("gatherv", "binomial")
def binomial(call: Call, send: Any, recv: Any, counts: Sequence[int] | None, displs: Sequence[int] | None) -> Steps:
    """Binomial tree: each rank gathers its subtree's blocks and sends them to its parent in one message.

    Steps: relative rank v keeps its own block followed by its children's
    subtrees (:func:`~mpicomm.coll.schedules.binomial`), so a scratch buffer
    holds the blocks of relative ranks v … v + subtree − 1 back to back; once
    the children's messages are in, it sends the lot to its parent. For
    gatherv the counts are unknown off the root, so every child first sends
    its subtree's element count (an int64 header) and a parent sizes its
    receives from them (the root, knowing the counts, posts header and data
    receives together). The root receives a child's subtree straight into
    *recv* when those blocks lie back to back there in relative-rank order,
    else into scratch, then copies each block to its displacement.
    Restrictions: none (any p, root, counts, displacements in any order with
    gaps); works in place.
    Cost: lg p·α + N(p−1)/p·β  (N = n·p, every block; gatherv: + lg p·α for the size headers)
    """
    p = call.p
    vrank = (call.rank - call.root) % p
    node = binomial_tree(vrank, p)
    # children in relative-rank order (the tree lists them largest subtree first): their subtrees follow
    # this rank's block in that order
    children = [(call.real_rank(c), [call.real_rank(v) for v in range(c, c + s)]) for c, s in reversed(node.children)]
    headers = call.collective == "gatherv"  # off the root nobody knows the counts: children announce them
    heard = np.zeros(len(children), np.int64)
    header_recvs = [(child, heard[i : i + 1]) for i, (child, _) in enumerate(children)] if headers else []
    if counts is not None:
        sizes = [sum(counts[r] for r in ranks) for _, ranks in children]
    else:
        if header_recvs:
            yield call.exchange(recvs=header_recvs)
        header_recvs = []
        sizes = [int(x) for x in heard]

    if node.parent is None:  # the root: every block to its displacement
        call.copy(block(recv, counts, displs, call.root), send)
        data, unpack = [], []
        for (child, ranks), size in zip(children, sizes):
            run = span(ranks, counts, displs)
            if run is not None:
                data.append((child, recv[run[0] : run[1]]))
            else:
                scratch = call.empty(size)
                data.append((child, scratch))
                unpack.append((ranks, scratch))
        if data:
            yield call.exchange(recvs=header_recvs + data)
        for ranks, scratch in unpack:
            offset = 0
            for r in ranks:
                call.copy(block(recv, counts, displs, r), scratch[offset : offset + counts[r]])
                offset += counts[r]
        return

    parent = call.real_rank(node.parent)
    total = send.size + sum(sizes)
    up = [(parent, np.array([total], np.int64))] if headers else []
    if not children:  # a leaf sends its own block as it is
        yield call.exchange(sends=up + [(parent, send)])
        return
    gathered = call.empty(total)
    call.copy(gathered[: send.size], send)
    data, offset = [], send.size
    for (child, _), size in zip(children, sizes):
        data.append((child, gathered[offset : offset + size]))
        offset += size
    yield call.exchange(sends=up, recvs=data)
    yield call.send(parent, gathered)


# ---------------------------------------------------------------- cost functions (n: the catalogue's size)


@cost("gather", "linear")
@cost("scatter", "linear")
def _rooted_linear(m: Machine, n: float, p: int) -> float:
    """(p−1)α + N(p−1)/p·β"""
    return direct_exchange(m, n * p, p)


@cost("gather", "binomial")
@cost("scatter", "binomial")
def _rooted_binomial(m: Machine, n: float, p: int) -> float:
    """lg p·α + N(p−1)/p·β"""
    a, b = m.link(p).alpha, m.link(p).beta
    total = n * p
    return ceil_lg(p) * a + total * (p - 1) / p * b


@cost("gatherv", "binomial")
@cost("scatterv", "binomial")
def _rooted_binomial_v(m: Machine, n: float, p: int) -> float:
    """lg p·α + N(p−1)/p·β, + lg p·α for the size headers"""
    return _rooted_binomial(m, n, p) + ceil_lg(p) * m.link(p).alpha
