"""apps.pipeline.stage: micro-batches in flight in any order, split backward, recompute equal to store."""

from __future__ import annotations

import numpy as np
import pytest

from apps.pipeline.model import ModelSpec, initial_values, stage_layers
from apps.pipeline.stage import Stage

pytestmark = pytest.mark.serial  # no MPI: the serial pass runs it

SPEC = ModelSpec(features=5, width=6, hidden=8, blocks=2, classes=3, activation="gelu")


def _stage(strategy="store"):
    lay, numbers = stage_layers(SPEC, 0, 2)
    return Stage(0, lay, numbers, initial_values(SPEC, set(numbers), 4), dtype=np.float64, seed=4, strategy=strategy)


def _data(k):
    rng = np.random.default_rng(k)
    return rng.standard_normal((4 + k, SPEC.features)), rng.standard_normal((4 + k, SPEC.classes))


def _one_at_a_time(strategy="store"):
    st = _stage(strategy)
    for k in range(3):
        x, dy = _data(k)
        st.forward(k, x, (0, k))
        st.backward(k, dy)
    return st.model.grads.copy()


@pytest.mark.parametrize("strategy", ["store", "recompute"])
def test_interleaved_micro_batches_equal_one_at_a_time(strategy):
    st = _stage(strategy)
    for k in range(3):
        st.forward(k, _data(k)[0], (0, k))
    assert st.in_flight == 3 and st.meter.peak_micro == 3
    for k in (1, 0, 2):
        st.backward(k, _data(k)[1])
    assert st.in_flight == 0 and st.held == 0
    np.testing.assert_allclose(st.model.grads, _one_at_a_time(), rtol=1e-13, atol=1e-15)


def test_split_backward_with_deferred_weights_equals_backward():
    st = _stage()
    for k in range(3):
        st.forward(k, _data(k)[0], (0, k))
    for k in range(3):
        st.backward_input(k, _data(k)[1])
    assert st.in_flight == 3  # W still to come: what it needs is held
    for k in (2, 0, 1):
        st.backward_weight(k)
    assert st.in_flight == 0 and st.held == 0
    np.testing.assert_allclose(st.model.grads, _one_at_a_time(), rtol=1e-13, atol=1e-15)


def test_recompute_holds_only_the_stage_input():
    store, recompute = _stage("store"), _stage("recompute")
    x = _data(0)[0]
    store.forward(0, x, (0, 0))
    recompute.forward(0, x, (0, 0))
    assert recompute.held == x.nbytes < store.held


def test_hook_fires_for_every_layer_in_reverse():
    st = _stage()
    seen = []
    st.forward(0, _data(0)[0], (0, 0))
    st.backward(0, _data(0)[1], hook=seen.append)
    assert seen == list(range(len(st.layers) - 1, -1, -1))
