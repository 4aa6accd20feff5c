"""apps/mapreduce/combine.py: each combiner's merge, bulk paths and the name lookup."""

from __future__ import annotations

from collections import Counter

import pytest

from apps.mapreduce.combine import Collect, Custom, Max, Min, Sum, Union, resolve


def test_sum_counts_keys_at_c_speed_and_merges_batches():
    c = Sum()
    store = c.new_store()
    assert isinstance(store, Counter)
    c.add_keys(store, ["a", "b", "a"])
    c.add_keys(store, ["a"], 5)
    c.add(store, "c", 2)
    assert store == {"a": 7, "b": 1, "c": 2}
    fresh = c.new_store()
    c.merge(fresh, ["a", "z"], [1, 2])
    c.merge(fresh, ["a", "y"], [10, 3])
    assert fresh == {"a": 11, "z": 2, "y": 3}


def test_min_max_union_collect_custom():
    for combiner, values, expected in [(Min(), [5, 3, 9], 3), (Max(), [5, 3, 9], 9), (Union(), [2, 1, 2], {1, 2}),
                                       (Collect(), [2, 1, 2], [2, 1, 2]), (Custom(lambda a, b: a * b), [2, 3, 4], 24)]:
        store = combiner.new_store()
        for v in values:
            combiner.add(store, "k", v)
        assert store == {"k": expected}, combiner
    u = Union()
    store = u.new_store()
    u.add_keys(store, {"a", "b"}, 3)
    u.add_keys(store, ["a"], 1)
    u.merge(store, ["a", "c"], [[7, 8], [9]])
    assert store == {"a": {1, 3, 7, 8}, "b": {3}, "c": {9}}
    assert u.finish({3, 1, 2}) == [1, 2, 3]
    col = Collect()
    store = {}
    col.merge(store, ["a"], [[1, 2]])
    col.merge(store, ["a"], [[3]])
    assert store == {"a": [1, 2, 3]}


def test_entry_bytes_grows_with_the_value():
    u = Union()
    assert u.entry_bytes("k", set(range(100))) > u.entry_bytes("k", {1}) > 0


def test_resolve_names_instances_callables_and_errors():
    assert isinstance(resolve("sum"), Sum) and isinstance(resolve(None), Collect)
    s = Max()
    assert resolve(s) is s
    assert isinstance(resolve(max), Custom)
    with pytest.raises(ValueError, match="unknown; use one of sum, min, max, union, collect"):
        resolve("avg")
    with pytest.raises(TypeError, match="expected a callable"):
        Custom(3)  # type: ignore[arg-type]
