"""apps.stencil.halo: every ghost facing a neighbour gets the neighbour's cell, nothing else is touched, in every mode."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import kernels
from apps.stencil.grid import Grid, Layout
from apps.stencil.halo import MODES, HaloExchange, face_boxes


def _value(index: np.ndarray, k: int, dims: int) -> np.ndarray:
    return index.astype(np.float64) * 10.0 ** (3 * (dims - 1 - k))


def _field(grid: Grid, dims: int) -> np.ndarray:
    """Global-position-dependent values on the owned cells, NaN in the ghosts."""
    u = np.full(grid.shape, np.nan)
    total = 0
    for k in range(dims):
        shape = [1] * dims
        shape[k] = grid.shape[k]
        total = total + _value(grid.global_indices(k), k, dims).reshape(shape)
    own = tuple(slice(a, b) for a, b in grid.interior)
    u[own] = (total + 0.5 * np.ones(grid.shape))[own]
    return u, total + 0.5


@pytest.mark.mpi
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dims,size,width", [(2, 11, 1), (2, 12, 2), (3, 7, 1)])
@pytest.mark.parametrize("path", ["numpy", "compiled"])
def test_ghosts_hold_the_neighbours_cells(mode, dims, size, width, path):
    if not kernels.available(path)[0]:
        pytest.skip(kernels.available(path)[1])
    comm = MPI.COMM_WORLD
    grid = Grid(comm, Layout(dims, size, (0, size), (width, size - width), width))
    try:
        halo = HaloExchange(grid, kernels.select(path), np.float64, mode)
        u, truth = _field(grid, dims)
        for _ in range(2):  # the plan is reused
            halo.exchange(u)
        want = np.full(grid.shape, np.nan)
        own = tuple(slice(a, b) for a, b in grid.interior)
        want[own] = truth[own]
        for i, (_, ghost) in enumerate(face_boxes(grid)):
            k, side = divmod(i, 2)
            if grid.has_neighbour(k, side):
                g = tuple(slice(a, b) for a, b in ghost)
                want[g] = truth[g]
        assert np.array_equal(u, want, equal_nan=True)
        halo.free()
    finally:
        grid.free()


@pytest.mark.mpi
def test_overlap_split_phase_and_misuse():
    comm = MPI.COMM_WORLD
    grid = Grid(comm, Layout(2, 10, (0, 10), (1, 9), 1))
    try:
        halo = HaloExchange(grid, kernels.select("numpy"), np.float64, "overlap")
        with pytest.raises(RuntimeError, match="without start"):
            halo.finish(np.zeros(grid.shape))
        u, _ = _field(grid, 2)
        halo.start(u)
        halo.finish(u)
        halo.free()
        with pytest.raises(ValueError, match="halo mode 'sideways'"):
            HaloExchange(grid, kernels.select("numpy"), np.float64, "sideways")
    finally:
        grid.free()
