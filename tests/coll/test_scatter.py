"""mpicomm.coll.scatter: every scatter and scatterv algorithm against the MPI library's own."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm

from .reference import LARGE, assert_matches, counts, data, layout, layouts, native, roots, uneven

ALGORITHMS = mpicomm.algorithms("scatter")
DTYPES = [np.int64, np.float16, np.complex128, np.bool_]


def root_data(comm, root: int, size: int, dtype, xp=np):
    """The root's whole send buffer (None elsewhere); gaps between blocks hold data too, never sent."""
    return data(root, size, dtype, xp) if comm.rank == root else None


def library_scatterv(comm, root: int, counts: list[int], displs: list[int], size: int, dtype) -> np.ndarray:
    """What MPI's Scatterv of the root's data delivers to this rank."""
    send = root_data(comm, root, size, dtype)
    recv = np.zeros(counts[comm.rank], dtype)
    native().Scatterv([send, (counts, displs)] if comm.rank == root else None, recv, root=root)
    return recv


def test_registered_names():
    assert ALGORITHMS == mpicomm.algorithms("scatterv") == ["binomial", "linear"]


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_scatter_matches_library(comm, xp, algorithm, dtype):
    p = comm.size
    for root in roots(p):
        for count in counts(p):
            recv = xp.zeros(count, dtype)
            comm.Scatter(root_data(comm, root, count * p, dtype, xp), recv, root=root, algorithm=algorithm)
            expected = library_scatterv(comm, root, [count] * p, [r * count for r in range(p)], count * p, dtype)
            assert_matches(recv, expected, f"{algorithm} root {root} count {count}")


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", [np.int64, np.bool_], ids=["int64", "bool"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_scatterv_uneven_counts_and_displacements(comm, xp, algorithm, dtype):
    p = comm.size
    for scale in (1, 300):
        counts_ = uneven(p, scale)
        for name, (displs, size) in layouts(counts_).items():
            for root in roots(p):
                send = root_data(comm, root, size, dtype, xp)
                recv = xp.zeros(counts_[comm.rank], dtype)
                spec = [send, (counts_, displs)] if comm.rank == root else None
                comm.Scatterv(spec, recv, root=root, algorithm=algorithm)
                expected = library_scatterv(comm, root, counts_, displs, size, dtype)
                assert_matches(recv, expected, f"{algorithm} {name} root {root} counts {counts_}")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_scatter_and_scatterv_in_place(comm, algorithm):
    p = comm.size
    counts_ = uneven(p, 4)
    displs, size = layout(counts_, "reversed")
    for root in roots(p):
        send = root_data(comm, root, 10 * p, np.int64)
        recv = MPI.IN_PLACE if comm.rank == root else np.zeros(10, np.int64)
        comm.Scatter(send, recv, root=root, algorithm=algorithm)
        expected = library_scatterv(comm, root, [10] * p, [10 * r for r in range(p)], 10 * p, np.int64)
        if comm.rank == root:
            assert_matches(send, data(root, 10 * p, np.int64), f"scatter in place left the root's buffer, root {root}")
        else:
            assert_matches(recv, expected, f"scatter in place, root {root}")

        send = root_data(comm, root, size, np.int64)
        recv = MPI.IN_PLACE if comm.rank == root else np.zeros(counts_[comm.rank], np.int64)
        spec = [send, (counts_, displs)] if comm.rank == root else None
        comm.Scatterv(spec, recv, root=root, algorithm=algorithm)
        expected = library_scatterv(comm, root, counts_, displs, size, np.int64)
        if comm.rank == root:
            assert_matches(send, data(root, size, np.int64), f"scatterv in place left the root's buffer, root {root}")
        else:
            assert_matches(recv, expected, f"scatterv in place, root {root}")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_scatter_and_scatterv_both_paths(comm, path, algorithm):
    p = comm.size
    root = p // 2
    recv = np.zeros(30, np.float32)
    comm.Scatter(root_data(comm, root, 30 * p, np.float32), recv, root=root, algorithm=algorithm)
    expected = library_scatterv(comm, root, [30] * p, [30 * r for r in range(p)], 30 * p, np.float32)
    assert_matches(recv, expected, f"scatter {algorithm} ({path})")

    counts_ = uneven(p, 50)
    displs, size = layout(counts_, "interleaved")
    send = root_data(comm, root, size, np.float32)
    recv = np.zeros(counts_[comm.rank], np.float32)
    comm.Scatterv([send, (counts_, displs)] if comm.rank == root else None, recv, root=root, algorithm=algorithm)
    expected = library_scatterv(comm, root, counts_, displs, size, np.float32)
    assert_matches(recv, expected, f"scatterv {algorithm} ({path})")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_scatter_large(comm, algorithm):
    p, root = comm.size, comm.size - 1
    recv = np.zeros(LARGE, np.int64)
    comm.Scatter(root_data(comm, root, LARGE * p, np.int64), recv, root=root, algorithm=algorithm)
    expected = library_scatterv(comm, root, [LARGE] * p, [r * LARGE for r in range(p)], LARGE * p, np.int64)
    assert_matches(recv, expected, f"{algorithm} at {LARGE} per rank")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_iscatter_and_iscatterv_in_flight(comm, algorithm):
    p = comm.size
    counts_ = uneven(p, 7)
    displs, size = layout(counts_, "reversed")
    first, second = np.zeros(100, np.int64), np.zeros(counts_[comm.rank], np.int64)
    spec = [root_data(comm, p - 1, size, np.int64), (counts_, displs)] if comm.rank == p - 1 else None
    requests = [
        comm.Iscatter(root_data(comm, 0, 100 * p, np.int64), first, root=0, algorithm=algorithm),
        comm.Iscatterv(spec, second, root=p - 1, algorithm=algorithm),
    ]
    assert all(isinstance(r, mpicomm.Request) for r in requests)
    mpicomm.Request.Waitall(requests)
    assert_matches(first, library_scatterv(comm, 0, [100] * p, [100 * r for r in range(p)], 100 * p, np.int64),
                   "iscatter")
    assert_matches(second, library_scatterv(comm, p - 1, counts_, displs, size, np.int64), "iscatterv")
