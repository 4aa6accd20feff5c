"""mpicomm.coll.allgather: every allgather(v) algorithm against the MPI library's own Allgather(v)."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from mpicomm import registry

from .reference import LARGE, LAYOUTS, assert_matches, counts, data, layout, native, unfilled

ALGORITHMS = mpicomm.algorithms("allgather")
DTYPES = [np.int64, np.float16, np.complex128, np.bool_]  # item sizes 8, 2, 16, 1


def library_allgather(p: int, count: int, dtype) -> np.ndarray:
    """What MPI's Allgather of every rank's ``data(rank, count)`` delivers."""
    out = np.empty(p * count, dtype)
    native().Allgather(data(native().Get_rank(), count, dtype), out)
    return out


# ---------------------------------------------------------------- allgatherv layouts

#: Per-rank counts for allgatherv: zeros, one element, a large block, a lone sender, nothing at all.
COUNT_PATTERNS = {
    "uneven": lambda p: [(0, 1, 5, 0, 1000, 2, 7)[s % 7] for s in range(p)],
    "last-only": lambda p: [0] * (p - 1) + [p + 1],
    "empty": lambda p: [0] * p,
}


def library_allgatherv(counts: list[int], displs: list[int], size: int, dtype) -> np.ndarray:
    """What MPI's Allgatherv of every rank's ``data(rank, counts[rank])`` delivers (gaps: SENTINEL)."""
    rank = native().Get_rank()
    out = unfilled(size, dtype)
    native().Allgatherv(data(rank, counts[rank], dtype), [out, (counts, displs)])
    return out


# ---------------------------------------------------------------- tests


def test_registered_names():
    assert {"bruck", "linear", "recursive_doubling", "ring", "shm", "hierarchical"} <= set(ALGORITHMS)
    assert mpicomm.algorithms("allgatherv") == ALGORITHMS
    for name in ALGORITHMS:
        assert registry.lookup("allgatherv", name).steps is registry.lookup("allgather", name).steps
        assert registry.lookup("allgather", name).in_place


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_allgather_matches_library(comm, xp, algorithm, dtype):
    p = comm.size
    for count in counts(p):
        recv = xp.zeros(p * count, dtype)
        comm.Allgather(data(comm.rank, count, dtype, xp), recv, algorithm=algorithm)
        assert_matches(recv, library_allgather(p, count, dtype), f"{algorithm} count {count}")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_allgather_in_place(comm, algorithm):
    p, rank = comm.size, comm.rank
    for count in counts(p):
        recv = np.zeros(p * count, np.int64)
        recv[rank * count : (rank + 1) * count] = data(rank, count)
        comm.Allgather(MPI.IN_PLACE, recv, algorithm=algorithm)
        assert_matches(recv, library_allgather(p, count, np.int64), f"{algorithm} in place, count {count}")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_allgatherv_uneven_counts_and_displacements(comm, xp, algorithm):
    p, rank = comm.size, comm.rank
    for make in COUNT_PATTERNS.values():
        vcounts = make(p)
        for how in LAYOUTS:
            displs, size = layout(vcounts, how)
            expected = library_allgatherv(vcounts, displs, size, np.int64)
            context = f"{algorithm} counts {vcounts} displs {displs}"
            recv = unfilled(size, np.int64, xp)
            comm.Allgatherv(data(rank, vcounts[rank], np.int64, xp), [recv, (vcounts, displs)], algorithm=algorithm)
            assert_matches(recv, expected, context)
            recv = unfilled(size, np.int64, xp)
            recv[displs[rank] : displs[rank] + vcounts[rank]] = data(rank, vcounts[rank], np.int64, xp)
            comm.Allgatherv(MPI.IN_PLACE, [recv, (vcounts, displs)], algorithm=algorithm)
            assert_matches(recv, expected, context + " in place")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_allgatherv_other_dtypes(comm, algorithm):
    p, rank = comm.size, comm.rank
    vcounts = COUNT_PATTERNS["uneven"](p)
    displs, size = layout(vcounts, "interleaved")
    for dtype in (np.complex128, np.uint8):
        recv = unfilled(size, dtype)
        comm.Allgatherv(data(rank, vcounts[rank], dtype), [recv, (vcounts, displs)], algorithm=algorithm)
        assert_matches(recv, library_allgatherv(vcounts, displs, size, dtype), f"{algorithm} {np.dtype(dtype)}")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_allgather_large(comm, algorithm):
    p = comm.size
    count = LARGE // p  # 10⁶ elements gathered in all
    recv = np.empty(p * count, np.int64)
    comm.Allgather(data(comm.rank, count), recv, algorithm=algorithm)
    assert_matches(recv, library_allgather(p, count, np.int64), f"{algorithm} at {p} × {count}")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_allgather_both_paths(comm, path, algorithm):
    p, rank = comm.size, comm.rank
    for count in (p + 1, 1000):
        recv = np.zeros(p * count, np.float32)
        comm.Allgather(data(rank, count, np.float32), recv, algorithm=algorithm)
        assert_matches(recv, library_allgather(p, count, np.float32), f"{algorithm} ({path}) count {count}")
    vcounts = COUNT_PATTERNS["uneven"](p)
    displs, size = layout(vcounts, "reversed")
    recv = unfilled(size, np.int64)
    comm.Allgatherv(data(rank, vcounts[rank]), [recv, (vcounts, displs)], algorithm=algorithm)
    assert_matches(recv, library_allgatherv(vcounts, displs, size, np.int64), f"{algorithm} ({path}) v")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_iallgather_and_iallgatherv_in_flight(comm, algorithm):
    p, rank = comm.size, comm.rank
    vcounts = COUNT_PATTERNS["uneven"](p)
    displs, size = layout(vcounts, "interleaved")
    first = np.zeros(p * 999, np.int64)
    second = unfilled(size, np.int64)
    requests = [
        comm.Iallgather(data(rank, 999), first, algorithm=algorithm),
        comm.Iallgatherv(data(rank, vcounts[rank]), [second, (vcounts, displs)], algorithm=algorithm),
    ]
    assert all(isinstance(r, mpicomm.Request) for r in requests)
    mpicomm.Request.Waitall(requests)
    assert_matches(first, library_allgather(p, 999, np.int64), "Iallgather")
    assert_matches(second, library_allgatherv(vcounts, displs, size, np.int64), "Iallgatherv")


@pytest.mark.mpi
def test_table_choice_runs(comm):
    """No algorithm named: the selection table's choice (by size and p) gathers correctly."""
    p = comm.size
    for count in (1, 20000):  # below and above the table's size thresholds
        recv = np.zeros(p * count, np.int64)
        comm.Allgather(data(comm.rank, count), recv)
        assert_matches(recv, library_allgather(p, count, np.int64), f"auto count {count}")
