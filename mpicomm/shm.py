"""Node-shared memory for collectives: a pool of arrays every rank of a node can read, and the scratch arena.

On one node, MPI can hand every rank a piece of one shared mapping
(``MPI_Win_allocate_shared``); each rank then reads and writes the others'
pieces with plain loads and stores, no messages. mpicomm uses that two ways:

* :class:`Pool` - arrays the *caller* allocates in shared memory
  (``pool.empty(count, dtype)``). A shared-memory algorithm (``"shm"``) given
  pool arrays reads the peers' inputs and writes their outputs where they
  are: it copies nothing in (the zero-copy path);
* the per-communicator arena - a scratch window that other arrays are copied
  into once, plus a small control window in which every rank publishes, per
  call, where its input and output live (its own scratch or a pool array).

A shared-memory collective is therefore: publish (copy in if needed), node
barrier, work straight on the peers' memory, node barrier, copy out if needed.
The barriers are MPI's (``Ibarrier`` on the collective's communicator, so a
nonblocking call stays nonblocking); ``Win_sync`` around them orders the
loads and stores (MPI's unified memory model).

Everything here is host memory; device (CuPy) buffers use the message-passing
algorithms. Windows are created collectively, in call order, so every rank
knows every pool by the same number. The scratch and control windows serve
one call at a time: the shared-memory algorithms are registered for blocking
calls only (``blocking_only``), so two never overlap on a communicator.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from mpi4py import MPI

from .coll.schedules import block_partition
from .requests import Step, Steps, barrier
from .state import State, as_state

__all__ = ["Pool", "Arena", "arena", "place", "target", "slices", "reduce_steps", "SCRATCH", "POOL", "ALIGN"]

ALIGN = 64  #: bytes: pool arrays and scratch regions start on cache-line boundaries
SCRATCH, POOL = 0, 1  #: where a published array lives
_SLOT = 8  #: int64 words per rank in the control window
_MIN_SCRATCH = 1 << 20


def _round(n: int, to: int = ALIGN) -> int:
    return -(-n // to) * to


class _Window:
    """One ``Win.Allocate_shared`` window; ``segments[r]`` is rank r's piece as a uint8 array."""

    def __init__(self, comm: MPI.Intracomm, nbytes: int):
        barrier(comm)  # keep serving pending mpicomm requests while the others arrive
        self.win = MPI.Win.Allocate_shared(nbytes, 1, comm=comm)
        self.win.Lock_all(MPI.MODE_NOCHECK)  # a passive epoch for Win_sync (memory ordering only)
        self.nbytes = nbytes
        self.segments = []
        for r in range(comm.Get_size()):
            buf, _ = self.win.Shared_query(r)
            self.segments.append(np.frombuffer(buf, np.uint8) if len(buf) else np.empty(0, np.uint8))
        self.base = self.segments[comm.Get_rank()].__array_interface__["data"][0]

    def sync(self) -> None:
        """Order this rank's loads and stores of shared memory around a barrier (``MPI_Win_sync``)."""
        self.win.Sync()

    def free(self) -> None:
        self.segments = []
        self.win.Unlock_all()
        self.win.Free()


def _check_single_node(state: State, what: str) -> None:
    if state.nodes != 1:
        raise ValueError(
            f"{what} needs every rank of the communicator on one node, but it spans {state.nodes} nodes; "
            f"use the node's communicator (comm.node_comm) or a message-passing algorithm"
        )


class Pool:
    """Arrays in node-shared memory: ``pool.empty(count, dtype)``; collective to create and to free.

    ``Pool(comm, nbytes)`` reserves *nbytes* on every rank of *comm* (all on one
    node). Arrays from :meth:`empty` are ordinary NumPy arrays; passed to a
    ``"shm"`` collective on *comm*, they are read and written in place by
    every rank - nothing is copied in. Allocation is local and bump-style;
    :meth:`reset` reclaims everything, :meth:`free` (collective) returns the
    memory. Also a context manager.
    """

    def __init__(self, comm: Any, nbytes: int):
        state = as_state(comm)
        _check_single_node(state, "a shared-memory pool")
        if not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
            raise ValueError(f"nbytes={nbytes!r}: give the bytes to reserve on each rank, a non-negative int")
        self.comm = comm
        self._rank, self._size = state.rank, state.size
        self._arena = arena(state)
        self._window: _Window | None = _Window(state.library_comm, _round(int(nbytes)))
        self.id = self._arena.add_pool(self)
        self._used = 0

    @property
    def window(self) -> _Window:
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
        start = _round(self._used)
        if start + nbytes > self.window.nbytes:
            raise MemoryError(
                f"shared-memory pool: {nbytes} bytes requested, {self.window.nbytes - start} of "
                f"{self.window.nbytes} left on rank {self._rank}; create the pool larger or reset() it"
            )
        self._used = start + nbytes
        return self.window.segments[self._rank][start : start + nbytes].view(dtype).reshape(shape)

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
        if 0 <= start and start + x.nbytes <= self._window.nbytes:
            return start
        return None

    def free(self) -> None:
        """Return the memory (collective over the pool's communicator)."""
        if self._window is not None:
            self._arena.remove_pool(self.id)
            self._window.free()
            self._window = None

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    def __repr__(self) -> str:
        state = "freed" if self._window is None else f"{self._used}/{self._window.nbytes} bytes used"
        return f"<mpicomm.shm.Pool #{getattr(self, 'id', '?')} on {self._size} ranks, {state}>"


class Arena:
    """Per communicator: the control window, the scratch window (grown on demand) and the pools.

    Used by the ``"shm"`` algorithms through :meth:`publish`, :meth:`view`,
    :meth:`fence` and :meth:`scratch`; see the module docstring.
    """

    def __init__(self, state: State):
        self.lib = state.library_comm
        self.rank = self.lib.Get_rank()
        self.p = self.lib.Get_size()
        self.control = _Window(self.lib, _SLOT * 8)
        self.slots = [s.view(np.int64) for s in self.control.segments]
        self._scratch: _Window | None = None
        self.pools: dict[int, Pool] = {}
        self._next_pool = 0

    # ------------------------------------------------------------ pools

    def add_pool(self, pool: Pool) -> int:
        self._next_pool += 1
        self.pools[self._next_pool] = pool
        return self._next_pool

    def remove_pool(self, pool_id: int) -> None:
        self.pools.pop(pool_id, None)

    def locate(self, x: Any) -> tuple[int, int] | None:
        """``(pool id, byte offset)`` when array *x* lies in one of this communicator's pools, else None."""
        for pool_id, pool in self.pools.items():
            offset = pool.offset(x)
            if offset is not None:
                return pool_id, offset
        return None

    # ------------------------------------------------------------ scratch

    def scratch(self, nbytes: int) -> np.ndarray:
        """This rank's scratch piece, at least *nbytes* (collective when it must grow: same *nbytes* everywhere)."""
        if self._scratch is None or self._scratch.nbytes < nbytes:
            size = max(_MIN_SCRATCH, 1 << max(0, (nbytes - 1).bit_length()))
            if self._scratch is not None:
                self._scratch.free()
                self._scratch = None
            self._scratch = _Window(self.lib, size)
        return self._scratch.segments[self.rank]

    def segment(self, kind: int, ident: int, rank: int) -> np.ndarray:
        """Rank *rank*'s piece of the scratch window (kind SCRATCH) or of pool *ident* (kind POOL)."""
        if kind == POOL:
            return self.pools[ident].window.segments[rank]
        if self._scratch is None:
            raise RuntimeError("shared-memory scratch read before any call reserved it (Arena.scratch)")
        return self._scratch.segments[rank]

    # ------------------------------------------------------------ per call

    def publish(self, words: list[int]) -> None:
        """Write this rank's descriptor words (at most 8) into its control slot."""
        self.slots[self.rank][: len(words)] = words

    def word(self, rank: int, i: int) -> int:
        return int(self.slots[rank][i])

    def view(self, rank: int, kind: int, ident: int, offset: int, count: int, dtype: np.dtype) -> np.ndarray:
        """*count* elements of *dtype* at *offset* in rank *rank*'s piece of a window."""
        nbytes = count * dtype.itemsize
        return self.segment(kind, ident, rank)[offset : offset + nbytes].view(dtype)

    def fence(self) -> Steps:
        """Steps: a barrier over the communicator, with memory ordering on both sides."""
        self.control.sync()
        yield Step([self.lib.Ibarrier()], peers=[("all", -1)])
        self.control.sync()

    def free(self) -> None:
        for pool in list(self.pools.values()):
            pool.free()
        if self._scratch is not None:
            self._scratch.free()
        self.control.free()


def arena(comm: Any) -> Arena:
    """The communicator's arena (created collectively on first use, then kept in its State and freed with it).

    *comm*: the communicator's :class:`~mpicomm.state.State`, or the communicator.
    """
    state = as_state(comm)
    found = state.arena
    if found is None:
        _check_single_node(state, "shared-memory collectives")
        found = state.arena = Arena(state)
    return found


def place(a: Arena, x: Any, scratch: np.ndarray, offset: int) -> list[int]:
    """Publishable descriptor ``[kind, pool id, byte offset]`` of array *x*.

    A pool array is used where it is; any other array is copied into this
    rank's *scratch* piece at byte *offset* (the one copy in).
    """
    found = a.locate(x)
    if found is not None:
        return [POOL, found[0], found[1]]
    if x.size:
        scratch[offset : offset + x.nbytes].view(x.dtype)[...] = x.reshape(-1)
    return [SCRATCH, 0, offset]


def target(a: Arena, x: Any) -> list[int]:
    """Descriptor of an output array: ``[POOL, id, offset]`` when peers can write into it, else ``[SCRATCH, 0, 0]``."""
    found = a.locate(x)
    return [POOL, found[0], found[1]] if found is not None else [SCRATCH, 0, 0]


def slices(count: int, p: int, itemsize: int) -> tuple[list[int], list[int]]:
    """Split *count* elements into *p* slices that start on cache lines: (counts, displs).

    Slices are whole multiples of ``ALIGN`` bytes (but the last), so two ranks
    never write the same cache line (no false sharing), and as even as that allows.
    """
    grain = max(1, ALIGN // itemsize) if ALIGN % itemsize == 0 else 1
    units, starts = block_partition(-(-count // grain), p)
    displs = [min(d * grain, count) for d in starts]
    counts = [min((d + u) * grain, count) - lo for d, u, lo in zip(starts, units, displs)]
    return counts, displs


def reduce_steps(call: Any, send: Any, recv: Any, root: int | None) -> Steps:
    """Steps of the shared-memory reduction: to every rank (*root* None, allreduce) or to *root* (reduce).

    1. every rank publishes its input (a pool array where it is, any other copied
       into its scratch) and its output (a pool array peers may write into);
    2. barrier;
    3. rank r reduces slice r of the p inputs in rank order (any op: the order is
       kept) into its scratch result, and writes it into every pool output;
    4. barrier; 5. a rank whose output is not in a pool copies the p slices from
       the peers' scratch results.
    """
    a = arena(call.state)
    rank, p, dtype = call.rank, call.p, call.dtype
    n = send.size
    nbytes = n * dtype.itemsize
    region = _round(nbytes)
    scratch = a.scratch(2 * region)  # [input copy | result]
    wants = root is None or rank == root
    out = target(a, recv) if wants and recv is not None else [SCRATCH, 0, 0]
    a.publish([*place(a, send, scratch, 0), *out, int(wants)])
    yield from a.fence()
    counts, displs = slices(n, p, dtype.itemsize)
    count, at = counts[rank], displs[rank] * dtype.itemsize
    inputs = [a.view(r, a.word(r, 0), a.word(r, 1), a.word(r, 2) + at, count, dtype) for r in range(p)]
    result = a.view(rank, SCRATCH, 0, region + at, count, dtype)
    if p == 1:
        call.copy(result, inputs[0])
    else:
        call.combine(inputs[0], inputs[1], result)
        for r in range(2, p):
            call.combine(result, inputs[r], result)
    for s in range(p):
        if a.word(s, 6) and a.word(s, 3) == POOL:
            a.view(s, POOL, a.word(s, 4), a.word(s, 5) + at, count, dtype)[...] = result
    yield from a.fence()
    if wants and out[0] != POOL:
        for r in range(p):
            if counts[r]:
                at = displs[r] * dtype.itemsize
                recv[displs[r] : displs[r] + counts[r]] = a.view(r, SCRATCH, 0, region + at, counts[r], dtype)
