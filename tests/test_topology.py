"""Communicators derived from an mpicomm.Comm: each an mpicomm one of its topology's class, its state built.

Every constructor (Dup, Split, Create_cart...) returns a communicator whose first mpicomm collective works
at once, which keeps mpi4py's topology methods (a Cartesian one is an ``MPI.Cartcomm`` too), and ranks left out
of it get ``MPI.COMM_NULL``, not a wrapper.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from mpicomm.state import State

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()


def works(new, members):
    """*new*'s first mpicomm collective sums this rank's world rank over *members* (world ranks, in order of
    their rank in *new*); its topology answers; Free frees it and later uses raise FreedError."""
    assert isinstance(new, mpicomm.Comm) and type(new._state) is State
    assert new.Get_size() == len(members) and members[new.Get_rank()] == RANK
    x = np.arange(5, dtype=np.int64) + 1000 * RANK
    total = np.empty_like(x)
    new.Allreduce(x, total)  # the first collective: the state was built when the communicator was made
    assert np.array_equal(total, sum(np.arange(5) + 1000 * r for r in members))
    gathered = np.empty(len(members), np.int64)
    new.Allgather(np.array([RANK], np.int64), gathered)
    assert gathered.tolist() == list(members)
    assert 0 <= new.local_rank < new.local_size and 0 <= new.node < new.nodes
    places = new.allgather((new.node, new.local_rank))
    assert len(set(places)) == new.size and sorted({n for n, _ in places}) == list(range(new.nodes))
    assert repr(new).startswith(f"<mpicomm.{type(new).__name__} rank {new.rank}/{new.size}")


def freed(new):
    new.Free()
    assert new == MPI.COMM_NULL
    with pytest.raises(mpicomm.FreedError, match="was freed"):
        new.Barrier()


def test_the_dup_family_keeps_the_class_and_builds_a_new_state(comm):
    for new in (comm.Dup(), comm.Dup(MPI.INFO_NULL), comm.Dup_with_info(MPI.INFO_NULL), comm.Clone()):
        assert type(new) is mpicomm.Comm and new._state is not comm._state
        assert new.Compare(comm) == MPI.CONGRUENT
        works(new, list(range(SIZE)))
        freed(new)


def test_split_and_split_type(comm):
    half = comm.Split(RANK % 2, key=-RANK)  # reversed order inside each half
    assert type(half) is mpicomm.Comm
    works(half, sorted(range(RANK % 2, SIZE, 2), reverse=True))
    freed(half)
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=RANK)
    assert type(node) is mpicomm.Comm
    works(node, [r for r, n in enumerate(comm.allgather(comm.node)) if n == comm.node])
    freed(node)


def test_comm_null_results_stay_comm_null(comm):
    left_out = comm.Split(MPI.UNDEFINED if RANK == 0 else 0, key=RANK)
    if RANK == 0:
        assert left_out == MPI.COMM_NULL and not isinstance(left_out, mpicomm.Comm)
    else:
        works(left_out, list(range(1, SIZE)))
        freed(left_out)
    nothing = comm.Split_type(MPI.UNDEFINED)
    assert nothing == MPI.COMM_NULL and not isinstance(nothing, mpicomm.Comm)


def test_create_and_create_group(comm):
    evens = list(range(0, SIZE, 2))
    group = comm.Get_group().Incl(evens)
    try:
        new = comm.Create(group)  # collective over comm: the odd ranks get COMM_NULL
        if RANK % 2:
            assert new == MPI.COMM_NULL and not isinstance(new, mpicomm.Comm)
        else:
            assert type(new) is mpicomm.Comm
            works(new, evens)
            freed(new)
            made = comm.Create_group(group, tag=7)  # collective over the group only
            assert type(made) is mpicomm.Comm
            works(made, evens)
            freed(made)
    finally:
        group.Free()


def test_create_cart_is_a_cartcomm_that_shifts(comm):
    cart = comm.Create_cart([SIZE], periods=[True])
    assert type(cart) is mpicomm.CartComm
    assert isinstance(cart, mpicomm.Comm) and isinstance(cart, MPI.Cartcomm)
    works(cart, list(range(SIZE)))
    assert cart.Get_coords(cart.rank) == [RANK] and cart.dims == [SIZE] and cart.periods == [True]
    assert cart.Shift(0, 1) == ((RANK - 1) % SIZE, (RANK + 1) % SIZE)
    assert cart.Get_topo() == ([SIZE], [True], [RANK])
    assert cart.neighbor_allgather(RANK) == [(RANK - 1) % SIZE, (RANK + 1) % SIZE]  # mpi4py's, on the same handle
    for new in (cart.Dup(), cart.Clone(), cart.Sub([True])):
        assert type(new) is mpicomm.CartComm and new.Shift(0, 1) == cart.Shift(0, 1)
        works(new, list(range(SIZE)))
        freed(new)
    freed(cart)


def test_a_2d_grid_and_its_rows(comm):
    dims = MPI.Compute_dims(SIZE, 2)
    grid = comm.Create_cart(dims, periods=[False, False])
    assert type(grid) is mpicomm.CartComm
    works(grid, list(range(SIZE)))  # reorder=False: grid rank = world rank
    row, col = grid.Get_coords(grid.rank)
    up, down = grid.Shift(0, 1)
    assert up == (grid.Get_cart_rank([row - 1, col]) if row > 0 else MPI.PROC_NULL)
    assert down == (grid.Get_cart_rank([row + 1, col]) if row < dims[0] - 1 else MPI.PROC_NULL)
    across = grid.Sub([False, True])  # the ranks of this row
    assert type(across) is mpicomm.CartComm and across.dims == [dims[1]]
    works(across, [grid.Get_cart_rank([row, c]) for c in range(dims[1])])
    freed(across)
    freed(grid)


@pytest.mark.mpi(min_size=2)
def test_ranks_off_the_grid_get_comm_null(comm):
    cart = comm.Create_cart([SIZE - 1])
    if RANK == SIZE - 1:
        assert cart == MPI.COMM_NULL and not isinstance(cart, mpicomm.Comm)
    else:
        assert type(cart) is mpicomm.CartComm
        works(cart, list(range(SIZE - 1)))
        freed(cart)
    graph = comm.Create_graph(list(range(1, SIZE)), [(i + 1) % (SIZE - 1) for i in range(SIZE - 1)])
    if RANK == SIZE - 1:
        assert graph == MPI.COMM_NULL and not isinstance(graph, mpicomm.Comm)
    else:
        assert type(graph) is mpicomm.GraphComm
        works(graph, list(range(SIZE - 1)))
        freed(graph)


def test_create_graph_is_a_graphcomm(comm):
    index = list(range(1, SIZE + 1))  # node i: one edge, to i + 1 (a directed ring)
    edges = [(i + 1) % SIZE for i in range(SIZE)]
    graph = comm.Create_graph(index, edges)
    assert type(graph) is mpicomm.GraphComm and isinstance(graph, MPI.Graphcomm)
    works(graph, list(range(SIZE)))
    assert graph.Get_neighbors(RANK) == [(RANK + 1) % SIZE] and graph.Get_dims() == (SIZE, SIZE)
    dup = graph.Dup()
    assert type(dup) is mpicomm.GraphComm and dup.Get_topo() == graph.Get_topo()
    works(dup, list(range(SIZE)))
    freed(dup)
    freed(graph)


def test_create_dist_graph_is_a_distgraphcomm(comm):
    before, after = (RANK - 1) % SIZE, (RANK + 1) % SIZE
    adjacent = comm.Create_dist_graph_adjacent([before], [after])
    given = comm.Create_dist_graph([RANK], [1], [after])  # each rank gives its own outgoing edge
    for graph in (adjacent, given):
        assert type(graph) is mpicomm.DistGraphComm and isinstance(graph, MPI.Distgraphcomm)
        works(graph, list(range(SIZE)))
        assert graph.Get_dist_neighbors_count() == (1, 1, False)
        assert graph.Get_dist_neighbors()[:2] == ([before], [after])
        assert graph.neighbor_allgather(RANK) == [before]
        dup, request = graph.Idup()
        request.Wait()
        assert type(dup) is mpicomm.DistGraphComm
        works(dup, list(range(SIZE)))
        freed(dup)
        freed(graph)


def test_comm_of_a_topology_is_its_class():
    cart = WORLD.Create_cart([SIZE])
    wrapped = mpicomm.Comm(cart)
    assert type(wrapped) is mpicomm.CartComm and wrapped.Shift(0, 1) == cart.Shift(0, 1)
    assert mpicomm.CartComm(cart)._state is wrapped._state  # one state per communicator
    works(wrapped, list(range(SIZE)))
    with pytest.raises(TypeError, match="CartComm wraps a communicator with a Cartesian topology"):
        mpicomm.CartComm(WORLD)
    with pytest.raises(TypeError, match=r"Create_cart"):
        mpicomm.CartComm()
    freed(wrapped)


def test_the_state_is_an_instance_attribute_only():
    """The collectives' hot path reads ``self._state`` as a plain instance attribute: no class attribute,
    property or ``__getattr__`` in the way."""
    for cls in (mpicomm.Comm, mpicomm.CartComm, mpicomm.GraphComm, mpicomm.DistGraphComm):
        assert not any("_state" in vars(k) for k in cls.__mro__)
        assert not any("__getattr__" in vars(k) for k in cls.__mro__)
