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

A shared-memory collective is therefore: publish (copy in if needed), tell
the peers, work straight on the peers' memory, copy out if needed. The ranks
synchronise on counters in the control window, not on MPI barriers: each rank
raises its own counter word (``IN`` once its data is published, ``RED`` once
its slice is reduced, ``DONE`` at the end of the call) and waits until the
words of the peers it reads from have reached the value of the step at hand.
Counters only grow (every call reserves its range of values alike on every
rank), so nothing is ever reset. ``Win_sync`` before raising a counter and
after seeing the peers' orders the loads and stores (MPI's unified memory
model). A call does not wait for the others at its end: the next call waits
until every peer has finished the previous one before it overwrites anything
a peer may still read (calls on pool arrays, which the caller owns, do wait).
A waiting rank spins briefly, then yields its core (``sched_yield``; at once
when the node has more ranks than cores), then naps; it keeps the process's
other mpicomm requests progressing, raises when a peer failed inside the
call (each rank marks the arena failed when a call raises on it), and
honours ``MPICOMM_TIMEOUT`` like the rest of mpicomm.

Everything here is host memory; device (CuPy) buffers use the message-passing
algorithms. Windows are created collectively, in call order, so every rank
knows every pool by the same number. The scratch and control windows serve
one call at a time: the shared-memory algorithms are registered for blocking
calls only (``blocking_only``), so two never overlap on a communicator.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import sys
import time
from array import array
from typing import Any, Iterator, Sequence

import numpy as np
from mpi4py import MPI

from . import config
from . import requests as _requests
from .cleanup import remove_own_segments
from .coll.schedules import block_partition
from .requests import Steps, barrier, progress, run
from .state import State, as_state


__all__ = ["Pool", "Arena", "arena", "place", "target", "slices", "reduce_steps", "alltoall_steps", "SCRATCH", "POOL",
           "ALIGN", "CHUNK_BYTES"]

ALIGN = 64  #: bytes: pool arrays and scratch regions start on cache-line boundaries
SCRATCH, POOL = 0, 1  #: where a published array lives
_SLOT = 16  #: int64 words per rank in the control window: 8 descriptor words, then the counters' cache line
IN, RED, DONE, FAILED = 8, 9, 10, 11  #: counter words: data published, slice reduced, call finished, failed
_MIN_SCRATCH = 1 << 20
_SPIN_FOR = 200e-6  #: seconds a waiting rank polls before it gives its core away (no more ranks than cores)
_YIELD_FOR = 2e-3  #: seconds of sched_yield between polls before sleeping
_FIRST_NAP, _LAST_NAP = 20e-6, 1e-3  #: the sleeps between polls after that, doubling
_NOTICE = 60.0  #: seconds of waiting between notices on stderr (without MPICOMM_TIMEOUT)
#: Elements of a large reduction are pipelined in chunks of about this many bytes: while one chunk is
#: reduced the next is being copied in, and each chunk is still in the cache when it is reduced and copied out.
CHUNK_BYTES = 4 << 20


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

    def export(self, rank: int) -> np.ndarray:
        """A new array over rank *rank*'s piece; every view of it names it as its base (see :class:`Pool`)."""
        buf, _ = self.win.Shared_query(rank)
        return np.frombuffer(buf, np.uint8) if len(buf) else np.empty(0, np.uint8)

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

    An array outlives :meth:`free` safely: the memory is unmapped only once
    no array (or view of one) from the pool is left on any rank - until then
    the window is kept, retired, and freed at a later collective call of the
    communicator's pools (creating or freeing one) where every rank agrees it
    is unused. Unmapping it earlier, as MPI's ``Win_free`` does, turned a
    later read of such an array into a segmentation fault.
    """

    def __init__(self, comm: Any, nbytes: int):
        state = as_state(comm)
        _check_single_node(state, "a shared-memory pool")
        if not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
            raise ValueError(f"nbytes={nbytes!r}: give the bytes to reserve on each rank, a non-negative int")
        self.comm = comm
        self._rank, self._size = state.rank, state.size
        self._arena = arena(state)
        self._arena.release()  # collective, like the window: frees retired pools no array uses any more
        self._window: _Window | None = _Window(state.library_comm, _round(int(nbytes)))
        # Arrays handed out are views of _root: NumPy makes every view's (and view of a view's) base the
        # first array that does not own its memory, so _root's reference count says whether any is alive.
        self._root: np.ndarray | None = self._window.export(self._rank)
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
        if 0 <= start and start + x.nbytes <= self._window.nbytes:
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

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    def __repr__(self) -> str:
        state = "freed" if self._window is None else f"{self._used}/{self._window.nbytes} bytes used"
        return f"<mpicomm.shm.Pool #{getattr(self, 'id', '?')} on {self._size} ranks, {state}>"


class Arena:
    """Per communicator: the control window, the scratch window (grown on demand) and the pools.

    Used by the ``"shm"`` algorithms: a call runs inside ``with arena.running(call, ticks) as base:``,
    publishes where its arrays live (:meth:`publish`, :func:`place`), and
    synchronises with :meth:`signal` / :meth:`wait` on counters in the control
    window; see the module docstring.
    """

    def __init__(self, state: State):
        self.lib = state.library_comm
        self.rank = self.lib.Get_rank()
        self.p = self.lib.Get_size()
        self.control = _Window(self.lib, _SLOT * 8)
        self.slots = [s.view(np.int64) for s in self.control.segments]
        self.words = [memoryview(s).cast("q") for s in self.control.segments]  # plain int loads and stores
        self.slots[self.rank][:] = 0  # Allocate_shared does not zero the memory
        self.control.sync()
        barrier(self.lib)  # every slot is zero before anyone reads one
        self.control.sync()
        self.everyone = list(range(self.p))
        self.others = [r for r in self.everyone if r != self.rank]
        self.clock = 0  #: the DONE value of the last call: the same on every rank (every call reserves alike)
        self.broken: int | None = None  #: the rank whose failure made this arena unusable
        self.what: Any = "shared-memory collective"  #: the call running now (its label names it in errors)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        # more ranks than cores: give the core away at once, the rank awaited may be the one descheduled
        self.spin = 0.0 if self.p > cores else _SPIN_FOR
        self._scratch: _Window | None = None
        self.pools: dict[int, Pool] = {}
        self._next_pool = 0
        #: freed pools' windows with their export arrays, in free order (the same on every rank)
        self.retired: list[tuple[_Window, np.ndarray]] = []

    # ------------------------------------------------------------ pools

    def add_pool(self, pool: Pool) -> int:
        self._next_pool += 1
        self.pools[self._next_pool] = pool
        return self._next_pool

    def remove_pool(self, pool_id: int) -> None:
        self.pools.pop(pool_id, None)

    def retire(self, window: _Window, root: np.ndarray | None) -> None:
        """Keep a freed pool's *window* until no view of *root* is left on any rank (:meth:`release`)."""
        self.retired.append((window, np.empty(0, np.uint8) if root is None else root))

    def release(self) -> None:
        """Free the retired windows no rank has arrays of any more (collective: every rank agrees first)."""
        if not self.retired:
            return
        alive = np.array(_viewed([root for _, root in self.retired]), np.int64)
        anywhere = np.empty_like(alive)
        run(_max_everywhere(self.lib, alive, anywhere), label="shared-memory pool free (agreement)")
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

    @contextlib.contextmanager
    def running(self, call: Any, ticks: int) -> Iterator[int]:
        """Run one call on the arena: yields *base*, the counter value the call's signals count up from.

        On entry, waits until every rank has finished the previous call (so
        the memory it read of this rank - scratch, published arrays - is free
        again: the end of a call need not wait for the others) and reserves
        *ticks* counter values (base + 1 … base + ticks; the same on every
        rank). An exception inside marks the arena failed: every peer waiting
        on this rank raises instead of hanging.
        """
        if self.broken is not None:
            raise RuntimeError(
                f"{call}: a shared-memory collective on this communicator failed earlier on rank {self.broken}, "
                f"so its shared-memory state is unusable; use a new communicator (comm.Dup()) or a "
                f"message-passing algorithm"
            )
        self.what = call
        base = self.clock
        self.wait(DONE, base, self.others)
        self.clock = base + ticks + 1
        try:
            yield base
        except BaseException:
            self.fail()
            raise

    def end(self, wait: bool = False) -> None:
        """This rank is done with the call; with *wait*, also wait until every rank is (its published arrays are free)."""
        self.signal(DONE, self.clock)
        if wait:
            self.wait(DONE, self.clock, self.others)

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

    def wait(self, word: int, value: int, ranks: list[int]) -> None:
        """Wait until counter *word* of every rank in *ranks* has reached *value*; then ``Win_sync`` (acquire).

        Spins briefly, then yields the core (``sched_yield``), then sleeps with
        a growing nap (up to 1 ms); meanwhile it keeps the other pending mpicomm
        requests progressing, raises when a peer failed inside the call, and
        aborts the job past ``MPICOMM_TIMEOUT`` (or says on stderr, once a
        minute, whom it waits for when no timeout is set).
        """
        words = self.words
        for r in ranks:
            if words[r][word] < value:
                self._block(word, value, [s for s in ranks if words[s][word] < value])
                break
        self.control.sync()

    def _block(self, word: int, value: int, pending: list[int]) -> None:
        words = self.words
        clock = time.perf_counter
        started = clock()
        spin = self.spin
        nap = _FIRST_NAP
        notice = _NOTICE
        timeout = config.timeout()
        polls = 0
        while True:
            pending = [r for r in pending if words[r][word] < value]
            if not pending:
                return
            waited = clock() - started
            if waited < spin:
                continue
            polls += 1
            for r in self.others:
                if words[r][FAILED]:
                    self.broken = words[r][FAILED] - 1  # the rank that failed first (r may only have seen it)
                    raise RuntimeError(
                        f"{self.what}: rank {self.broken} failed inside this shared-memory collective (its own "
                        f"error says why); the communicator's shared-memory state is unusable from now on: use a "
                        f"new communicator (comm.Dup()) or a message-passing algorithm"
                    )
            if _requests._active:
                progress()  # serve this rank's other pending requests: a peer may wait on one of them
            if waited < _YIELD_FOR:
                os.sched_yield()
                continue
            time.sleep(nap)
            nap = min(2 * nap, _LAST_NAP)
            if timeout is not None and waited > timeout:
                self._abort(pending, waited)
            if waited > notice:
                notice += _NOTICE
                _say(f"mpicomm: rank {MPI.COMM_WORLD.Get_rank()} of MPI_COMM_WORLD has waited {waited:.0f} s in "
                     f"{self.what} for rank(s) {', '.join(map(str, pending))} of its communicator to arrive; set "
                     f"MPICOMM_TIMEOUT=seconds to abort a hung job")

    def _abort(self, pending: list[int], waited: float) -> None:
        _say(f"mpicomm watchdog: rank {MPI.COMM_WORLD.Get_rank()} of MPI_COMM_WORLD waited more than "
             f"{waited:.0f} s (MPICOMM_TIMEOUT) and aborts the job.\n  stuck in {self.what}: waiting in shared "
             f"memory for rank(s) {', '.join(map(str, pending))} of its communicator; they never arrived")
        remove_own_segments()  # MPI_Abort skips MPI_Finalize, which would have removed them from /dev/shm
        time.sleep(0.5)  # let the other stuck ranks write their own reports
        MPI.COMM_WORLD.Abort(3)

    def free(self) -> None:
        if self.broken is None:
            self.wait(DONE, self.clock, self.others)  # no peer still reads this rank's scratch
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


def _max_everywhere(comm: MPI.Intracomm, mine: np.ndarray, out: np.ndarray) -> Steps:
    """Steps of an element-wise MAX over every rank of *comm* (for :func:`mpicomm.requests.run`)."""
    yield [comm.Iallreduce(mine, out, op=MPI.MAX)]


def _say(text: str) -> None:
    os.write(sys.stderr.fileno(), (text + "\n").encode())


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


def target(a: Arena, x: Any) -> list[int]:
    """Descriptor of an output array: ``[POOL, id, offset]`` when peers can write into it, else ``[SCRATCH, 0, 0]``."""
    found = a.locate(x)
    return [POOL, found[0], found[1]] if found is not None else [SCRATCH, 0, 0]


@functools.lru_cache(maxsize=256)
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


def chunking(count: int, itemsize: int, chunk_bytes: int | None = None) -> int:
    """Elements per pipelined chunk of a *count*-element vector: about *chunk_bytes* (``CHUNK_BYTES``), whole cache lines."""
    grain = max(1, ALIGN // itemsize) if ALIGN % itemsize == 0 else ALIGN
    size = max(grain, (chunk_bytes or CHUNK_BYTES) // itemsize // grain * grain)
    return max(1, min(size, count))


def reduce_steps(call: Any, send: Any, recv: Any, root: int | None) -> Steps:
    """Steps of the shared-memory reduction: to every rank (*root* None, allreduce) or to *root* (reduce).

    The vector is cut into chunks of about :data:`CHUNK_BYTES` (whole cache
    lines), each into p slices (:func:`slices`); chunk c is pipelined:

    1. every rank publishes where its input and output live (pool arrays where
       they are) and copies chunk c of a plain input into its scratch - all but
       its own slice, which only it reads - then raises its IN counter to c;
    2. once every peer's IN has reached c, rank r reduces slice r of chunk c of
       the p inputs in rank order (x_0 ⊕ x_1 ⊕ …: any op) into its scratch
       result, or straight into the pool outputs, and raises its RED counter;
    3. once every peer's RED has reached c, a rank whose output is not in a
       pool copies chunk c's p reduced slices out.

    Stage 1 of chunk c + 1 runs before stage 2 of chunk c, stage 3 of chunk
    c − 1 after it, so a rank that waits for a slower peer's chunk waits less.
    No barrier at the end: the next call waits until every peer has finished
    this one before it overwrites its scratch (a call whose input or output
    is a pool array waits at its end, as the caller owns that memory).
    """
    yield from ()  # a step generator that posts no MPI request: it synchronises on shared counters
    rank, p, dtype = call.rank, call.p, call.dtype
    wants = root is None or rank == root
    if p == 1:
        if wants and recv is not None:
            call.copy(recv, send)
        return
    a = arena(call.state)
    n = send.size
    item = dtype.itemsize
    nbytes = n * item
    region = _round(nbytes)
    chunk = chunking(n, item)
    nchunks = -(-n // chunk)
    with a.running(call, nchunks) as base:
        scratch = a.scratch(2 * region)  # [input copy | result]
        found = a.locate(send)
        own = [POOL, found[0], found[1]] if found is not None else [SCRATCH, 0, 0]
        out = target(a, recv) if wants and recv is not None else [SCRATCH, 0, 0]
        a.publish([*own, *out, int(wants)])
        flat = send.reshape(-1)
        copied = scratch[:nbytes].view(dtype)
        cuts = {}

        def bounds(c: int) -> tuple[int, list[int], list[int]]:
            lo = c * chunk
            size = min(chunk, n - lo)
            if size not in cuts:
                cuts[size] = slices(size, p, item)
            return (lo, *cuts[size])

        inputs: list[Any] = []
        outputs: list[Any] = []
        results = []

        def copy_in(c: int) -> None:
            if own[0] != POOL:
                lo, counts, displs = bounds(c)
                a_, b_ = lo + displs[rank], lo + displs[rank] + counts[rank]
                end = lo + min(chunk, n - lo)
                if a_ > lo:
                    copied[lo:a_] = flat[lo:a_]
                if end > b_:
                    copied[b_:end] = flat[b_:end]
            a.signal(IN, base + c + 1)

        def reduce(c: int) -> None:
            a.wait(IN, base + c + 1, a.others)
            if not inputs:  # the peers' descriptors are readable now
                for s in range(p):
                    inputs.append(flat if s == rank else a.published(s, nbytes, dtype))
                    if a.word(s, 6) and a.word(s, 3) == POOL:
                        outputs.append(a.published(s, nbytes, dtype, at=3))
                if any(a.word(s, 6) and a.word(s, 3) != POOL for s in range(p)):
                    outputs.insert(0, scratch[region : region + nbytes].view(dtype))
            lo, counts, displs = bounds(c)
            count = counts[rank]
            if count:
                i, j = lo + displs[rank], lo + displs[rank] + count
                into = outputs[0][i:j]
                call.combine(inputs[0][i:j], inputs[1][i:j], into)
                for s in range(2, p):
                    call.combine(into, inputs[s][i:j], into)
                for other in outputs[1:]:
                    other[i:j] = into
            a.signal(RED, base + c + 1)

        copies_out = wants and out[0] != POOL

        def copy_out(c: int) -> None:
            a.wait(RED, base + c + 1, a.everyone)
            if not results:
                results.extend(a.view(s, SCRATCH, 0, region, n, dtype) for s in range(p))
            lo, counts, displs = bounds(c)
            for s in range(p):
                if counts[s]:
                    i, j = lo + displs[s], lo + displs[s] + counts[s]
                    recv[i:j] = results[s][i:j]

        for c in range(nchunks + 2):
            if c < nchunks:
                copy_in(c)
            if 0 < c <= nchunks:
                reduce(c - 1)
            if copies_out and 1 < c:
                copy_out(c - 2)
        a.end(wait=own[0] == POOL or out[0] == POOL)


def alltoall_steps(call: Any, send: Any, sendcounts: Sequence[int], senddispls: Sequence[int],
                   recv: Any, recvcounts: Sequence[int], recvdispls: Sequence[int]) -> Steps:
    """Steps of the shared-memory alltoall(v); see :func:`mpicomm.coll.alltoall.shm`.

    Each rank's scratch holds a header - for every destination d, the byte
    offset of its block for d and its element count (``int64`` pairs) - then,
    unless *send* is a pool array, the blocks packed in destination order (the
    block for itself is not copied). alltoallv first agrees on the largest
    scratch any rank needs (its counts are not known everywhere).
    """
    yield from ()  # a step generator that posts no MPI request: it synchronises on shared counters
    p, rank, dtype = call.p, call.rank, call.dtype
    item = dtype.itemsize
    mine = send[senddispls[rank] : senddispls[rank] + sendcounts[rank]]
    call.copy(recv[recvdispls[rank] : recvdispls[rank] + recvcounts[rank]], mine)
    if p == 1:
        return
    a = arena(call.state)
    header = _round(16 * p)
    packed = [0]
    for c in sendcounts:
        packed.append(packed[-1] + c)
    mismatched = []
    with a.running(call, 2) as base:
        found = a.locate(send)
        need = header + packed[-1] * item  # alltoall: the same on every rank, pool array or not
        if call.collective != "alltoall":
            need = header + (0 if found is not None else packed[-1] * item)  # the scratch must grow alike everywhere: agree on the largest need
            a.publish([0, 0, 0, need])
            a.signal(IN, base + 1)
            a.wait(IN, base + 1, a.others)
            need = max(a.word(s, 3) for s in range(p))
        scratch = a.scratch(need)
        table = scratch[: 16 * p].view(np.int64).reshape(p, 2)
        if found is not None:
            own = [POOL, found[0], found[1]]
            table[:, 0] = np.asarray(senddispls[:p], np.int64) * item
        else:
            own = [SCRATCH, 0, header]
            table[:, 0] = np.asarray(packed[:p], np.int64) * item
            data = scratch[header : header + packed[-1] * item].view(dtype)
            flat = send.reshape(-1)
            d = 0
            while d < p:  # copy runs of blocks that lie one after another in send (not the own block)
                if d == rank or not sendcounts[d]:
                    d += 1
                    continue
                e = d + 1
                while e < p and e != rank and senddispls[e] == senddispls[e - 1] + sendcounts[e - 1]:
                    e += 1
                lo = senddispls[d]
                hi = senddispls[e - 1] + sendcounts[e - 1]
                data[packed[d] : packed[d] + hi - lo] = flat[lo:hi]
                d = e
        table[:, 1] = sendcounts[:p]
        a.publish(own)
        a.signal(IN, base + 2)
        for k in range(1, p):
            s = (rank - k) % p
            a.wait(IN, base + 2, [s])
            theirs = a.view(s, SCRATCH, 0, 0, 2 * p, np.dtype(np.int64))
            offset, count = int(theirs[2 * rank]), int(theirs[2 * rank + 1])
            if count != recvcounts[s]:
                mismatched.append(f"rank {s} sent {count} elements, recvcounts[{s}] = {recvcounts[s]}")
                continue
            if count:
                w = a.words[s]
                start = w[2] + offset
                recv[recvdispls[s] : recvdispls[s] + count] = a.segment(w[0], w[1], s)[start : start + count * item].view(dtype)
        a.end(wait=own[0] == POOL)
    if mismatched:
        raise ValueError(f"{call.label} on rank {rank}: " + "; ".join(mismatched) + " - sendcounts and recvcounts "
                         "must match pairwise")
