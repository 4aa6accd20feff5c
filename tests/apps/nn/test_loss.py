"""apps.nn.loss: cross-entropy by hand and by finite differences; denominator, stability, empty batches."""

from __future__ import annotations

import math

import numpy as np
import pytest

from apps.nn import correct, softmax_cross_entropy

pytestmark = pytest.mark.serial  # no MPI: the serial pass runs it


def test_hand_computed_values():
    logits = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    labels = np.array([2, 0])
    # Row 0: log(e + e^2 + e^3) - 3; row 1: log 3.
    row0 = math.log(math.e + math.e ** 2 + math.e ** 3) - 3.0
    row1 = math.log(3.0)
    loss, d = softmax_cross_entropy(logits, labels)
    assert isinstance(loss, float)
    assert loss == pytest.approx((row0 + row1) / 2, rel=1e-14)
    z = math.e + math.e ** 2 + math.e ** 3
    want = np.array([[math.e / z, math.e ** 2 / z, math.e ** 3 / z - 1], [1 / 3 - 1, 1 / 3, 1 / 3]]) / 2
    np.testing.assert_allclose(d, want, rtol=1e-14)


def test_gradient_matches_finite_differences():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((4, 5)) * 3
    labels = np.array([0, 4, 2, 2])
    _, d = softmax_cross_entropy(logits, labels)
    h = 1e-6
    numeric = np.zeros_like(logits)
    for idx in np.ndindex(logits.shape):
        up, down = logits.copy(), logits.copy()
        up[idx] += h
        down[idx] -= h
        numeric[idx] = (softmax_cross_entropy(up, labels)[0] - softmax_cross_entropy(down, labels)[0]) / (2 * h)
    np.testing.assert_allclose(d, numeric, rtol=1e-6, atol=1e-8)


def test_denominator_scales_gradient_only():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((6, 3))
    labels = rng.integers(0, 3, 6)
    loss, d = softmax_cross_entropy(logits, labels)
    loss2, d2 = softmax_cross_entropy(logits, labels, denominator=24)
    assert loss2 == loss
    np.testing.assert_allclose(d2, d * 6 / 24, rtol=1e-14)
    # Two halves of a batch with denominator = whole batch sum to the whole batch's gradient.
    _, a = softmax_cross_entropy(logits[:2], labels[:2], denominator=6)
    _, b = softmax_cross_entropy(logits[2:], labels[2:], denominator=6)
    np.testing.assert_allclose(np.concatenate([a, b]), d, rtol=1e-14)


def test_stable_for_large_logits():
    logits = np.array([[1000.0, 0.0], [-1000.0, 1000.0]])
    loss, d = softmax_cross_entropy(logits, np.array([0, 0]))
    assert loss == pytest.approx(1000.0)
    assert np.all(np.isfinite(d))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dtype_and_empty_batch(dtype):
    loss, d = softmax_cross_entropy(np.zeros((0, 4), dtype), np.zeros(0, np.int64))
    assert loss == 0.0 and d.shape == (0, 4) and d.dtype == dtype
    _, d = softmax_cross_entropy(np.ones((2, 4), dtype), np.array([1, 3]))
    assert d.dtype == dtype
    assert correct(np.zeros((0, 4), dtype), np.zeros(0, np.int64)) == 0


def test_correct():
    logits = np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]])
    assert correct(logits, np.array([1, 0, 0])) == 2
    assert isinstance(correct(logits, np.array([1, 0, 1])), int)


def test_argument_errors():
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):
        softmax_cross_entropy(np.zeros((2, 3)), np.array([0, 3]))
    with pytest.raises(TypeError, match="integer"):
        softmax_cross_entropy(np.zeros((2, 3)), np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"shape \(2,\)"):
        softmax_cross_entropy(np.zeros((2, 3)), np.array([0, 1, 2]))
    with pytest.raises(ValueError, match="denominator must be positive, got 0"):
        softmax_cross_entropy(np.zeros((2, 3)), np.array([0, 1]), denominator=0)
