"""Combiners: how values of one key merge, on the map side (MR-MPI's compress) and after the shuffle.

Why a combiner object and not just a reducer: word count emits tens of millions of
pairs and only about a hundred thousand distinct words. Combining as pairs arrive
(``Counter.update`` runs in C) keeps one value per key in memory and on the wire,
so the shuffle moves the vocabulary, not the text. The same merge runs again on
the receiving rank, so a job whose reducer is the combiner itself needs none.

A combiner is a commutative, associative merge. The named ones have fast bulk
paths; :class:`Custom` takes any Python ``fn(a, b) -> value``; :class:`Collect`
keeps every value in a list (no combining: MR-MPI's convert to a multivalue).
"""

from __future__ import annotations

import abc
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["Combiner", "Sum", "Min", "Max", "Union", "Collect", "Custom", "resolve", "NAMES"]

#: Bytes a dict entry costs beyond its key and value objects (hash, pointers, spare slots).
ENTRY_OVERHEAD = 80


class Combiner(abc.ABC):
    """Merges the values of equal keys; *value_kinds* lists the value kinds it works on."""

    name = "combiner"
    value_kinds: tuple[str, ...] = ("int", "float", "str", "ints")

    def new_store(self) -> dict:
        """An empty store (key → combined value)."""
        return {}

    @abc.abstractmethod
    def add(self, store: dict, key: Any, value: Any) -> None:
        """Merge one pair into *store* (every combiner defines it)."""

    def add_keys(self, store: dict, keys: Iterable, value: Any) -> None:
        """Merge ``(k, value)`` for every k in *keys*."""
        for key in keys:
            self.add(store, key, value)

    def merge(self, store: dict, keys: list, values: list) -> None:
        """Merge a batch of pairs (keys distinct within the batch) into *store*."""
        if not store:
            store.update(zip(keys, map(self.prepare, values)))
            return
        for key, value in zip(keys, values):
            self.add(store, key, self.prepare(value))

    def prepare(self, value: Any) -> Any:
        """A value as read back from a batch, in the form the store keeps (Union: a set)."""
        return value

    def finish(self, value: Any) -> Any:
        """A stored value in the form it is packed (Union: a sorted list)."""
        return value

    def entry_bytes(self, key: Any, value: Any) -> int:
        """Estimated bytes one store entry holds (key, value, dict slot)."""
        return sys.getsizeof(key) + sys.getsizeof(value) + ENTRY_OVERHEAD

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Sum(Combiner):
    """Sum of the values (counts); ``add_keys`` with value 1 is ``Counter.update`` (C)."""

    name = "sum"
    value_kinds = ("int", "float")

    def new_store(self) -> dict:
        return Counter()

    def add(self, store: dict, key: Any, value: Any) -> None:
        store[key] = store.get(key, 0) + value

    def add_keys(self, store: dict, keys: Iterable, value: Any = 1) -> None:
        if value == 1 and isinstance(store, Counter):
            store.update(keys)
            return
        get = store.get
        for key in keys:
            store[key] = get(key, 0) + value

    def merge(self, store: dict, keys: list, values: list) -> None:
        if not store:
            dict.update(store, zip(keys, values))
            return
        get = store.get
        for key, value in zip(keys, values):
            store[key] = get(key, 0) + value


class Min(Combiner):
    """The smallest value."""

    name = "min"
    value_kinds = ("int", "float", "str")

    def add(self, store: dict, key: Any, value: Any) -> None:
        old = store.get(key)
        if old is None or value < old:
            store[key] = value


class Max(Combiner):
    """The largest value."""

    name = "max"
    value_kinds = ("int", "float", "str")

    def add(self, store: dict, key: Any, value: Any) -> None:
        old = store.get(key)
        if old is None or value > old:
            store[key] = value


class Union(Combiner):
    """The set of distinct integer values (an inverted index's postings); packed as sorted int lists."""

    name = "union"
    value_kinds = ("ints",)

    def add(self, store: dict, key: Any, value: Any) -> None:
        found = store.get(key)
        if found is None:
            store[key] = found = set()
        if isinstance(value, (set, frozenset, list, tuple)):
            found.update(value)
        else:
            found.add(value)

    def add_keys(self, store: dict, keys: Iterable, value: Any) -> None:
        get = store.get
        for key in keys:
            found = get(key)
            if found is None:
                store[key] = {value}
            else:
                found.add(value)

    def prepare(self, value: Any) -> Any:
        return set(value)

    def finish(self, value: Any) -> Any:
        return sorted(value)

    def entry_bytes(self, key: Any, value: Any) -> int:
        return sys.getsizeof(key) + sys.getsizeof(value) + 32 * len(value) + ENTRY_OVERHEAD


class Collect(Combiner):
    """No combining: every value is kept, in a list (the reducer gets them all)."""

    name = "collect"
    value_kinds = ("ints",)

    def add(self, store: dict, key: Any, value: Any) -> None:
        found = store.get(key)
        if found is None:
            store[key] = found = []
        if isinstance(value, list):
            found.extend(value)
        else:
            found.append(value)

    def prepare(self, value: Any) -> Any:
        return list(value)

    def entry_bytes(self, key: Any, value: Any) -> int:
        return sys.getsizeof(key) + sys.getsizeof(value) + 32 * len(value) + ENTRY_OVERHEAD


class Custom(Combiner):
    """Any commutative, associative ``fn(a, b) -> value``, called once per merge."""

    name = "custom"

    def __init__(self, fn: Callable[[Any, Any], Any]):
        if not callable(fn):
            raise TypeError(f"combine {fn!r}: expected a callable fn(a, b) -> value or one of {', '.join(NAMES)}")
        self.fn = fn

    def add(self, store: dict, key: Any, value: Any) -> None:
        store[key] = self.fn(store[key], value) if key in store else value

    def __repr__(self) -> str:
        return f"Custom({getattr(self.fn, '__name__', self.fn)!r})"


NAMES = {"sum": Sum, "min": Min, "max": Max, "union": Union, "collect": Collect}


def resolve(combine: str | Combiner | Callable[[Any, Any], Any] | None) -> Combiner:
    """A :class:`Combiner` from a name, an instance, a callable ``fn(a, b)``, or None (collect)."""
    if combine is None:
        return Collect()
    if isinstance(combine, Combiner):
        return combine
    if isinstance(combine, str):
        if combine not in NAMES:
            raise ValueError(f"combine {combine!r}: unknown; use one of {', '.join(NAMES)} or a callable fn(a, b)")
        return NAMES[combine]()
    return Custom(combine)
