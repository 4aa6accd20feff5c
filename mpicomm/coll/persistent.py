"""Persistent collectives (MPI-4's ``MPI_Allreduce_init`` & co.): plan once, start many times.

``comm.Allreduce_init(sendbuf, recvbuf, op)`` returns a :class:`Prequest`
bound to those buffers; each ``Start()`` runs the collective on whatever the
buffers hold then, and ``Wait()``/``Test()`` complete it, as many times as
wanted; ``Free()`` releases it. As in MPI, every rank creates its persistent
collectives in the same order (creation is collective), starts them in the
same order, and a request is not started again before it completed.

What is done once, when the request is made (:class:`Plan`):

* the arguments are read (mpi4py's buffer specs), checked, and the ranks
  agree on them (the same agreement as a blocking call: one 32-byte
  allreduce; any problem raises the same :class:`~.args.ArgumentError` on
  every rank, at creation);
* the algorithm is chosen (as for a nonblocking call: ``algorithm=``, the
  communicator's default, ``MPICOMM_<COLLECTIVE>_ALGORITHM``, the decision
  data or model, the table);
* the scratch arrays the algorithm allocates are kept after the first run
  and reused by every later one (:meth:`~.call.Call.empty`).

What a ``Start`` does: take the communicator's next sequence number and tag
(so concurrent requests never match each other's messages) and run the
algorithm's steps; no argument is read or checked again, no collective is
added. Buffer specs that only the MPI library runs (derived datatypes) are
handed to the library's nonblocking collective at each start (MPICH 5.0's
``MPI_Testall`` fails on its own persistent collective requests, and the
progress engine tests requests together).
"""

from __future__ import annotations

from typing import Callable, Sequence

from mpi4py import MPI

from .. import config
from .. import trace as _trace
from ..requests import Request, Step, Steps, run
from ..state import State
from .agreement import agreement
from .args import Args
from .dispatch import _bind, _call, _choose, _traced

__all__ = ["Plan", "Prequest", "create"]


class Plan:
    """One collective bound to its arguments on one communicator: read, agreed and chosen once.

    :meth:`steps` makes the steps of one run. Made by :func:`create`
    (collective over the communicator).
    """

    __slots__ = ("state", "args", "algorithm", "source", "library", "scratch", "runs")

    def __init__(self, state: State, args: Args, algorithm: str | None):
        self.state = state
        self.args = args
        self.runs = 0
        self.scratch: list = []
        chosen = None
        source = "?"
        try:
            chosen, source = _choose(state, args, algorithm, blocking=False)
        except ValueError as exc:
            args.fail(exc)
        self.algorithm, self.source = chosen, source
        call = _call(state, args, chosen, source)  # the creation is a collective call of its own (its agreement)
        call.blocking = False
        call.algorithm = chosen.name if chosen is not None else str(algorithm)
        if config.validate() and args.collective != "barrier":
            self.library = bool(run(agreement(call, args), label=call))
        else:
            if args.problem is not None:
                raise args.problem
            self.library = args.unsupported is not None
        if self.library:
            if args.native is None:
                raise TypeError(f"{args.collective}: {args.unsupported}, and this call has no MPI library form")
        elif chosen is None:
            raise args.problem or ValueError(f"{args.collective}: no algorithm selected")

    @property
    def label(self) -> str:
        name = "library" if self.library else self.algorithm.name  # type: ignore[union-attr]
        return f"persistent {self.args.collective} ({name}, {self.runs} runs)"

    def __str__(self) -> str:  # a request's label: built only when shown
        return self.label

    def steps(self) -> Steps:
        """The steps of one run (takes the communicator's next sequence number and tag)."""
        self.runs += 1
        began = _trace.now() if _trace.ON else 0.0
        if self.library:
            return _library(self.args.native)  # type: ignore[arg-type]
        call = _call(self.state, self.args, self.algorithm, self.source)
        call.blocking = False
        call.scratch = self.scratch
        steps = _bind(call, self.args, self.algorithm)  # type: ignore[arg-type]
        if _trace.ON:
            steps = _traced(call, self.args, steps, began)
        return steps

    def release(self) -> None:
        """Let go of the scratch."""
        self.scratch = []


def _library(start: Callable[[], MPI.Request]) -> Steps:
    yield Step([start()], peers=[("library", -1)])


class Prequest(Request):
    """A persistent collective request: ``Start``, ``Wait``/``Test`` (or ``Request.Waitall``...), ``Free``.

    Inactive until started, and again once a wait or test has reported its
    completion; ``Start`` on an active request, or any use after ``Free``,
    raises ValueError naming the request.
    """

    __slots__ = ("_plan",)

    def __init__(self, plan: Plan):
        self._plan: Plan | None = plan
        Request.__init__(self, _inactive(), plan)
        self._delivered = True  # inactive: a wait returns at once, Waitany skips it

    def _live_plan(self) -> Plan:
        plan = self._plan
        if plan is None:
            raise ValueError(f"{self.label}: this persistent request was freed; make a new one with *_init")
        return plan

    def Start(self) -> None:
        """Start one run of the collective on the buffers' current contents (every rank, in the same order)."""
        plan = self._live_plan()
        if not self._done:
            raise ValueError(f"{self.label}: started again before it completed; Wait (or Test until done) first")
        Request.__init__(self, plan.steps(), plan)

    @staticmethod
    def Startall(requests: Sequence["Prequest"]) -> None:
        """Start every request in *requests*, in order."""
        for r in requests:
            if not isinstance(r, Prequest):
                raise TypeError(f"Startall takes mpicomm persistent requests (from *_init), got {type(r).__qualname__}")
            r.Start()

    def Free(self) -> None:
        """Release the request (it must not be active: wait for it first)."""
        if self._plan is None:
            return
        if not self._done:
            raise ValueError(f"{self.label}: freed while active; Wait for it first")
        plan, self._plan = self._plan, None
        plan.release()

    @property
    def plan(self) -> Plan:
        """What was fixed at creation: the arguments, the chosen algorithm (``plan.algorithm.name``), the scratch."""
        return self._live_plan()

    def __bool__(self) -> bool:
        """True until freed (an inactive persistent request is not a null request)."""
        return self._plan is not None

    def __repr__(self) -> str:
        if self._plan is None:
            return "<mpicomm.Prequest: freed>"
        state = "inactive" if self._done else "active"
        return f"<mpicomm.Prequest {self._plan.label}: {state}>"


def _inactive() -> Steps:
    return None
    yield  # a generator that finishes at once


def create(state: State, args: Args, algorithm: str | None) -> Prequest:
    """A :class:`Prequest` for the collective *args* describes on *state*'s communicator (collective)."""
    return Prequest(Plan(state, args, algorithm))

