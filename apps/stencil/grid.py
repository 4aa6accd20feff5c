"""The decomposition of a structured grid over a Cartesian communicator.

Vocabulary (used by every module of the stencil application):

* the **global array** has ``extent`` cells per dimension; the cells of the
  ``owned`` range ``[a, b)`` (the same in every dimension) are split among the
  ranks in near-equal blocks (:func:`apps.blocks.block`: the first ``n mod p``
  blocks get one cell more), so any rank count and any grid size that leaves every rank at least
  ``width`` cells works, square or not;
* each rank's **local array** is its block plus ``width`` ghost cells on every
  side (the stencil's radius): ghosts facing a neighbour are filled by the halo
  exchange, ghosts on the physical boundary hold boundary values;
* a **box** is a tuple of ``(lo, hi)`` per dimension in local array indices
  (``hi`` exclusive), the unit the kernels and the halo plan work in.

``MPI.Compute_dims`` picks the rank grid (3 ranks in 2-D: 3 × 1), the
Cartesian communicator's ``Shift`` gives each dimension's lower and upper
neighbour (``MPI.PROC_NULL`` at the physical boundary).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from mpi4py import MPI

from apps.blocks import block
from kernels.checks import slices

__all__ = ["Box", "Layout", "Grid", "shrink", "strips", "slabs", "cells"]

Box = tuple[tuple[int, int], ...]


def cells(box: Box) -> int:
    """Number of cells in *box* (0 when empty)."""
    count = 1
    for lo, hi in box:
        count *= max(0, hi - lo)
    return count


def shrink(box: Box, by: tuple[tuple[int, int], ...]) -> Box:
    """*box* with ``by[k] = (low, high)`` cells taken off each side of dimension k (never inverted)."""
    out = []
    for (lo, hi), (a, b) in zip(box, by):
        new_lo = min(lo + a, hi)
        out.append((new_lo, max(hi - b, new_lo)))
    return tuple(out)


def strips(outer: Box, inner: Box) -> list[Box]:
    """Disjoint boxes covering *outer* minus *inner* (*inner* inside *outer*), dimension by dimension.

    In 2-D: the full-width low and high strips of dimension 0, then the low and
    high strips of dimension 1 between them; no cell twice, none left out.
    """
    out, current = [], list(outer)
    for k, ((lo, hi), (ilo, ihi)) in enumerate(zip(outer, inner)):
        if ilo > lo:
            out.append(tuple(current[:k] + [(lo, ilo)] + current[k + 1:]))
        if ihi < hi:
            out.append(tuple(current[:k] + [(ihi, hi)] + current[k + 1:]))
        current[k] = (ilo, ihi)
    return [b for b in out if cells(b)]


def slabs(box: Box, parts: int) -> list[Box]:
    """*box* cut along dimension 0 into at most *parts* near-equal slabs (:func:`apps.blocks.block`), empty ones
    left out."""
    (lo, hi), rest = box[0], tuple(box[1:])
    n = max(0, hi - lo)
    out = []
    for i in range(min(parts, n) if n else 1):
        start, stop = block(n, min(parts, n) if n else 1, i)
        out.append(((lo + start, lo + stop),) + rest)
    return [b for b in out if cells(b)] or [box]


@dataclass(frozen=True)
class Layout:
    """The global geometry of a problem: what is split, what is updated, how wide the halo is."""

    dims: int
    extent: int  #: global array cells per dimension (including physical boundary cells)
    owned: tuple[int, int]  #: global index range [a, b) split among the ranks, in every dimension
    update: tuple[int, int]  #: global index range the stencil updates, in every dimension
    width: int  #: ghost cells per side (the stencil's radius)


class Grid:
    """One rank's block of a :class:`Layout` over a Cartesian communicator (collective to build).

    Raises ``ValueError`` (the same on every rank, before any communicator is
    made) when the grid is too small for the rank grid.
    """

    def __init__(self, mpi_comm: MPI.Intracomm, layout: Layout, rank_dims: list[int] | None = None):
        d, w = layout.dims, layout.width
        p = mpi_comm.Get_size()
        if rank_dims is not None:
            given = [int(x) for x in rank_dims]
            fixed = math.prod(x for x in given if x)
            if len(given) != d or min(given) < 0 or (0 in given and p % fixed) or (0 not in given and fixed != p):
                raise ValueError(
                    f"--rank-dims {'x'.join(map(str, given))} does not fit {p} ranks in {d} dimensions: "
                    f"give {d} numbers whose product is {p} (0 lets MPI choose that one)"
                )
        dims = list(MPI.Compute_dims(p, [0] * d if rank_dims is None else list(rank_dims)))
        n_owned = layout.owned[1] - layout.owned[0]
        for k, parts in enumerate(dims):
            smallest = n_owned // parts
            if smallest < max(1, w):
                need = parts * max(1, w)
                raise ValueError(
                    f"a grid of {n_owned} cells per side split over {parts} ranks in dimension {k} "
                    f"(rank grid {' x '.join(map(str, dims))} for {p} ranks) leaves blocks of {smallest} cells, "
                    f"fewer than the stencil's radius {max(1, w)}: use --size {need} or more, or fewer ranks"
                )
        self.layout, self.dims, self.ndim, self.width = layout, dims, d, w
        self.cart: MPI.Cartcomm = mpi_comm.Create_cart(dims, periods=[False] * d, reorder=False)
        self.rank = self.cart.Get_rank()
        self.coords = tuple(self.cart.Get_coords(self.rank))
        starts, stops = zip(*(block(n_owned, dims[k], self.coords[k]) for k in range(d)))
        sizes = [b - a for a, b in zip(starts, stops)]
        #: first owned global index and owned cells per dimension
        self.lo = tuple(layout.owned[0] + s for s in starts)
        self.size = tuple(sizes)
        #: offset of this block in the owned range (where it goes in a file of the owned cells)
        self.starts = tuple(starts)
        self.shape = tuple(s + 2 * w for s in sizes)
        #: (lower, upper) neighbour per dimension; MPI.PROC_NULL at the physical boundary
        self.neighbours = tuple(tuple(self.cart.Shift(k, 1)) for k in range(d))
        #: the owned cells, in local indices
        self.interior: Box = tuple((w, w + s) for s in sizes)
        #: the cells this rank updates: the owned cells inside the global update range
        self.update: Box = tuple(
            (max(layout.update[0], lo) - lo + w, max(min(layout.update[1], lo + s), max(layout.update[0], lo)) - lo + w)
            for lo, s in zip(self.lo, self.size)
        )

    @property
    def owned(self) -> tuple[slice, ...]:
        """Slices of the owned cells in a local array."""
        return slices(self.interior)

    def owned_host(self, a: Any) -> np.ndarray:
        """A contiguous host (NumPy) copy of *a*'s owned cells; CuPy arrays are copied from the device."""
        view = a[self.owned]
        return np.ascontiguousarray(view.get() if hasattr(view, "get") else view)

    def global_indices(self, k: int) -> np.ndarray:
        """Global index of every local cell (ghosts included) along dimension *k*, as a NumPy range."""
        return np.arange(self.lo[k] - self.width, self.lo[k] - self.width + self.shape[k])

    def has_neighbour(self, k: int, side: int) -> bool:
        """Whether dimension *k*'s lower (side 0) or upper (side 1) face borders another rank."""
        return self.neighbours[k][side] != MPI.PROC_NULL

    def free(self) -> None:
        """Release the Cartesian communicator."""
        if self.cart != MPI.COMM_NULL:
            self.cart.Free()
