"""Node-shared memory: the windows and the arena the shared-memory collectives work in.

On one node, MPI can hand every rank a piece of one shared mapping
(``MPI_Win_allocate_shared``); each rank then reads and writes the others'
pieces with plain loads and stores, no messages. Per communicator, the
:class:`Arena` holds a small control window in which every rank publishes,
per call, where its input and output live (its own scratch, or an array of a
:class:`mpicomm.shm.Pool`), and a scratch window that other arrays are copied
into once.

A shared-memory collective (its schedule: :mod:`mpicomm.coll.node_memory`) is
therefore: publish (copy in if needed), tell the peers, work straight on the
peers' memory, copy out if needed. The ranks synchronise on counters in the
control window, not on MPI barriers: each rank raises its own counter word
(``IN`` once its data is published, ``RED`` once its slice is reduced, ``DONE``
at the end of the call) and waits until the words of the peers it reads from
have reached the value of the step at hand. Counters only grow (every call
reserves its range of values alike on every rank), so nothing is ever reset.
``Win_sync`` before raising a counter and after seeing the peers' orders the
loads and stores (MPI's unified memory model). A call does not wait for the
others at its end: the next call waits until every peer has finished the
previous one before it overwrites anything a peer may still read (calls on pool
arrays, which the caller owns, do wait). Waiting for a counter is a round of
the collective's schedule (a :class:`~mpicomm.schedule.Sync`):
:func:`sync_condition` makes the test the executor polls - it raises when a
peer failed inside the call (each rank marks the arena failed when a call
raises on it).

Everything here is host memory. Windows are created collectively, in call
order. The scratch and control windows serve one call at a time: a
communicator's collectives run one after another (:mod:`mpicomm.engine.progress`).
What is needed of a communicator is read from its state, duck-typed
(``library_comm``, ``nodes``, ``arena``): this layer imports nothing above it.
"""


from __future__ import annotations

import os
import sys
import time
from array import array
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from mpi4py import MPI

from . import cma

if TYPE_CHECKING:
    from ..state import State

__all__ = ["SharedWindow", "Arena", "arena", "check_single_node", "place", "target", "address", "sync_condition",
           "SCRATCH", "POOL", "PRIVATE", "ALIGN", "IN", "RED", "DONE", "FAILED", "round_up"]

ALIGN = 64  #: bytes: pool arrays and scratch regions start on cache-line boundaries
SCRATCH, POOL, PRIVATE = 0, 1, 2  #: where a published array lives: scratch, a pool, or its owner's memory (CMA)
_SLOT = 16  #: int64 words per rank in the control window: 8 descriptor words, then the counters' cache line
IN, RED, DONE, FAILED = 8, 9, 10, 11  #: counter words: data published, slice reduced, call finished, failed
_PID, _PROBE = 12, 13  #: words of the slot that hold the rank's process id and the address of its CMA probe
_MIN_SCRATCH = 1 << 20


def round_up(n: int, to: int = ALIGN) -> int:
    """*n* rounded up to a multiple of *to* (cache lines by default)."""
    return -(-n // to) * to


class SharedWindow:
    """One ``Win.Allocate_shared`` window; ``segments[r]`` is rank r's piece as a uint8 array."""

    def __init__(self, comm: MPI.Intracomm, nbytes: int):
        comm.Barrier()  # every rank is here
        self.win = MPI.Win.Allocate_shared(nbytes, 1, comm=comm)
        self.win.Lock_all(MPI.MODE_NOCHECK)  # a passive epoch for Win_sync (memory ordering only)
        self.nbytes = nbytes
        self.segments = []
        for r in range(comm.Get_size()):
            buf, _ = self.win.Shared_query(r)
            self.segments.append(np.frombuffer(buf, np.uint8) if len(buf) else np.empty(0, np.uint8))  # type: ignore[call-overload]  # MPI.buffer is a buffer (its stub: Python 3.12+)
        self.base = self.segments[comm.Get_rank()].__array_interface__["data"][0]

    def sync(self) -> None:
        """Order this rank's loads and stores of shared memory around a barrier (``MPI_Win_sync``)."""
        self.win.Sync()

    def export(self, rank: int) -> np.ndarray:
        """A new array over rank *rank*'s piece; every view of it names it as its base (see :class:`Pool`)."""
        buf, _ = self.win.Shared_query(rank)
        return np.frombuffer(buf, np.uint8) if len(buf) else np.empty(0, np.uint8)  # type: ignore[call-overload]  # MPI.buffer is a buffer (its stub: Python 3.12+)

    def free(self) -> None:
        self.segments = []
        self.win.Unlock_all()
        self.win.Free()


def check_single_node(state: State, what: str) -> None:
    if state.nodes != 1:
        raise ValueError(
            f"{what} needs every rank of the communicator on one node, but it spans {state.nodes} nodes; "
            f"use the node's communicator (comm.node_comm) or a message-passing algorithm"
        )


class Arena:
    """Per communicator: the control window, the scratch window (grown on demand) and the pools.

    Used by the ``"shm"`` algorithms (:mod:`mpicomm.coll.node_memory`): a call
    reserves its counter values (:meth:`reserve`), publishes where its arrays
    live (:meth:`publish`, :func:`place`), and synchronises with :meth:`signal`
    and the schedule's counter waits (:func:`sync_condition`); see the module
    docstring.

    ``cma``: every rank of the node can read every other's ordinary memory
    with one copy (:mod:`.cma`; found out here, collectively, once): a call
    then publishes its arrays where they are (``PRIVATE`` and their address)
    instead of copying them into the scratch window, and waits at its end
    until every peer has read them. ``pid``: each rank's process id.
    """

    def __init__(self, state: State):
        self.lib = state.library_comm
        self.rank = self.lib.Get_rank()
        self.p = self.lib.Get_size()
        self.control = SharedWindow(self.lib, _SLOT * 8)
        self.slots = [s.view(np.int64) for s in self.control.segments]
        self.words = [memoryview(s).cast("q") for s in self.control.segments]  # type: ignore[arg-type]  # int loads/stores; ndarray is a buffer (stub: 3.12+)
        self.slots[self.rank][:] = 0  # Allocate_shared does not zero the memory
        self.probe = np.frombuffer(os.urandom(16), np.uint8).copy()  # private bytes a peer reads to test CMA
        self.words[self.rank][_PID] = os.getpid()
        self.words[self.rank][_PROBE] = self.probe.__array_interface__["data"][0]
        self.control.sync()
        self.lib.Barrier()  # every slot is set before anyone reads one
        self.control.sync()
        self.pid = [int(self.words[r][_PID]) for r in range(self.p)]
        self.cma = self._cross_memory_attach()
        self.everyone = list(range(self.p))
        self.others = [r for r in self.everyone if r != self.rank]
        self.clock = 0  #: the DONE value of the last call: the same on every rank (every call reserves alike)
        self.broken: int | None = None  #: the rank whose failure made this arena unusable
        self.what: Any = "shared-memory collective"  #: the call running now (its label names it in errors)
        self._scratch: SharedWindow | None = None
        self.pools: dict[int, Any] = {}  # id → mpicomm.shm.Pool
        self._next_pool = 0
        #: freed pools' windows with their export arrays, in free order (the same on every rank)
        self.retired: list[tuple[SharedWindow, np.ndarray]] = []

    def _cross_memory_attach(self) -> bool:
        """Whether every rank can read its peers' memory (collective: the answer is the same everywhere)."""
        from .. import config

        ok = config.cma() and cma.supported()
        if ok and self.p > 1:
            right = (self.rank + 1) % self.p
            # (a collective: a point-to-point receive here could match a message of an abandoned collective call)
            expected = self.lib.allgather(self.probe.tobytes())[right]
            ok = cma.works(self.pid[right], int(self.words[right][_PROBE]), expected)
        return bool(self.lib.allreduce(int(ok), op=MPI.MIN)) if self.p > 1 else bool(ok)

    def read(self, rank: int, address: int, out: np.ndarray) -> None:
        """Copy ``out.nbytes`` bytes at *address* in rank *rank*'s memory into *out* (one copy: :mod:`.cma`)."""
        cma.read(self.pid[rank], address, out)

    # ------------------------------------------------------------ pools

    def add_pool(self, pool: Any) -> int:
        self._next_pool += 1
        self.pools[self._next_pool] = pool
        return self._next_pool

    def remove_pool(self, pool_id: int) -> None:
        self.pools.pop(pool_id, None)

    def retire(self, window: SharedWindow, root: np.ndarray | None) -> None:
        """Keep a freed pool's *window* until no view of *root* is left on any rank (:meth:`release`)."""
        self.retired.append((window, np.empty(0, np.uint8) if root is None else root))

    def release(self) -> None:
        """Free the retired windows no rank has arrays of any more (collective: every rank agrees first)."""
        if not self.retired:
            return
        alive = np.array(_viewed([root for _, root in self.retired]), np.int64)
        anywhere = np.empty_like(alive)
        self.lib.Allreduce(alive, anywhere, op=MPI.MAX)
        keep = []
        for (window, root), used in zip(self.retired, anywhere):
            if used:
                keep.append((window, root))
            else:
                window.free()
        self.retired = keep

    def locate(self, x: Any) -> tuple[int, int] | None:
        """``(pool id, byte offset)`` when array *x* lies in one of this communicator's pools, else None."""
        for pool_id, pool in self.pools.items():
            offset = pool.offset(x)
            if offset is not None:
                return pool_id, offset
        return None

    # ------------------------------------------------------------ scratch

    def scratch(self, nbytes: int) -> np.ndarray:
        """This rank's scratch piece, at least *nbytes* (collective when it must grow: same *nbytes* everywhere).

        Call it only after :meth:`running` has begun the call: by then no peer
        still reads the old scratch, which growing frees.
        """
        if self._scratch is None or self._scratch.nbytes < nbytes:
            size = max(_MIN_SCRATCH, 1 << max(0, (nbytes - 1).bit_length()))
            if self._scratch is not None:
                self._scratch.free()
                self._scratch = None
            self._scratch = SharedWindow(self.lib, size)
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
        """Write this rank's descriptor words (at most 8) into its control slot (peers read them after a :meth:`signal`)."""
        self.words[self.rank][: len(words)] = array("q", words)

    def word(self, rank: int, i: int) -> int:
        return self.words[rank][i]

    def view(self, rank: int, kind: int, ident: int, offset: int, count: int, dtype: np.dtype) -> np.ndarray:
        """*count* elements of *dtype* at *offset* in rank *rank*'s piece of a window."""
        nbytes = count * dtype.itemsize
        return self.segment(kind, ident, rank)[offset : offset + nbytes].view(dtype)

    def published(self, rank: int, nbytes: int, dtype: np.dtype, at: int = 0) -> np.ndarray:
        """The array rank *rank* published in descriptor words ``at … at + 2`` (*nbytes* long, as *dtype*)."""
        w = self.words[rank]
        offset = w[at + 2]
        return self.segment(w[at], w[at + 1], rank)[offset : offset + nbytes].view(dtype)

    def reserve(self, what: Any, ticks: int) -> int:
        """Begin a call: reserve *ticks* counter values (base + 1 … base + ticks; the same on every rank, as every
        call reserves alike) and return base. The call must then wait until every peer's DONE has reached base
        (the previous call is over everywhere) before it touches shared memory."""
        if self.broken is not None:
            raise RuntimeError(
                f"{what}: a shared-memory collective on this communicator failed earlier on rank {self.broken}, "
                f"so its shared-memory state is unusable; use a new communicator (comm.Dup()) or a "
                f"message-passing algorithm"
            )
        self.what = what
        base = self.clock
        self.clock = base + ticks + 1
        return base

    def end(self) -> None:
        """This rank is done with the call (its DONE counter reaches the clock)."""
        self.signal(DONE, self.clock)

    def fail(self) -> None:
        """Mark this arena failed on this rank and tell the peers (they raise instead of waiting for it)."""
        if self.broken is None:
            self.broken = self.rank
        self.control.sync()
        self.words[self.rank][FAILED] = self.broken + 1
        self.control.sync()

    def signal(self, word: int, value: int) -> None:
        """Set this rank's counter *word* to *value*, after everything it stored before (``Win_sync``: release)."""
        self.control.sync()
        self.words[self.rank][word] = value

    def ready(self, word: int, value: int, ranks: Sequence[int]) -> bool:
        """Whether counter *word* of every rank in *ranks* has reached *value* (then ``Win_sync``: acquire);
        raises when a peer failed inside the call."""
        words = self.words
        for r in ranks:
            if words[r][word] < value:
                for other in self.others:
                    if words[other][FAILED]:
                        self.broken = words[other][FAILED] - 1  # the rank that failed first
                        raise RuntimeError(
                            f"{self.what}: rank {self.broken} failed inside this shared-memory collective (its own "
                            f"error says why); the communicator's shared-memory state is unusable from now on: use a "
                            f"new communicator (comm.Dup()) or a message-passing algorithm"
                        )
                return False
        self.control.sync()
        return True

    def free(self) -> None:
        if self.broken is None:
            started = time.perf_counter()
            while not self.ready(DONE, self.clock, self.others):  # no peer still reads this rank's scratch
                if time.perf_counter() - started > 1e-3:
                    time.sleep(1e-4)
        for pool in list(self.pools.values()):
            pool.free()
        # windows of pools whose arrays are still alive stay mapped (MPI_Finalize reclaims them)
        if self._scratch is not None:
            self._scratch.free()
        self.control.free()


def _viewed(roots: list[np.ndarray]) -> list[bool]:
    """Whether an array from the pool (or a view of one) still refers to each of *roots*.

    *roots* are held by :attr:`Arena.retired` and by the list passed here;
    their reference counts are compared with a control array's, held by one
    name here instead of a retired entry, so the interpreter's own temporary
    references cancel out (and the test suite checks the bookkeeping).
    """
    control = np.empty(0, np.uint8)
    counts = [sys.getrefcount(x) for x in [control, *roots]]
    return [n > counts[0] + 1 for n in counts[1:]]  # + 1: the retired entry; the caller's list vs the name


def arena(comm: Any) -> Arena:
    """The communicator's arena (created collectively on first use, then kept in its state and freed with it).

    *comm*: the communicator's :class:`~mpicomm.state.State`.
    """
    state = comm
    found = state.arena
    if found is None:
        check_single_node(state, "shared-memory collectives")
        found = state.arena = Arena(state)
    return found


def place(a: Arena, x: Any, scratch: np.ndarray, offset: int, skip: tuple[int, int] | None = None) -> list[int]:
    """Publishable descriptor ``[kind, pool id, byte offset]`` of array *x*.

    A pool array is used where it is; any other array is copied into this
    rank's *scratch* piece at byte *offset* (the one copy in), but for the
    elements ``skip = (lo, hi)``, which only this rank reads (from *x* itself).
    """
    found = a.locate(x)
    if found is not None:
        return [POOL, found[0], found[1]]
    if x.size:
        flat = x.reshape(-1)
        dst = scratch[offset : offset + x.nbytes].view(x.dtype)
        lo, hi = skip if skip is not None else (flat.size, flat.size)
        if lo:
            dst[:lo] = flat[:lo]
        if hi < flat.size:
            dst[hi:] = flat[hi:]
    return [SCRATCH, 0, offset]


def address(x: Any) -> int:
    """Where host array *x*'s first element lives."""
    return x.__array_interface__["data"][0] if x.size else 0


def target(a: Arena, x: Any) -> list[int]:
    """Descriptor of an output array: ``[POOL, id, offset]`` when peers can write into it, else ``[SCRATCH, 0, 0]``."""
    found = a.locate(x)
    return [POOL, found[0], found[1]] if found is not None else [SCRATCH, 0, 0]


def sync_condition(state: State, sync: Any) -> Callable[[Any], bool]:
    """The test the executor polls for a :class:`~mpicomm.schedule.Sync` round of a shared-memory schedule:
    counter ``sync.word`` of ``sync.ranks`` at the run's base + ``sync.delta`` (true at once when
    ``sync.when(run)`` is false)."""
    word, delta, ranks, when = sync.word, sync.delta, sync.ranks, sync.when

    def ready(run: Any) -> bool:
        if when is not None and not when(run):
            return True
        return state.arena.ready(word, run.base + delta, ranks)

    return ready
