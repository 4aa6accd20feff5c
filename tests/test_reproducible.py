"""mpicomm.reproducible: the digits and their rounding, in one process (the collectives: tests/front/test_reproducing.py).

Contributions with wide exponent ranges and cancellations: the sum is the same bits in every order, within
the documented bound of the exact sum (math.fsum), and where the ordinary sum is exact, equal to it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from mpicomm import reproducible as R


def wide(seed: int, n: int, dtype, spread: int = 60) -> np.ndarray:
    """Values of both signs over 2**±spread, some cancelling each other."""
    g = np.random.default_rng(seed)
    x = (g.standard_normal(n) * np.exp2(g.integers(-spread, spread, n))).astype(dtype)
    if n > 4:
        x[: n // 4] = -np.flip(x[-(n // 4):])  # (pairs that cancel exactly)
    return x


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("contributions", [1, 2, 3, 5, 17])
def test_every_order_gives_the_same_bits_within_the_bound(dtype, contributions):
    n = 500
    xs = [wide(100 + i, n, dtype) for i in range(contributions)]
    if contributions > 1:  # sums that nearly cancel
        xs[-1][:50] = -np.sum([x[:50].astype(np.float64) for x in xs[:-1]], axis=0).astype(dtype)
    first = R.sum_of(xs)
    assert first.dtype == np.dtype(dtype) and first.shape == (n,)
    g = np.random.default_rng(7)
    for _ in range(6):
        order = g.permutation(contributions)
        assert R.sum_of([xs[i] for i in order]).tobytes() == first.tobytes()
    for i in range(n):
        column = [float(x[i]) for x in xs]
        error = abs(float(first[i]) - math.fsum(column))
        assert error <= R.bound(column, float(first[i]), dtype), (i, column, first[i])


def test_the_bound_is_met_where_the_ordinary_sum_fails():
    """1 + 2**-60 - 1 in float64: the ordinary sum in that order gives 0, the reproducible one 2**-60 in every
    order (the small term is within the 80-bit window below the largest)."""
    xs = [np.array([1.0]), np.array([2.0 ** -60]), np.array([-1.0])]
    assert (xs[0] + xs[1] + xs[2])[0] == 0.0
    assert R.sum_of(xs)[0] == 2.0 ** -60
    assert R.sum_of(xs[::-1])[0] == 2.0 ** -60


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_sums_that_are_exact_equal_the_ordinary_sum(dtype):
    g = np.random.default_rng(3)
    xs = [g.integers(-1000, 1000, 300).astype(dtype) for _ in range(4)]
    assert R.sum_of(xs).tobytes() == (xs[0] + xs[1] + xs[2] + xs[3]).tobytes()


def test_specials_zeros_subnormals_and_overflow():
    tiny = np.nextafter(0.0, 1.0)
    big = np.finfo(np.float64).max
    x = np.array([np.inf, np.nan, -np.inf, 0.0, tiny, big, -0.0, 1.0, np.inf])
    y = np.array([-np.inf, 1.0, -np.inf, 0.0, tiny, big, -0.0, np.inf, 2.0])
    out = R.sum_of([x, y])
    assert np.isnan(out[0]) and np.isnan(out[1])
    assert out[2] == -np.inf and out[7] == np.inf and out[8] == np.inf
    assert out[3] == 0.0 and out[6] == 0.0
    assert out[4] == 2 * tiny
    assert out[5] == np.inf  # (the exact sum is above the largest float64)
    assert R.sum_of([y, x]).tobytes() == out.tobytes()


def test_complex_sums_are_their_parts_sums():
    re = [wide(i, 64, np.float64) for i in range(3)]
    im = [wide(10 + i, 64, np.float64) for i in range(3)]
    z = R.sum_of([a + 1j * b for a, b in zip(re, im)])
    assert z.dtype == np.complex128
    assert z.real.tobytes() == R.sum_of(re).tobytes() and z.imag.tobytes() == R.sum_of(im).tobytes()


def test_float32_digits_lose_nothing_within_sixteen_bits_of_the_largest():
    xs = [np.float32([1.0, 3.0]), np.float32([2.0 ** -15, 2.0 ** -14]), np.float32([1.0, -3.0])]
    assert R.sum_of(xs).tolist() == [2.0 + 2.0 ** -15, 2.0 ** -14]


@pytest.mark.parametrize("dtype,op,what", [(np.int64, "sum", "exact"), (np.float64, "max", "exact"),
                                           (np.bool_, "lor", "exact"), (np.float64, "sum", None),
                                           (np.complex64, "sum", None)])
def test_supported(dtype, op, what):
    assert R.supported(dtype, op) == what


@pytest.mark.parametrize("dtype,op", [(np.float64, "prod"), (np.float16, "sum"), (np.longdouble, "sum")])
def test_what_has_no_reproducible_sum_is_named(dtype, op):
    with pytest.raises(ValueError, match=r"op SUM on float32, float64, complex64 or complex128.*reproducible=False"):
        R.supported(dtype, op)


def test_sum_of_refuses_mixed_or_too_many_contributions():
    with pytest.raises(ValueError, match="same shape and element type"):
        R.sum_of([np.zeros(3), np.zeros(4)])
    with pytest.raises(ValueError, match="at least one"):
        R.sum_of([])


@pytest.mark.skipif(R._kernels is None, reason="the compiled kernels are not built")
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_host_kernels_give_the_array_module_codes_bits(dtype, monkeypatch):
    """Host arrays run the compiled kernels, device arrays the array-module code: a job mixing both must agree."""
    spread = 300 if dtype == np.float64 else 60
    xs = [wide(40 + i, 3000, dtype, spread) for i in range(3)]
    xs[0][:6] = [np.inf, -np.inf, np.nan, 0.0, np.finfo(dtype).tiny / 4, -np.finfo(dtype).max]
    compiled = R.sum_of(xs)
    e = R.exponents(xs[1])
    d = R.digits(xs[1], e)
    monkeypatch.setattr(R, "_kernels", None)
    assert R.sum_of(xs).tobytes() == compiled.tobytes()
    assert R.exponents(xs[1]).tobytes() == e.tobytes() and R.digits(xs[1], e).tobytes() == d.tobytes()
