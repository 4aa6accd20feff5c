"""kernels/gelu.py: the fused bias + GELU kernel against the NumPy reference (and the reference against the
formula's erf-free form in float64), out of place and in place, in numba's CUDA simulator (CuPy on a GPU)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kernels import gelu
from tests.kernels.conftest import DTYPE_IDS, DTYPES, host

pytestmark = pytest.mark.serial  # no MPI: the serial pass runs it


def operands(m: int, n: int, dtype):
    rng = np.random.default_rng(3)
    x = 3 * rng.standard_normal((m, n)) + np.arange(m * n).reshape(m, n) / (m * n)
    bias = rng.standard_normal(n) - np.arange(n) / n
    return x.astype(dtype), bias.astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in-place"])
def test_kernel_equals_the_reference(simt, dtype, in_place):
    x, bias = operands(3, 37, dtype)  # 37 columns: two blocks of 32 threads, the second partly idle
    want = np.empty_like(x)
    gelu.bias_gelu_numpy(x, bias, want)
    dx = simt.asarray(x.copy())
    out = dx if in_place else simt.full(x.shape, np.nan, dtype=dtype)
    gelu.bias_gelu(dx, simt.asarray(bias), out, threads=32)
    np.testing.assert_allclose(host(out), want, rtol=4 * np.finfo(dtype).eps, atol=4 * np.finfo(dtype).eps)


def test_reference_follows_the_formula():
    x, bias = operands(2, 5, np.float64)
    got = np.empty_like(x)
    gelu.bias_gelu_numpy(x, bias, got)
    for (i, j), value in np.ndenumerate(x):
        v = value + bias[j]
        want = 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))
        assert got[i, j] == pytest.approx(want, rel=1e-12, abs=1e-15)  # 1 + tanh cancels for v << 0
    # GELU's shape: ~identity for large v, ~0 for very negative v, 0 at 0
    probe = np.array([[-20.0, 0.0, 20.0]])
    out = np.empty_like(probe)
    gelu.bias_gelu_numpy(probe, np.zeros(3), out)
    assert out[0, 0] == pytest.approx(0, abs=1e-30) and out[0, 1] == 0 and out[0, 2] == 20


@pytest.mark.parametrize("args, error, message", [
    ((np.zeros((2, 3)), np.zeros(4), np.zeros((2, 3))), ValueError, r"bias \(4,\).*one entry per column of x \(3\)"),
    ((np.zeros((2, 3)), np.zeros(3), np.zeros((3, 2))), ValueError, "out has x's shape"),
    ((np.zeros((2, 3)), np.zeros(3, np.float32), np.zeros((2, 3))), ValueError, "dtypes float64, float32, float64"),
    ((np.zeros(3), np.zeros(3), np.zeros(3)), TypeError, "x is a ndarray .* pass a 2-D"),
    ((np.zeros((2, 3), np.int32), np.zeros(3, np.int32), np.zeros((2, 3), np.int32)), ValueError,
     "x has dtype int32"),
])
def test_bad_arguments_are_named(args, error, message):
    with pytest.raises(error, match=message):
        gelu.bias_gelu(*args)


def test_out_may_be_x_but_not_overlap_it_otherwise():
    x = np.zeros((3, 4))
    with pytest.raises(ValueError, match="out overlaps x without being x"):
        gelu.bias_gelu(x[:2], np.zeros(4), x[1:])
    with pytest.raises(ValueError, match="out shares memory with bias"):
        gelu.bias_gelu(x[:1], x[2], x[2:3])
    with pytest.raises(ValueError, match="threads = 0"):
        gelu.bias_gelu(x, np.zeros(4), x, threads=0)
