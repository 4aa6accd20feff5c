"""mpicomm.front.reproducing: reproducible sums on a communicator, against the serial sum of the same contributions.

Every registered algorithm of allreduce, reduce and reduce_scatter(_block), blocking, nonblocking and
persistent, and scan/exscan; counts 0, 1, p − 1, p + 1 and large, float32/float64/complex128 data with wide exponent ranges and cancellations (rank- and
index-dependent): the same bits from every algorithm, equal to :func:`mpicomm.reproducible.sum_of` of the
same contributions in another order; a communicator split in two gives the bits of the serial sum of its own
ranks' contributions (another rank count). Bad input raises the same error on every rank.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from mpicomm import registry
from mpicomm import reproducible as R

from ..coll.reference import counts
from ..conftest import runnable

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(300)]

WORLD = MPI.COMM_WORLD
DTYPES = [np.float64, np.float32, np.complex128]


def contribution(rank: int, n: int, dtype) -> np.ndarray:
    """Rank *rank*'s values: both signs over 2**±40, a quarter cancelling what rank 0 holds."""
    def reals(seed: int, kind) -> np.ndarray:
        g = np.random.default_rng(seed)
        x = (g.standard_normal(n) * np.exp2(g.integers(-40, 40, n))).astype(kind)
        if rank % 2 == 1 and n >= 4:  # (cancels rank 0's first quarter, on the odd ranks)
            x[: n // 4] = -np.asarray(reals_of_rank0(seed - 1000 * rank, kind))[: n // 4]
        return x

    def reals_of_rank0(seed: int, kind) -> np.ndarray:
        g = np.random.default_rng(seed)
        return (g.standard_normal(n) * np.exp2(g.integers(-40, 40, n))).astype(kind)

    dt = np.dtype(dtype)
    if dt.kind == "c":
        part = np.dtype(f"f{dt.itemsize // 2}")
        return reals(1000 * rank + 1, part) + 1j * reals(1000 * rank + 2, part)
    return reals(1000 * rank + 1, dt)


def expected(ranks: list[int], n: int, dtype) -> np.ndarray:
    """The serial reproducible sum of those ranks' contributions, in reverse order."""
    if n == 0:
        return np.zeros(0, dtype)
    return R.sum_of([contribution(r, n, dtype) for r in reversed(ranks)])


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_allreduce_algorithm_gives_the_serial_sums_bits(comm, dtype):
    rank, p = comm.Get_rank(), comm.Get_size()
    for n in counts(p) + [20_000]:
        x = contribution(rank, n, dtype)
        want = expected(list(range(p)), n, dtype)
        for algorithm in runnable(comm, "allreduce"):
            out = np.full_like(x, np.nan)
            comm.Allreduce(x, out, algorithm=algorithm, reproducible=True)
            assert out.tobytes() == want.tobytes(), (n, algorithm)
        inplace = x.copy()
        comm.Allreduce(MPI.IN_PLACE, inplace, reproducible=True)
        assert inplace.tobytes() == want.tobytes(), (n, "in place")


@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_and_reduce_scatter_give_the_same_bits(comm, dtype):
    rank, p = comm.Get_rank(), comm.Get_size()
    root = p - 1
    for n in counts(p):
        x = contribution(rank, n, dtype)
        want = expected(list(range(p)), n, dtype)
        for algorithm in runnable(comm, "reduce"):
            out = np.full_like(x, np.nan) if rank == root else None
            comm.Reduce(x, out, root=root, algorithm=algorithm, reproducible=True)
            if rank == root:
                assert out.tobytes() == want.tobytes(), (n, algorithm)
        whole = np.concatenate([contribution(rank, n, dtype) for _ in range(p)])  # every block is rank's x
        for algorithm in runnable(comm, "reduce_scatter_block"):
            out = np.full_like(x, np.nan)
            comm.Reduce_scatter_block(whole, out, algorithm=algorithm, reproducible=True)
            assert out.tobytes() == want.tobytes(), (n, algorithm)
        uneven = [n + r for r in range(p)]  # (block r has n + r elements)
        big = np.concatenate([contribution(rank, n + r, dtype) for r in range(p)])
        out = np.full(uneven[rank], np.nan, dtype)
        for algorithm in runnable(comm, "reduce_scatter"):
            comm.Reduce_scatter(big, out, uneven, algorithm=algorithm, reproducible=True)
            assert out.tobytes() == expected(list(range(p)), n + rank, dtype).tobytes(), (n, algorithm)


@pytest.mark.parametrize("dtype", [np.float64, np.complex64])
def test_nonblocking_and_persistent_calls_give_the_same_bits(comm, dtype):
    """Several nonblocking calls of one shape in flight at once (they share a plan and its arrays), mixed with
    ordinary calls, and persistent requests started again and again: each gives the serial sum's bits (20,000
    elements: the allreduce that reduce-scatters the digits and all-gathers the results)."""
    rank, p = comm.Get_rank(), comm.Get_size()
    for n in counts(p) + [20_000]:
        xs = [contribution(rank + 7 * i, n, dtype) for i in range(3)]
        wants = [expected([r + 7 * i for r in range(p)], n, dtype) for i in range(3)]
        outs = [np.full_like(x, np.nan) for x in xs]
        plain = np.arange(n, dtype=np.float64) + rank
        plain_out = np.empty_like(plain)
        requests = [comm.Iallreduce(xs[0], outs[0], reproducible=True),
                    comm.Iallreduce(plain, plain_out),  # (an ordinary call between them)
                    comm.Iallreduce(xs[1], outs[1], reproducible=True, algorithm=runnable(comm, "allreduce")[-1]),
                    comm.Ireduce(xs[2], outs[2], root=0, reproducible=True)]
        mpicomm.Request.Waitall(requests)
        assert outs[0].tobytes() == wants[0].tobytes(), n
        assert outs[1].tobytes() == wants[1].tobytes(), n
        if rank == 0:
            assert outs[2].tobytes() == wants[2].tobytes(), n
        assert plain_out.tolist() == [p * i + p * (p - 1) / 2 for i in range(n)]
        whole = np.concatenate([xs[0]] * p)
        block = np.full_like(xs[0], np.nan)
        comm.Ireduce_scatter_block(whole, block, reproducible=True).Wait()
        assert block.tobytes() == wants[0].tobytes(), n
        x, out = xs[1].copy(), np.empty_like(xs[1])
        request = comm.Allreduce_init(x, out, reproducible=True)
        try:
            for i in range(3):
                x[...] = xs[i]  # (each start sums what the buffer holds then)
                out[...] = np.nan
                request.Start()
                request.Wait()
                assert out.tobytes() == wants[i].tobytes(), (n, i)
        finally:
            request.Free()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_scan_and_exscan_sum_each_prefix_on_the_grid_of_every_contribution(comm, dtype):
    rank, p = comm.Get_rank(), comm.Get_size()
    for n in counts(p):
        x = contribution(rank, n, dtype)
        every = [contribution(r, n, dtype) for r in range(p)]
        for algorithm in runnable(comm, "scan"):
            out = np.full_like(x, np.nan)
            comm.Scan(x, out, algorithm=algorithm, reproducible=True)
            want = R.sum_of(reversed(every[:rank + 1]), grid=every) if n else x
            assert out.tobytes() == want.tobytes(), (n, algorithm)
        for algorithm in runnable(comm, "exscan"):
            out = np.full_like(x, np.nan)
            comm.Iexscan(x, out, algorithm=algorithm, reproducible=True).Wait()
            if rank > 0:
                want = R.sum_of(every[:rank], grid=every) if n else x
                assert out.tobytes() == want.tobytes(), (n, algorithm)
            else:
                assert np.isnan(out).all()  # (rank 0's receive buffer is left as it was)
        out = np.full_like(x, np.nan)
        request = comm.Scan_init(x, out, reproducible=True)
        request.Start()
        request.Wait()
        request.Free()
        assert out.tobytes() == (R.sum_of(every[:rank + 1], grid=every) if n else x).tobytes(), n


def test_persistent_requests_started_in_another_order_raise_on_every_rank(comm):
    """Two reproducible persistent requests of one shape, started in a different order on rank 0: the nested
    collectives carry the requests' numbers, so every rank raises instead of summing each other's data."""
    rank, p = comm.Get_rank(), comm.Get_size()
    if p == 1:
        pytest.skip("needs two ranks")
    a, b = np.full(8, 1.0 + rank), np.full(8, 2.0 + rank)
    ra = comm.Allreduce_init(MPI.IN_PLACE, a, reproducible=True)
    rb = comm.Allreduce_init(MPI.IN_PLACE, b, reproducible=True)
    try:
        first, second = (rb, ra) if rank == 0 else (ra, rb)
        messages = []
        for request in (first, second):
            request.Start()
            try:
                request.Wait()
            except mpicomm.ArgumentError as exc:
                messages.append(str(exc).partition(": ")[2])
            else:
                messages.append("")
        everyone = WORLD.allgather(messages[0])
        assert all(everyone), everyone
        c = np.full(8, 1.0 + rank)
        comm.Allreduce(MPI.IN_PLACE, c, reproducible=True)  # (the communicator works afterwards)
        assert c.tolist() == [p + p * (p - 1) / 2] * 8
    finally:
        ra.Free()
        rb.Free()


def test_another_rank_count_gives_its_own_serial_sum(comm):
    """The world split into the even and the odd ranks: each half's reproducible allreduce is the serial sum of
    its ranks' contributions (so a run on 2 ranks and on 4 agree wherever their contributions do)."""
    rank, p = comm.Get_rank(), comm.Get_size()
    plain = WORLD.Split(rank % 2, rank)
    try:
        half = mpicomm.Comm(plain)
        half.reproducible = True
        mine = [r for r in range(p) if r % 2 == rank % 2]
        x = contribution(rank, 1000, np.float64)
        out = np.empty_like(x)
        half.Allreduce(x, out)
        assert out.tobytes() == expected(mine, 1000, np.float64).tobytes()
    finally:
        plain.Free()


def test_the_setting_and_what_is_exact_already(comm, monkeypatch):
    rank, p = comm.Get_rank(), comm.Get_size()
    dup = comm.Dup()
    try:
        assert dup.reproducible is False
        dup.reproducible = True
        x = contribution(rank, 300, np.float64)
        out = np.empty_like(x)
        dup.Allreduce(x, out)  # (the communicator's setting)
        assert out.tobytes() == expected(list(range(p)), 300, np.float64).tobytes()
        ints = np.arange(5, dtype=np.int64) * (rank + 1)
        total = np.empty_like(ints)
        dup.Allreduce(ints, total)  # integers: the ordinary sum, exact already
        assert total.tolist() == [i * p * (p + 1) // 2 for i in range(5)]
        dup.Allreduce(x, out, op=MPI.MAX)  # so is MAX
        both = np.empty_like(x)
        WORLD.Allreduce(x, both, op=MPI.MAX)
        assert out.tobytes() == both.tobytes()
        with pytest.raises(TypeError, match="True or False"):
            dup.reproducible = "yes"
    finally:
        dup.Free()


def test_an_op_without_a_reproducible_sum_raises_on_every_rank(comm):
    rank, _ = comm.Get_rank(), comm.Get_size()
    op = MPI.PROD if rank == 0 else MPI.SUM  # (only rank 0 asks for what has none)
    try:
        comm.Allreduce(np.ones(4), np.empty(4), op=op, reproducible=True)
    except mpicomm.ArgumentError as exc:
        message = str(exc).partition(": ")[2]
    else:
        message = ""
    everyone = WORLD.allgather(message)
    assert all("op SUM on float32, float64" in m for m in everyone) and len(set(everyone)) == 1, everyone


def test_bad_input_on_one_rank_raises_on_every_rank(comm):
    rank, p = comm.Get_rank(), comm.Get_size()
    n = 5 if rank == 0 else 4
    try:
        comm.Allreduce(np.ones(n), np.empty(4), reproducible=True)  # rank 0: send and receive sizes differ
    except mpicomm.ArgumentError as exc:
        message = str(exc).partition(": ")[2]
    else:
        message = ""
    everyone = WORLD.allgather(message)
    assert all(everyone) and len(set(everyone)) == 1, everyone
    assert registry.algorithms("allreduce")  # (the communicator works afterwards)
    out = np.empty(3)
    comm.Allreduce(np.full(3, 1.5), out, reproducible=True)
    assert out.tolist() == [1.5 * p] * 3


def test_the_array_functions_follow_the_communicators_setting(comm):
    """mpicomm.allreduce, iallreduce, reduce_scatter and scan on a communicator with ``reproducible`` set."""
    rank, p = comm.Get_rank(), comm.Get_size()
    dup = comm.Dup()
    try:
        dup.reproducible = True
        x = contribution(rank, 301, np.float64)
        want = expected(list(range(p)), 301, np.float64)
        assert mpicomm.allreduce(x, comm=dup).tobytes() == want.tobytes()
        assert mpicomm.iallreduce(x, comm=dup).wait().tobytes() == want.tobytes()
        whole = np.concatenate([x] * p)
        assert mpicomm.reduce_scatter(whole, [301] * p, comm=dup).tobytes() == want.tobytes()
        every = [contribution(r, 301, np.float64) for r in range(p)]
        assert mpicomm.scan(x, comm=dup).tobytes() == R.sum_of(every[:rank + 1], grid=every).tobytes()
    finally:
        dup.Free()
