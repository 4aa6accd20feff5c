"""apps.sgd.buckets: contiguous buckets in reverse layer order, DDP's caps, readiness by layer."""

from __future__ import annotations

import pytest

from apps.sgd.buckets import Parameter, buffer_sizes, in_flight, plan, ready_at

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


def test_a_bucket_is_written_from_its_highest_layer():
    params = _params([[4, 2], [], [3, 1]])
    assert [b.written_from for b in plan(params, 8, per_parameter=True)] == [2, 2, 0, 0]
    assert [(b.written_from, b.ready_after) for b in plan(params, 8)] == [(2, 0)]


def test_zero2_reuses_a_buffer_once_its_previous_bucket_has_launched():
    params = _params([[100, 10], [], [300, 30], [50, 5]])
    # One bucket per layer: backward writes one bucket at a time, so two buffers alternate;
    # each is sized for the largest of its buckets (0 and 2: 55 and 110; 1: 330).
    per_layer = plan(params, 4, cap_mb=31 * 4 / (1 << 20))
    assert [b.size for b in per_layer] == [55, 330, 110]
    assert in_flight(per_layer) == 2 and buffer_sizes(per_layer, 2) == [110, 330]
    # One bucket per tensor: a layer's b and W are written by the same backward, so two are open at once
    # and a third buffer takes the overlap.
    per_tensor = plan(params, 4, per_parameter=True)
    assert in_flight(per_tensor) == 3 and buffer_sizes(per_tensor, 3) == [300, 50, 100]
    # Without overlap every collective starts after backward: a buffer per bucket, the whole gradient.
    assert in_flight(per_tensor, overlap=False) == 6 and sum(buffer_sizes(per_tensor, 6)) == 495
    whole = plan(params, 4)
    assert in_flight(whole) == 1 and buffer_sizes(whole, 1) == [495]


def test_bad_caps_and_gaps_are_refused():
    with pytest.raises(ValueError, match="bucket cap 0 MB"):
        plan(_params([[3]]), 4, cap_mb=0)
    gap = [Parameter("a", 0, 3, 0), Parameter("b", 4, 6, 1)]
    with pytest.raises(ValueError, match="not contiguous"):
        plan(gap, 4)
