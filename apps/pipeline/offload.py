"""Offloaded activations: parked in slots of another rank's memory between a forward and its backward.

The stage packs a micro-batch's saved activations (every layer's
:meth:`apps.nn.Layer.stash`, copied to the host when they live on a GPU) into
one byte buffer and writes it into a free slot of the partner rank's memory;
the backward reads it back and frees the slot. The partner takes no part. The
parking rank's planned peak of micro-batches in flight sets the slot count,
the largest stash of one micro-batch the slot size; the partner holds
slots × size bytes for it. Two places for the slots (:class:`RmaSlots`,
:class:`SharedSlots`):

``rma``
    the partner's RMA window (:meth:`mpicomm.Comm.expose`): ``put`` to park,
    a nonblocking get (``rget``, MPI's ``MPI_Rget``) to fetch. Passive-target RMA progresses
    only when the partner enters MPI, so a get issued when the backward needs
    the data waits for the partner's next MPI call (measured: fetching took
    3.65× the time of storing). Hence the prefetch below.
``shared``
    both ranks on one node: the slots are the partner's piece of a
    shared-memory window (``MPI_Win_allocate_shared`` on the node's
    communicator), which this rank maps too: parking and fetching are memory
    copies, and nobody waits for the partner.

Prefetch (:meth:`Offload.prefetch`), over RMA only: the executor names the
micro-batch of the next backward before each compute action; its fetch starts
then and is waited for when that backward begins, so it overlaps the
computation in between (the current backward, or a forward). A prefetched
micro-batch is held from then on: with prefetch a rank holds at most two
fetched micro-batches at once (the one whose backward runs and the next). A
shared window is not prefetched: its fetch is a memory copy at the backward,
and prefetching it would only hold two micro-batches where one suffices.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from apps.nn.xp import to_host

__all__ = ["Offload", "RmaSlots", "SharedSlots", "WINDOWS"]

#: ``--offload-window`` choices: where the partner's slots live (auto: shared when both ranks share a node).
WINDOWS = ("auto", "rma", "shared")


class RmaSlots:
    """The partner's slots in an mpicomm RMA window (``comm.expose``): put, and a nonblocking get (``rget``)."""

    kind = "rma"

    def __init__(self, window: Any, partner: int, wait: Callable[[Any], Any]) -> None:
        self.window, self.partner, self.wait = window, partner, wait

    def put(self, raw: np.ndarray, offset: int) -> None:
        self.window.put(raw, self.partner, offset)

    def start(self, offset: int, nbytes: int) -> Any:
        """Start reading *nbytes* at *offset*: the request (its result is the bytes)."""
        return self.window.rget(self.partner, offset, nbytes, out=np.empty(nbytes, np.uint8))

    def finish(self, started: Any) -> np.ndarray:
        out: np.ndarray = self.wait(started)  # sleeping: the partner answers when it next enters MPI
        return out


class SharedSlots:
    """The partner's slots in node-shared memory: this rank maps the partner's piece; put and get are copies."""

    kind = "shared"

    def __init__(self, segment: np.ndarray) -> None:
        self.segment = segment  # uint8 view of the partner's piece of the shared window

    def put(self, raw: np.ndarray, offset: int) -> None:
        self.segment[offset:offset + raw.size] = raw

    def start(self, offset: int, nbytes: int) -> np.ndarray:
        return self.segment[offset:offset + nbytes].copy()

    def finish(self, started: np.ndarray) -> np.ndarray:
        return started


class Offload:
    """Park packed activations in slots of a partner rank's memory, fetch them back, prefetch (module docstring)."""

    def __init__(self, slots_at: RmaSlots | SharedSlots, slot_bytes: int, slots: int, xp: Any = np) -> None:
        if slots < 1 or slot_bytes < 0:
            raise ValueError(f"offload needs at least one slot of >= 0 bytes, got {slots} slots of {slot_bytes} bytes")
        self.target = slots_at
        self.slot_bytes, self.slots = int(slot_bytes), int(slots)
        self.xp = xp  # the module the fetched activations go back to
        self._free = list(range(self.slots))
        self._where: dict[Any, tuple[int, list[tuple[int, np.dtype, tuple[int, ...], int]], int]] = {}
        self._started: dict[Any, Any] = {}  # key -> a fetch in progress (prefetched)
        self.bytes_moved = 0
        self.prefetched = 0  # fetches that a prefetch had started

    def park(self, key: Any, stash: list[tuple[Any, ...]]) -> None:
        """Pack every array of *stash* into one buffer and write it into a free slot of the partner's memory."""
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
                a = np.ascontiguousarray(to_host(v))
                layout.append((i, a.dtype, a.shape, offset))
                parts.append(a.reshape(-1).view(np.uint8))
                offset += a.nbytes
        if offset > self.slot_bytes:
            raise RuntimeError(f"offload: {offset} bytes of activations exceed the {self.slot_bytes}-byte slot")
        if parts:
            self.target.put(np.concatenate(parts), slot * self.slot_bytes)
        self.bytes_moved += offset
        self._where[key] = (slot, layout, offset)

    def parked(self, key: Any) -> bool:
        return key in self._where

    def prefetch(self, key: Any) -> int:
        """Start fetching *key* if it is parked and not yet started; the bytes started (0 if none; a shared
        window's slots are not prefetched, see the module docstring)."""
        if key not in self._where or key in self._started or self.target.kind == "shared":
            return 0
        slot, _, total = self._where[key]
        if total:
            self._started[key] = self.target.start(slot * self.slot_bytes, total)
        return total

    def fetch(self, key: Any, layers: int) -> list[tuple[Any, ...]]:
        """The parked stash of *key* (waiting for its prefetch, or reading it now), and free its slot."""
        slot, layout, total = self._where[key]
        if key in self._started:
            self.prefetched += 1
            raw = self.target.finish(self._started.pop(key))
        elif total:
            raw = self.target.finish(self.target.start(slot * self.slot_bytes, total))
        else:
            raw = np.empty(0, np.uint8)
        del self._where[key]
        self.bytes_moved += total
        self._free.append(slot)
        out: list[list[Any]] = [[] for _ in range(layers)]
        for i, dt, shape, off in layout:
            if off < 0:
                out[i].append(None)
            else:
                n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
                out[i].append(self.xp.asarray(raw[off:off + n].view(dt).reshape(shape)))
        return [tuple(v) for v in out]
