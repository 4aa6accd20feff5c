"""``Work`` objects of the torch backend: mpicomm requests whose futures complete on the core's progress thread.

Every collective of the backend is an mpicomm collective on the group's
communicator (:mod:`.group`). A call that waits at once (``opts.asyncOp``
False, as ``dist.all_reduce(t)`` sets) runs the *blocking* mpicomm call and
returns a completed :class:`Work`. An asynchronous call (``async_op=True``,
DDP's bucket all-reduces) starts the *nonblocking* mpicomm call - in program
order, on the calling thread, as MPI's matching needs - and returns a
:class:`Work` that wraps its :class:`~mpicomm.engine.requests.CollectiveRequest`:

* the collective completes whether or not anyone waits: the core queues it
  on the communicator and its progress thread (one per process, asleep while
  nothing is queued, sleeping between polls) advances it while the caller
  computes (:mod:`mpicomm.engine.progress`);
* the Work completes through ``request.add_done_callback``: from whichever
  thread completes the collective - the progress thread, or the caller's in
  ``wait()`` - it delivers the results into the caller's tensors (copies
  back, AVG's scaling) and then completes the future. DDP's reducer, which
  waits on a bucket's future in C++ where no Python runs, therefore gets its
  buckets completed while backward computes.

Point-to-point operations (``send``/``recv``) wrap plain MPI requests: they
complete in ``wait()``/``is_completed()``, and when someone asks for their
future they are handed to the core's progress thread too (each on a queue of
its own, so no transfer waits behind another).

What changed with the core's engine (core v2): the backend's own ``Engine`` -
its progress thread (``mpicomm-torch-progress``), the process-wide lock it
held around every MPI call (``Engine.lock``, ``engine()``) and its choice of
``sync`` on machines with fewer than two cores per rank - is gone. The core's
rules apply instead: collectives on one communicator are issued by one thread
at a time (a second thread is refused, and the communicator poisoned, on every
rank), and the core's progress thread completes them meanwhile; a program that
also calls mpicomm from another thread uses its own communicator
(``comm.Dup()``), not the group's. A future's callbacks (``fut.then(...)``)
run where the collective completed, often on the progress thread; one that
starts another asynchronous collective of the group from there (DDP's
PowerSGD hooks do) queues it behind everything already issued on the group,
as the core allows from a completion callback (a blocking one is refused
there: it would wait for itself).

``MPICOMM_TORCH_PROGRESS``: ``async`` (the default; ``auto`` and ``thread``,
the old settings, mean it too) as above, or ``sync``: every operation
completes before its call returns (the blocking mpicomm call - for one CPU
tensor, the remembered one of :mod:`.group` - so callbacks run on the calling
thread: no overlap with backward, nothing left to the progress thread).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
from mpi4py import MPI

from .. import config
from ..engine.requests import CollectiveRequest, watched

__all__ = ["Work", "done", "started", "point_to_point", "watch", "SYNC", "synchronous", "cuda_devices",
           "settle_devices"]


def _sync_at_import() -> bool:
    try:
        return config.torch_progress() == "sync"
    except ValueError:  # refused, on every rank, when the process group's Comm is made (mpicomm.config.problems)
        return False


#: True when every operation completes before its call returns (``MPICOMM_TORCH_PROGRESS=sync``).
SYNC = _sync_at_import()


def synchronous() -> bool:
    """:data:`SYNC`, read when asked (a test may switch it)."""
    return SYNC


class Work(torch.distributed.Work):
    """One backend operation: ``wait()``, ``is_completed()``, ``get_future()``, ``result()``, ``source_rank()``.

    Made by :func:`done` (completed inside its call) or :func:`started` (in flight). No ``__init__`` of its
    own: the class attributes are a completed operation's, so the blocking path sets one attribute.
    """

    _result: Any = None
    _name: str = "operation"
    _completed = True
    _error: BaseException | None = None
    _future: torch.futures.Future[list[Any]] | None = None  # completed with _result, the output tensors
    _requests: Sequence[Any] = ()  # CollectiveRequests, or plain MPI requests (point to point) until handed over
    _plain = False  # _requests are plain MPI requests not handed to the progress thread
    _status: MPI.Status | None = None
    _finish: Callable[[], Any] | None = None
    _lock: Any = None
    _then: list[Callable[[Work], None]] | None = None  # run once completed (a coalesced Work's parts report to it)

    def __repr__(self) -> str:
        return f"<mpicomm Work {self._name} {'completed' if self._completed else 'in flight'}>"

    # ------------------------------------------------------------ completion

    def _part_done(self, _: Any = None) -> None:
        """A request (or part) completed: complete the Work once every one has (any thread)."""
        if self._completed:
            return
        for r in self._requests:
            if not _finished(r):
                return
        self._complete()

    def _complete(self) -> None:
        """Deliver the results (once, whichever thread gets here first), then complete the future."""
        with self._lock:
            if self._completed:
                return
            error = self._error_plain
            if error is None:
                error = next((e for e in map(_error_of, self._requests) if e is not None), None)
            if error is None and self._finish is not None:
                try:
                    self._finish()
                    settle_devices(self._result)
                except BaseException as exc:  # noqa: BLE001 - delivered to whoever waits
                    error = exc
            self._error = error
            self._finish = None
            self._completed = True
            future, then = self._future, self._then
            self._then = None
        if future is not None:
            _settle(future, self._result, error)
        for fn in then or ():
            fn(self)

    def _on_done(self, fn: Callable[[Work], None]) -> None:
        """Call ``fn(self)`` once completed (now, if it is)."""
        if not self._completed:
            with self._lock:
                if not self._completed:
                    if self._then is None:
                        self._then = []
                    self._then.append(fn)
                    return
        fn(self)

    # ------------------------------------------------------------ torch.distributed.Work

    def wait(self, timeout: Any = None) -> bool:
        """Block until the operation completes (driving it on this thread); raise its error, if any."""
        if not self._completed:
            if self._plain:
                try:
                    if self._status is not None:
                        self._requests[0].Wait(self._status)
                    else:
                        MPI.Request.Waitall(list(self._requests))
                except MPI.Exception as exc:
                    self._error_plain = exc
            else:
                for r in self._requests:
                    try:
                        r.wait() if isinstance(r, Work) else r.Wait()
                    except BaseException:  # noqa: BLE001 - the Work's error, raised below
                        pass
            self._complete()
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        """True once the operation has completed (a test: advances it when it can without blocking)."""
        if not self._completed:
            if self._plain:
                try:
                    ready = (self._requests[0].Test(self._status) if self._status is not None
                             else MPI.Request.Testall(list(self._requests)))
                except MPI.Exception as exc:
                    self._error_plain, ready = exc, True
                if ready:
                    self._complete()
            else:
                for r in self._requests:
                    if isinstance(r, Work):
                        r.is_completed()
                    elif not r.done:
                        try:
                            r.Test()
                        except BaseException:  # noqa: BLE001 - the Work's error, raised by wait()
                            pass
                self._part_done()
        return self._completed

    def is_success(self) -> bool:
        return self._completed and self._error is None

    def exception(self) -> Any:
        return self._error

    def get_future(self) -> torch.futures.Future[list[Any]]:
        """A future completed with the operation's output tensors once it completes (DDP's reducer waits on it)."""
        future = self._future
        if future is not None:
            return future
        if self._completed:
            future = self._future = torch.futures.Future(devices=cuda_devices(self._result))
            _settle(future, self._result, self._error)
            return future
        with self._lock:
            if self._future is None:
                self._future = torch.futures.Future(devices=cuda_devices(self._result))
            future = self._future
            completed = self._completed  # completed since the check: _complete saw no future
            handed = None
            if not completed and self._plain:  # nobody may test them now but the progress thread
                handed = self._requests = (watch(self._requests, self._status),)
                self._plain = False
        if completed:
            _settle(future, self._result, self._error)
        elif handed is not None:
            handed[0].add_done_callback(self._part_done)  # (at once, if already complete: outside the lock)
        return future

    def result(self) -> list[Any]:
        self.wait()
        return self._result if isinstance(self._result, list) else [self._result]

    def source_rank(self) -> int:
        """The sender of a receive from any source (``recv_anysource``)."""
        self.wait()
        if self._status is None:
            raise ValueError(f"mpicomm backend: source_rank() is for a receive from any source, not {self._name}")
        return self._status.Get_source()

    _source_rank = source_rank

    def synchronize(self) -> None:
        self.wait()

    _error_plain: BaseException | None = None  # a plain MPI request's error (point to point)


def done(result: Any, name: str = "operation") -> Work:
    """A :class:`Work` for an operation that completed inside its call (its results already delivered)."""
    work = Work()
    work._result = result
    if name != "operation":
        work._name = name
    return work


def started(requests: Any, finish: Callable[[], Any] | None, result: Any, name: str) -> Work:
    """A :class:`Work` for operations in flight.

    *requests*: a ``CollectiveRequest`` or other :class:`Work` (a coalesced
    call's parts), a list of them, or None (nothing in flight). *finish* runs
    once all have completed without error, before the future completes.
    """
    requests = _listed(requests)
    if not requests:
        if finish is not None:
            finish()
        return done(result, name)
    work = Work()
    work._result, work._name = result, name
    work._completed = False
    work._lock = threading.Lock()
    work._finish = finish
    work._requests = requests
    for r in requests:
        if isinstance(r, Work):
            r._on_done(work._part_done)
        else:
            r.add_done_callback(work._part_done)
    return work


def point_to_point(requests: Any, finish: Callable[[], Any] | None, result: Any, name: str,
                   status: MPI.Status | None = None) -> Work:
    """A :class:`Work` for plain MPI point-to-point requests (*status*: a receive from any source's)."""
    requests = _listed(requests)
    work = Work()
    work._result, work._name = result, name
    if not requests:
        if finish is not None:
            finish()
        return work
    work._completed = False
    work._lock = threading.Lock()
    work._finish = finish
    work._requests = requests
    work._plain = True
    work._status = status
    return work


def _listed(requests: Any) -> list[Any]:
    if requests is None:
        return []
    if isinstance(requests, (list, tuple)):
        return [r for r in requests if r is not None]
    return [requests]


def _finished(r: Work | MPI.Request | CollectiveRequest) -> bool:
    if isinstance(r, Work):
        return r._completed
    if isinstance(r, MPI.Request):  # a plain request tested (and completed) by the Work itself
        return True
    return r.run.done


def _error_of(r: Work | MPI.Request | CollectiveRequest) -> BaseException | None:
    if isinstance(r, Work):
        return r._error
    if isinstance(r, MPI.Request):
        return None
    return r.run.error


def cuda_devices(result: Any) -> list[int | str | torch.device]:
    """The CUDA devices of the tensors in *result* (a tensor, or lists of them), each once, in order met.

    A future made with them records a CUDA event on each device's current stream when it completes, and
    whoever waits on it (``wait()``, ``value()``, a ``then`` callback, DDP's reducer) has its own current
    stream wait for those events: the stream half of the contract in docs/gpus.md.
    """
    found: list[int | str | torch.device] = []
    stack = [result]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            if item.is_cuda and item.device not in found:
                found.append(item.device)
        elif isinstance(item, (list, tuple)):
            stack.extend(reversed(item))
    return found


def settle_devices(result: Any) -> None:
    """Wait on the host for the copies that delivered *result* (on this thread's current streams) to be done.

    The delivery may run on the progress thread, whose current stream is not the caller's; waiting here makes
    a completed operation's results final in device memory, whatever stream reads them next.
    """
    for device in cuda_devices(result):
        torch.cuda.current_stream(device).synchronize()


def _settle(future: torch.futures.Future[list[Any]], result: Any, error: BaseException | None) -> None:
    if error is not None:
        future.set_exception(error)  # type: ignore[arg-type]  # torch annotates it T (the result); it takes the error
    else:
        future.set_result(result)


def watch(requests: Sequence[MPI.Request], status: MPI.Status | None = None) -> CollectiveRequest:
    """A ``CollectiveRequest`` that completes once the plain MPI *requests* have (the core's progress thread
    tests them: :func:`mpicomm.engine.requests.watched`); *status*: a single receive's."""
    return watched(requests, status)
