"""Fixtures shared by the suite, and the multi-rank harness (see tests/mpi_harness.py)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.mpi_harness import *  # noqa: F401,F403 - registers the harness hooks

BACKENDS = ("numpy", "cupy")



def cupy_or_skip():
    """CuPy, or skip the test with the reason it cannot run here."""
    from mpicomm.device import cupy_module, visible_devices

    cupy = cupy_module()
    if cupy is None:
        pytest.skip("CuPy is not installed (pip install -e '.[cuda12]' or '.[cuda13]')")
    if visible_devices() == 0:
        pytest.skip("CuPy is installed but no CUDA device is visible")
    return cupy


@pytest.fixture(params=BACKENDS)
def xp(request):
    """The array module under test: NumPy, and CuPy where a GPU exists (skipped otherwise)."""
    if request.param == "numpy":
        return np
    cupy = cupy_or_skip()
    from mpicomm.device import bind
    from mpicomm.launcher import from_environment

    bind(from_environment().local_rank or 0)
    return cupy


@pytest.fixture(scope="session")
def comm():
    """mpicomm.Comm over COMM_WORLD (the size is whatever mpiexec gave)."""
    import mpicomm

    return mpicomm.Comm()


def runnable(comm, collective: str) -> list[str]:
    """The algorithms of *collective* that can run on *comm*'s layout: the shared-memory ones need one node."""
    from mpicomm import registry

    return [name for name in registry.algorithms(collective)
            if comm.nodes == 1 or not registry.lookup(collective, name).single_node]


def rank_data(rank: int, count: int, dtype=np.float64, xp=np) -> np.ndarray:
    """Test data that depends on rank and index: rank·10⁶ + index, cast to *dtype*.

    Small integer and boolean dtypes wrap or saturate, so the pattern is folded
    into their range first (still distinct across ranks and neighbouring indices).
    """
    values = rank * 1_000_000 + np.arange(count, dtype=np.int64)
    dt = np.dtype(dtype)
    if dt.kind == "b":
        values = (values + rank) % 3 == 0
    elif dt.kind in "iu" and dt.itemsize < 8:
        values = (rank * 37 + np.arange(count)) % (1 << (8 * dt.itemsize - 1))
    elif dt.kind == "f" and dt.itemsize == 2:
        values = rank * 100 + (np.arange(count) % 1000)
    out = np.asarray(values).astype(dt)
    if dt.kind == "c":
        out = (out + 1j * (np.arange(count) % 7)).astype(dt)
    return xp.asarray(out)


#: A handful of dtypes that cover the kinds (int, float, complex, bool, half).
SOME_DTYPES = [np.int64, np.float32, np.complex128, np.bool_, np.float16]
SOME_DTYPE_IDS = ["int64", "float32", "complex128", "bool", "float16"]


def host(a):
    """*a* as a NumPy array (CuPy arrays are copied to the host)."""
    return a if isinstance(a, np.ndarray) else a.get()


@pytest.fixture(params=["direct", "staged"])
def path(request):
    """Both transfer paths: MPI on the arrays themselves, and forced host staging (the ``staged`` fixture)."""
    if request.param == "staged":
        request.getfixturevalue("staged")
    return request.param


@pytest.fixture
def staged(monkeypatch):
    """Force every buffer through the staging path (host buffers), NumPy included."""
    monkeypatch.setenv("MPICOMM_TRANSFER", "staged")
