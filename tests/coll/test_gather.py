"""mpicomm.coll.gather: every gather and gatherv algorithm against the MPI library's own."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm

from .reference import LARGE, assert_matches, counts, data, layout, layouts, native, roots, uneven

ALGORITHMS = mpicomm.algorithms("gather")
DTYPES = [np.int64, np.float16, np.complex128, np.bool_]


def library_gatherv(comm, root: int, counts: list[int], displs: list[int], size: int, dtype) -> np.ndarray | None:
    """What MPI's Gatherv of every rank's data into zeros delivers on the root (None elsewhere)."""
    send = data(comm.rank, counts[comm.rank], dtype)
    recv = np.zeros(size, dtype) if comm.rank == root else None
    native().Gatherv(send, [recv, (counts, displs)] if comm.rank == root else None, root=root)
    return recv


def test_registered_names():
    assert ALGORITHMS == mpicomm.algorithms("gatherv") == ["binomial", "linear"]


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_gather_matches_library(comm, xp, algorithm, dtype):
    p = comm.size
    for root in roots(p):
        for count in counts(p):
            recv = xp.zeros(count * p, dtype) if comm.rank == root else None
            comm.Gather(data(comm.rank, count, dtype, xp), recv, root=root, algorithm=algorithm)
            expected = library_gatherv(comm, root, [count] * p, [r * count for r in range(p)], count * p, dtype)
            if comm.rank == root:
                assert_matches(recv, expected, f"{algorithm} root {root} count {count}")


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", [np.int64, np.bool_], ids=["int64", "bool"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_gatherv_uneven_counts_and_displacements(comm, xp, algorithm, dtype):
    p = comm.size
    for scale in (1, 300):
        counts_ = uneven(p, scale)
        for name, (displs, size) in layouts(counts_).items():
            for root in roots(p):
                recv = xp.zeros(size, dtype) if comm.rank == root else None
                spec = [recv, (counts_, displs)] if comm.rank == root else None
                comm.Gatherv(data(comm.rank, counts_[comm.rank], dtype, xp), spec, root=root, algorithm=algorithm)
                expected = library_gatherv(comm, root, counts_, displs, size, dtype)
                if comm.rank == root:
                    assert_matches(recv, expected, f"{algorithm} {name} root {root} counts {counts_}")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_gather_and_gatherv_in_place(comm, algorithm):
    p = comm.size
    counts_ = uneven(p, 4)
    displs, size = layout(counts_, "reversed")
    for root in roots(p):
        mine = data(comm.rank, 10, np.int64)
        if comm.rank == root:
            recv = np.zeros(10 * p, np.int64)
            recv[10 * root : 10 * root + 10] = mine
            comm.Gather(MPI.IN_PLACE, recv, root=root, algorithm=algorithm)
        else:
            recv = None
            comm.Gather(mine, None, root=root, algorithm=algorithm)
        expected = library_gatherv(comm, root, [10] * p, [10 * r for r in range(p)], 10 * p, np.int64)
        if comm.rank == root:
            assert_matches(recv, expected, f"gather in place, root {root}")

        mine = data(comm.rank, counts_[comm.rank], np.int64)
        if comm.rank == root:
            recv = np.zeros(size, np.int64)
            recv[displs[root] : displs[root] + counts_[root]] = mine
            comm.Gatherv(MPI.IN_PLACE, [recv, (counts_, displs)], root=root, algorithm=algorithm)
        else:
            comm.Gatherv(mine, None, root=root, algorithm=algorithm)
        expected = library_gatherv(comm, root, counts_, displs, size, np.int64)
        if comm.rank == root:
            assert_matches(recv, expected, f"gatherv in place, root {root}")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_gather_and_gatherv_both_paths(comm, path, algorithm):
    p = comm.size
    root = p // 2
    recv = np.zeros(30 * p, np.float32) if comm.rank == root else None
    comm.Gather(data(comm.rank, 30, np.float32), recv, root=root, algorithm=algorithm)
    expected = library_gatherv(comm, root, [30] * p, [30 * r for r in range(p)], 30 * p, np.float32)
    if comm.rank == root:
        assert_matches(recv, expected, f"gather {algorithm} ({path})")

    counts_ = uneven(p, 50)
    displs, size = layout(counts_, "interleaved")
    recv = np.zeros(size, np.float32) if comm.rank == root else None
    spec = [recv, (counts_, displs)] if comm.rank == root else None
    comm.Gatherv(data(comm.rank, counts_[comm.rank], np.float32), spec, root=root, algorithm=algorithm)
    expected = library_gatherv(comm, root, counts_, displs, size, np.float32)
    if comm.rank == root:
        assert_matches(recv, expected, f"gatherv {algorithm} ({path})")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_gather_large(comm, algorithm):
    p, root = comm.size, comm.size - 1
    recv = np.zeros(LARGE * p, np.int64) if comm.rank == root else None
    comm.Gather(data(comm.rank, LARGE, np.int64), recv, root=root, algorithm=algorithm)
    expected = library_gatherv(comm, root, [LARGE] * p, [r * LARGE for r in range(p)], LARGE * p, np.int64)
    if comm.rank == root:
        assert_matches(recv, expected, f"{algorithm} at {LARGE} per rank")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_igather_and_igatherv_in_flight(comm, algorithm):
    p = comm.size
    counts_ = uneven(p, 7)
    displs, size = layout(counts_, "reversed")
    first = np.zeros(100 * p, np.int64) if comm.rank == 0 else None
    second = np.zeros(size, np.int64) if comm.rank == p - 1 else None
    requests = [
        comm.Igather(data(comm.rank, 100, np.int64), first, root=0, algorithm=algorithm),
        comm.Igatherv(data(comm.rank, counts_[comm.rank], np.int64),
                      [second, (counts_, displs)] if comm.rank == p - 1 else None, root=p - 1, algorithm=algorithm),
    ]
    assert all(isinstance(r, mpicomm.Request) for r in requests)
    mpicomm.Request.Waitall(requests)
    expected_first = library_gatherv(comm, 0, [100] * p, [100 * r for r in range(p)], 100 * p, np.int64)
    expected_second = library_gatherv(comm, p - 1, counts_, displs, size, np.int64)
    if comm.rank == 0:
        assert_matches(first, expected_first, "igather")
    if comm.rank == p - 1:
        assert_matches(second, expected_second, "igatherv")
