"""Gather algorithms: the root ends with every rank's block, each at its displacement.

Signature: ``algorithm(s, send, recv, counts, displs)`` for gather and gatherv
alike: *s* is the :class:`~mpicomm.schedule.Builder` the algorithm describes
its rounds to, *send* this rank's block (a view); *recv*, *counts* and
*displs* (elements, per rank) matter on the root only. For gather the counts
are known everywhere (all equal); for gatherv they are None off the root. In
place, the root's *send* is its own block of *recv* (the same memory: the
copy into place drops out). n = bytes gathered at the root (all p blocks),
p = ranks; relative ranks ``vrank = (rank − root) mod p`` make any root look
like rank 0.

Where counts are unknown off the root (the v-variant), children announce their
subtrees' sizes in one-element int64 headers; a rank that has to size a
receive from them describes the rest of its schedule once they are in
(:attr:`~mpicomm.schedule.Schedule.then`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..model import Machine, ceil_lg, direct_exchange
from ..registry import cost, register
from ..schedule import Builder, View
from .patterns import binomial as binomial_tree

__all__ = ["linear", "binomial", "span", "block"]

_INT64 = np.dtype(np.int64)


def block(buf: View, counts: Sequence[int], displs: Sequence[int], r: int) -> View:
    """Rank *r*'s block of *buf*: elements ``displs[r] … displs[r] + counts[r] − 1`` (a view)."""
    return buf.part(displs[r], displs[r] + counts[r])


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


def constants(s: Builder, values: Sequence[int], text: str) -> View:
    """An int64 scratch buffer holding *values* (written by a local step in the current round)."""
    values = [int(v) for v in values]
    view = s.empty(len(values), _INT64)
    s.local(lambda run: store(run, view, values), f"{text}: {values} into {view}", reads=(), writes=(view,))
    return view


def store(run: Any, view: View, values: Sequence[int]) -> None:
    """Write int64 *values* into a run's *view* (a header to send; host or device scratch)."""
    x = run.program.buffers[view.buf][view.start : view.stop]
    host = np.asarray(values, _INT64)
    if type(x) is np.ndarray:
        np.copyto(x, host)
    else:  # CuPy
        x.set(host)


def read_ints(run: Any, view: View) -> list[int]:
    """The int64 values a run holds in *view* (a header received; host or device scratch)."""
    x = run.program.buffers[view.buf][view.start : view.stop]
    return [int(v) for v in (x if type(x) is np.ndarray else x.get())]


@register("gather", "linear")
@register("gatherv", "linear")
def linear(s: Builder, send: View, recv: View, counts: Sequence[int] | None, displs: Sequence[int] | None) -> None:
    """Linear: every rank sends its block straight to the root.

    Steps: the root copies its own block into place and posts p − 1 receives,
    each straight into the sender's block of *recv* at its displacement;
    every other rank sends its block to the root.
    Restrictions: none (any p, any counts and displacements); works in place.
    """
    if s.rank != s.root:
        s.send(s.root, send)
        return
    assert counts is not None and displs is not None  # known at the root, gatherv too
    s.copy(block(recv, counts, displs, s.root), send)
    recvs = [(r, block(recv, counts, displs, r)) for r in range(s.p) if r != s.root]
    if recvs:
        s.exchange(recvs=recvs)


@register("gather", "binomial")
@register("gatherv", "binomial")
def binomial(s: Builder, send: View, recv: View, counts: Sequence[int] | None, displs: Sequence[int] | None) -> None:
    """Binomial tree: each rank gathers its subtree's blocks and sends them to its parent in one message.

    Steps: relative rank v keeps its own block followed by its children's
    subtrees (:func:`~mpicomm.coll.patterns.binomial`), so a scratch buffer
    holds the blocks of relative ranks v … v + subtree − 1 back to back; once
    the children's messages are in, it sends the lot to its parent. For
    gatherv the counts are unknown off the root, so every child first sends
    its subtree's element count (an int64 header) and a parent sizes its
    receives from them: it receives the headers, then describes the rest of
    its schedule from their values (the root, knowing the counts, posts
    header and data receives together). The root receives a child's subtree
    straight into *recv* when those blocks lie back to back there in
    relative-rank order, else into scratch, then copies each block to its
    displacement.
    Restrictions: none (any p, root, counts, displacements in any order with
    gaps); works in place.
    """
    node = binomial_tree(s.vrank, s.p)
    # children in relative-rank order (the tree lists them largest subtree first): their subtrees follow
    # this rank's block in that order
    children = [(s.real_rank(c), [s.real_rank(v) for v in range(c, c + size)]) for c, size in reversed(node.children)]
    headers = s.collective == "gatherv"  # off the root nobody knows the counts: children announce them
    heard = s.empty(len(children), _INT64) if headers and children else None
    header_recvs = ([(child, heard.part(i, i + 1)) for i, (child, _) in enumerate(children)]
                    if heard is not None else [])

    if node.parent is None:  # the root: every block to its displacement
        assert counts is not None and displs is not None
        s.copy(block(recv, counts, displs, s.rank), send)
        data, unpack = [], []
        for child, ranks in children:
            run = span(ranks, counts, displs)
            if run is not None:
                data.append((child, recv.part(run[0], run[1])))
            else:
                scratch = s.empty(sum(counts[r] for r in ranks))
                data.append((child, scratch))
                unpack.append((ranks, scratch))
        if data:
            s.exchange(recvs=header_recvs + data)
        for ranks, scratch in unpack:
            offset = 0
            for r in ranks:
                s.copy(block(recv, counts, displs, r), scratch.part(offset, offset + counts[r]))
                offset += counts[r]
        return

    parent = s.real_rank(node.parent)
    if not children:  # a leaf sends its own block as it is (gatherv: its size first)
        header = [(parent, constants(s, [send.size], "the size header"))] if headers else []
        s.exchange(sends=header + [(parent, send)])
        return
    if counts is not None:  # gather: every size is known
        sizes = [sum(counts[r] for r in ranks) for _, ranks in children]
        up = constants(s, [send.size + sum(sizes)], "the size header") if headers else None
        _forward(s, parent, send, children, sizes, header_recvs, up)
        return
    # gatherv off the root: the subtrees' sizes arrive first; the rest is described once they are known
    assert heard is not None
    s.exchange(recvs=header_recvs)
    up = s.empty(1, _INT64)
    heard_sizes: list[int] = []  # filled in when the headers are in (one plan's runs never overlap)

    def hear(run: Any) -> None:
        heard_sizes[:] = read_ints(run, heard)
        store(run, up, [send.size + sum(heard_sizes)])

    s.local(hear, f"read the children's sizes from {heard}; their sum with the own block's into {up}",
            reads=(heard,), writes=(up,))
    s.then = lambda b: _forward(b, parent, send, children, heard_sizes, [], up)


def _forward(s: Builder, parent: int, send: View, children: list[tuple[int, list[int]]], sizes: Sequence[int],
             header_recvs: list[tuple[int, View]], up: View | None) -> None:
    """An inner rank of the tree: receive the children's subtrees after the own block, send the lot up
    (with the size header *up* in front of it, if given)."""
    total = send.size + sum(sizes)
    gathered = s.empty(total)
    s.copy(gathered.part(0, send.size), send)
    data, offset = [], send.size
    for (child, _), size in zip(children, sizes):
        data.append((child, gathered.part(offset, offset + size)))
        offset += size
    s.exchange(sends=[(parent, up)] if up is not None else [], recvs=header_recvs + data)
    s.send(parent, gathered)


# ---------------------------------------------------------------- cost functions (n: the catalogue's size)


@cost("gather", "linear")
@cost("scatter", "linear")
def _rooted_linear(m: Machine, n: float, p: int) -> float:
    """(p−1)α + N(p−1)/p·β  (N = n·p, every block; at the root)"""
    return direct_exchange(m, n * p, p)


@cost("gather", "binomial")
@cost("scatter", "binomial")
def _rooted_binomial(m: Machine, n: float, p: int) -> float:
    """lg p·α + N(p−1)/p·β  (N = n·p, every block)"""
    a, b = m.link(p).alpha, m.link(p).beta
    total = n * p
    return ceil_lg(p) * a + total * (p - 1) / p * b


@cost("gatherv", "binomial")
@cost("scatterv", "binomial")
def _rooted_binomial_v(m: Machine, n: float, p: int) -> float:
    """lg p·α + N(p−1)/p·β, + lg p·α for the count headers  (N = n·p, every block; off the root nobody knows the
    counts: gatherv's children send theirs up, scatterv's parents send them down)"""
    return _rooted_binomial(m, n, p) + ceil_lg(p) * m.link(p).alpha
