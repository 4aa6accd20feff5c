"""The array-first functions (mpicomm.allreduce & co.): results, shapes, out=, comm=, algorithm=, errors.

Every result is compared with the MPI library's own collective on the same
data (``MPI.COMM_WORLD``); the algorithms themselves are tested in tests/coll.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from mpicomm import collectives, registry
from mpicomm.catalogue import COLLECTIVES
from tests.coll import reference
from tests.conftest import host, runnable

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(120)]

WORLD = MPI.COMM_WORLD
RANK, P = WORLD.Get_rank(), WORLD.Get_size()


def data(rank, shape, dtype=np.float64, xp=np):
    n = int(np.prod(shape))
    return reference.data(rank, n, dtype, xp).reshape(shape)


def assert_result(result, expected, xp, context=""):
    """Same module as the input (NumPy in, NumPy out; CuPy in, CuPy out), shape, dtype and values."""
    assert type(result) is type(xp.empty(0)), f"{context}: got {type(result)}"
    assert tuple(result.shape) == tuple(expected.shape), f"{context}: shape {result.shape} vs {expected.shape}"
    reference.assert_matches(host(result), expected, context)


def argument_error_everywhere(call, *fragments):
    """*call* raises an ArgumentError on every rank, naming the problem."""
    try:
        call()
        got = None
    except mpicomm.ArgumentError as exc:
        got = str(exc)
    everyone = WORLD.allgather(got)
    assert all(m is not None for m in everyone), everyone
    for fragment in fragments:
        assert fragment in got, (fragment, got)


@pytest.fixture
def no_allocation(monkeypatch):
    """Counts the arrays the functions allocate for results."""
    made = []
    original = collectives._new

    def counting(x, shape, dtype=None):
        made.append(shape)
        return original(x, shape, dtype)

    monkeypatch.setattr(collectives, "_new", counting)
    return made


# ---------------------------------------------------------------- reductions


@pytest.mark.parametrize("op,mpi_op", [("sum", MPI.SUM), ("max", MPI.MAX), (MPI.PROD, MPI.PROD)], ids=["sum", "max", "prod"])
def test_allreduce(comm, xp, op, mpi_op):
    x = data(RANK, (3, 5), np.float64, xp)
    expected = np.empty((3, 5))
    WORLD.Allreduce(host(x), expected, op=mpi_op)
    result = mpicomm.allreduce(x, op)
    assert_result(result, expected, xp, f"allreduce {op}")
    assert result is not x
    reference.assert_matches(host(x), host(data(RANK, (3, 5), np.float64, xp)), "input untouched")


def test_allreduce_out_and_in_place(comm, xp, no_allocation):
    x = data(RANK, (2, 3, 4), np.int64, xp)
    expected = np.empty((2, 3, 4), np.int64)
    WORLD.Allreduce(host(x), expected)
    out = xp.zeros((2, 3, 4), np.int64)
    assert mpicomm.allreduce(x, out=out) is out
    assert_result(out, expected, xp, "allreduce out=")
    assert mpicomm.allreduce(x, out=x) is x  # in place
    assert_result(x, expected, xp, "allreduce out=x")
    assert no_allocation == []


def test_allreduce_zero_size_and_scalar_shapes(comm):
    empty = np.zeros((0, 3))
    assert mpicomm.allreduce(empty).shape == (0, 3)
    scalar = np.array(float(RANK))
    result = mpicomm.allreduce(scalar)
    assert result.shape == () and result == sum(range(P))


@pytest.mark.parametrize("root", sorted({0, P // 2, P - 1}))
def test_reduce(comm, xp, root):
    x = data(RANK, (4, 3), np.int32, xp)
    expected = np.empty((4, 3), np.int32)
    WORLD.Reduce(host(x), expected, op=MPI.MIN, root=root)
    result = mpicomm.reduce(x, "min", root)
    if root == RANK:
        assert_result(result, expected, xp, "reduce")
    else:
        assert result is None
    out = xp.empty((4, 3), np.int32)
    result = mpicomm.reduce(x, MPI.MIN, root=root, out=out)
    if root == RANK:
        assert result is out
        assert_result(out, expected, xp, "reduce out=")
    else:
        assert result is None


def test_scan_and_exscan(comm, xp):
    x = data(RANK, (2, 7), np.int64, xp)
    expected = np.empty((2, 7), np.int64)
    WORLD.Scan(host(x), expected)
    assert_result(mpicomm.scan(x), expected, xp, "scan")
    WORLD.Exscan(host(x), expected)
    result = mpicomm.exscan(x)
    if RANK == 0:
        assert result is None
    else:
        assert_result(result, expected, xp, "exscan")
    out = xp.full((2, 7), -1, np.int64)
    result = mpicomm.exscan(x, out=out)
    assert result is out  # rank 0 too: out comes back, untouched
    if RANK == 0:
        assert (host(out) == -1).all()
    else:
        assert_result(out, expected, xp, "exscan out=")
    y = data(RANK, (5,), np.float64, xp)
    scanned = np.empty(5)
    WORLD.Scan(host(y), scanned, op=MPI.MAX)
    assert_result(mpicomm.scan(y, "max"), scanned, xp, "scan max")


# ---------------------------------------------------------------- bcast, gather, scatter


@pytest.mark.parametrize("root", sorted({0, P // 2, P - 1}))
def test_bcast(comm, xp, root):
    x = data(RANK, (3, 2), np.complex128, xp)
    expected = host(data(root, (3, 2), np.complex128))
    result = mpicomm.bcast(x, root)
    assert_result(result, expected, xp, "bcast")
    assert result is not x
    reference.assert_matches(host(x), host(data(RANK, (3, 2), np.complex128)), "bcast leaves x alone")
    out = xp.zeros((3, 2), np.complex128)
    assert mpicomm.bcast(x, root=root, out=out) is out
    assert_result(out, expected, xp, "bcast out=")
    y = data(RANK, (4,), np.float32, xp)
    assert mpicomm.bcast(y, root, out=y) is y  # in place: the root's y goes everywhere
    assert_result(y, host(data(root, (4,), np.float32)), xp, "bcast out=x")


@pytest.mark.parametrize("root", sorted({0, P - 1}))
def test_gather(comm, xp, root):
    x = data(RANK, (2, 3), np.int16, xp)
    expected = np.empty((P, 2, 3), np.int16)
    WORLD.Gather(host(x), expected, root=root)
    result = mpicomm.gather(x, root)
    if root == RANK:
        assert_result(result, expected, xp, "gather")
    else:
        assert result is None
    out = xp.empty((P, 2, 3), np.int16) if root == RANK else None
    result = mpicomm.gather(x, root=root, out=out)
    assert result is out


def _gatherv_expected(sizes, root):
    x = data(RANK, (sizes[RANK],))
    expected = np.empty(sum(sizes)) if root == RANK else None
    WORLD.Gatherv(x, [expected, sizes] if root == RANK else None, root=root)
    return x, expected


@pytest.mark.parametrize("given", [False, True], ids=["counts None", "counts given"])
def test_gatherv(comm, xp, given):
    root = P - 1
    sizes = [(r * 3) % 4 for r in range(P)]  # zeros included
    x, expected = _gatherv_expected(sizes, root)
    result = mpicomm.gatherv(xp.asarray(x), sizes if given else None, root)
    if root == RANK:
        assert_result(result, expected, xp, "gatherv")
    else:
        assert result is None


def test_gatherv_multidimensional_input_is_flattened(comm):
    x = data(RANK, (2, RANK + 1))
    expected = np.concatenate([data(r, (2, r + 1)).reshape(-1) for r in range(P)])
    result = mpicomm.gatherv(x, root=0)
    if RANK == 0:
        assert_result(result, expected, np, "gatherv 2-D")


#: scatter runs its default algorithm (the binomial tree reads the counts off the root too).
SCATTER = "auto"


def test_scatter_gives_the_counts_off_the_root(comm, monkeypatch):
    seen = []
    monkeypatch.setattr(collectives, "start", lambda c, args, algorithm, blocking: seen.append(args))
    root = 0
    mpicomm.scatter(data(root, (P, 3)) if root == RANK else None, root)  # the arguments only: nothing runs
    (args,) = seen
    known = args.problem is None and args.sendcounts == (3,) * P and args.senddispls == tuple(3 * i for i in range(P))
    assert all(WORLD.allgather(known))  # the same outcome on every rank


@pytest.mark.parametrize("root", sorted({0, P // 2}))
def test_scatter_non_root_without_out(comm, xp, root):
    source = data(root, (P, 3, 2), np.float32, xp)
    x = source if root == RANK else None  # off the root, nothing: the root announces dtype and shape
    expected = np.empty((3, 2), np.float32)
    WORLD.Scatter(host(source) if root == RANK else None, expected, root=root)
    result = mpicomm.scatter(x, root, algorithm=SCATTER)
    assert_result(result, expected, xp, "scatter")
    assert result.dtype == np.float32


def test_scatter_with_out_everywhere(comm, xp, no_allocation):
    root = P - 1
    source = data(root, (P, 4), np.int64, xp)
    out = xp.zeros(4, np.int64)
    result = mpicomm.scatter(source if root == RANK else None, root, out=out, algorithm=SCATTER)
    assert result is out
    assert_result(out, host(source)[RANK], xp, "scatter out=")
    assert no_allocation == []


def test_scatterv(comm, xp):
    root = P // 2
    counts = [(r + 2) % 3 for r in range(P)]
    source = data(root, (sum(counts) + 2,), np.float64, xp)  # longer than needed: allowed
    expected = np.empty(counts[RANK])
    WORLD.Scatterv([host(source), counts] if root == RANK else None, expected, root=root)
    result = mpicomm.scatterv(source if root == RANK else None, counts if root == RANK else None, root)
    assert_result(result, expected, xp, "scatterv")
    out = xp.empty(counts[RANK])
    assert mpicomm.scatterv(source if root == RANK else None, counts, root, out=out) is out
    assert_result(out, expected, xp, "scatterv out=")


def test_a_numpy_integer_root_is_the_root(comm):
    """A root given as a NumPy integer (check_peer takes one): the exchanges before the call use it too."""
    root = np.int64(P - 1)
    sizes = [r + 1 for r in range(P)]
    x, expected = _gatherv_expected(sizes, int(root))
    result = mpicomm.gatherv(x, root=root)  # without counts: the root's come from the sizes it gathered
    if root == RANK:
        assert_result(result, expected, np, "gatherv, NumPy root")
    else:
        assert result is None
    source = data(int(root), (P, 3))
    result = mpicomm.scatter(source if root == RANK else None, root)  # off the root: the root announced the shape
    assert_result(result, source[RANK], np, "scatter, NumPy root")


# ---------------------------------------------------------------- all-to-all family


def test_allgather(comm, xp, no_allocation):
    x = data(RANK, (2, 2), np.uint8, xp)
    expected = np.empty((P, 2, 2), np.uint8)
    WORLD.Allgather(host(x), expected)
    assert_result(mpicomm.allgather(x), expected, xp, "allgather")
    assert no_allocation == [(P, 2, 2)]
    out = xp.empty((P, 2, 2), np.uint8)
    assert mpicomm.allgather(x, out=out) is out
    assert_result(out, expected, xp, "allgather out=")
    assert len(no_allocation) == 1


@pytest.mark.parametrize("given", [False, True], ids=["counts None", "counts given"])
def test_allgatherv(comm, xp, given):
    sizes = [(r * 5 + 1) % 4 for r in range(P)]
    x = data(RANK, (sizes[RANK],), np.int64, xp)
    expected = np.empty(sum(sizes), np.int64)
    WORLD.Allgatherv(host(x), [expected, sizes])
    assert_result(mpicomm.allgatherv(x, sizes if given else None), expected, xp, "allgatherv")


def test_alltoall(comm, xp):
    x = data(RANK, (P, 3), np.float64, xp)
    expected = np.empty((P, 3))
    WORLD.Alltoall(host(x), expected)
    assert_result(mpicomm.alltoall(x), expected, xp, "alltoall")
    out = xp.empty((P, 3))
    assert mpicomm.alltoall(x, out=out) is out
    assert_result(out, expected, xp, "alltoall out=")
    assert mpicomm.alltoall(x, out=x) is x  # in place
    assert_result(x, expected, xp, "alltoall out=x")


@pytest.mark.parametrize("given", [False, True], ids=["recvcounts None", "recvcounts given"])
def test_alltoallv(comm, xp, given):
    sendcounts = [(RANK + 2 * j) % 3 for j in range(P)]
    recvcounts = [(i + 2 * RANK) % 3 for i in range(P)]
    x = data(RANK, (sum(sendcounts),), np.int32, xp)
    expected = np.empty(sum(recvcounts), np.int32)
    WORLD.Alltoallv([host(x), sendcounts], [expected, recvcounts])
    result = mpicomm.alltoallv(x, sendcounts, recvcounts if given else None)
    assert_result(result, expected, xp, "alltoallv")


@pytest.mark.parametrize("n", [0, 1, 2 * P + 1, 50])
def test_reduce_scatter_counts_none_gives_near_equal_blocks(comm, xp, n):
    x = data(RANK, (n,), np.int64, xp)
    counts = [n // P + (1 if i < n % P else 0) for i in range(P)]
    expected = np.empty(counts[RANK], np.int64)
    WORLD.Reduce_scatter(host(x), expected, counts)
    assert_result(mpicomm.reduce_scatter(x), expected, xp, "reduce_scatter")


def test_reduce_scatter_counts_given(comm, xp):
    counts = [(3 * r) % 5 for r in range(P)]
    x = data(RANK, (sum(counts),), np.float64, xp)
    expected = np.empty(counts[RANK])
    WORLD.Reduce_scatter(host(x), expected, counts, op=MPI.MAX)
    assert_result(mpicomm.reduce_scatter(x, counts, "max"), expected, xp, "reduce_scatter counts")
    out = xp.empty(counts[RANK])
    assert mpicomm.reduce_scatter(x, counts, MPI.MAX, out=out) is out
    assert_result(out, expected, xp, "reduce_scatter out=")


def test_reduce_scatter_block(comm, xp):
    x = data(RANK, (P, 2, 3), np.int64, xp)
    expected = np.empty((2, 3), np.int64)
    WORLD.Reduce_scatter_block(host(x), expected)
    assert_result(mpicomm.reduce_scatter_block(x), expected, xp, "reduce_scatter_block")
    out = xp.empty((2, 3), np.int64)
    assert mpicomm.reduce_scatter_block(x, "sum", out=out) is out
    assert_result(out, expected, xp, "reduce_scatter_block out=")


def test_barrier(comm):
    mpicomm.barrier()
    for name in mpicomm.algorithms("barrier"):
        mpicomm.barrier(algorithm=name, comm=comm)


# ---------------------------------------------------------------- nonblocking


def test_nonblocking_wait_returns_the_array(comm, xp):
    x = data(RANK, (2, 5), np.int64, xp)
    allreduced = np.empty((2, 5), np.int64)
    WORLD.Allreduce(host(x), allreduced)
    gathered = np.empty((P, 2, 5), np.int64)
    WORLD.Allgather(host(x), gathered)
    root = P - 1
    flat = data(RANK, (13,), np.int64, xp)
    counts = [13 // P + (1 if i < 13 % P else 0) for i in range(P)]
    scattered = np.empty(counts[RANK], np.int64)
    WORLD.Reduce_scatter(host(flat), scattered, counts)
    a2a_in = data(RANK, (P, 2), np.int64, xp)
    a2a = np.empty((P, 2), np.int64)
    WORLD.Alltoall(host(a2a_in), a2a)
    # all five in flight at once
    requests = [
        mpicomm.iallreduce(x),
        mpicomm.ibcast(x, root),
        mpicomm.iallgather(x),
        mpicomm.ireduce_scatter(flat),
        mpicomm.ialltoall(a2a_in),
    ]
    results = [r.wait() for r in reversed(requests)][::-1]
    assert_result(results[0], allreduced, xp, "iallreduce")
    assert_result(results[1], host(data(root, (2, 5), np.int64)), xp, "ibcast")
    assert_result(results[2], gathered, xp, "iallgather")
    assert_result(results[3], scattered, xp, "ireduce_scatter")
    assert_result(results[4], a2a, xp, "ialltoall")


def test_nonblocking_out(comm):
    x = data(RANK, (6,), np.float64)
    out = np.empty(6)
    request = mpicomm.iallreduce(x, "max", out=out)
    assert isinstance(request, mpicomm.Request)
    assert request.wait() is out
    reference.assert_matches(out, data(P - 1, (6,)), "iallreduce max out=")  # data grows with the rank


# ---------------------------------------------------------------- errors on every rank


def test_wrong_out_shape_raises_on_every_rank(comm):
    x = data(RANK, (3, 4))
    argument_error_everywhere(lambda: mpicomm.allreduce(x, out=np.empty(12)),
                              "out has shape (12,) and dtype float64; this call needs shape (3, 4), dtype float64")
    argument_error_everywhere(lambda: mpicomm.allgather(x, out=np.empty((3, 4))), f"this call needs shape ({P}, 3, 4)")
    mpicomm.allreduce(x)  # the communicator still works


def test_wrong_out_dtype_raises_on_every_rank(comm):
    x = data(RANK, (3,))
    argument_error_everywhere(lambda: mpicomm.allreduce(x, out=np.empty(3, np.float32)), "dtype float32",
                              "dtype float64")
    out = np.empty(3, np.int64) if RANK == P - 1 else None  # wrong on one rank only
    argument_error_everywhere(lambda: mpicomm.bcast(x, out=out), f"rank {P - 1}: out has shape (3,) and dtype int64")


def test_wrong_out_on_one_rank_only(comm):
    x = data(RANK, (2, 2))
    out = np.empty((2, 2)) if RANK != 0 else np.empty((2, 2))[:, :1]
    argument_error_everywhere(lambda: mpicomm.allreduce(x, out=out), "rank 0: ")


def test_bad_inputs_raise_on_every_rank(comm):
    argument_error_everywhere(lambda: mpicomm.allreduce([1.0, 2.0]), "x must be an array or a buffer")
    x = data(RANK, (P + 1,))
    argument_error_everywhere(lambda: mpicomm.alltoall(x), f"alltoall splits the first axis, which must be p = {P}")
    argument_error_everywhere(lambda: mpicomm.reduce_scatter_block(x),
                              f"reduce_scatter_block splits the first axis, which must be p = {P}")
    argument_error_everywhere(lambda: mpicomm.reduce_scatter(x, [1] * P),
                              f"need {P} entries summing to x.size = {P + 1}")
    argument_error_everywhere(lambda: mpicomm.allreduce(x, "band"), "op band is not defined on dtype float64")
    argument_error_everywhere(lambda: mpicomm.bcast(x, root=P), f"root={P} is not a rank")
    argument_error_everywhere(lambda: mpicomm.allreduce(x, algorithm="nope"),
                              "unknown allreduce algorithm 'nope'; registered: " + ", ".join(mpicomm.algorithms("allreduce")))
    argument_error_everywhere(lambda: mpicomm.allreduce(np.zeros((4, 4))[:, 0]), "x is not C-contiguous")
    with pytest.raises(TypeError, match="comm must be an mpicomm.Comm or an MPI.Intracomm"):
        mpicomm.allreduce(x, comm="world")  # local, before any communication


def test_scatter_shape_checked_on_the_root(comm):
    root = 0
    x = data(RANK, (P + 1, 2))
    argument_error_everywhere(lambda: mpicomm.scatter(x if root == RANK else None, root, out=np.empty(2),
                                                      algorithm=SCATTER),
                              f"rank {root}: x has shape ({P + 1}, 2); scatter splits the first axis, which must be p = {P}")


# ---------------------------------------------------------------- comm= and algorithm=


@pytest.mark.parametrize("wrap", [False, True], ids=["MPI.Intracomm", "mpicomm.Comm"])
def test_sub_communicator(comm, wrap):
    sub = WORLD.Split(RANK % 2, key=-RANK)  # reversed order inside each half
    try:
        target = mpicomm.Comm(sub) if wrap else sub
        x = data(RANK, (4,))
        expected = np.empty(4)
        sub.Allreduce(x, expected)
        reference.assert_matches(mpicomm.allreduce(x, comm=target), expected, "allreduce on a sub-communicator")
        gathered = np.empty((sub.Get_size(), 4))
        sub.Allgather(x, gathered)
        reference.assert_matches(mpicomm.allgather(x, comm=target), gathered, "allgather on a sub-communicator")
        root = sub.Get_size() - 1
        reference.assert_matches(mpicomm.bcast(x, root, comm=target), sub.bcast(x, root=root), "bcast on a sub")
        mpicomm.barrier(comm=target)
    finally:
        sub.Free()


@pytest.mark.parametrize("collective,call", [
    ("allreduce", lambda name: mpicomm.allreduce(data(RANK, (10,)), algorithm=name)),
    ("bcast", lambda name: mpicomm.bcast(data(RANK, (10,)), algorithm=name)),
    ("allgather", lambda name: mpicomm.allgather(data(RANK, (3,)), algorithm=name)),
    ("reduce_scatter", lambda name: mpicomm.reduce_scatter(data(RANK, (2 * P,)), algorithm=name)),
], ids=lambda v: v if isinstance(v, str) else "")
def test_algorithm_argument_is_honoured(comm, caplog, collective, call):
    names = runnable(comm, collective)
    assert names
    with caplog.at_level(logging.DEBUG, logger="mpicomm"):
        for name in names:
            caplog.clear()
            call(name)
            messages = [r.getMessage() for r in caplog.records if r.name == "mpicomm"]
            assert f"{collective}: algorithm {name} (from the call)" in messages, messages
        caplog.clear()
        call("auto")
        messages = [r.getMessage() for r in caplog.records if r.name == "mpicomm"]
        # auto: the measured rules of this layout when there are some, else the default rules (the table)
        measured = mpicomm.world()._state.rules
        sources = ("(from the table)",) if measured is None else ("(from the table)", "(from the rules)")
        assert any(m.startswith(f"{collective}: algorithm ") and any(s in m for s in sources) for m in messages), messages


def test_algorithm_from_the_communicator_default(comm, caplog):
    other = comm.Dup()
    try:
        name = mpicomm.algorithms("allreduce")[-1]
        other.set_algorithm("allreduce", name)
        with caplog.at_level(logging.DEBUG, logger="mpicomm"):
            mpicomm.allreduce(data(RANK, (4,)), comm=other)
        assert f"allreduce: algorithm {name} (from the communicator)" in caplog.messages
    finally:
        other.Free()


def test_algorithms_for_every_collective():
    for name in COLLECTIVES:
        names = mpicomm.algorithms(name)
        assert names and names == sorted(names) and all(isinstance(n, str) for n in names), name
        assert set(names) == set(registry.table()[name])
    with pytest.raises(ValueError) as info:
        mpicomm.algorithms("allreduse")
    message = str(info.value)
    assert "unknown collective 'allreduse'; known: " in message
    for name in COLLECTIVES:
        assert name in message


# ---------------------------------------------------------------- reproducible sums of stacked contributions


def _wide(k: int, shape) -> np.ndarray:
    """Contribution k: rank-free, index-dependent values over 2**±40, both signs (their sum depends on its order)."""
    g = np.random.default_rng(100 + k)
    return g.standard_normal(shape) * np.exp2(g.integers(-40, 40, shape))


def _mine(rank: int, p: int) -> list[int]:
    """The contributions rank holds: (rank + 1) % 3 of them, numbered in rank order (rank 2 holds none)."""
    held = [(r + 1) % 3 for r in range(p)]
    first = sum(held[:rank])
    return list(range(first, first + held[rank]))


def test_stacked_contributions_sum_to_the_serial_sums_bits(comm):
    """``stacked=True``: every rank's rows (0, 1 or 2 of them) are contributions; allreduce, iallreduce and
    reduce_scatter give the bits of mpicomm.reproducible.sum_of of all of them, as one process computes."""
    from mpicomm import reproducible

    rank, p = comm.Get_rank(), comm.Get_size()
    every = [k for r in range(p) for k in _mine(rank=r, p=p)]
    shape = (3, 5)
    x = np.stack([_wide(k, shape) for k in _mine(rank, p)]) if _mine(rank, p) else np.empty((0, *shape))
    want = reproducible.sum_of([_wide(k, shape) for k in reversed(every)])
    got = mpicomm.allreduce(x, comm=comm, stacked=True)
    assert got.shape == shape and got.tobytes() == want.tobytes()
    assert mpicomm.iallreduce(x, comm=comm, stacked=True, algorithm="ring").wait().tobytes() == want.tobytes()
    rows = np.stack([np.concatenate([_wide(k, 4 * p)]) for k in _mine(rank, p)]) if _mine(rank, p) \
        else np.empty((0, 4 * p))
    whole = reproducible.sum_of([_wide(k, 4 * p) for k in every])
    part = mpicomm.reduce_scatter(rows, [4] * p, comm=comm, stacked=True)
    assert part.tobytes() == whole[4 * rank:4 * rank + 4].tobytes()
    single = _wide(rank, 7)  # (reproducible=True alone: one contribution per rank)
    assert mpicomm.allreduce(single, comm=comm, reproducible=True).tobytes() == \
        reproducible.sum_of([_wide(r, 7) for r in range(p)]).tobytes()


def test_stacked_contributions_of_an_op_without_a_reproducible_sum_raise_on_every_rank(comm):
    try:
        mpicomm.allreduce(np.ones((2, 3)), "max", comm=comm, stacked=True)
    except mpicomm.ArgumentError as exc:
        message = str(exc).partition(": ")[2]
    else:
        message = ""
    everyone = comm.allgather(message)
    assert all("stacked contributions need a reproducible sum" in m for m in everyone), everyone
    with pytest.raises(TypeError, match="drop reproducible=False"):
        mpicomm.allreduce(np.ones((2, 3)), comm=comm, stacked=True, reproducible=False)
