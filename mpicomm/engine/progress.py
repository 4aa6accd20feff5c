"""Progress: every nonblocking and persistent collective completes, whatever its rank is doing meanwhile.

Each communicator has one :class:`Queue` of runs in call order. Collectives on
one communicator run one after another, in the order they were called - the
order every rank agrees on - so their messages can use one tag per
communicator (non-overtaking does the matching) and shared-memory algorithms
never overlap on one communicator's scratch. The head run is driven by
whoever holds the queue's lock:

* the caller's thread, inside ``Wait``/``Test`` and any blocking collective
  on the communicator (it drives the queue up to its own run);
* the **progress thread** - one per process, started with the first
  nonblocking or persistent collective that does not complete at once, asleep
  on a condition while nothing is queued. It polls the queues with
  ``MPI_Testall`` and sleeps between polls (20 µs, doubling to 1 ms while
  nothing moves): it never spins and never holds the GIL while it sleeps, so
  it costs the user's computation almost nothing. A run therefore completes
  while its rank computes, sleeps, or sits in any MPI call, native ones
  included (mpi4py releases the GIL there).

A thread that waits holds the queue's lock while it sleeps in MPI
(an MPI request is completed by one thread only); the
progress thread skips a queue whose lock is taken. Where the MPI library
gives less than ``MPI_THREAD_MULTIPLE`` no progress thread is started:
queued runs then advance inside mpicomm's own calls only.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

from . import executor as _executor
from .executor import Run

__all__ = ["Queue", "submit", "tell_thread", "drive", "wait", "finish_pending", "progress_all", "thread_started", "ProgressThread", "queues", "unattended"]



class _Held:
    """``with q.held:`` - the queue's lock, for a thread that may have to wait for it: counted in ``q.waiters``
    while it waits, so that the progress thread polling in the compiled lane (:func:`~.executor.nap`) lets go."""

    __slots__ = ("q",)

    def __init__(self, q: Queue):
        self.q = q

    def __enter__(self) -> None:
        q = self.q
        if q.lock.acquire(False):
            return
        with q.counting:
            q.waiters[0] += 1
        try:
            q.lock.acquire()
        finally:
            with q.counting:
                q.waiters[0] -= 1

    def __exit__(self, *exc: object) -> None:
        self.q.lock.release()


class Queue:
    """The runs of one communicator, in call order; the head is the one in flight."""

    __slots__ = ("runs", "lock", "waiters", "address", "counting", "held", "owner", "driving", "__weakref__")

    def __init__(self) -> None:
        self.runs: collections.deque[Run] = collections.deque()
        self.lock = threading.RLock()  # (re-entrant: a completion callback may start another collective)
        # how many threads wait for the lock (an int64 the progress thread's nap in the compiled lane reads, so
        # that it hands the lock over at once): taken through `held`, never `with lock` where it may wait
        self.waiters = np.zeros(1, np.int64)
        self.address = self.waiters.ctypes.data
        self.counting = threading.Lock()
        self.held = _Held(self)
        self.owner = 0  # the thread that queued the runs (collectives on one communicator: one thread at a time)
        self.driving = False  # a drive() is under way (a step of the head run may wait in MPI and re-enter)

    def __bool__(self) -> bool:
        return bool(self.runs)

    def __len__(self) -> int:
        return len(self.runs)


#: Every queue with runs, for the progress thread (a queue leaves it once empty).
queues: set[Queue] = set()
_wake = threading.Condition()


def _start(run: Run) -> None:
    try:
        run.start()
    except BaseException as exc:  # a failed set-up fails the run, not the thread that happened to start it
        run._fail(exc)


def _launch(run: Run) -> bool:
    """Start *run* and advance it without blocking; True once it has finished."""
    try:
        return run.launch()
    except BaseException as exc:  # (as _start)
        run._fail(exc)
        return True


def drive(q: Queue) -> bool:
    """Advance *q*'s runs as far as they go without blocking (its lock held); True if one finished.

    Not re-entrant: a step of the head run that waits in MPI (a collective set-up inside a schedule) may
    end up here again, through the progress of other requests, and is left alone then.
    """
    if q.driving:
        return False
    q.driving = True
    try:
        runs = q.runs
        finished = False
        while runs:
            head = runs[0]
            if not head.started and not head.done:
                _start(head)
            if not head.poll():
                break
            runs.popleft()
            finished = True
        return finished
    finally:
        q.driving = False


def submit(q: Queue, run: Run) -> None:
    """Queue *run* (a nonblocking or persistent collective) behind the communicator's earlier ones.

    When it is the only one, its first messages are posted now, by the caller.
    """
    with q.held:
        q.runs.append(run)
        if len(q.runs) == 1 and _launch(run):
            q.runs.popleft()
            return
    tell_thread(q)


def tell_thread(q: Queue) -> None:
    """*q* has runs the caller will not finish now: make sure the progress thread (if any) polls it."""
    if _thread.enabled:
        if q in queues and not _thread.idle:
            return  # the running thread polls this queue: nothing to tell it
        # Under the condition's lock: the thread, going idle, drops the queues it found empty and sleeps under
        # that lock, so a queue added here is either seen by its last look or added after it sleeps and wakes it
        # (without the lock, a queue that gained this run between the thread's look and its clean-up was dropped
        # while the thread went to sleep - the run then moved only when its caller waited on it).
        with _wake:
            queues.add(q)
            if _thread.idle:
                _thread.ensure()
                _wake.notify()


def wait(run: Run, q: Queue, watchdog: Any = None, others: Callable[[], bool] | None = None) -> None:
    """Block until *run* (queued on *q*) has finished, driving the queue meanwhile.

    Polls a few times, then sleeps in MPI on the head run's requests
    (:meth:`~mpicomm.engine.executor.Run.sleep`), holding the queue's lock (or backs off while the head waits on
    shared-memory counters). With *watchdog*, it naps instead and reports a
    wait that lasts too long. *others*: advances the process's other pending
    operations and says whether any is left (then it polls instead of sleeping
    in MPI, since a peer may need one of them first).
    """
    if run.lane is not None and watchdog is None and _wait_in_lane(run, q, others):
        return
    for _ in range(_executor.SPINS):
        if run.done:
            return
        if q.lock.acquire(False):
            try:
                drive(q)
            finally:
                q.lock.release()
    started = time.perf_counter()
    nap = 0.0
    while not run.done:
        with q.held:
            drive(q)
            if run.done:
                return
            if watchdog is not None:
                head = q.runs[0] if q.runs else run
                watchdog.pause([head])
                continue
            front = q.runs[0] if q.runs else None
            busy = others() if others is not None else False
            if front is not None and not busy and not front.waits_on_memory() and front.live():
                front.sleep()
                continue
            if front is not None and not busy and front.sleep_in_child():
                continue
        waited = time.perf_counter() - started
        if waited < 2e-3:
            os.sched_yield()
        else:
            nap = min(2 * nap if nap else 2e-5, 1e-3)
            time.sleep(nap)


def _wait_in_lane(run: Run, q: Queue, others: Callable[[], bool] | None) -> bool:
    """Wait for *run*, the head of *q*, inside its compiled lane (the GIL released, the queue's lock held, as a
    sleeping wait holds it); True once it has finished. False, without waiting, when it is not the head or
    the process has other operations that need this thread's polls (*others*); also when the lane handed the
    run back to the executor's loop, which the caller's wait then drives."""
    with q.held:
        if q.driving or not q.runs or q.runs[0] is not run or not run.started or run.done:
            return run.done
        if others is not None and others():
            return False
        q.driving = True
        try:
            run.poll(True)
        finally:
            q.driving = False
        drive(q)  # (the finished run leaves the queue; the next one starts)
        return run.done


def finish_pending(q: Queue) -> None:
    """Drive every run queued on *q* to its end (a communicator being freed: its pending collectives
    complete first, as MPI requires)."""
    while q.runs:
        wait(q.runs[-1], q)


def progress_all() -> int:
    """Advance every queue whose lock is free, without blocking; how many runs finished."""
    finished = 0
    for q in list(queues):
        if q.runs and q.lock.acquire(False):
            try:
                before = len(q.runs)
                drive(q)
                finished += before - len(q.runs)
            finally:
                q.lock.release()
    return finished


class ProgressThread:
    """The process's progress thread (see the module docstring).

    After the last queued run has finished it keeps polling (at its longest
    nap) for :attr:`LINGER` seconds before it sleeps on the condition, so a
    program that starts a collective every few milliseconds never pays for
    waking it; it costs one poll per millisecond meanwhile.
    """

    FIRST_NAP = 2e-5
    LAST_NAP = 1e-3
    LINGER = 0.05
    #: The longest the thread polls one run in its compiled lane without looking at the queues again (it returns
    #: sooner when the run moves or a thread waits for the queue), and the longest gap between those polls (with
    #: more ranks than cores, where a poll takes a core the peers need, the Python naps' longest).
    LANE_NAP = 0.01
    LANE_GAP = 5e-5

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self._enabled: bool | None = None
        self.polls = 0
        self.idle = True  # asleep on the condition (a submit must notify it)

    @property
    def enabled(self) -> bool:
        if self._enabled is None:
            self._enabled = MPI.Query_thread() >= MPI.THREAD_MULTIPLE
        return self._enabled

    def ensure(self) -> None:
        """Start the thread if it is not running (call with ``_wake`` held)."""
        if self.thread is None or not self.thread.is_alive():
            self.idle = False
            self.thread = threading.Thread(target=self._loop, name="mpicomm-progress", daemon=True)
            self.thread.start()

    def _loop(self) -> None:
        nap = self.FIRST_NAP
        quiet_since = time.perf_counter()
        while True:
            active = [q for q in list(queues) if q.runs]
            if not active:
                if time.perf_counter() - quiet_since < self.LINGER:
                    time.sleep(self.LAST_NAP)
                    continue
                with _wake:
                    self.idle = True
                    while not any(q.runs for q in list(queues)):
                        for q in [q for q in list(queues) if not q.runs]:
                            queues.discard(q)  # (a submit adds its queue again)
                        _wake.wait()
                    self.idle = False
                nap = self.FIRST_NAP
                continue
            quiet_since = time.perf_counter()
            if MPI.Is_finalized():
                return
            moved = False
            for q in active:
                if q.lock.acquire(False):
                    try:
                        head = q.runs[0] if q.runs else None
                        before = (len(q.runs), head.k if head else 0, head.a if head else 0)
                        drive(q)
                        head = q.runs[0] if q.runs else None
                        moved |= before != (len(q.runs), head.k if head else 0, head.a if head else 0)
                    except BaseException:  # never let the thread die: a failed run keeps its error
                        pass
                    finally:
                        q.lock.release()
            self.polls += 1
            if moved:
                nap = self.FIRST_NAP
                time.sleep(0)  # let the user's threads in
            elif self._nap_in_lanes(active):
                nap = self.FIRST_NAP
            else:
                time.sleep(nap)
                nap = min(2 * nap, self.LAST_NAP)


    def _nap_in_lanes(self, active: list[Queue]) -> bool:
        """Wait for the active queues' head runs inside their compiled lanes, all in one call
        (:func:`~.executor.nap`), holding the queues' locks and not the GIL; True if it did (a run moved, or time
        was up). False at once unless every active queue's head run can (see :meth:`Run.napping`) and its lock
        is free."""
        if len(active) > 64:  # (the most one call into the lane takes)
            return False
        held: list[Queue] = []
        try:
            for q in active:
                head = q.runs[0] if q.runs else None
                if head is None or not head.napping() or not q.lock.acquire(False):
                    return False
                held.append(q)
                if q.driving or not q.runs or q.runs[0] is not head:
                    return False
            runs = [q.runs[0] for q in held]
            for q in held:
                q.driving = True
            try:
                gap = self.LANE_GAP if _executor.SPINS else self.LAST_NAP
                _executor.nap(runs, [q.address for q in held], self.LANE_NAP, gap)
            finally:
                for q in held:
                    q.driving = False
            for q in held:
                drive(q)  # (a finished run leaves its queue; the next one starts)
            return True
        except BaseException:  # never let the thread die: a failed run keeps its error
            return True
        finally:
            for q in held:
                q.lock.release()


_thread = ProgressThread()


def unattended(q: Queue) -> bool:
    """Whether runs of queues other than *q* wait for their caller's help (no progress thread drives them)."""
    return not _thread.enabled and any(x.runs for x in list(queues) if x is not q)


def thread_started() -> bool:
    """Whether the progress thread is running (for tests and reports)."""
    return _thread.thread is not None and _thread.thread.is_alive()


def on_fork() -> None:  # pragma: no cover - a forked child has no progress thread
    _thread.thread = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=on_fork)


def callback_when_done(run: Run, fn: Callable[[Run], None], q: Queue | None = None) -> None:
    """Call ``fn(run)`` once *run* has finished (now, if it has), from whichever thread finishes it.

    *q*: the queue *run* is on, whose lock keeps another thread from finishing
    it between the check and the registration.
    """
    if q is not None:
        with q.held:
            if not run.done:
                if run.callbacks is None:
                    run.callbacks = []
                run.callbacks.append(fn)
                return
    elif not run.done:
        if run.callbacks is None:
            run.callbacks = []
        run.callbacks.append(fn)
        return
    fn(run)
