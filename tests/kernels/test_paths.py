"""kernels/paths.py: the path names, availability, selection and its errors."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import kernels

pytestmark = pytest.mark.serial  # no MPI: the serial pass runs it


def test_paths():
    assert kernels.PATHS == ("numpy", "compiled", "cupy")


def test_numpy_is_always_available():
    assert kernels.available("numpy") == (True, "NumPy reference")
    k = kernels.select("numpy")
    assert (k.name, k.xp) == ("numpy", np)
    assert repr(k) == "Kernels('numpy', xp=numpy)"
    k.sync()


def test_compiled_availability_follows_numba():
    ok, reason = kernels.available("compiled")
    assert ok == (importlib.util.find_spec("numba") is not None)
    if ok:
        k = kernels.select("compiled")
        assert (k.name, k.xp) == ("compiled", np)
    else:
        assert "pip install -e '.[compiled]'" in reason
        with pytest.raises(RuntimeError, match="numba is not installed"):
            kernels.select("compiled")


def test_cupy_availability_is_explained():
    ok, reason = kernels.available("cupy")
    if ok:
        k = kernels.select("cupy")
        assert k.name == "cupy" and k.xp.__name__ == "cupy"
        k.sync()
    else:
        assert "CuPy" in reason or "GPU" in reason
        with pytest.raises(RuntimeError, match="kernel path 'cupy' is not available: .*(CuPy|GPU)"):
            kernels.select("cupy")
        if importlib.util.find_spec("cupy") is None:
            assert "pip install -e '.[cuda12]'" in reason


@pytest.mark.parametrize("name", ["numba", "", "NumPy", None])
def test_unknown_path_lists_the_valid_ones(name):
    with pytest.raises(ValueError, match=r"unknown kernel path .*valid paths: numpy, compiled, cupy"):
        kernels.select(name)
    with pytest.raises(ValueError, match="valid paths"):
        kernels.available(name)


def test_a_numpy_path_refuses_gpu_style_and_foreign_arrays():
    k = kernels.select("numpy")
    with pytest.raises(TypeError, match="numpy path takes numpy.ndarray"):
        k.triad(np.zeros(3), np.zeros(3), (1.0, 2.0, 3.0), 1.0)


def test_the_cupy_path_names_the_capability_it_needs():
    from kernels.paths import capability_reason

    cuda12, cuda13 = [50, 60, 70, 75, 80, 90], [75, 80, 90, 100]
    assert capability_reason(90, cuda13, "13.0") is None and capability_reason(60, cuda12, "12.9") is None
    assert capability_reason(52, cuda12, "12.9") == (
        "the current GPU has compute capability 5.2; the CuPy kernels need 6.0 or newer (double-precision "
        "atomicAdd): use a CPU path (kernels.select('compiled'))")
    reason = capability_reason(70, cuda13, "13.0")
    assert reason is not None and reason.startswith(
        "the current GPU has compute capability 7.0; the CuPy kernels need 7.5 or newer (the oldest architecture "
        "NVRTC 13.0 compiles for): install CUDA 12's CuPy")
