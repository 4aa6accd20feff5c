"""kernels/matmul.py: the tiled kernel against NumPy at shapes that are not multiples of the tile (edge tiles,
k shorter than a tile), both dtypes, in numba's CUDA simulator (CuPy on a GPU); its argument checks."""

from __future__ import annotations

import numpy as np
import pytest

from kernels import matmul
from tests.kernels.conftest import DTYPE_IDS, DTYPES, host

pytestmark = pytest.mark.serial  # no MPI: the serial pass runs it


def operands(m: int, k: int, n: int, dtype, seed: int = 0):
    """Random values plus an index term, so that a kernel reading the wrong element shows."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)) + np.arange(m * k).reshape(m, k) / (m * k)
    b = rng.standard_normal((k, n)) - np.arange(k * n).reshape(k, n) / (k * n)
    return a.astype(dtype), b.astype(dtype)


def assert_product(c, a, b) -> None:
    """Within k·eps·Σ|a||b| of the product computed in float64 (each dtype sums in its own order)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    bound = a.shape[1] * np.finfo(a.dtype).eps * (np.abs(a64) @ np.abs(b64))
    err = np.abs(host(c).astype(np.float64) - a64 @ b64)
    assert np.all(err <= bound), f"worst error {err.max()} at {np.unravel_index(np.argmax(err - bound), err.shape)}"


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("m, k, n, tile", [(9, 11, 7, 4), (5, 3, 6, 4)], ids=["edge-tiles", "k-below-tile"])
def test_tiled_equals_numpy(simt, m, k, n, tile, dtype):
    a, b = operands(m, k, n, dtype)
    c = simt.full((m, n), np.nan, dtype=dtype)  # every element must be written
    matmul.matmul(simt.asarray(a), simt.asarray(b), c, tile=tile)
    assert_product(c, a, b)
    want = np.empty((m, n), dtype)
    matmul.matmul_numpy(a, b, want)
    np.testing.assert_allclose(host(c), want, rtol=0, atol=float(np.abs(want).max()) * k * np.finfo(dtype).eps)


def test_the_reference_is_numpys_product():
    a, b = operands(4, 5, 3, np.float64)
    c = np.empty((4, 3))
    matmul.matmul_numpy(a, b, c)
    assert np.array_equal(c, a @ b)


@pytest.mark.parametrize("args, error, message", [
    ((np.zeros((2, 3)), np.zeros((4, 2)), np.zeros((2, 2)), 4), ValueError,
     r"shapes a \(2, 3\) @ b \(4, 2\) -> c \(2, 2\) do not fit"),
    ((np.zeros((2, 3), np.float32), np.zeros((3, 2)), np.zeros((2, 2)), 4), ValueError, "dtypes float32, float64"),
    ((np.zeros((2, 3), np.int64), np.zeros((3, 2), np.int64), np.zeros((2, 2), np.int64), 4), ValueError,
     "a has dtype int64; the kernel takes float32 or float64"),
    ((np.zeros((3, 2)).T, np.zeros((3, 2)), np.zeros((2, 2)), 4), ValueError, "a of shape .* is not C-contiguous"),
    ((np.zeros(3), np.zeros((3, 2)), np.zeros((1, 2)), 4), TypeError, "a is a ndarray .* pass a 2-D"),
    ((np.zeros((2, 3)), np.zeros((3, 2)), np.zeros((2, 2)), 33), ValueError, "tile = 33; the tile side is an integer "
                                                                             "from 1 to 32"),
])
def test_bad_arguments_are_named(args, error, message):
    with pytest.raises(error, match=message):
        matmul.matmul(*args)


def test_output_must_not_alias_an_input():
    a = np.zeros((3, 3))
    with pytest.raises(ValueError, match="c shares memory with a or b"):
        matmul.matmul(a, np.zeros((3, 3)), a)
