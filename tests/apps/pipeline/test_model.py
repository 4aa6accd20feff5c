"""apps.pipeline.model: balanced partitions, stage layers, initial values equal to the unsplit model's."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from apps.nn import Sequential
from apps.pipeline.model import ModelError, ModelSpec, block_ranges, initial_values, layers, partition, stage_layers

pytestmark = pytest.mark.serial  # no MPI: the serial pass runs it


def _brute(costs, parts):
    n = len(costs)
    best = None
    for cuts in itertools.combinations(range(1, n), parts - 1):
        bounds = list(zip((0, *cuts), (*cuts, n)))
        worst = max(sum(costs[a:b]) for a, b in bounds)
        best = worst if best is None else min(best, worst)
    return best


@pytest.mark.parametrize("seed", range(20))
def test_partition_minimises_the_largest_stage(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 9))
    parts = int(rng.integers(1, n + 1))
    costs = list(rng.integers(1, 20, size=n).astype(float))
    bounds = partition(costs, parts)
    assert bounds[0][0] == 0 and bounds[-1][1] == n and all(a < b for a, b in bounds)
    assert all(b[1] == c[0] for b, c in zip(bounds, bounds[1:]))
    assert max(sum(costs[a:b]) for a, b in bounds) == _brute(costs, parts)


def test_block_ranges_errors_name_the_fix():
    spec = ModelSpec(blocks=6)
    with pytest.raises(ModelError, match="8 stages but the model has 6 blocks; use --blocks >= 8"):
        block_ranges(spec, 8)
    with pytest.raises(ModelError, match=r"blocks \(6\) divisible by stages x chunks \(4\); use --blocks 8"):
        block_ranges(spec, 4, equal=True)
    assert block_ranges(spec, 3, equal=True) == [(0, 2), (2, 4), (4, 6)]


def test_stages_cover_the_model_in_order_with_global_layer_numbers():
    spec = ModelSpec(features=5, width=6, hidden=8, blocks=5, classes=3)
    numbers = []
    for lo, hi in block_ranges(spec, 3):
        _, index = stage_layers(spec, lo, hi)
        numbers += index
    total = sum(len(layers(spec, u)) for u in range(spec.blocks + 2))
    assert numbers == list(range(total))


def test_initial_values_are_the_unsplit_models():
    spec = ModelSpec(features=5, width=6, hidden=8, blocks=3, classes=3)
    whole = Sequential([layer for u in range(spec.blocks + 2) for layer in layers(spec, u)], dtype=np.float64, seed=9)
    values = initial_values(spec, set(range(len(whole.layers))), 9)
    flat = np.concatenate([v.reshape(-1) for n in sorted(values) for v in values[n].values()])
    np.testing.assert_array_equal(flat, whole.params)
