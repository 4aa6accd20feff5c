"""apps.stencil.grid: blocks tile the grid at any rank count, neighbours agree, strips cover exactly."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from mpi4py import MPI

from apps.stencil.grid import Grid, Layout, cells, shrink, slabs, strips


@pytest.mark.parametrize("outer,inner", [
    (((1, 9), (1, 7)), ((2, 8), (2, 6))),
    (((1, 9), (1, 7)), ((1, 8), (2, 7))),      # no neighbour below / right: nothing to strip there
    (((1, 3), (1, 3)), ((2, 2), (2, 2))),      # inner empty
    (((1, 6), (2, 5), (1, 4)), ((2, 5), (3, 4), (2, 3))),
])
def test_strips_cover_exactly_once(outer, inner):
    shape = tuple(hi + 1 for _, hi in outer)
    count = np.zeros(shape, int)
    count[tuple(slice(a, b) for a, b in inner)] += 1
    for box in strips(outer, inner):
        count[tuple(slice(a, b) for a, b in box)] += 1
    want = np.zeros(shape, int)
    want[tuple(slice(a, b) for a, b in outer)] = 1
    assert np.array_equal(count, want)


@pytest.mark.parametrize("box,parts", [(((2, 11), (1, 5)), 4), (((2, 4), (1, 5), (3, 6)), 4), (((3, 3), (1, 5)), 4)])
def test_slabs_cover_the_box_in_order(box, parts):
    pieces = slabs(box, parts)
    assert len(pieces) <= parts and sum(cells(b) for b in pieces) == cells(box)
    assert all(b[1:] == box[1:] for b in pieces)
    assert all(a[0][1] == b[0][0] for a, b in zip(pieces, pieces[1:]))


def test_shrink_never_inverts():
    assert shrink(((1, 2), (1, 5)), ((1, 1), (0, 1))) == ((2, 2), (1, 4))
    assert cells(((2, 2), (1, 4))) == 0


@pytest.mark.mpi
@pytest.mark.parametrize("dims,size,width", [(2, 7, 1), (2, 9, 2), (3, 5, 1)])
def test_blocks_tile_and_neighbours_agree(dims, size, width):
    comm = MPI.COMM_WORLD
    p = comm.Get_size()
    if size // max(MPI.Compute_dims(p, [0] * dims)) < width:
        pytest.skip(f"{size} cells cannot be split for {p} ranks at width {width}")
    grid = Grid(comm, Layout(dims, size + 2, (1, size + 1), (1, size + 1), width))
    try:
        everyone = comm.allgather((grid.lo, grid.size, grid.coords, grid.neighbours, grid.cart.Get_rank()))
        owner = -np.ones((size + 2,) * dims, int)
        for r, (lo, sz, _, _, _) in enumerate(everyone):
            region = owner[tuple(slice(a, a + s) for a, s in zip(lo, sz))]
            assert (region == -1).all(), "blocks overlap"
            region[...] = r
        assert (owner[(slice(1, size + 1),) * dims] >= 0).all(), "a cell belongs to nobody"
        by_rank = {e[4]: e for e in everyone}
        for k in range(dims):
            lower, upper = grid.neighbours[k]
            if upper != MPI.PROC_NULL:
                assert by_rank[upper][3][k][0] == grid.cart.Get_rank()
                assert by_rank[upper][0][k] == grid.lo[k] + grid.size[k]
            if lower != MPI.PROC_NULL:
                assert by_rank[lower][3][k][1] == grid.cart.Get_rank()
        assert grid.shape == tuple(s + 2 * width for s in grid.size)
        assert grid.update == grid.interior
    finally:
        grid.free()


@pytest.mark.mpi
def test_star_update_range_is_inside_radius():
    comm = MPI.COMM_WORLD
    n, r = 24, 3
    grid = Grid(comm, Layout(2, n, (0, n), (r, n - r), r))
    try:
        mine = {tuple(gl - r + lo for lo, gl in zip(idx, grid.lo))
                for idx in itertools.product(*(range(a, b) for a, b in grid.update))}
        everything = set().union(*comm.allgather(mine))
        assert everything == set(itertools.product(range(r, n - r), repeat=2))
    finally:
        grid.free()


@pytest.mark.mpi
def test_too_small_grid_is_refused_on_every_rank():
    comm = MPI.COMM_WORLD
    p = comm.Get_size()
    n = 2 * p - 1  # blocks of 1 or 2 cells over p x 1 ranks: too thin for radius 2
    with pytest.raises(ValueError, match=r"blocks of 1 cells, fewer than the stencil's radius 2: use --size \d+ or more"):
        Grid(comm, Layout(2, n, (0, n), (0, n), 2), rank_dims=[p, 1])
