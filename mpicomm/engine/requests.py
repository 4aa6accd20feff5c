"""Requests: pending mpicomm operations, and the progress engine that completes them.

An mpicomm operation is a *step generator*: it posts nonblocking MPI
operations and yields the list of their requests; once all of them complete it
is resumed with their statuses, posts the next step, and so on; its return
value is the operation's result::

    def steps():
        (status,) = yield [comm.Irecv(header, source, tag)]   # step 1: the header
        ...                                                    # size the payload
        yield [comm.Irecv(payload, status.source, tag2)]       # step 2: the payload
        return payload

:class:`Request` drives one such generator. Blocking operations are the same
generators driven to completion, so blocking and nonblocking share one code path.

A step may be a :class:`RequestStep` (a list of requests that also carries
what to run once they have all completed - copying a staged receive back to
the GPU - and which peer each request talks to, for the watchdog).

Progress semantics: there is no progress thread. Any ``Wait``/``Test`` on any
mpicomm request advances *every* outstanding mpicomm request of the process
(posting each one's next step as soon as its current step completes), and a
blocking wait blocks in ``MPI_Waitany`` over all their MPI requests, so no
request waits on another one's progress. Blocking is not sleeping: MPICH's
progress engine polls there, taking a core (with more ranks than cores, set
``MPIR_CVAR_CH4_PROGRESS_THROTTLE=1``, as ``python -m tests`` does, or wait by
``Test`` and sleep, as the pipeline application's executor does). A request whose
generator raises completes with that error; ``Wait``/``Test`` re-raise it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from mpi4py import MPI

from ..runtime import handle_interrupts
from . import executor as _executor
from . import progress as _progress
from .executor import Program, Run, Step
from .watchdog import Watchdog, recorder

# Ctrl-C on any rank ends the whole job, also while this process sleeps in an MPI wait below (where
# Python's own handler would not run until the wait returned: never, if the peer is gone).
handle_interrupts()

__all__ = ["Request", "CollectiveRequest", "watched", "RequestStep", "Envelope", "Steps", "run", "progress", "outstanding",
           "barrier", "Watchdog", "recorder"]

#: A step generator: yields lists of MPI requests, receives their statuses.
Steps = Generator[Sequence[MPI.Request], list[MPI.Status], Any]


@dataclass
class Envelope:
    """A receive's result with its envelope; the request returns ``value`` and fills statuses."""

    value: Any
    source: int
    tag: int
    count: int = 0
    datatype: Any = None


_list_init = list.__init__
_Waitall = MPI.Request.Waitall


class RequestStep(list):
    """One step's MPI requests, with ``after`` (callables run once all have
    completed, before the generator resumes) and ``peers`` (``("recv"|"send",
    rank)`` per request, ``("all", -1)`` for the argument agreement over every
    rank, ``("library", -1)`` for the MPI library's own collective; named by
    the watchdog when a step never completes). ``owner``, when set, is the
    traced collective call whose steps these are (a nested call's steps pass
    through the calls around it)."""

    __slots__ = ("after", "peers", "owner")

    def __init__(self, requests: Iterable[MPI.Request] = (), after: list | None = None, peers: list | None = None):
        _list_init(self, requests)
        self.after = [] if after is None else after
        self.peers = [] if peers is None else peers

    def finish(self) -> None:
        for fn in self.after:
            fn()


def _after(step: Sequence[MPI.Request]) -> None:
    if type(step) is RequestStep and step.after:
        step.finish()


_active: list[Request] = []


class Request:
    """A pending mpicomm operation (mpi4py's ``Request`` interface: ``Wait``, ``Test``, ``Waitall``...).

    ``wait()``/``test()`` (lowercase) also return the operation's result, as
    mpi4py's lowercase methods do: the received array of an ``irecv_array``.
    The class methods - ``Waitall``/``waitall``/``Testall``, ``Waitany``/``waitany``/``Testany``/``testany``,
    ``Waitsome``/``waitsome``/``Testsome``/``testsome`` - accept plain ``MPI.Request`` objects too.
    """

    __slots__ = (
        "_gen", "_reqs", "_statuses", "_step", "_done", "_result", "_error", "_envelope", "_cancelled",
        "_delivered", "_label", "_busy", "__weakref__",
    )

    def __init__(self, steps: Steps, label: Any = "request"):
        self._gen: Steps | None = steps  # (None in a CollectiveRequest, which runs no generator)
        self._reqs: list[MPI.Request] = []
        self._statuses: list[MPI.Status] = []
        self._step = 0  # index of the current step
        self._done = False
        self._result: Any = None
        self._error: BaseException | None = None
        self._envelope: Envelope | None = None
        self._cancelled = False
        self._delivered = False  # completion reported by a wait/test (Waitany then skips it, like REQUEST_NULL)
        self._label = label  # a string, or an object whose str() is one (built only when shown)
        self._busy = False  # its generator is running (a blocking set-up inside it may drive the engine)
        self._resume(None, first=True)
        if not self._done:
            _active.append(self)

    @property
    def label(self) -> str:
        """What the request is, for messages: ``"allreduce #12 (ring)"``, ``"irecv_array"``..."""
        return str(self._label)

    @label.setter
    def label(self, value: Any) -> None:
        self._label = value

    # ------------------------------------------------------------ engine

    def _resume(self, statuses: list[MPI.Status] | None, first: bool = False) -> None:
        self._busy = True
        try:
            step = next(self._gen) if first else self._gen.send(statuses)  # type: ignore[arg-type, union-attr]  # only a plain Request resumes its generator; statuses: a list after the first
        except StopIteration as stop:
            self._finish(stop.value, None)
            return
        except Exception as exc:
            if first:  # errors before the first step (argument checks) raise at the call itself
                raise
            self._finish(None, exc)  # later ones go to whoever waits or tests
            return
        finally:
            self._busy = False
        self._step += 0 if first else 1
        self._reqs = step if type(step) is RequestStep else list(step)
        self._statuses = [MPI.Status() for _ in self._reqs]

    def _finish(self, value: Any, error: BaseException | None) -> None:
        self._done = True
        self._reqs = []
        self._error = error
        if isinstance(value, Envelope):
            self._envelope = value
            value = value.value
        self._result = value

    def _poll(self) -> bool:
        """Advance as far as possible without blocking; True if any step completed."""
        progressed = False
        if self._busy:  # re-entered from inside its own generator (a collective set-up waiting): not now
            return False
        while not self._done:
            live = [i for i, r in enumerate(self._reqs) if r]
            if live:
                sub = [self._reqs[i] for i in live]
                st = [MPI.Status() for _ in live]
                if not MPI.Request.Testall(sub, st):
                    return progressed
                for i, s in zip(live, st):
                    self._statuses[i] = s
            _after(self._reqs)
            self._resume(self._statuses)
            progressed = True
        return progressed

    def _complete_step(self) -> None:
        """Sleep in MPI until every request of the current step has completed (keeping their statuses).

        For a wait on the only outstanding mpicomm request: one ``MPI_Waitall``
        per step, as a blocking call runs, instead of waking at each request's
        completion; the next :func:`progress` resumes the generator.
        """
        live = [i for i, r in enumerate(self._reqs) if r]
        if not live:
            return
        statuses = [MPI.Status() for _ in live]
        _Waitall([self._reqs[i] for i in live], statuses)
        for i, status in zip(live, statuses):
            self._statuses[i] = status

    def _deliver(self, status: MPI.Status | None) -> Any:
        self._delivered = True
        if self._error is not None:
            raise self._error
        if status is not None:
            if self._envelope is not None:
                _fill(status, self._envelope)
            status.Set_cancelled(self._cancelled)
        return self._result

    # ------------------------------------------------------------ mpi4py interface

    @property
    def done(self) -> bool:
        """True once the operation has completed (successfully or with an error)."""
        return self._done

    def Test(self, status: MPI.Status | None = None) -> bool:
        """Advance all outstanding requests; True if this one has completed."""
        progress()
        if self._done:
            self._deliver(status)
        return self._done

    def Wait(self, status: MPI.Status | None = None) -> bool:
        """Block until this request completes (raising its error, if any)."""
        _wait_for([self])
        self._deliver(status)
        return True

    def test(self, status: MPI.Status | None = None) -> tuple[bool, Any]:
        """``(done, result)``; result is None until done."""
        if self.Test(status):
            return True, self._result
        return False, None

    def wait(self, status: MPI.Status | None = None) -> Any:
        """Block until done; return the operation's result."""
        self.Wait(status)
        return self._result

    @property
    def delivered(self) -> bool:
        """True once a wait or test has reported this request's completion (or error) to a caller."""
        return self._delivered

    @property
    def cancelled(self) -> bool:
        """True if :meth:`Cancel` stopped the operation before it matched anything."""
        return self._cancelled

    def Cancel(self) -> None:
        """Cancel a pending receive (one that may never be matched) and complete the request.

        Only an operation still in its first step can be cancelled (a receive
        whose message has not arrived). As with ``MPI_Cancel``, one that has
        already matched - or moved past its first step - is not cancelled: it
        runs to completion and delivers its data (``cancelled`` stays False).
        Otherwise the request completes with result None and ``cancelled`` True.
        """
        if self._done:
            return
        if self._step > 0:
            _wait_for([self])
            return
        live = [i for i, r in enumerate(self._reqs) if r]
        for i in live:
            self._reqs[i].Cancel()
        statuses = [MPI.Status() for _ in live]
        if live:
            MPI.Request.Waitall([self._reqs[i] for i in live], statuses)
        for i, status in zip(live, statuses):
            self._statuses[i] = status
        cancelled = [status.Is_cancelled() for status in statuses]
        if live and not any(cancelled):  # already matched: finish normally
            self._resume(self._statuses)
            _wait_for([self])
            return
        assert self._gen is not None  # a plain Request (CollectiveRequest has its own Cancel)
        self._gen.close()
        if all(cancelled):
            self._cancelled = True
            self._finish(None, None)
        else:
            self._finish(None, RuntimeError(f"{self.label}: cancelled after part of its step had matched; data may be lost"))
        if self in _active:
            _active.remove(self)

    @staticmethod
    def _wrap(requests: Iterable[Any]) -> list[Request]:
        out = []
        for r in _check_types(requests):
            if isinstance(r, Request):
                out.append(r)
            else:
                wrapped = Request(_single(r), "MPI request")
                if r == MPI.REQUEST_NULL:  # already completed: inactive, as MPI treats it
                    wrapped._delivered = True
                out.append(wrapped)
        return out

    @classmethod
    def Waitall(cls, requests: Sequence[Any], statuses: list[MPI.Status] | None = None) -> bool:
        """Wait for all *requests* (mpicomm or plain MPI); fill *statuses* if given."""
        reqs = cls._wrap(requests)
        _wait_for(reqs)
        _grow(statuses, len(reqs))
        for i, r in enumerate(reqs):
            r._deliver(statuses[i] if statuses is not None else None)
        return True

    @classmethod
    def waitall(cls, requests: Sequence[Any], statuses: list[MPI.Status] | None = None) -> list[Any]:
        """Wait for all *requests*; return their results."""
        reqs = cls._wrap(requests)
        cls.Waitall(reqs, statuses)
        return [r._result for r in reqs]

    @classmethod
    def Testall(cls, requests: Sequence[Any], statuses: list[MPI.Status] | None = None) -> bool:
        """Advance everything; True (and *statuses* filled) if all *requests* have completed.

        As in MPI, when it returns False no request has been completed by it.
        """
        ours = [r for r in requests if isinstance(r, Request)]
        plain = [(i, r) for i, r in enumerate(requests) if not isinstance(r, Request)]
        _check_types(requests)
        progress()
        if not all(r._done for r in ours):
            return False
        sub = [MPI.Status() for _ in plain]
        if plain and not MPI.Request.Testall([r for _, r in plain], sub):
            return False
        plain_status = {i: st for (i, _), st in zip(plain, sub)}
        _grow(statuses, len(requests))
        for i, r in enumerate(requests):
            target = statuses[i] if statuses is not None else None
            if isinstance(r, Request):
                r._deliver(target)
            elif target is not None:
                _copy_status(plain_status[i], target)
        return True

    # ------------------------------------------------------------ any / some: MPI's completion semantics
    #
    # Over mpicomm requests and plain MPI requests alike, as MPI_Waitany & co. behave:
    # * inactive requests are ignored: MPI.REQUEST_NULL, an inactive (or freed) persistent request - native or
    #   mpicomm - and an mpicomm request whose completion a wait or test has already reported; when every request
    #   is inactive the "any" forms return MPI.UNDEFINED (Testany: flag True, and an empty status) and the "some"
    #   forms None (mpi4py's answer for MPI_UNDEFINED);
    # * each completion is reported once: a plain request is completed by MPI (set to REQUEST_NULL - in place,
    #   so the caller's list sees it - or made inactive if persistent), an mpicomm request is marked delivered;
    # * statuses are filled as mpi4py fills them: Waitany's one status; Waitsome's statuses[k] for the k-th index
    #   returned (the list grows when shorter). A send's or a collective's status is the empty one;
    # * a completed operation that failed raises its error (an mpicomm request re-raises it, a plain one raises
    #   mpi4py's MPI.Exception) in a call that reports nothing else: completions are taken in index order and a
    #   failure ends the batch, so the ones before it are returned now and it raises at the next call - no other
    #   completion is consumed with an error and lost. The failed request is inactive afterwards.
    #
    # Waiting advances every outstanding mpicomm operation and sleeps as Waitall does: in MPI_Waitany over every
    # point-to-point MPI request of the process and the plain requests given; with a collective among the
    # requests, in the collective's own MPI requests when it is the only thing pending, else by polling with
    # growing naps (its communicator's queue completes it, not an MPI request given here).

    @classmethod
    def Waitany(cls, requests: Sequence[Any], status: MPI.Status | None = None) -> int:
        """Wait until one of *requests* (mpicomm or plain MPI) completes; return its index.

        As in MPI, inactive requests - REQUEST_NULL, an inactive persistent
        request, one whose completion a wait or test has already reported - are
        ignored; ``MPI.UNDEFINED`` (and an empty *status*) when all are.
        """
        return _any(requests, status, True, False)[0]

    @classmethod
    def waitany(cls, requests: Sequence[Any], status: MPI.Status | None = None) -> tuple[int, Any]:
        """:meth:`Waitany`, returning ``(index, result)``: ``(MPI.UNDEFINED, None)`` when all are inactive."""
        index, _, result = _any(requests, status, True, True)
        return index, result

    @classmethod
    def Testany(cls, requests: Sequence[Any], status: MPI.Status | None = None) -> tuple[int, bool]:
        """Advance everything; ``(index, True)`` if one of *requests* has completed (reported once),
        ``(MPI.UNDEFINED, False)`` if none has, ``(MPI.UNDEFINED, True)`` when all are inactive."""
        index, flag, _ = _any(requests, status, False, False)
        return index, flag

    @classmethod
    def testany(cls, requests: Sequence[Any], status: MPI.Status | None = None) -> tuple[int, bool, Any]:
        """:meth:`Testany`, returning ``(index, flag, result)`` (result None unless one completed)."""
        return _any(requests, status, False, True)

    @classmethod
    def Waitsome(cls, requests: Sequence[Any], statuses: list[MPI.Status] | None = None) -> list[int] | None:
        """Wait until at least one of *requests* completes; return the indices of all that have (in index order).

        ``statuses[k]`` is filled for the k-th index returned. None when every request is inactive.
        """
        found = _completions(requests, True, True, False, statuses)
        return None if found is None else [i for i, _ in found]

    @classmethod
    def waitsome(cls, requests: Sequence[Any], statuses: list[MPI.Status] | None = None
                 ) -> tuple[list[int] | None, list[Any] | None]:
        """:meth:`Waitsome`, returning ``(indices, results)``; ``(None, None)`` when all are inactive."""
        found = _completions(requests, True, True, True, statuses)
        if found is None:
            return None, None
        return [i for i, _ in found], [result for _, result in found]

    @classmethod
    def Testsome(cls, requests: Sequence[Any], statuses: list[MPI.Status] | None = None) -> list[int] | None:
        """Advance everything; the indices of the requests that have completed (``[]``: none yet; None: all
        inactive), each reported once; ``statuses[k]`` filled for the k-th."""
        found = _completions(requests, False, True, False, statuses)
        return None if found is None else [i for i, _ in found]

    @classmethod
    def testsome(cls, requests: Sequence[Any], statuses: list[MPI.Status] | None = None
                 ) -> tuple[list[int] | None, list[Any] | None]:
        """:meth:`Testsome`, returning ``(indices, results)``; ``(None, None)`` when all are inactive."""
        found = _completions(requests, False, True, True, statuses)
        if found is None:
            return None, None
        return [i for i, _ in found], [result for _, result in found]

    def __bool__(self) -> bool:
        """Active (like a non-null ``MPI.Request``) until a wait or test has reported its completion."""
        return not self._delivered

    def __repr__(self) -> str:
        state = "done" if self._done else f"waiting on {sum(1 for r in self._reqs if r)} MPI request(s)"
        return f"<mpicomm.Request {self.label}: {state}>"


def _grow(statuses: list[MPI.Status] | None, n: int) -> None:
    """As mpi4py: a statuses list shorter than the requests grows to one status per request."""
    if statuses is not None and len(statuses) < n:
        statuses.extend(MPI.Status() for _ in range(n - len(statuses)))


def _check_types(requests: Iterable[Any]) -> list[Any]:
    items = list(requests)
    for r in items:
        if not isinstance(r, (Request, MPI.Request)):
            raise TypeError(f"expected mpicomm.Request or MPI.Request, got {type(r).__qualname__}")
    return items


def _single(req: MPI.Request) -> Steps:
    if req == MPI.REQUEST_NULL:
        return Envelope(None, MPI.ANY_SOURCE, MPI.ANY_TAG, 0, MPI.BYTE)
    (status,) = yield [req]
    return Envelope(None, status.Get_source(), status.Get_tag(), status.Get_count(MPI.BYTE), MPI.BYTE)


def _active_mpicomm(r: Request) -> bool:
    """Not yet reported to a wait or test (and, for a persistent request, started and not freed)."""
    return not r._delivered and bool(r)


def _native_scan(natives: list[tuple[int, MPI.Request]]) -> tuple[list[int], int | None, bool]:
    """Which of the plain MPI *natives* (``(index, request)``, none null) have completed, without completing any:
    ``(indices, failed, inactive)``. *failed*: the first one that completed with an error (then only those before
    it are listed); *inactive*: every one is inactive (a persistent request not started)."""
    reqs = [r for _, r in natives]
    for _ in range(len(reqs) + 1):
        try:
            done = MPI.Request.Get_status_some(reqs)
        except MPI.Exception:
            pass  # one has failed: find it below (MPI_Request_get_status reports the error, freeing nothing)
        else:
            if done is None:
                return [], None, True
            return sorted(natives[j][0] for j in done), None, False
        k = _first_failed(reqs)
        if k is None:
            continue
        try:
            before = MPI.Request.Get_status_some(reqs[:k]) if k else None
        except MPI.Exception:
            continue  # (another one failed meanwhile, earlier in the list)
        return sorted(natives[j][0] for j in before or ()), natives[k][0], False
    raise RuntimeError("MPI_Request_get_status_some keeps failing on requests that MPI_Request_get_status "
                       "reports as fine")


def _first_failed(reqs: list[MPI.Request]) -> int | None:
    """The index of the first of *reqs* that completed with an error (none is freed), if any."""
    for k, r in enumerate(reqs):
        try:
            r.Get_status()
        except MPI.Exception:
            return k
    return None


def _scan(items: list[Any], many: bool, holding: bool) -> list[tuple[int, bool]] | None:
    """Advance everything once; the completions to report now, ``(index, failed)`` in index order (one, unless
    *many*); None if every request is inactive. A failed one is reported alone: the batch ends before it, unless
    it is first (and *holding* is False: no completion is already taken)."""
    progress()
    driven: set[int] = set()
    for r in items:
        if (isinstance(r, CollectiveRequest) and not r._done and r.queue not in _progress.queues
                and id(r.queue) not in driven):
            driven.add(id(r.queue))
            r._poll()  # (no progress thread drives its queue)
    active = False
    candidates: list[tuple[int, bool]] = []
    natives: list[tuple[int, MPI.Request]] = []
    for i, r in enumerate(items):
        if isinstance(r, Request):
            if _active_mpicomm(r):
                active = True
                if r._done:
                    candidates.append((i, r._error is not None))
        elif r:  # not REQUEST_NULL
            natives.append((i, r))
    if natives:
        done, failed, inactive = _native_scan(natives)
        active = active or not inactive
        candidates += [(i, False) for i in done]
        if failed is not None:
            candidates.append((failed, True))
    if not active:
        return None
    candidates.sort()
    plan: list[tuple[int, bool]] = []
    for i, failed in candidates:
        if failed:
            if not plan and not holding:
                plan.append((i, True))
            break
        plan.append((i, False))
        if not many:
            break
    return plan


def _status_at(statuses: list[MPI.Status] | None, k: int) -> MPI.Status | None:
    """The status for the k-th completion reported (mpi4py grows a shorter list)."""
    if statuses is None:
        return None
    _grow(statuses, k + 1)
    return statuses[k]


def _report(items: list[Any], plan: list[tuple[int, bool]], taken: tuple[int, MPI.Status, Any] | None,
            lower: bool, statuses: list[MPI.Status] | None) -> list[tuple[int, Any]]:
    """Complete the planned requests (and the one MPI already completed while waiting, *taken*), in index
    order; ``(index, result)`` for each; an mpicomm request that failed raises its error (planned alone)."""
    entries = sorted(plan + ([(taken[0], False)] if taken is not None else []))
    out: list[tuple[int, Any]] = []
    for i, _ in entries:
        target = _status_at(statuses, len(out))
        r = items[i]
        if taken is not None and i == taken[0]:
            if target is not None:
                _copy_status(taken[1], target)
            result = taken[2]
        elif isinstance(r, Request):
            if target is not None:
                _empty(target)
            result = r._deliver(target)
        elif lower:
            flag, result = r.test(target)
            if not flag:  # (cannot happen: it had completed)
                continue
        else:
            if not r.Test(target):
                continue
            result = None
        out.append((i, result))
    return out


class _Naps:
    """A wait that cannot sleep in MPI polls: a few times at once, then yielding the core for 2 ms, then
    napping 20 µs doubling to 1 ms (as a collective's wait does while other requests are pending)."""

    __slots__ = ("polls", "since", "nap")

    def __init__(self) -> None:
        self.polls = 0
        self.since = 0.0
        self.nap = 0.0

    def spinning(self) -> bool:
        if self.polls < _executor.SPINS:
            self.polls += 1
            return True
        return False

    def pause(self) -> None:
        now = time.perf_counter()
        if not self.since:
            self.since = now
        if now - self.since < 2e-3:
            os.sched_yield()
        else:
            self.nap = min(2 * self.nap if self.nap else 2e-5, 1e-3)
            time.sleep(self.nap)


def _sleep(items: list[Any], lower: bool, watchdog: Watchdog | None, naps: _Naps) -> tuple[int, MPI.Status, Any] | None:
    """Block until something may have completed (nothing of *items* has, nor is every one inactive).

    Returns ``(index, status, result)`` when a plain request of *items* was completed by MPI in the wait."""
    mine = [r for r in items if isinstance(r, Request) and _active_mpicomm(r)]
    if any(r._done for r in mine):  # completed since the scan (by the progress thread): report it, never sleep -
        return None  # sleeping in MPI on the plain requests alone could wait for ever
    pending = mine
    natives = [(i, r) for i, r in enumerate(items) if not isinstance(r, Request) and r]
    if watchdog is not None:
        watchdog.pause(pending + [r for r in _active if r not in pending])
        return None
    collectives = [r for r in pending if isinstance(r, CollectiveRequest)]
    if collectives:
        if naps.spinning():
            return None
        queues = {id(r.queue): r.queue for r in collectives}
        if len(queues) == 1 and not natives and not _active:
            (q,) = queues.values()
            if not _progress.unattended(q):
                with q.held:  # (the progress thread leaves it alone meanwhile: one thread completes its requests)
                    _progress.drive(q)
                    front = q.runs[0] if q.runs else None
                    if front is not None and not front.waits_on_memory() and front.live():
                        front.sleep()  # nothing else can complete first: the head run's step, in MPI
                        return None
        naps.pause()
        return None
    owners = any(not r._busy and any(r._reqs) for r in _active)
    if not natives and not owners:
        naps.pause()  # (only a request whose generator is running - a re-entered wait - is pending)
        return None
    taken = _block([r for _, r in natives], lower)
    if taken is None:
        if not owners:  # MPI had nothing to wait for (the plain requests are inactive persistent ones)
            naps.pause()
        return None
    j, status, result = taken
    return natives[j][0], status, result


def _completions(requests: Sequence[Any], block: bool, many: bool, lower: bool,
                 statuses: list[MPI.Status] | None) -> list[tuple[int, Any]] | None:
    """The completions of *requests* reported by one any/some call: ``(index, result)`` in index order;
    ``[]`` when none (a test); None when every request is inactive."""
    items = _check_types(requests)
    watchdog = Watchdog.start() if block else None
    naps = _Naps()
    while True:
        plan = _scan(items, many, False)
        if plan is None:
            return None
        if plan or not block:
            return _report(items, plan, None, lower, statuses)
        taken = _sleep(items, lower, watchdog, naps)
        if taken is not None:
            more = _scan(items, True, True) if many else None  # and whatever else has completed by now
            return _report(items, more or [], taken, lower, statuses)


def _any(requests: Sequence[Any], status: MPI.Status | None, block: bool, lower: bool) -> tuple[int, bool, Any]:
    """``(index, flag, result)`` of Waitany/Testany and their lowercase forms."""
    found = _completions(requests, block, False, lower, None if status is None else [status])
    if found is None:
        if status is not None:
            _empty(status)
        return MPI.UNDEFINED, True, None
    if not found:
        return MPI.UNDEFINED, False, None
    ((index, result),) = found
    return index, True, result


def progress() -> int:
    """Advance every outstanding mpicomm request without blocking (collectives of every communicator whose
    queue no other thread is driving, and point-to-point transfers); return how many stepped."""
    stepped = _progress.progress_all()
    for r in list(_active):
        if r._poll():
            stepped += 1
    if stepped:
        _active[:] = [r for r in _active if not r._done]
    return stepped


def outstanding() -> list[Request]:
    """The requests of this process that have not completed yet."""
    return list(_active)


def _block(extra: Sequence[MPI.Request] = (), lower: bool = False) -> tuple[int, MPI.Status, Any] | None:
    """Sleep in MPI until some outstanding MPI request completes; keep its status.

    *extra* are plain MPI requests waited on too: if one of them completes,
    return ``(its index, its status, its result)`` (the result: mpi4py's
    lowercase ``waitany``'s, when *lower*; else None).
    """
    owners = [(r, i) for r in _active if not r._busy for i, m in enumerate(r._reqs) if m]
    if not owners and not extra:
        return None
    status = MPI.Status()
    reqs = [r._reqs[i] for r, i in owners] + list(extra)
    result = None
    if lower and extra:
        index, result = MPI.Request.waitany(reqs, status)
    else:
        index = MPI.Request.Waitany(reqs, status)
    if index == MPI.UNDEFINED:
        return None
    if index >= len(owners):
        return index - len(owners), status, result
    r, i = owners[index]
    r._statuses[i] = status
    return None


def _empty(status: MPI.Status) -> None:
    """Make *status* MPI's empty status (a send's, a collective's, an inactive request's)."""
    status.source = MPI.ANY_SOURCE
    status.tag = MPI.ANY_TAG
    status.error = MPI.SUCCESS
    status.Set_elements(MPI.BYTE, 0)
    status.Set_cancelled(False)


def _copy_status(source: MPI.Status, target: MPI.Status) -> None:
    target.source = source.Get_source()
    target.tag = source.Get_tag()
    target.error = MPI.SUCCESS  # single-completion calls leave MPI_ERROR undefined; errors raise instead
    target.Set_elements(MPI.BYTE, source.Get_count(MPI.BYTE))
    target.Set_cancelled(source.Is_cancelled())


def pending_elsewhere(q: _progress.Queue) -> Callable[[], bool] | None:
    """What a blocking collective on *q* must advance while it waits: the process's point-to-point requests
    and the queues no progress thread drives (MPI's progress rule: a peer may need one of them to reach the
    collective); None when there is nothing (it then sleeps in MPI on its own requests)."""
    if not _active and not _progress.unattended(q):
        return None

    def others() -> bool:
        progress()
        return bool(_active) or _progress.unattended(q)
    return others


def _others() -> bool:
    """Advance the point-to-point requests; whether any is still outstanding (a collective's wait then polls
    instead of sleeping in MPI: a peer may need one of them to reach the collective)."""
    if _active:
        progress()
    return bool(_active)


def _wait_for(requests: Sequence[Request]) -> None:
    watchdog = Watchdog.start()
    for r in requests:
        if type(r) is CollectiveRequest and not r._done:
            _progress.wait(r.run, r.queue, watchdog, _others)
            r._settle()
    while True:
        progress()
        if all(r._done for r in requests):
            return
        if watchdog is None:
            if len(_active) == 1 and not _active[0]._busy:
                _active[0]._complete_step()  # the only one outstanding: wait for its whole step at once
            else:
                _block()
        else:
            watchdog.pause([r for r in requests if not r._done] + [r for r in _active if r not in requests])


def _waitall(step: Sequence[MPI.Request], statuses: list[MPI.Status], label: Any, index: int, watchdog: Watchdog | None) -> None:
    if watchdog is None:
        MPI.Request.Waitall(step, statuses)
        return
    requests = list(step)
    while not MPI.Request.Testall(requests, statuses):
        watchdog.pause([(label, index, step)])


def run(steps: Steps, status: MPI.Status | None = None, label: Any = "operation") -> Any:
    """Drive *steps* to completion (a blocking operation); return its result.

    *label* names the operation in the watchdog's report: a string, or any
    object whose ``str()`` is one (so a label is only built if it is shown).

    When no other mpicomm request is outstanding the steps run straight through
    ``MPI_Waitall``; otherwise they join the progress engine, so a blocking call
    never starves a pending nonblocking one (which MPI itself would progress).
    """
    if _active:
        return Request(steps, label).wait(status)
    watchdog = Watchdog.start()
    index = 0
    try:
        step = next(steps)
        while True:
            statuses = [MPI.Status() for _ in step]
            if watchdog is None:
                _Waitall(step, statuses)
            else:
                _waitall(step, statuses, label, index, watchdog)
            if type(step) is RequestStep and step.after:
                step.finish()
            step = steps.send(statuses)
            index += 1
    except StopIteration as stop:
        value = stop.value
    if isinstance(value, Envelope):
        if status is not None:
            _fill(status, value)
        return value.value
    return value


def _fill(status: MPI.Status, env: Envelope) -> None:
    """Make *status* describe a completed receive (source, tag, element count)."""
    status.source = env.source
    status.tag = env.tag
    status.error = MPI.SUCCESS
    if env.datatype is not None:
        status.Set_elements(env.datatype, env.count)


class CollectiveRequest(Request):
    """A nonblocking or persistent collective in flight: a :class:`~mpicomm.engine.executor.Run` queued on its
    communicator (see :mod:`mpicomm.engine.progress`). It completes whether or not anyone waits on it."""

    __slots__ = ("run", "queue", "_then", "_callbacks")

    def __init__(self, run: Run, queue: _progress.Queue, then: Any = None, label: Any = None):
        self.run = run
        self.queue = queue
        self._then = then  # what the request returns once the run is done (a callable), if anything
        self._gen = None
        self._reqs = []
        self._statuses = []
        self._step = 0
        self._done = False
        self._result = None
        self._error = None
        self._envelope = None
        self._cancelled = False
        self._delivered = False
        self._label = run if label is None else label
        self._busy = False
        self._callbacks: list[Any] | None = None
        _progress.callback_when_done(run, self._finished, queue)

    def _finished(self, run: Run) -> None:
        self._settle()
        callbacks, self._callbacks = self._callbacks, None
        for fn in callbacks or ():
            fn(self)

    def add_done_callback(self, fn: Any) -> None:
        """Call ``fn(request)`` once the collective has completed (at once if it has), from whichever thread
        completes it: the caller's, or the progress thread (so keep *fn* short and thread-safe)."""
        with self.queue.held:
            if not self.run.done:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(fn)
                return
        self._settle()
        fn(self)

    def _settle(self) -> None:
        run = self.run
        if self._done or not run.done:
            return
        if run.error is not None:
            self._error = run.error
        elif self._then is not None:
            try:
                self._result = self._then()
            except BaseException as exc:  # noqa: BLE001 - delivered to whoever waits
                self._error = exc
        self._done = True

    def _poll(self) -> bool:
        if self._done:
            return False
        q = self.queue
        if q.lock.acquire(False):
            try:
                _progress.drive(q)
            finally:
                q.lock.release()
        self._settle()
        return self._done

    def _complete_step(self) -> None:
        _progress.wait(self.run, self.queue)
        self._settle()

    def Wait(self, status: MPI.Status | None = None) -> bool:
        """Block until the collective completes (raising its error, if any)."""
        if not self._done:
            run = self.run
            if not run.done:
                _progress.wait(run, self.queue, Watchdog.start(), _others)
            self._settle()
        self._deliver(status)
        return True

    def Cancel(self) -> None:
        """Refused: cancelling a collective is erroneous in MPI. The operation goes on and completes."""
        raise ValueError(f"{self.label}: a collective request cannot be cancelled (MPI calls cancelling a "
                         f"collective erroneous); it goes on and completes - Wait for it instead")

    def __repr__(self) -> str:
        state = "done" if self._done else ("in flight" if self.run.started else "queued")
        return f"<mpicomm.Request {self.label}: {state}>"


def watched(requests: Sequence[MPI.Request], status: MPI.Status | None = None,
            label: str = "point to point") -> CollectiveRequest:
    """A request that completes once the plain MPI *requests* have: the progress thread tests them (on a queue
    of their own, so they wait behind nothing), and ``add_done_callback`` works as for a collective.

    *status*: filled with the status of a single request (a receive from any source).
    """
    reqs = list(requests)
    statuses = [MPI.Status() for _ in reqs] if status is None else [status]

    def ready(run: Run) -> bool:
        return bool(MPI.Request.Testall(reqs, statuses))

    step = Step(label)
    step.syncs = (ready,)
    program = Program([step.finish()], label)
    queue = _progress.Queue()
    run = Run(program)
    _progress.submit(queue, run)
    return CollectiveRequest(run, queue, label=label)


def barrier(comm: MPI.Intracomm) -> None:
    """An MPI barrier on *comm* during which this rank keeps serving its mpicomm requests.

    mpicomm calls it before its own blocking collective set-ups (creating a
    ``Comm``, a window, a rendezvous): a peer blocked in a large ``send_array``
    to this rank, whose payload receive this rank has yet to post, gets it
    posted here instead of waiting forever.
    """
    run(_ibarrier(comm))


def _ibarrier(comm: MPI.Intracomm) -> Steps:
    yield [comm.Ibarrier()]
