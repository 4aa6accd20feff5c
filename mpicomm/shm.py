"""Node-shared memory for the caller: a pool of arrays every rank of a node can read and write.

``shm.Pool(comm, nbytes)`` reserves shared memory on every rank of a
one-node communicator; arrays from ``pool.empty(count, dtype)`` are ordinary
NumPy arrays. Passed to a shared-memory collective (``algorithm="shm"``) on
*comm*, they are read and written where they are by every rank - nothing is
copied in or out (the zero-copy path; plain arrays are copied through the
communicator's scratch). The windows, the arena and the counters the
collectives synchronise on live in :mod:`mpicomm.transport.memory`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .state import as_state
from .transport import memory
from .transport.memory import SharedWindow, check_single_node, round_up

__all__ = ["Pool", "arena"]


class Pool:
    """Arrays in node-shared memory: ``pool.empty(count, dtype)``; collective to create and to free.

    ``Pool(comm, nbytes)`` reserves *nbytes* on every rank of *comm* (all on one
    node). Arrays from :meth:`empty` are ordinary NumPy arrays; passed to a
    ``"shm"`` collective on *comm*, they are read and written in place by
    every rank - nothing is copied in. Allocation is local and bump-style;
    :meth:`reset` reclaims everything, :meth:`free` (collective) returns the
    memory. Also a context manager.

    An array outlives :meth:`free` safely: the memory is unmapped only once
    no array (or view of one) from the pool is left on any rank - until then
    the window is kept, retired, and freed at a later collective call of the
    communicator's pools (creating or freeing one) where every rank agrees it
    is unused. Unmapping it earlier, as MPI's ``Win_free`` does, turned a
    later read of such an array into a segmentation fault.
    """

    def __init__(self, comm: Any, nbytes: int):
        state = as_state(comm)
        check_single_node(state, "a shared-memory pool")
        if not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
            raise ValueError(f"nbytes={nbytes!r}: give the bytes to reserve on each rank, a non-negative int")
        self.comm = comm
        self._rank, self._size = state.rank, state.size
        self._arena = memory.arena(state)
        self._arena.release()  # collective, like the window: frees retired pools no array uses any more
        self._window: SharedWindow | None = SharedWindow(state.library_comm, round_up(int(nbytes)))
        # Arrays handed out are views of _root: NumPy makes every view's (and view of a view's) base the
        # first array that does not own its memory, so _root's reference count says whether any is alive.
        self._root: np.ndarray | None = self._window.export(self._rank)
        self.id = self._arena.add_pool(self)
        self._used = 0

    @property
    def window(self) -> SharedWindow:
        if self._window is None:
            raise ValueError("this shared-memory pool was freed; create a new one")
        return self._window

    @property
    def nbytes(self) -> int:
        """Bytes reserved on this rank."""
        return self.window.nbytes

    @property
    def available(self) -> int:
        """Bytes this rank can still allocate."""
        return self.window.nbytes - self._used

    def empty(self, shape: int | tuple[int, ...], dtype: Any = np.float64) -> np.ndarray:
        """A new uninitialised array in this rank's piece of the pool (local, not collective)."""
        dtype = np.dtype(dtype)
        count = math.prod(shape) if isinstance(shape, tuple) else int(shape)
        nbytes = count * dtype.itemsize
        start = round_up(self._used)
        if start + nbytes > self.window.nbytes:
            raise MemoryError(
                f"shared-memory pool: {nbytes} bytes requested, {self.window.nbytes - start} of "
                f"{self.window.nbytes} left on rank {self._rank}; create the pool larger or reset() it"
            )
        self._used = start + nbytes
        return self._root[start : start + nbytes].view(dtype).reshape(shape)  # type: ignore[index]

    def zeros(self, shape: int | tuple[int, ...], dtype: Any = np.float64) -> np.ndarray:
        """Like :meth:`empty`, filled with zeros."""
        x = self.empty(shape, dtype)
        x[...] = 0
        return x

    def reset(self) -> None:
        """Forget every array allocated so far (their memory will be handed out again)."""
        self._used = 0

    def offset(self, x: np.ndarray) -> int | None:
        """Where *x* starts in this rank's piece (bytes), or None when *x* is not wholly inside it."""
        if self._window is None or type(x) is not np.ndarray or not x.flags.c_contiguous:
            return None
        start = x.__array_interface__["data"][0] - self._window.base
        if start >= 0 and start + x.nbytes <= self._window.nbytes:
            return start
        return None

    def free(self) -> None:
        """Return the memory (collective over the pool's communicator); the pool allocates no more.

        Arrays from the pool that are still alive on some rank keep the memory
        mapped until they are gone (see the class docstring): reading them is
        safe, and the memory is returned at a later pool creation or free.
        """
        if self._window is not None:
            self._arena.remove_pool(self.id)
            self._arena.retire(self._window, self._root)
            self._window, self._root = None, None
            self._arena.release()

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    def __repr__(self) -> str:
        state = "freed" if self._window is None else f"{self._used}/{self._window.nbytes} bytes used"
        return f"<mpicomm.shm.Pool #{getattr(self, 'id', '?')} on {self._size} ranks, {state}>"


def arena(comm: Any) -> memory.Arena:
    """The communicator's arena (its control and scratch windows; created collectively on first use)."""
    return memory.arena(as_state(comm))
