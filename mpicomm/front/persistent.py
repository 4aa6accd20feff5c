"""Persistent collectives (MPI-4's ``MPI_Allreduce_init`` & co.): plan once, start many times.

``comm.Allreduce_init(sendbuf, recvbuf, op)`` returns a :class:`Prequest`
bound to those buffers; each ``Start()`` runs the collective on whatever the
buffers hold then, and ``Wait()``/``Test()`` complete it, as many times as
wanted; ``Free()`` releases it. As in MPI, every rank creates its persistent
collectives in the same order (creation is collective), starts them in the
same order, and a request is not started again before it completed.

At creation (collective): the arguments are read and checked, the algorithm
chosen, the plan compiled (prepared point-to-point requests, scratch,
reductions bound to the buffers) and the ranks agree on it - any problem
raises the same :class:`~mpicomm.plan.args.ArgumentError` on every rank - and
the request takes the communicator's next persistent number. A ``Start``
queues one run of the plan (its first messages are posted at once when
nothing else is queued on the communicator) and returns; the progress thread
completes it while the program computes. Every start's agreement carries
the request's number, so requests started in different orders on different
ranks raise the same error on every rank instead of exchanging each other's
data.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from mpi4py import MPI

from .. import config
from ..engine import executor as _executor
from ..engine import progress as _progress
from ..engine import requests as _requests
from ..engine.executor import Program, Run
from ..engine.progress import callback_when_done, submit
from ..engine.requests import CollectiveRequest
from ..plan.args import Args
from ..plan.compile import Plan
from ..transport.buffers import ready
from . import dispatch

if TYPE_CHECKING:
    from ..state import State

__all__ = ["Prequest", "create"]


_INACTIVE = Program([], "inactive persistent request")


class Prequest(CollectiveRequest):
    """A persistent collective request: ``Start``, ``Wait``/``Test`` (or ``Request.Waitall``...), ``Free``.

    Inactive until started, and again once a wait or test has reported its
    completion to the caller (MPI's rule: completing the run in the background
    does not make it inactive). ``Start`` or ``Free`` on an active request, or
    any use after ``Free``, raises ValueError naming the request. Whether it
    is active depends only on the calls this rank made (Start, and the
    Wait/Test that reported it), never on how far the run got meanwhile, so
    the same program gets the same answer on every rank.
    """

    __slots__ = ("_plan", "_args", "_algorithm", "starts", "_host", "_make")

    def __init__(self, plan: Plan, args: Args, algorithm: str | None, make: Callable[[int], Plan] | None = None):
        self._plan: Plan | None = plan
        self._args = args
        self._algorithm = algorithm
        self._make = make  # builds the plan from the request's number, where the ordinary compile does not
        self.starts = 0
        self._host = args.device is None  # host arrays: Start and Wait may take the compiled lane's short path
        run = Run(_INACTIVE, -1)
        run.done = True  # inactive: a wait returns at once, Waitany skips it
        CollectiveRequest.__init__(self, run, plan.state.queue, None, self)
        self._delivered = True

    def _live_plan(self) -> Plan:
        plan = self._plan
        if plan is None:
            raise ValueError(f"{self.label}: this persistent request was freed; make a new one with *_init")
        return plan

    @property  # type: ignore[misc]  # read-only on purpose: the plan names it
    def label(self) -> str:
        plan = self._plan
        if plan is None:
            return "persistent request (freed)"
        return f"persistent {plan.collective} #{plan.persistent} ({plan.name_}, {self.starts} starts)"

    def Start(self) -> None:
        """Start one run of the collective on the buffers' current contents (every rank, in the same order)."""
        plan = self._plan
        if plan is not None and self._delivered and self._host and plan.program.lane is not None:
            # The short path (host arrays, a plan with a compiled lane, nothing queued or in its way): the run
            # starts, polls and often finishes in one call into the lane, with little Python around it (a Python
            # call costs as much as the lane's whole round on 8 bytes)
            state = plan.state
            q = state.queue
            if not q.runs and plan.epoch == state.epoch and not state.freed and state.lock.acquire(False):
                try:  # (a completion callback's start takes the call lock too, where it is free)
                    if q.lock.acquire(False):
                        try:
                            if not q.runs and not q.driving:
                                run = self._next_run(plan.program, state)
                                if run.launch():
                                    self._settle()
                                else:
                                    run.callbacks = [self._finished]
                                    q.owner = threading.get_ident()
                                    q.runs.append(run)
                                    _progress.tell_thread(q)
                                return
                        finally:
                            q.lock.release()
                finally:
                    state.lock.release()
        plan = self._live_plan()
        if not self._delivered:  # (not _done: the progress thread may have finished the run already)
            raise ValueError(f"{self.label}: started again while active (started, and no Wait or Test has "
                             f"reported its completion yet); Wait for it (or Test until it says done) first")
        state = plan.state
        if state.freed:
            state.check_live()
        if self._args.device is not None:  # the stream contract: the caller's queued work on the buffers is done
            for x in (self._args.send, self._args.recv):
                if x is not None:
                    ready(x)
        locked = dispatch.enter(state)
        try:
            if plan.epoch != state.epoch:  # a call failed on a disagreement since: fresh tags, so a fresh plan
                number = plan.persistent
                if self._make is not None:
                    plan.release()
                    plan = self._plan = self._make(number)  # type: ignore[arg-type]  # (a persistent plan's)
                else:
                    plan = self._plan = dispatch.plan_for(state, self._args, self._algorithm, False,
                                                          persistent=number)
            run = self._next_run(plan.program, state)
            if locked:
                state.queue.owner = threading.get_ident()
            callback_when_done(run, self._finished, state.queue)
            submit(state.queue, run)
            if run.done:
                self._settle()
        finally:
            if locked:
                state.lock.release()

    def _next_run(self, program: Program, state: State) -> Run:
        """This request's next run (numbered, in the flight recorder); the request becomes active."""
        self.starts += 1
        seq = state.collectives
        state.collectives = seq + 1
        run = Run(program, seq)
        run.keep = self._args  # (the request keeps them too; the run may outlive a dropped request)
        state.recent.append(run)
        self.run = run
        self._done = False
        self._delivered = False
        self._error = None
        self._result = None
        return run

    def Wait(self, status: MPI.Status | None = None) -> bool:
        """Block until the collective completes (raising its error, if any); at once when inactive."""
        if not self._done:
            run = self.run
            lane = run.lane
            q = self.queue
            if (lane is not None and not run.done and run.k >= 0 and not run.broken and not _requests._active
                    and not config.raw("MPICOMM_TIMEOUT") and q.lock.acquire(False)):
                # The short path: this run heads the queue, nothing else needs this thread's polls, no watchdog:
                # wait in the lane (the GIL released) and finish the run here
                try:
                    if not q.driving and q.runs and q.runs[0] is run:
                        q.driving = True
                        try:  # (the run's completion callback settles this request)
                            if run._advance(lane, _executor.SPINS, True) is None:
                                run.poll(True)  # handed back to the executor's loop
                        except Exception as exc:  # noqa: BLE001 - as in Run.poll
                            run._failed(exc)
                        except BaseException as exc:
                            run._fail(exc)
                        finally:
                            q.driving = False
                        if run.done:
                            q.runs.popleft()
                            if q.runs:
                                _progress.drive(q)  # (the next run starts)
                finally:
                    q.lock.release()
        if self._done and self._error is None and status is None:
            self._delivered = True
            return True
        return CollectiveRequest.Wait(self, status)

    @staticmethod
    def Startall(requests: Sequence[Prequest]) -> None:
        """Start every request in *requests*, in order."""
        for r in requests:
            if not isinstance(r, Prequest):
                raise TypeError(f"Startall takes mpicomm persistent requests (from *_init), got {type(r).__qualname__}")
            r.Start()

    def Free(self) -> None:
        """Release the request; refused (ValueError, on every rank) while it is active: Wait for it first.

        MPI-4's rule for persistent collectives: once a process starts one, it
        must complete it (MPI-4.0/4.1, "Persistent Collective Operations"), and
        freeing the request of a collective in progress is erroneous
        (``MPI_Request_free`` on a nonblocking collective's request, section
        "Nonblocking Collective Operations"). Where MPI leaves that erroneous
        call undefined, mpicomm refuses it whether or not the run has finished
        in the background: the request stays active and usable (Wait, then
        Free or Start again). Freeing twice is harmless.
        """
        if self._plan is None:
            return
        if not self._delivered:
            raise ValueError(f"{self.label}: freed while active (started, and no Wait or Test has reported its "
                             f"completion yet); Wait for it first, then Free")
        plan, self._plan = self._plan, None
        self._args = Args(plan.collective)  # (the caller's buffers are theirs again now, not when this is collected)
        self.run.keep = None
        dispatch.retire(plan)

    @property
    def plan(self) -> Plan:
        """What was fixed at creation: the arguments, the chosen algorithm (``plan.algorithm``), the program."""
        return self._live_plan()

    def __bool__(self) -> bool:
        """True until freed (an inactive persistent request is not a null request)."""
        return self._plan is not None

    def __repr__(self) -> str:
        if self._plan is None:
            return "<mpicomm.Prequest: freed>"
        state = "inactive" if self._delivered else "active"
        return f"<mpicomm.Prequest {self.label}: {state}>"


def create(state: State | Any, args: Args, algorithm: str | None,
           make: Callable[[int], Plan] | None = None) -> Prequest:
    """A :class:`Prequest` for the collective *args* describes on *state*'s communicator (collective; *state*: its
    :class:`~mpicomm.state.State`, or what a freed or unready ``Comm`` holds instead, which raises when read);
    *make*: builds its plan from the request's number (see :func:`~.dispatch.persistent_plan`)."""
    return Prequest(dispatch.persistent_plan(state, args, algorithm, make), args, algorithm, make)
