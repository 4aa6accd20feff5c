"""Fixtures for the kernel tests: the paths, index-dependent data, and the comparison rule.

Every non-reference path is compared with the NumPy path: the CPU paths bit for
bit (``np.array_equal``), the CuPy path within a few units in the last place
(CUDA contracts ``a + b*c`` into one FMA). The NumPy path itself is compared
with plain Python loops over NumPy scalars (tests/kernels/loops.py), which
follow the documented operation order one cell at a time.

The SIMT kernels (kernels/simt.py) run on CuPy arrays where a GPU is visible
and otherwise in numba's CUDA simulator on NumPy arrays: the ``simt`` fixture
gives the array module, and chooses the simulator before numba.cuda is first
imported.
"""

from __future__ import annotations

import numpy as np
import pytest

import kernels
from tests.conftest import cupy_or_skip

DTYPES = [np.float64, np.float32]
DTYPE_IDS = ["float64", "float32"]


def simt_module():
    """The SIMT kernels' array module: CuPy on a visible GPU, else NumPy with numba's CUDA simulator (skipped
    without numba)."""
    from kernels import simt
    from mpicomm.device import visible_devices

    if visible_devices() > 0 and not simt.simulated():
        cupy = cupy_or_skip()
        from mpicomm.device import bind
        from mpicomm.launcher import from_environment

        bind(from_environment().local_rank or 0)
        xp = cupy
    else:
        simt.use_simulator()
        xp = np
    why = simt.reason()
    if why is not None:
        pytest.skip(f"the SIMT kernels cannot run here: {why}")
    return xp


@pytest.fixture
def simt():
    """The array module the SIMT kernels run on here (CuPy on a GPU, NumPy in the simulator)."""
    return simt_module()


def kernels_or_skip(path: str) -> kernels.Kernels:
    """``kernels.select(path)``, or skip the test with the reason the path cannot run here."""
    if path == "cupy":
        cupy_or_skip()
        from mpicomm.device import bind
        from mpicomm.launcher import from_environment

        bind(from_environment().local_rank or 0)
    ok, reason = kernels.available(path)
    if not ok:
        pytest.skip(f"kernel path {path!r} cannot run here: {reason}")
    return kernels.select(path)


@pytest.fixture(params=kernels.PATHS)
def k(request) -> kernels.Kernels:
    """Each path's kernels (compiled and cupy skipped, with the reason, where they cannot run)."""
    return kernels_or_skip(request.param)


@pytest.fixture(params=[p for p in kernels.PATHS if p != "numpy"])
def other(request) -> kernels.Kernels:
    """The paths tested against the NumPy reference."""
    return kernels_or_skip(request.param)


@pytest.fixture
def ref() -> kernels.Kernels:
    """The NumPy reference."""
    return kernels.select("numpy")


def field(shape: tuple[int, ...], dtype=np.float64, seed: int = 0) -> np.ndarray:
    """Random data with ghost cells filled too (so a kernel reading the wrong cell shows), plus an index term."""
    rng = np.random.default_rng(seed)
    index = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape) / np.prod(shape)
    return (rng.standard_normal(shape) + index).astype(dtype)


def host(a) -> np.ndarray:
    """*a* on the host (CuPy arrays are copied)."""
    return a if isinstance(a, np.ndarray) else a.get()


def on(k: kernels.Kernels, a: np.ndarray):
    """A copy of host array *a* as an array of *k*'s module."""
    return k.xp.asarray(a.copy())


def assert_agrees(k: kernels.Kernels, got, want, scale: float = 1.0) -> None:
    """CPU paths: equal bit for bit; CuPy: within 8 ulp of *scale* (FMA contraction)."""
    got, want = host(got), host(want)
    if k.name == "cupy":
        eps = np.finfo(want.dtype).eps
        np.testing.assert_allclose(got, want, rtol=8 * eps, atol=8 * eps * scale)
    else:
        assert got.dtype == want.dtype
        assert np.array_equal(got, want), f"{k.name} differs from the reference at {np.argwhere(got != want)[:5]}"


def assert_scalar_agrees(k: kernels.Kernels, got: float, want: float, dtype, scale: float = 1.0) -> None:
    assert isinstance(got, float)
    if k.name == "cupy":
        eps = np.finfo(dtype).eps
        assert got == pytest.approx(want, rel=8 * eps, abs=8 * eps * scale)
    else:
        assert got == want
