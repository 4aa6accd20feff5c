"""mpicomm.coll.neighbor: every neighbourhood algorithm against the MPI library's own, on several topologies.

Each topology is made twice, by mpicomm (``mpicomm.Comm().Create_…``) and by
mpi4py on ``MPI.COMM_WORLD`` (the library's collectives, the reference), with
the same arguments. They cover what makes neighbourhoods hard: a neighbour
that is ``MPI.PROC_NULL`` (a non-periodic edge), one rank that is both
neighbours of a dimension (periodic, size 2) or its own neighbour (size 1),
repeated edges in a graph and a distributed graph (the k-th block to a peer
meets its k-th receive from this rank), a rank with no edges, in- and
out-degrees that differ, and receive blocks laid out in reverse with gaps.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm

from .reference import LARGE, assert_matches, counts, data, expect_everywhere, layout, unfilled

ALGORITHMS = mpicomm.algorithms("neighbor_alltoall")
COLLECTIVES = ("neighbor_allgather", "neighbor_allgatherv", "neighbor_alltoall", "neighbor_alltoallv")  # (w: below)
FORMS = ("blocking", "nonblocking", "persistent")


def _ring_graph(p: int) -> tuple[list[int], list[int]]:
    """Create_graph's (index, edges): rank r's neighbours r+1 and r−1, each twice (a symmetric multigraph: a graph
    communicator's ranks send to and receive from the same neighbours)."""
    edges: list[int] = []
    index = []
    for r in range(p):
        edges += [(r + 1) % p, (r - 1) % p, (r + 1) % p, (r - 1) % p]
        index.append(len(edges))
    return index, edges


def _out_edges(r: int, p: int) -> list[int]:
    """The distributed graph's out-edges: rank 0 has none; the others a repeated edge, a far one, themselves."""
    if r == 0:
        return []
    return [(r + 1) % p, (r + 1) % p, (r + 2) % p, r]


def _in_edges(r: int, p: int) -> list[int]:
    """The in-edges matching :func:`_out_edges`, in reverse rank order (the receive order is the receiver's)."""
    return [s for s in reversed(range(p)) for q in _out_edges(s, p) if q == r]


TOPOLOGIES = {
    "ring": lambda c: c.Create_cart([c.Get_size()], periods=[True]),
    "line": lambda c: c.Create_cart([c.Get_size()], periods=[False]),
    "grid": lambda c: c.Create_cart(MPI.Compute_dims(c.Get_size(), 2), periods=[True, False]),
    "graph": lambda c: c.Create_graph(*_ring_graph(c.Get_size())),
    "distgraph": lambda c: c.Create_dist_graph_adjacent(_in_edges(c.Get_rank(), c.Get_size()),
                                                        _out_edges(c.Get_rank(), c.Get_size())),
}


@pytest.fixture(scope="module", params=list(TOPOLOGIES))
def pair(request):
    """(mpicomm's topology communicator, the library's) over the same topology."""
    make = TOPOLOGIES[request.param]
    ours, theirs = make(mpicomm.Comm()), make(MPI.COMM_WORLD)
    yield request.param, ours, theirs
    ours.Free()
    theirs.Free()


def _size(sender: int, k: int, n: int) -> int:
    """A v-form's count for a sender's k-th block: varies with the sender and the edge (0 included)."""
    return (n + 3 * sender + 2 * k) % (n + 4) if n else 0


def _buffers(name: str, comm, n: int, dtype):
    """(sendbuf spec, a function making a receive spec around an array, receive size) for *name* at count *n*."""
    rank = comm.Get_rank()
    sources, destinations = comm.inedges, comm.outedges
    if name == "neighbor_allgather":
        return data(rank, n, dtype), (lambda out: out), n * len(sources)
    if name == "neighbor_alltoall":
        return data(rank, n * len(destinations), dtype), (lambda out: out), n * len(sources)
    if name == "neighbor_allgatherv":
        mine = _size(rank, 0, n)
        incoming = [_size(s, 0, n) if s >= 0 else 3 for s in sources]
        displs, size = layout(incoming, "reversed")
        return data(rank, mine, dtype), (lambda out: [out, (incoming, displs)]), size
    # neighbor_alltoallv: the k-th block a rank sends a peer has _size(sender, k, n) elements (the Cartesian order
    # of blocks sent and received decides k; a peer that is a neighbour once has k = 0 - only repeats differ)
    outgoing = _edge_sizes(comm, destinations, rank, n, sending=True)
    incoming = _edge_sizes(comm, sources, rank, n, sending=False)
    sdispls, ssize = layout(outgoing, "interleaved")
    rdispls, rsize = layout(incoming, "reversed")
    return [data(rank, ssize, dtype), (outgoing, sdispls)], (lambda out: [out, (incoming, rdispls)]), rsize


def _edge_sizes(comm, peers: list[int], rank: int, n: int, sending: bool) -> list[int]:
    """Per-edge counts that pair up: the same for a peer's k-th edge either way (PROC_NULL edges: any count)."""
    if comm.Get_topology() == MPI.CART:  # one edge per direction; the block sent up lands in the one from below
        return [n + (i // 2) if peer >= 0 else 2 for i, peer in enumerate(peers)]
    seen: dict[int, int] = {}
    out = []
    for peer in peers:
        k = seen[peer] = seen.get(peer, -1) + 1
        out.append(_size(rank if sending else peer, k, n))
    return out


def _run(comm, name: str, form: str, send, recv, algorithm):
    method = name[0].upper() + name[1:]
    if form == "blocking":
        getattr(comm, method)(send, recv, algorithm=algorithm)
    elif form == "nonblocking":
        getattr(comm, "I" + name)(send, recv, algorithm=algorithm).Wait()
    else:
        request = getattr(comm, method + "_init")(send, recv, algorithm=algorithm)
        for _ in range(2):
            request.Start()
            request.Wait()
        request.Free()


def _native(comm, name: str, send, recv) -> None:
    getattr(comm, name[0].upper() + name[1:])(send, recv)


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS + ["auto"])
def test_every_collective_matches_the_library(pair, algorithm):
    topology, ours, theirs = pair
    rank, p = ours.Get_rank(), ours.Get_size()
    for name in COLLECTIVES:
        for form in FORMS if algorithm != "auto" else FORMS[:1]:  # (auto is one of the others: its choice runs)
            for n in counts(p):
                for dtype in (np.int64, np.float16) if form == "blocking" else (np.int64,):
                    send, spec, size = _buffers(name, ours, n, dtype)
                    got, want = unfilled(size, dtype), unfilled(size, dtype)
                    _run(ours, name, form, send, spec(got), algorithm)
                    _native(theirs, name, send, spec(want))
                    assert_matches(got, want, f"{topology} {name} {form} n={n} {np.dtype(dtype)} rank {rank}")


#: Neighbor_alltoallw's datatypes: a sender's blocks are all of W_TYPES[sender % 4] (its receivers use the same).
W_TYPES = [MPI.INT32_T, MPI.DOUBLE, MPI.SIGNED_CHAR, MPI.INT16_T.Create_contiguous(3).Commit()]


def _wspec(sizes: list[int], types: list, buf) -> list:
    displs, _ = layout([n * t.Get_size() for n, t in zip(sizes, types)], "reversed")
    return [buf, (sizes, displs), types]


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS + ["auto"])
def test_neighbor_alltoallw_moves_each_neighbours_datatype_as_the_library(pair, algorithm):
    topology, ours, theirs = pair
    rank = ours.Get_rank()
    sources, destinations = ours.inedges, ours.outedges
    for n in (0, 1, 5):
        outgoing = _edge_sizes(ours, destinations, rank, n, sending=True)
        incoming = _edge_sizes(ours, sources, rank, n, sending=False)
        stypes = [W_TYPES[rank % 4]] * len(destinations)
        rtypes = [W_TYPES[s % 4] if s >= 0 else MPI.INT32_T for s in sources]
        ssize = layout([c * t.Get_size() for c, t in zip(outgoing, stypes)], "reversed")[1]
        rsize = layout([c * t.Get_size() for c, t in zip(incoming, rtypes)], "reversed")[1]
        send = ((np.arange(ssize) * 7 + rank * 31) % 251).astype(np.uint8)
        want = np.full(rsize, 249, np.uint8)
        theirs.Neighbor_alltoallw(_wspec(outgoing, stypes, send), _wspec(incoming, rtypes, want))
        for form in FORMS:
            got = np.full(rsize, 249, np.uint8)
            _run(ours, "neighbor_alltoallw", form, _wspec(outgoing, stypes, send), _wspec(incoming, rtypes, got),
                 algorithm)
            assert_matches(got, want, f"{topology} neighbor_alltoallw {form} n={n} rank {rank}")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_large_exchange_matches_the_library(pair, algorithm):
    topology, ours, theirs = pair
    for name in ("neighbor_alltoall", "neighbor_allgatherv"):
        send, spec, size = _buffers(name, ours, LARGE // 4, np.float64)
        got, want = unfilled(size, np.float64), unfilled(size, np.float64)
        _run(ours, name, "blocking", send, spec(got), algorithm)
        _native(theirs, name, send, spec(want))
        assert_matches(got, want, f"{topology} {name} n={LARGE // 4}")


@pytest.mark.mpi
def test_blocks_pair_by_direction_where_one_rank_is_both_neighbours():
    """A periodic dimension of size 2 (or 1): the block sent up lands in the peer's block from below."""
    comm = mpicomm.Comm()
    p, rank = comm.Get_size(), comm.Get_rank()
    if p > 2:
        pytest.skip("the size-2 periodic case needs p <= 2")
    cart = comm.Create_cart([p], periods=[True])
    for algorithm in ALGORITHMS:
        out = np.full(2, -1, np.int64)
        cart.Neighbor_alltoall(np.array([10 * rank, 10 * rank + 1], np.int64), out, algorithm=algorithm)
        peer = (rank + 1) % p
        assert out.tolist() == [10 * peer + 1, 10 * peer], algorithm  # from below: what the peer sent up
    cart.Free()


@pytest.mark.mpi
def test_mismatched_counts_raise_the_same_error_on_every_rank():
    comm = mpicomm.Comm()
    p, rank = comm.Get_size(), comm.Get_rank()
    if p < 2:
        pytest.skip("needs a neighbour")
    cart = comm.Create_cart([p], periods=[True])
    recv = np.zeros(2 * (4 if rank == p - 1 else 3), np.int64)  # the last rank expects 4 elements a block
    message = expect_everywhere(cart, lambda: cart.Neighbor_alltoall(np.zeros(6, np.int64), recv), "expects 4")
    assert f"rank {p - 1}" in message
    cart.Free()


@pytest.mark.mpi
def test_in_place_is_refused_on_every_rank():
    comm = mpicomm.Comm()
    cart = comm.Create_cart([comm.Get_size()], periods=[True])
    buf = np.zeros(4, np.int64)
    send = MPI.IN_PLACE if comm.Get_rank() == 0 else np.zeros(2, np.int64)
    expect_everywhere(cart, lambda: cart.Neighbor_allgather(send, buf), "no in-place form")
    cart.Free()


@pytest.mark.mpi
def test_an_algorithm_that_does_not_exist_is_named():
    comm = mpicomm.Comm()
    cart = comm.Create_cart([comm.Get_size()], periods=[True])
    with pytest.raises(ValueError, match="direct"):
        cart.Neighbor_allgather(np.zeros(1), np.zeros(2), algorithm="ring")
    cart.Free()
