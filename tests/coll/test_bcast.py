"""mpicomm.coll.bcast: every broadcast algorithm against the MPI library's own Bcast."""

from __future__ import annotations

import numpy as np
import pytest

import mpicomm
from mpicomm.coll import bcast

from .reference import LARGE, assert_matches, counts, data, native

ALGORITHMS = mpicomm.algorithms("bcast")
DTYPES = [np.int64, np.float16, np.complex128, np.bool_]  # item sizes 8, 2, 16, 1 (segments and blocks differ)


def roots(p: int) -> list[int]:
    """0, the last rank and a middle one."""
    return sorted({0, p - 1, p // 2})


def library_bcast(comm, root: int, count: int, dtype) -> np.ndarray:
    """What MPI's Bcast of the root's data delivers."""
    buf = data(root, count, dtype) if comm.rank == root else np.zeros(count, dtype)
    native().Bcast(buf, root=root)
    return buf


def fresh(comm, root: int, count: int, dtype, xp=np):
    """The root's data on the root, zeros elsewhere."""
    if comm.rank == root:
        return data(root, count, dtype, xp)
    return xp.zeros(count, dtype)


def test_registered_names():
    assert {"binomial", "linear", "pipeline", "scatter_allgather", "shm", "hierarchical"} <= set(ALGORITHMS)


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_bcast_matches_library(comm, xp, algorithm, dtype):
    for root in roots(comm.size):
        for count in counts(comm.size):
            buf = fresh(comm, root, count, dtype, xp)
            comm.Bcast(buf, root=root, algorithm=algorithm)
            assert_matches(buf, library_bcast(comm, root, count, dtype), f"{algorithm} root {root} count {count}")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_bcast_large(comm, algorithm):
    root = comm.size - 1
    buf = fresh(comm, root, LARGE, np.int64)
    comm.Bcast(buf, root=root, algorithm=algorithm)
    assert_matches(buf, library_bcast(comm, root, LARGE, np.int64), f"{algorithm} at {LARGE}")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_bcast_both_paths(comm, path, algorithm):
    root = comm.size // 2
    for count in (comm.size + 1, 1000):
        buf = fresh(comm, root, count, np.float32)
        comm.Bcast(buf, root=root, algorithm=algorithm)
        assert_matches(buf, library_bcast(comm, root, count, np.float32), f"{algorithm} ({path}) count {count}")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_two_ibcasts_in_flight(comm, algorithm):
    p = comm.size
    first, second = fresh(comm, 0, 1000, np.int64), fresh(comm, p - 1, 999, np.int64)
    requests = [comm.Ibcast(first, root=0, algorithm=algorithm), comm.Ibcast(second, root=p - 1, algorithm=algorithm)]
    assert all(isinstance(r, mpicomm.Request) for r in requests)
    mpicomm.Request.Waitall(requests)
    assert_matches(first, library_bcast(comm, 0, 1000, np.int64), "first")
    assert_matches(second, library_bcast(comm, p - 1, 999, np.int64), "second")


@pytest.mark.mpi
def test_pipeline_many_segments(comm, monkeypatch):
    """Segments of 3 elements: a long chain of steps and a short last segment."""
    monkeypatch.setattr(bcast, "SEGMENT_BYTES", 3 * 8)
    for root in roots(comm.size):
        for count in (2, 3, 100):
            buf = fresh(comm, root, count, np.int64)
            comm.Bcast(buf, root=root, algorithm="pipeline")
            assert_matches(buf, library_bcast(comm, root, count, np.int64), f"root {root} count {count}")


@pytest.mark.mpi
def test_pipeline_segment_smaller_than_an_element(comm, monkeypatch):
    monkeypatch.setattr(bcast, "SEGMENT_BYTES", 1)
    buf = fresh(comm, 0, 5, np.complex128)
    comm.Bcast(buf, root=0, algorithm="pipeline")
    assert_matches(buf, library_bcast(comm, 0, 5, np.complex128), "one element per segment")
