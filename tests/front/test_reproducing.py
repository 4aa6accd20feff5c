"""mpicomm.front.reproducing: reproducible sums on a communicator, against the serial sum of the same contributions.

Every registered algorithm of allreduce, reduce and reduce_scatter(_block), counts 0, 1, p − 1, p + 1 and
large, float32/float64/complex128 data with wide exponent ranges and cancellations (rank- and
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
