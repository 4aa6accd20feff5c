"""``Work`` objects for the torch backend, and the engine that completes them.

Every collective returns at once with a :class:`Work`. Its operation has
already started (in program order, on the calling thread: every rank starts
the same operations in the same order, which MPI's matching needs); it
completes in one of two ways:

* the caller waits (``work.wait()``, ``dist.all_reduce(t)`` without
  ``async_op``): the calling thread drives mpicomm's progress engine until the
  request is done, then delivers the results and completes the future;
* nobody waits, but someone holds the future: DDP's reducer launches a bucket's
  all-reduce from a gradient hook and later blocks in C++ on the future, where
  no Python runs. A progress thread (one per process, started with the first
  such operation, asleep while nothing is in flight) tests the outstanding
  requests with a short back-off and completes each future as its request
  completes, so bucket all-reduces progress while backward computes.

One lock (:data:`Engine.lock`) serialises every use of MPI by the backend, so
the thread level needed is ``MPI_THREAD_SERIALIZED`` (mpi4py asks for
``MULTIPLE``).

``MPICOMM_TORCH_PROGRESS`` chooses: ``thread`` (the progress thread),
``sync`` (every operation completes before its call returns: correct, no
overlap, no thread) or ``auto``, the default: ``thread`` when each rank of the
node has at least two cores, else ``sync``. mpicomm's algorithms advance only
when someone calls into them, so the thread must test often; with no spare
core its polling takes cycles from backward itself (measured with DDP on 2
ranks sharing 2 cores, over several runs: 1.07–1.42× gloo's steps/s with the
thread, 1.33–1.89× without).
Where the library gives less than ``MPI_THREAD_SERIALIZED``, ``sync``.
A program that uses mpicomm directly from another thread while backend work is
in flight should hold :data:`Engine.lock` around those calls.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable

import torch
from mpi4py import MPI

from ..requests import Request

__all__ = ["Work", "Engine", "engine"]


class Work(torch.distributed.Work):
    """One backend operation: ``wait()``, ``is_completed()``, ``get_future()``, ``source_rank()``."""

    # Class defaults: a Work that completed inside its call (the blocking path) sets nothing else.
    _request: Any = None  # an mpicomm Request, an MPI request, a list of them, or None (done)
    _finish: Callable[[], Any] | None = None
    _future: torch.futures.Future | None = None  # made when asked for (most callers only wait)
    _error: BaseException | None = None
    _status: MPI.Status | None = None

    def __init__(self, engine: "Engine", request: Any, finish: Callable[[], Any] | None, result: Any, name: str,
                 done: bool = False):
        super().__init__()
        self._engine = engine
        self._result = result
        self._name = name
        self._completed = done  # True: the operation has completed already (a blocking call)
        if not done:
            self._request = request
            self._finish = finish
            if name == "recv_anysource":
                self._status = MPI.Status()

    def __repr__(self) -> str:
        return f"<mpicomm Work {self._name} {'completed' if self._completed else 'in flight'}>"

    # ------------------------------------------------------------ completion (engine lock held)

    def _test(self) -> bool:
        """Advance progress; complete this work if its request has completed. True when completed."""
        if self._completed:
            return True
        try:
            if not _test(self._request, self._status):
                return False
        except BaseException as exc:  # the operation failed on this rank: deliver the error
            self._fail(exc)
            return True
        self._complete()
        return True

    def _wait(self) -> None:
        if self._completed:
            return
        try:
            _wait(self._request, self._status)
        except BaseException as exc:
            self._fail(exc)
            return
        self._complete()

    def _complete(self) -> None:
        try:
            if self._finish is not None:
                self._finish()
        except BaseException as exc:
            self._fail(exc)
            return
        self._completed = True
        self._request = None
        if self._future is not None:
            self._future.set_result(self._result)

    def _fail(self, exc: BaseException) -> None:
        self._completed = True
        self._request = None
        self._error = exc
        if self._future is not None:
            self._future.set_exception(exc)

    # ------------------------------------------------------------ torch.distributed.Work

    def wait(self, timeout: Any = None) -> bool:
        """Block until the operation completes (driving progress on this thread); raise its error, if any."""
        if not self._completed:
            with self._engine.lock:
                self._wait()
                self._engine.forget(self)
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        """True once the operation has completed (a test: advances progress when it can without blocking)."""
        if not self._completed and self._engine.lock.acquire(blocking=False):
            try:
                if self._test():
                    self._engine.forget(self)
            finally:
                self._engine.lock.release()
        return self._completed

    def is_success(self) -> bool:
        return self._completed and self._error is None

    def exception(self) -> Any:
        return self._error

    def get_future(self) -> torch.futures.Future:
        """A future completed with the operation's output tensors (DDP's reducer waits on it)."""
        with self._engine.lock:
            if self._future is None:
                self._future = torch.futures.Future()
                if self._completed:
                    if self._error is not None:
                        self._future.set_exception(self._error)
                    else:
                        self._future.set_result(self._result)
            if not self._completed:
                self._engine.watch(self)
        return self._future

    def result(self) -> list:
        self.wait()
        return self._result if isinstance(self._result, list) else [self._result]

    def source_rank(self) -> int:
        """The sender of a receive from any source (``recv_anysource``)."""
        self.wait()
        return self._status.Get_source()

    _source_rank = source_rank

    def synchronize(self) -> None:
        self.wait()


def _test(request: Any, status: MPI.Status | None) -> bool:
    if request is None:
        return True
    if isinstance(request, list):
        return bool(Request.Testall(request))
    return bool(request.Test() if status is None else request.Test(status))


def _wait(request: Any, status: MPI.Status | None) -> None:
    if request is None:
        return
    if isinstance(request, list):
        Request.Waitall(request)
    elif status is None:
        request.Wait()
    else:
        request.Wait(status)


class Engine:
    """The backend's lock, the works nobody waits on yet, and the thread that completes them."""

    #: Serialises every MPI call the backend makes (see the module docstring).
    lock = threading.RLock()

    def __init__(self) -> None:
        self._watched: list[Work] = []
        self._wake = threading.Condition(self.lock)
        self._thread: threading.Thread | None = None
        setting = os.environ.get("MPICOMM_TORCH_PROGRESS", "auto").strip().lower()
        if setting not in ("auto", "thread", "sync"):
            raise ValueError(f"MPICOMM_TORCH_PROGRESS={setting!r}: expected auto (the default), thread or sync")
        if setting == "auto":
            setting = "thread" if _cores_per_rank() >= 2 else "sync"
        #: True: a progress thread completes the futures nobody waits on; False: every call completes at once.
        self.threaded = setting == "thread" and MPI.Query_thread() >= MPI.THREAD_SERIALIZED

    def submit(self, start: Callable[[bool], Any], finish: Callable[[], Any] | None, result: Any, name: str,
               wait: bool) -> Work:
        """Start an operation now; a :class:`Work` for it.

        ``start(blocking)`` starts it and returns its request (None when done).
        *blocking* is True when the caller waits at once (*wait*: ``asyncOp``
        False) or there is no progress thread: the operation then completes
        (through the blocking mpicomm call, the cheaper one) before this returns.
        """
        blocking = wait or not self.threaded
        with self.lock:
            work = Work(self, start(blocking), finish, result, name)
            if blocking:
                work._wait()
            else:
                work._test()
        return work

    def watch(self, work: Work) -> None:
        """Complete *work* on the progress thread once its request completes (its future is being waited on)."""
        with self.lock:
            if work._completed or work in self._watched:
                return
            if not self.threaded:
                work._wait()
                return
            self._watched.append(work)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="mpicomm-torch-progress", daemon=True)
                self._thread.start()
            self._wake.notify()

    def forget(self, work: Work) -> None:
        if work in self._watched:
            self._watched.remove(work)

    def _run(self) -> None:
        pause = 0.0
        while True:
            with self.lock:
                while not self._watched:
                    pause = 0.0
                    self._wake.wait()
                done = [w for w in self._watched if w._test()]
                for w in done:
                    self._watched.remove(w)
            if done:
                pause = 0.0
            else:  # nothing finished: back off from a yield to 1 ms, so backward keeps the cores
                pause = min(1e-3, pause * 2 or 2e-5)
            time.sleep(pause)


def _cores_per_rank() -> float:
    """The cores this process may run on, shared by the ranks of its node (``LOCAL_WORLD_SIZE``, else 1)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        local = 1
    return cores / local


_ENGINE: Engine | None = None


def engine() -> Engine:
    """The process's one :class:`Engine` (every group shares it: one lock for all the backend's MPI use)."""
    global _ENGINE
    if _ENGINE is None:
        _ENGINE = Engine()
    return _ENGINE
