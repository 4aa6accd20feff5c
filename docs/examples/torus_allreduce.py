"""Bring your own algorithm: an allreduce on a 2-D torus of ranks, registered as ``torus2d``.

An mpicomm algorithm is a function that *describes* one rank's part of a
collective to a :class:`mpicomm.schedule.Builder` - rounds of sends and
receives of views of the call's buffers, then copies and combines - and never
touches MPI itself. Register it with :func:`mpicomm.register_algorithm` (its
docstring states its steps and restrictions), give the cost model its formula
with :func:`mpicomm.register_cost` (the function computes it, its docstring
states it in words), and it is selectable (``algorithm="torus2d"``,
``comm.set_algorithm("allreduce", "torus2d")``,
``MPICOMM_ALLREDUCE_ALGORITHM=torus2d``), validated, traced, run blocking,
nonblocking and persistent, printed and checked like the built-in ones.

Every process of a job must know the algorithm, so name this module in the
environment; run from the repository root (``docs.examples`` is a package
there)::

    export MPICOMM_ALGORITHM_MODULES=docs.examples.torus_allreduce
    mpiexec -n 4 python my_program.py          # comm.Allreduce(x, y, algorithm="torus2d")

    # its schedule on every rank of p = 4, and the check that every message meets its receive
    python -m mpicomm algorithms --schedule allreduce torus2d -p 4 --count 8 --module docs.examples.torus_allreduce
    # ... drawn as a space-time diagram
    python -m mpicomm algorithms --schedule allreduce torus2d -p 6 --count 12 --plot torus.png \\
        --module docs.examples.torus_allreduce
    # against the MPI library's own Allreduce at p = 2 … 6 (p = 5 is refused: prime)
    python -m mpicomm verify allreduce torus2d -p 2..6 --module docs.examples.torus_allreduce

(``--module`` sets ``MPICOMM_ALGORITHM_MODULES`` for the command and the MPI
jobs it starts.) A program may also just ``import docs.examples.torus_allreduce``
before its first collective, on every rank.
"""

from __future__ import annotations

import math

from mpicomm import register_algorithm, register_cost
from mpicomm.model import Machine
from mpicomm.schedule import Builder, View

__all__ = ["grid", "torus2d"]


def grid(p: int) -> tuple[int, int]:
    """``(rows, cols)`` of the torus: rows the largest divisor of *p* that is at most √p, cols = p / rows.

    A prime p > 3 has no such grid but 1 × p - a plain ring, which the
    built-in ``ring`` already is - so it raises ValueError (p ≤ 3: the ring is
    the torus).
    """
    if p < 1:
        raise ValueError(f"torus2d: p = {p} is not a number of ranks")
    rows = max(d for d in range(1, math.isqrt(p) + 1) if p % d == 0)
    if rows == 1 and p > 3:
        raise ValueError(f"torus2d needs p = rows x cols with rows >= 2, but p = {p} is prime; use allreduce "
                         f"algorithm 'ring' (the 1 x p torus) or 'auto' on {p} ranks")
    return rows, p // rows


def _blocks(count: int, k: int) -> list[tuple[int, int]]:
    """*count* elements cut into *k* blocks ``(start, stop)``, the first ``count % k`` one element larger."""
    q, r = divmod(count, k)
    starts = [i * q + min(i, r) for i in range(k + 1)]
    return [(starts[i], starts[i + 1]) for i in range(k)]


class _Scratch:
    """Two receive buffers used in turn, so the next block's receive is in flight while this one is combined."""

    def __init__(self, s: Builder, width: int):
        self.buffers = (s.empty(width), s.empty(width))
        self.turn = 0

    def next(self, size: int) -> View:
        self.turn ^= 1
        return self.buffers[self.turn][:size]


def _ring(s: Builder, members: list[int], me: int, blocks: list[View], scratch: _Scratch | None) -> None:
    """A ring among the ranks *members* (this rank is ``members[me]``) over *blocks*, one per member.

    With *scratch*: a reduce-scatter - in step k send block (me − k − 1) right,
    receive block (me − k − 2) from the left into scratch and combine it into
    this rank's copy; after k − 1 steps block *me* is reduced over the members.
    Without: an allgather - step k forwards block (me − k) and receives block
    (me − k − 1) in place.
    """
    k = len(members)
    right, left = members[(me + 1) % k], members[(me - 1) % k]
    for step in range(k - 1):
        if scratch is not None:
            out, into = blocks[(me - step - 1) % k], blocks[(me - step - 2) % k]
            incoming = scratch.next(into.size)
            s.exchange(sends=[(right, out)], recvs=[(left, incoming)])
            s.combine(incoming, into, into)
        else:
            s.exchange(sends=[(right, blocks[(me - step) % k])], recvs=[(left, blocks[(me - step - 1) % k])])


@register_algorithm("allreduce", "torus2d", commutative_only=True)
def torus2d(s: Builder, send: View, recv: View) -> None:
    """2-D torus: ring reduce-scatter along each row, then along each column, then the allgathers back.

    Steps: lay the p ranks out as a rows × cols grid (:func:`grid`: rows the
    largest divisor of p up to √p; rank r sits in row r // cols, column
    r mod cols) and cut the vector into cols blocks. (1) Ring reduce-scatter
    along the row: after cols − 1 steps rank (i, j) holds block j reduced over
    its row. (2) Ring reduce-scatter of block j along column j, cut into rows
    sub-blocks: after rows − 1 steps rank (i, j) holds sub-block i of block j
    reduced over all p ranks. (3) Ring allgather of those sub-blocks along the
    column: block j whole. (4) Ring allgather of the blocks along the row: the
    whole vector. Received partials go through two scratch buffers used in
    turn, so the next receive is in flight while the last one is combined.
    Restrictions: commutative ops only (each ring combines in ring order); p
    must not be prime unless p ≤ 3 (1 × p is the plain ring: raises
    ValueError); any count (count < cols leaves blocks empty); works in place.
    """
    s.copy(recv, send)
    rows, cols = grid(s.p)
    n = recv.size
    if s.p == 1 or n == 0:
        return
    i, j = divmod(s.rank, cols)
    row = [i * cols + c for c in range(cols)]
    column = [r * cols + j for r in range(rows)]
    blocks = [recv[a:b] for a, b in _blocks(n, cols)]
    scratch = _Scratch(s, max(block.size for block in blocks))
    _ring(s, row, j, blocks, scratch)  # (1) block j reduced over row i
    mine = blocks[j]
    pieces = [mine[a:b] for a, b in _blocks(mine.size, rows)]
    _ring(s, column, i, pieces, scratch)  # (2) sub-block i of block j reduced over everything
    _ring(s, column, i, pieces, None)  # (3) block j whole, on every rank of column j
    _ring(s, row, j, blocks, None)  # (4) every block, on every rank


@register_cost("allreduce", "torus2d")
def _torus2d_cost(m: Machine, n: float, p: int) -> float:
    """2(R+C−2)·α + 2n(p−1)/p·β + n(p−1)/p·γ  (R × C = p: the ring's bandwidth in R + C − 2 steps instead of
    p − 1; infinite for a prime p > 3, where it cannot run)

    A cost function must not raise: the costs of compositions take the cheapest registered algorithm of each
    level.
    """
    try:
        rows, cols = grid(p)
    except ValueError:
        return math.inf
    link = m.link(p)
    return 2 * (rows + cols - 2) * link.alpha + 2 * n * (p - 1) / p * link.beta + n * (p - 1) / p * m.gamma
