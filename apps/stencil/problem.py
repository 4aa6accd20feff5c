"""The problems the stencil application solves, each with an answer known in closed form.

``heat`` — the heat equation u_t = Δu on the unit square (cube), zero on the
boundary, explicit Euler with ``c = κ·dt/h²`` (default ``1/(2d)``, where the
update is Jacobi's iteration for Laplace's equation)::

    v[p] = u[p] + c · (Σ_axis-neighbours u − 2d · u[p])

Initial field u₀ = Π_k sin(π x_k) at x = i·h, h = 1/(n+1). It is an
eigenvector of the discrete Laplacian: each neighbour pair gives
sin(π(x−h)) + sin(π(x+h)) = 2 cos(πh) · sin(πx), so one step multiplies the
field by exactly ``g = 1 − 4·d·c·sin²(πh/2)`` and after T steps
``u_T = g^T · u₀``. The check at the end is therefore against the *discrete*
solution: its error is rounding only (about T·ε), which catches any misplaced
halo cell, where a continuous manufactured solution would hide it under the
O(h²) discretization error.

``star`` — the Parallel Research Kernels' "Stencil" (2-D): a star of radius r,
weights ±1/(2·k·r) at offsets ±k along each axis; ``in[i, j] = i + j``,
``out = 0``; each iteration ``out += stencil(in)`` on the cells at least r from
the edge, then ``in += 1`` everywhere. The stencil of i + j is exactly
1 per axis, so after T iterations every updated cell holds 2·T and the L1 norm
per updated cell is 2·T (PRK's validation).

A problem gives the layout (what is split, what is updated, the halo width),
the initial fields, the step, the bytes and flops per updated point, and the
verification.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels.checks import slices

from .grid import Grid, Layout, cells

__all__ = ["PROBLEMS", "Heat", "Star", "make", "Verdict"]

PROBLEMS = ("heat", "star")


@dataclass
class Verdict:
    passed: bool
    error: float  #: relative error against the closed form
    tolerance: float
    what: str  #: what was compared, for the report


class Heat:
    """The heat equation with the discrete-eigenvector solution (2-D 5-point or 3-D 7-point)."""

    name = "heat"
    fields = ("u",)

    def __init__(self, dims: int, size: int, c: float | None = None):
        self.dims, self.n = dims, size
        self.c = 1.0 / (2 * dims) if c is None else float(c)
        if not 0.0 < self.c <= 1.0 / (2 * dims):
            raise ValueError(f"--c {self.c}: explicit Euler is stable for 0 < c <= 1/(2·{dims}) = {1 / (2 * dims):g}")
        self.h = 1.0 / (size + 1)
        self.g = 1.0 - 4.0 * dims * self.c * math.sin(math.pi * self.h / 2) ** 2
        self.layout = Layout(dims=dims, extent=size + 2, owned=(1, size + 1), update=(1, size + 1), width=1)

    def points(self) -> int:
        """Cells updated per iteration, all ranks together."""
        return self.n ** self.dims

    def bytes_per_point(self, itemsize: int) -> int:
        """Memory traffic per update with normal stores: read u, write-allocate v, write v."""
        return 3 * itemsize

    def flops_per_point(self) -> int:
        return 2 * self.dims + 3  # 2d−1 adds for the neighbours, 2d·u, subtract, times c, add

    def _initial_owned(self, grid: Grid) -> np.ndarray:
        """u₀ on this rank's owned cells (host), the same bits whatever the decomposition."""
        field = None
        for k in range(self.dims):
            lo = grid.lo[k]
            s = np.sin(np.pi * np.arange(lo, lo + grid.size[k], dtype=np.float64) * self.h)
            shape = [1] * self.dims
            shape[k] = grid.size[k]
            s = s.reshape(shape)
            field = s if field is None else field * s
        return field

    def initial(self, grid: Grid, xp: Any, dtype: Any) -> dict[str, Any]:
        u = np.zeros(grid.shape, dtype)
        u[grid.owned] = self._initial_owned(grid)
        return {"u": xp.asarray(u)}

    def step(self, k: Any, f: dict[str, Any], spare: dict[str, Any], box, residual: bool) -> float | None:
        """One update of *box* from ``f['u']`` into ``spare['u']`` (the solver swaps them after)."""
        return k.heat(f["u"], spare["u"], self.c, box, residual=residual)

    def after(self, k: Any, f: dict[str, Any], grid: Grid) -> None:
        """Nothing: the new field is the spare one (swapped by the solver)."""

    swaps = True
    exchanged = "u"

    def verify(self, comm: Any, grid: Grid, f: dict[str, Any], iterations: int) -> Verdict:
        from mpi4py import MPI

        u = f["u"]
        owned = grid.owned_host(u)
        expected = self._initial_owned(grid) * self.g ** iterations
        local = float(np.max(np.abs(owned - expected))) if owned.size else 0.0
        error = comm.allreduce(local, op=MPI.MAX) / max(self.g ** iterations, 1e-300)
        # rounding only: a few units in the last place of the run's dtype per step (float32 starts rounded, too)
        tolerance = 64 * np.finfo(owned.dtype).eps * (iterations + 1)
        return Verdict(bool(error <= tolerance), float(error), float(tolerance), f"max |u - g^T·u0| / g^T, g = {self.g:.12g}")


class Star:
    """The PRK star stencil of radius r (2-D), validated by its L1 norm."""

    name = "star"
    fields = ("in", "out")
    swaps = False
    exchanged = "in"

    def __init__(self, dims: int, size: int, radius: int = 2):
        if dims != 2:
            raise ValueError(f"--problem star is 2-D (the Parallel Research Kernels' Stencil): use --dims 2, not {dims}")
        if radius < 1:
            raise ValueError(f"--radius {radius}: must be >= 1")
        if size < 2 * radius + 1:
            raise ValueError(f"--size {size} with --radius {radius}: need at least 2·r+1 = {2 * radius + 1} cells per side")
        self.dims, self.n, self.r = dims, size, radius
        self.layout = Layout(dims=2, extent=size, owned=(0, size), update=(radius, size - radius), width=radius)

    def points(self) -> int:
        return (self.n - 2 * self.r) ** 2

    def bytes_per_point(self, itemsize: int) -> int:
        """read in, read and write out; then in += 1: read and write in."""
        return 5 * itemsize

    def flops_per_point(self) -> int:
        return 2 * (4 * self.r + 1) + 1  # PRK's count

    def initial(self, grid: Grid, xp: Any, dtype: Any) -> dict[str, Any]:
        i = grid.global_indices(0).astype(dtype).reshape(-1, 1)
        j = grid.global_indices(1).astype(dtype).reshape(1, -1)
        inp = np.zeros(grid.shape, dtype)
        inp[grid.owned] = (i + j)[grid.owned]
        return {"in": xp.asarray(inp), "out": xp.zeros(grid.shape, dtype)}

    def step(self, k: Any, f: dict[str, Any], spare: dict[str, Any] | None, box, residual: bool) -> float | None:
        return k.star(f["in"], f["out"], self.r, box)

    def after(self, k: Any, f: dict[str, Any], grid: Grid) -> None:
        """``in += 1`` on the owned cells (ghosts arrive with the next exchange)."""
        f["in"][grid.owned] += 1

    def verify(self, comm: Any, grid: Grid, f: dict[str, Any], iterations: int) -> Verdict:
        from mpi4py import MPI

        out = f["out"]
        box = grid.update
        part = out[slices(box)]
        local = float(abs(part).sum(dtype=np.float64)) if cells(box) else 0.0
        norm = comm.allreduce(local, op=MPI.SUM) / self.points()
        expected = 2.0 * iterations
        error = abs(norm - expected) / max(expected, 1.0)
        tolerance = 1e-8 if out.dtype == np.float64 else 1e-4
        return Verdict(bool(error <= tolerance), float(error), float(tolerance), f"L1 norm per point {norm:.10g}, expected 2·T = {expected:g}")


def make(name: str, dims: int, size: int, radius: int = 2, c: float | None = None):
    """The problem called *name* (:data:`PROBLEMS`)."""
    if size < 1:
        raise ValueError(f"--size {size}: must be >= 1")
    if name == "heat":
        return Heat(dims, size, c)
    if name == "star":
        return Star(dims, size, radius)
    raise ValueError(f"--problem {name!r}: expected one of {', '.join(PROBLEMS)}")
