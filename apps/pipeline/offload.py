"""Offloaded activations: parked in slots of another rank's RMA window between a forward and its backward.

The stage packs a micro-batch's saved activations (every layer's
:meth:`apps.nn.Layer.stash`) into one byte buffer and ``put``s it into a free
slot of the partner rank's window (:meth:`mpicomm.Comm.expose`); the backward
``get``s it back and frees the slot. The partner takes no part (passive-target
RMA). The parking rank's planned peak of micro-batches in flight sets the slot
count, the largest stash of one micro-batch the slot size; the partner exposes
slots × size bytes for it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["Offload"]


class Offload:
    """Park packed activations in slots of a partner rank's window (see the module docstring)."""

    def __init__(self, window: Any, partner: int, slot_bytes: int, slots: int) -> None:
        if slots < 1 or slot_bytes < 0:
            raise ValueError(f"offload needs at least one slot of >= 0 bytes, got {slots} slots of {slot_bytes} bytes")
        self.window, self.partner = window, partner
        self.slot_bytes, self.slots = int(slot_bytes), int(slots)
        self._free = list(range(self.slots))
        self._where: dict[Any, tuple[int, list[tuple[int, np.dtype, tuple[int, ...], int]]]] = {}
        self.bytes_moved = 0

    def park(self, key: Any, stash: list[tuple[Any, ...]]) -> None:
        """Pack every array of *stash* into one buffer and put it into a free slot of the partner's window."""
        if not self._free:
            raise RuntimeError(f"offload: all {self.slots} slots in use; the schedule keeps more micro-batches in "
                               f"flight than planned")
        slot = self._free.pop(0)
        layout = []
        parts = []
        offset = 0
        for i, values in enumerate(stash):
            for v in values:
                if v is None:
                    layout.append((i, np.dtype(np.uint8), (), -1))
                    continue
                a = np.ascontiguousarray(v)
                layout.append((i, a.dtype, a.shape, offset))
                parts.append(a.reshape(-1).view(np.uint8))
                offset += a.nbytes
        if offset > self.slot_bytes:
            raise RuntimeError(f"offload: {offset} bytes of activations exceed the {self.slot_bytes}-byte slot")
        if parts:
            self.window.put(np.concatenate(parts), self.partner, slot * self.slot_bytes)
        self.bytes_moved += offset
        self._where[key] = (slot, layout)

    def fetch(self, key: Any, layers: int) -> list[tuple[Any, ...]]:
        """Get a parked stash back (and free its slot)."""
        slot, layout = self._where.pop(key)
        total = max((off + int(np.prod(shape, dtype=np.int64)) * dt.itemsize for _, dt, shape, off in layout
                     if off >= 0), default=0)
        raw = self.window.get(self.partner, slot * self.slot_bytes, total) if total else np.empty(0, np.uint8)
        self.bytes_moved += total
        self._free.append(slot)
        out: list[list[Any]] = [[] for _ in range(layers)]
        for i, dt, shape, off in layout:
            if off < 0:
                out[i].append(None)
            else:
                n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
                out[i].append(raw[off:off + n].view(dt).reshape(shape))
        return [tuple(v) for v in out]
