"""apps.sgd.buckets: contiguous buckets in reverse layer order, DDP's caps, readiness by layer."""

from __future__ import annotations

import pytest

from apps.sgd.buckets import Parameter, plan, ready_at

pytestmark = pytest.mark.serial


def _params(sizes_by_layer):
    """Parameters laid out in forward order: layer i owns the sizes listed for it."""
    out, start = [], 0
    for layer, sizes in enumerate(sizes_by_layer):
        for j, n in enumerate(sizes):
            out.append(Parameter(f"{layer}.{j}", start, start + n, layer))
            start += n
    return out


def test_buckets_tile_the_buffer_from_the_end_in_order():
    params = _params([[100, 10], [], [300, 30], [50, 5]])
    buckets = plan(params, 4, cap_mb=400 * 4 / (1 << 20))  # cap: 400 elements
    assert [b.index for b in buckets] == list(range(len(buckets)))
    assert buckets[0].stop == 495 and buckets[-1].start == 0
    for a, b in zip(buckets, buckets[1:]):
        assert b.stop == a.start  # contiguous, walking backwards
    assert sum(b.size for b in buckets) == 495


def test_first_bucket_is_capped_at_one_mib_then_the_cap():
    mib = 1 << 20
    params = _params([[mib // 4] * 8])  # eight 1 MiB float32 tensors in one layer
    buckets = plan(params, 4, cap_mb=3)
    assert [b.size * 4 // mib for b in buckets] == [1, 3, 3, 1]


def test_a_cap_below_one_mib_applies_to_the_first_bucket_too():
    params = _params([[10], [10], [10], [10]])
    assert [b.size for b in plan(params, 8, cap_mb=16 * 8 / (1 << 20))] == [20, 20]


def test_per_parameter_gives_one_bucket_per_tensor():
    params = _params([[4, 2], [3, 1]])
    buckets = plan(params, 8, per_parameter=True)
    assert [b.names for b in buckets] == [("1.1",), ("1.0",), ("0.1",), ("0.0",)]


def test_a_bucket_is_ready_after_its_lowest_layer():
    params = _params([[4, 2], [], [3, 1]])
    buckets = plan(params, 8, per_parameter=True)
    table = ready_at(buckets, 3)
    assert table == [[2, 3], [], [0, 1]]
    whole = plan(params, 8)
    assert ready_at(whole, 3) == [[0], [], []]


def test_bad_caps_and_gaps_are_refused():
    with pytest.raises(ValueError, match="bucket cap 0 MB"):
        plan(_params([[3]]), 4, cap_mb=0)
    gap = [Parameter("a", 0, 3, 0), Parameter("b", 4, 6, 1)]
    with pytest.raises(ValueError, match="not contiguous"):
        plan(gap, 4)
