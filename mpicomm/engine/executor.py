"""The executor: one loop that runs every compiled collective, blocking, nonblocking and persistent alike.

A plan (:mod:`mpicomm.plan`) compiles an algorithm's schedule, once, into a
:class:`Program`: a list of :class:`Step` s, each

* ``pre`` - callables run when the step is posted (staging a small message
  into its header buffer, shared-memory bookkeeping);
* ``reqs`` - prepared persistent point-to-point requests (``Send_init`` /
  ``Recv_init`` on the communicator's private duplicate), started together
  with one ``Startall``; or ``post``, a callable that posts fresh requests
  (device buffers staged through host memory) and returns what to run once
  they complete;
* ``syncs`` - conditions on counters in node-shared memory;
* ``nested`` - whole collectives on other communicators (a hierarchical
  algorithm's levels), started as child runs;
* ``ops`` - local work once all of the above completed (reductions, copies).

A :class:`Run` is one execution of a program. :meth:`Run.poll` advances it as
far as it can without blocking: when step k's requests have completed, it
posts step k + 1 *before* running step k's ops if the plan found that they
do not touch the same memory (``Step.early``), so reductions overlap the next
transfer. :func:`complete` drives a run to its end on the calling thread,
polling briefly, then sleeping in ``MPI_Waitall`` on what it waits for (which releases the GIL).

The agreement (validation) travels with the run: either inside the data
messages themselves (a *fused* program: each of the first steps carries the
ranks' digest words in front of its data, ``Program.verdict_at`` says after
which step all of them are known), or as its own short butterfly of 40-byte
messages (``Program.agree``) that advances independently of the data steps,
so a rank whose peers run a different schedule still learns of it and never
waits for a message that will not come. ``Program.check`` judges the
combined words; on a mismatch it abandons the run's requests and raises the
same :class:`ArgumentError` on every rank. A *gated* program (shared-memory
and composite algorithms, which set up shared state collectively) posts its
first data step only after the ranks agreed.

This module knows nothing of algorithms, arguments or selection: only of
requests, counters, callables and the order to run them in.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from mpi4py import MPI

from . import lane as _lane

if TYPE_CHECKING:
    from ..state import State

__all__ = ["Step", "AgreeStep", "Program", "Run", "complete", "nap", "graveyard", "bury", "prune", "Ledger", "SPINS",
           "in_callback"]

_Testall = MPI.Request.Testall
_Startall = MPI.Prequest.Startall
_Waitall = MPI.Request.Waitall
_TRUNCATE = (MPI.ERR_TRUNCATE, MPI.ERR_IN_STATUS)

#: Polls of a blocking wait before it sleeps in MPI_Waitall (a short message usually lands within them).
SPINS = 64


def ranks_on_node(ranks: int) -> None:
    """Told, as each communicator is made, how many of its ranks share this node: with more ranks than this
    process may use cores, a wait polls once and then sleeps in MPI (:data:`SPINS` becomes 0), since a
    spinning rank holds the core the peer it waits for needs (8-byte allreduce, 4 ranks on 2 cores: 39
    against 68 µs with 64 polls)."""
    global SPINS
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    if ranks > cores:
        SPINS = 0

#: Requests abandoned by runs that failed (sends no peer received yet): kept until they complete (:func:`prune`),
#: never waited on.
graveyard: list[Any] = []
_graves = threading.Lock()

#: What a run's messages did, per ``(peer, tag)``: ``[sent, received]`` (see :meth:`Run.abandon`).
Ledger = dict[tuple[int, int], list[int]]


def bury(request: Any) -> None:
    """Keep an abandoned send in the :data:`graveyard` (with its buffer: mpi4py's request holds it)."""
    with _graves:
        graveyard.append(request)


def prune() -> int:
    """Drop the graveyard's requests that completed (their messages were received after all, as a
    disagreement's drain receives them); returns how many are left."""
    with _graves:
        graveyard[:] = [r for r in graveyard if _in_flight(r)]
        return len(graveyard)


def _in_flight(r: Any) -> bool:
    try:
        return bool(r) and not r.Test()
    except MPI.Exception:
        return False  # completed, with an error: a buried receive that matched a longer message (truncated)


def _tally(ledger: Ledger, tag: int, peers: Sequence[tuple[str, int]], done: Sequence[bool] | None = None) -> None:
    """Count messages into *ledger*: each ``(kind, peer)`` of a step on *tag* (*done*: per message, whether a
    receive matched; every send counts)."""
    if tag < 0:
        return
    for i, (kind, peer) in enumerate(peers):
        if peer < 0 or kind not in ("send", "recv"):
            continue
        entry = ledger.get((peer, tag))
        if entry is None:
            entry = ledger[(peer, tag)] = [0, 0]
        if kind == "send":
            entry[0] += 1
        elif done is None or done[i]:
            entry[1] += 1


def _settled(r: Any, receive: bool) -> bool:
    """Give up request *r* of an abandoned run; True when its message counts (:func:`_tally`). A send (or the
    library's collective) still in flight is buried, never cancelled (see :meth:`Run.abandon`); a receive
    still posted is cancelled, and counts only if it matched a message before the cancel took (a truncated one
    counts too)."""
    try:
        if not r or r.Test():
            return True
    except MPI.Exception:
        return True  # (completed, with an error: a truncated receive)
    if not receive:
        bury(r)
        return True
    status = MPI.Status()
    try:
        r.Cancel()
        for _ in range(1000):
            if r.Test(status):
                return not status.Is_cancelled()
            os.sched_yield()
    except MPI.Exception:
        return True
    bury(r)  # (matched, its data still arriving)
    return True


def _merge(into: Ledger, other: Ledger) -> None:
    for key, (sent, got) in other.items():
        entry = into.get(key)
        if entry is None:
            into[key] = [sent, got]
        else:
            entry[0] += sent
            entry[1] += got

_here = threading.local()


def in_callback() -> bool:
    """Whether this thread is running a finished run's completion callbacks (which may start collectives)."""
    return getattr(_here, "depth", 0) > 0


def _call_back(run: Run) -> None:
    callbacks = run.callbacks
    if not callbacks:
        return
    _here.depth = getattr(_here, "depth", 0) + 1
    try:
        for fn in callbacks:
            fn(run)
    finally:
        _here.depth -= 1


class Step:
    """One compiled round (see the module docstring)."""

    __slots__ = ("reqs", "post", "pre", "ops", "words", "syncs", "nested", "early", "text", "peers", "waits", "tag")

    def __init__(self, text: str = ""):
        self.reqs: list[MPI.Prequest] | None = None
        self.post: Callable[[], tuple[list[MPI.Request], list[Callable[[], None]]]] | None = None
        self.pre: tuple[Callable[[Run], None], ...] = ()
        self.ops: tuple[Callable[[Run], None], ...] = ()
        self.words: tuple[Callable[[Run], None], ...] = ()  # the agreement's part of a fused step: always run
        self.syncs: tuple[Callable[[Run], bool], ...] = ()
        self.nested: tuple[Callable[[Run], Run], ...] = ()
        self.early = False
        self.text = text
        self.peers: tuple[tuple[str, int], ...] = ()  # ("recv"|"send", rank) per request, for the watchdog
        self.tag = -1  # the tag of its messages on the communicator's private duplicate (-1: not a collective's)
        self.waits = False  # syncs or nested (set by finish())

    def finish(self) -> Step:
        """Freeze what the executor checks on every poll (call once the step is filled in)."""
        self.waits = bool(self.syncs or self.nested)
        return self

    def __repr__(self) -> str:
        return f"<Step {self.text}>"


class AgreeStep:
    """One round of the independent agreement: its persistent requests (the receive first, when it has one),
    then combine the words."""

    __slots__ = ("reqs", "combine", "peer", "receives", "tag", "peers")

    def __init__(self, reqs: list[MPI.Prequest], combine: Callable[[Run], None], peer: int, receives: bool = True,
                 tag: int = -1):
        self.reqs = reqs
        self.combine = combine
        self.peer = peer
        self.receives = receives  # its first request is a receive
        self.tag = tag
        self.peers = (("recv", peer),) * receives + (("send", peer),) * (len(reqs) - receives)  # (as Step's)


class Program:
    """A compiled plan for one rank (see the module docstring)."""

    __slots__ = ("steps", "agree", "verdict_at", "gated", "check", "on_start", "label", "state", "base", "buffers",
                 "epoch", "renew", "runs", "lane")

    def __init__(self, steps: list[Step], label: Any = "collective", state: State | None = None):
        self.steps = steps
        self.agree: list[AgreeStep] | None = None  # the independent agreement's rounds
        self.verdict_at = -1  # fused: the step after whose words the verdict is known (-1: not fused)
        self.gated = False  # post the first data step only once the ranks agreed
        # judge the agreement: raises on a mismatch; may return another program to run instead (the library's)
        self.check: Callable[[Run], Program | None] | None = None
        self.on_start: Callable[[Run], None] | None = None
        self.label = label  # an object whose str() names the call (built only when shown)
        self.state = state  # the communicator's state (the watchdog's roll call, counters)
        self.base: Callable[[Run], int] | None = None  # shared-memory counters: reserve the run's base value
        self.buffers: list[Any] = []  # the bound arrays (send, recv, scratch…), for local steps that need them
        self.epoch = 0  # the communicator's epoch (its tags) this program was compiled for
        self.renew: Callable[[], Program] | None = None  # the same program for the communicator's current tags
        self.runs = 0  # runs made of it
        self.lane: Any = None  # its data steps as records, run in C (mpicomm.engine.lane), or None

    @property
    def validated(self) -> bool:
        return self.check is not None


class Run:
    """One execution of a :class:`Program` (see the module docstring)."""

    __slots__ = ("program", "k", "reqs", "afters", "children", "a", "agreed", "broken", "done", "error", "started",
                 "base", "seq", "callbacks", "status", "result", "keep", "lane", "on_end", "at", "past", "ledger",
                 "__weakref__")

    def __init__(self, program: Program, seq: int = -1):
        self.program = program
        program.runs += 1
        self.k = -1  # the data step in flight (-1: not started, or gated until the ranks agree)
        self.reqs: Sequence[Any] = ()  # the MPI requests of step k
        self.at = -1  # the step whose requests reqs are (-1: none posted, or every step's finished)
        self.past: list[Run] | None = None  # nested runs of steps that finished (their messages count: abandon)
        self.ledger: Ledger | None = None  # what its messages did, once abandoned (:meth:`abandon`)
        self.afters: list[Callable[[], None]] | None = None  # what step k's fresh requests need once complete
        self.children: list[Run] | None = None
        self.a = -1  # the agreement round in flight (-1: none, or finished)
        self.agreed = program.check is None
        self.broken: bool | Exception = False  # a message arrived with another size than posted (the ranks
        # disagree), or what went wrong before the verdict (:meth:`_set_aside`)
        self.done = False
        self.error: BaseException | None = None
        self.started = False
        self.base = 0  # shared-memory schedules: the counter value this run counts up from
        self.seq = seq
        self.callbacks: list[Callable[[Run], None]] | None = None
        self.status = "entered"  # the flight recorder's: entered, done or failed
        self.result: Any = None
        self.keep: Any = None  # what must stay alive until the run ends (a nonblocking call's arrays)
        self.lane = program.lane  # the compiled lane runs its data steps (None: this loop does, from here on)
        #: called as ``on_end(run, ok)`` by the thread that ends the run, before anyone can see it done (a staged
        #: nonblocking call copies its result out and frees its plan: see mpicomm.front.dispatch)
        self.on_end: Callable[[Run, bool], None] | None = None

    def __str__(self) -> str:
        label = self.program.label
        name = getattr(label, "name", None)
        return name(self.seq) if callable(name) else str(label)

    @property
    def details(self) -> str:
        """What the run is and what it moves (``allreduce #12 (ring): 1000 × float64, op sum``)."""
        label = self.program.label
        details = getattr(label, "details", None)
        return details(self.seq) if callable(details) else str(self)

    @property
    def state(self) -> Any:
        return self.program.state

    @property
    def collective(self) -> str:
        return getattr(self.program.label, "collective", str(self.program.label))

    # ------------------------------------------------------------ start

    def start(self) -> None:
        """Post the first messages (the agreement's, and the first data step unless gated); a failure here
        fails the run (see :attr:`error`)."""
        self.started = True
        try:
            self._start()
        except BaseException as exc:
            self._fail(exc)

    def launch(self, block: bool = False) -> bool:
        """:meth:`start` then :meth:`poll` (*block*), in one call into the compiled lane where the run has one
        and nothing needs Python at its start; True once the run has finished (or failed)."""
        program = self.program
        lane = self.lane
        state = program.state
        if lane is None or (state is not None and program.epoch != state.epoch and program.renew is not None):
            self.start()
            return self.done or self.poll(block)
        self.started = True
        try:
            if program.on_start is not None:
                program.on_start(self)
            if program.check is not None and program.verdict_at < 0 and not program.agree and self._judge():
                return self.done or self._poll(block)  # (one rank, judged now: handed another program, started)
            self.k = self.at = 0
            done = self._advance(lane, SPINS if block else 1, block, start=True)
            return done if done is not None else self._poll(block)
        except Exception as exc:  # noqa: BLE001 - as in poll
            return self._failed(exc)
        except BaseException as exc:
            self._fail(exc)
            return True

    def _start(self) -> None:
        program = self.program
        state = program.state
        if state is not None and program.epoch != state.epoch and program.renew is not None:
            # a call before this one failed on a disagreement after this one was queued: its tags changed
            program = self.program = program.renew()
            self.lane = program.lane
        if program.on_start is not None:
            program.on_start(self)
        if program.base is not None:
            self.base = program.base(self)
        agree = program.agree
        if agree:
            self.a = 0
            lane = self.lane
            if lane is None:
                _Startall(agree[0].reqs)
            else:
                rc = lane.agree()
                if rc:
                    raise MPI.Exception(rc)
        elif program.check is not None and program.verdict_at < 0 and self._judge():  # nobody to exchange with
            return  # (judged now: the run was handed another program, which _judge started)
        if not program.gated or self.agreed:
            if program.steps:
                self._post(0)
            else:
                self.k = 0

    def _post(self, k: int) -> None:
        step = self.program.steps[k]
        self.k = self.at = k
        lane = self.lane
        if lane is not None:
            rc = lane.post(k)
            self.reqs = step.reqs or ()
            if rc:
                raise MPI.Exception(rc)
            return
        for fn in step.pre:
            fn(self)
        if step.reqs is not None:
            self.reqs = step.reqs
            _Startall(step.reqs)
        elif step.post is not None:
            self.reqs, self.afters = step.post()
        else:
            self.reqs = ()
        if step.nested:
            self.children = [make(self) for make in step.nested]

    # ------------------------------------------------------------ progress

    def poll(self, block: bool = False) -> bool:
        """Advance as far as possible without blocking; True once the run has finished (or failed). *block*: a
        run whose data steps are in the compiled lane waits there, without the GIL, until it ends (or the lane
        hands it back: see :meth:`_advance`)."""
        if self.done:
            return True
        try:
            return self._poll(block)
        except Exception as exc:  # noqa: BLE001 - failed here, or set aside until the verdict
            return self._failed(exc)
        except BaseException as exc:
            self._fail(exc)
            return True

    def _failed(self, exc: Exception) -> bool:
        """*exc* happened while advancing: fail the run (True), or set it aside until the verdict (False)."""
        if self.a >= 0 and not self.agreed:
            # the agreement is still out: a peer may run another call, whose messages this rank just read
            # as its own (a count header, a block); the verdict decides, alike on every rank
            self._set_aside(exc)
            return False
        self._fail(exc)
        return True

    def _set_aside(self, exc: Exception) -> None:
        """Stop the data steps after *exc* and wait for the agreement's verdict; if every rank agreed after
        all, *exc* is this run's error (see the end of :meth:`_poll`)."""
        self.broken = exc  # (truthy: the run's data is lost)
        children = self.children or []
        for child in children:
            if not child.done:
                child.abandon()
        self.past = children if self.past is None else self.past + children
        self.children, self.afters = None, None
        self.k = len(self.program.steps)  # (its requests stay, so that the verdict's abandon cancels them)

    def _poll(self, block: bool = False) -> bool:
        lane = self.lane
        if lane is not None and self.k >= 0 and not self.broken:
            done = self._advance(lane, SPINS if block else 1, block)
            if done is not None:
                return done
        if self.a >= 0:
            self._poll_agreement()  # (may hand the run another program: read it after)
        program = self.program
        steps = program.steps
        n = len(steps)
        k = self.k
        while 0 <= k < n:
            step = steps[k]
            reqs = self.reqs
            if reqs and not _Testall_or_truncated(reqs, self):
                if not self.broken or program.verdict_at >= 0:
                    return False
                self.k = n  # the data is lost and the rest may never come: wait for the verdict (below), whose
                break  # abandon cancels the receives still posted
            if step.waits and not self._waited(step):
                return False
            if self.afters is not None:
                for after in self.afters:
                    after()
                self.afters = None
            k += 1
            early = step.early and k < n and not self.broken
            if early:
                self._post(k)
            for fn in step.words:
                fn(self)
            if k - 1 == program.verdict_at and self._judge():
                return self._poll()  # the run now runs another program (the library's collective)
            if not self.broken:
                for fn in step.ops:
                    fn(self)
            elif program.verdict_at < 0:
                k = n  # the data is lost: wait for the agreement's verdict, which names the problem
            if k == n:
                self.k = n
                if not self.broken:
                    self.reqs, self.at = (), -1
                break
            if not early:
                self._post(k)
        if self.k == -1:  # gated: waiting for the agreement
            if not self.agreed:
                return False
            if not steps:
                self.k = 0
            else:
                self._post(0)
                return self._poll()
        if self.a >= 0 or not self.agreed:
            return False
        if isinstance(self.broken, Exception):
            raise self.broken
        if self.broken:  # every rank runs this call, so a message it did not send matched: name the channel
            state = self.program.state
            tags = f", tag {' or '.join(map(str, state.tags(self.program.epoch)))} for this call" if state is not None else ""
            raise RuntimeError(f"{self}: a message longer than this rank posted for it arrived on mpicomm's private "
                               f"communicator (comm.library_comm{tags}), although every rank agreed on the call: a "
                               f"message this call did not send matched its receive. A program's own sends on "
                               f"comm.library_comm with a collective's tag (below {getattr(state, 'tag_modulus', '?')}) "
                               f"do that: send on the communicator itself (or a Dup of it), or on comm.library_comm "
                               f"only with tags from comm.collective_tag(). If nothing else sends there, this is a "
                               f"bug in mpicomm: please report it")
        self._finish()
        return True

    def _advance(self, lane: Any, spins: int, block: bool, start: bool = False) -> bool | None:
        """Run the data steps from step k in the compiled lane (:mod:`.lane`): True when the run finished there,
        False when a step's requests are still in flight (not *block*), None when the lane handed the run back
        to this loop (at step k; for the rest of the run): the agreement's words differ from this rank's, a
        message was longer than posted (the run is broken), or MPI failed (raised here). *start*: start the run
        first (the agreement's first round and the first data step)."""
        r = lane.start(spins, block) if start else lane.advance(self.k, spins, block)
        if r == -1:  # (the common answer, decoded here: a Python call costs what the lane's 8-byte round costs)
            self.ended_in_lane()
            return True
        return self._decoded(lane, r)

    def napping(self) -> bool:
        """Whether the progress thread may wait for this run inside its compiled lane (:func:`nap`)."""
        return self.lane is not None and self.started and not self.done and self.k >= 0 and not self.broken

    def _decoded(self, lane: Any, r: int) -> bool | None:
        """What a lane call's answer *r* means for this run (see :meth:`_advance`)."""
        steps = self.program.steps
        self.a = lane.a
        if r >= 0:
            self.k = r
            self.reqs = steps[r].reqs or () if r < len(steps) else ()
            self.at = r if r < len(steps) else -1
            return False
        if r == -1:
            self.ended_in_lane()
            return True
        e, k = (-r - 2) & 3, (-r - 2) >> 2
        self.lane = None
        self.k = k
        self.reqs = steps[k].reqs or () if k < len(steps) else ()
        self.at = k if k < len(steps) else -1
        if e == _lane.TRUNCATED:
            self.broken = True
            program = self.program
            if self.a < 0 and (program.agree is not None or k > program.verdict_at >= 0):
                self.agreed = True  # the lane completed the agreement, every word equal: the verdict is in
        elif e == _lane.ERROR:
            raise MPI.Exception(lane.last_rc)
        return None

    def ended_in_lane(self) -> None:
        """The lane ran the last step, and every word the agreement received equalled this rank's own: the ranks
        agree, the run is done (its completion callbacks run now)."""
        self.a = -1
        self.k = len(self.program.steps)
        self.reqs, self.at = (), -1
        self.agreed = True
        self._finish()

    def _waited(self, step: Step) -> bool:
        """Whether the step's counter waits and nested runs are done (raises a nested run's error)."""
        for ready in step.syncs:
            if not ready(self):
                return False
        children = self.children
        if children is not None:
            for child in children:
                if not child.done and not child.poll():
                    return False
            failed = next((c.error for c in children if c.error is not None), None)
            self.children = None
            self.past = children if self.past is None else self.past + children
            if failed is not None:
                raise failed
        return True

    def _poll_agreement(self) -> None:
        agree = self.program.agree
        while self.a >= 0:
            step = agree[self.a]  # type: ignore[index]
            if not _Testall_or_truncated(step.reqs, self):  # (truncated: a fused peer's message, another call)
                return
            step.combine(self)
            self.a += 1
            if self.a == len(agree):  # type: ignore[arg-type]
                self.a = -1
                self._judge()
                return
            _Startall(agree[self.a].reqs)  # type: ignore[index]

    def _judge(self) -> bool:
        """The agreement is complete: let the program judge it (it raises on a disagreement). True when it
        handed this run another program instead - every rank agreed to let the MPI library run the call -
        which is then started."""
        replacement = self.program.check(self)  # type: ignore[misc]
        self.agreed = True
        if replacement is None:
            return False
        self.program = replacement
        self.lane = replacement.lane
        self.reqs, self.afters, self.children, self.a, self.broken = (), None, None, -1, False
        self.k = self.at = -1
        self.agreed = replacement.check is None
        if replacement.steps:
            self._post(0)
        else:
            self.k = 0
        return True

    # ------------------------------------------------------------ ends

    def _finish(self) -> None:
        end, self.on_end = self.on_end, None
        if end is not None:
            end(self, True)
        self.keep = None
        self.done = True
        self.status = "done"
        if self.callbacks:
            _call_back(self)

    def _fail(self, exc: BaseException) -> None:
        self.abandon()
        end, self.on_end = self.on_end, None
        if end is not None:
            end(self, False)
        self.keep = None
        self.error = exc
        self.done = True
        self.status = "failed"
        if self.callbacks:
            _call_back(self)

    def abandon(self) -> Ledger:
        """Give up this run's requests in flight: cancel the receives; keep unfinished sends (and the library's
        collectives) in the graveyard. Never cancel a send: MPICH 5.0.2 crashes cancelling a large (rendezvous)
        send whose receiver already completed with a truncation error - a peer that ran another call - and MPI-4
        deprecates it.

        Returns what its messages and its nested runs' did up to here (kept as :attr:`ledger`): per ``(peer,
        tag)``, how many it sent and how many of its receives matched. A disagreement's exchange
        (:func:`mpicomm.plan.agreement.settle`) gives every rank every ledger, so each receives exactly the
        messages sent to it that nothing matched, and no abandoned message stays in MPI's queue. Once is enough:
        a run abandoned again (a failed agreement's check abandons it, then the run fails) returns that ledger."""
        if self.ledger is not None:
            return self.ledger
        program = self.program
        steps, agree = program.steps, program.agree
        at = self.at
        whole = at if at >= 0 else len(steps) if self.k >= len(steps) else 0  # the steps that finished
        rounds = (self.a if self.a >= 0 else len(agree)) if agree and self.started else 0  # (-1 once finished)
        ledger = self._counted(whole, rounds)
        live: list[tuple[int, Sequence[tuple[str, int]], Sequence[Any]]] = []
        if self.reqs and 0 <= at < len(steps):
            live.append((steps[at].tag, steps[at].peers, self.reqs))
        if agree and self.a >= 0:
            live.append((agree[rounds].tag, agree[rounds].peers, agree[rounds].reqs))
        self.a = -1
        for child in self.children or ():
            mine = child.traffic() if child.done else child.abandon()
            if child.program.state is program.state:  # (a level's communicator has tags of its own)
                _merge(ledger, mine)
        self.children, self.past = None, None
        self.reqs, self.at = (), -1
        if self.afters is not None:
            self.afters = None
        for tag, peers, reqs in live:
            matched = [_settled(r, i < len(peers) and peers[i][0] == "recv") for i, r in enumerate(reqs)]
            _tally(ledger, tag, peers, matched)
        self.ledger = ledger
        return ledger

    def traffic(self) -> Ledger:
        """What this run's messages did (:meth:`abandon`): its ledger once abandoned; else, for a run that
        finished, every message of its program and of its nested runs."""
        if self.ledger is not None:
            return self.ledger
        return self._counted(len(self.program.steps), len(self.program.agree or ()))

    def _counted(self, steps: int, rounds: int) -> Ledger:
        """The messages of its first *steps* data steps and *rounds* agreement rounds (all finished), and of its
        nested runs of finished steps on the same communicator (a level's communicator has tags of its own)."""
        ledger: Ledger = {}
        program = self.program
        for step in program.steps[:steps]:
            _tally(ledger, step.tag, step.peers)
        for round_ in (program.agree or ())[:rounds]:
            _tally(ledger, round_.tag, round_.peers)
        for child in self.past or ():
            if child.program.state is program.state:
                _merge(ledger, child.traffic())
        return ledger

    def live(self) -> list[Any]:
        """The MPI requests this run waits on now (for a sleeping wait)."""
        out = [r for r in self.reqs if r] if self.reqs else []
        if self.a >= 0:
            out += [r for r in self.program.agree[self.a].reqs if r]  # type: ignore[index]
        return out

    def sleep(self) -> None:
        """Block in MPI until the part of this run that waits can advance: the agreement's round in flight
        (it always completes: every rank in a collective on this communicator takes part, whatever it runs),
        else the data step's requests. ``MPI_Waitall``, not ``Waitany``: with more ranks than cores, MPICH
        yields the core in ``Waitall`` but spins in ``Waitany``/``Waitsome`` (measured at 4 ranks on 2
        cores: 21 against 270-300 µs per 8-byte recursive-doubling allreduce; native 14 µs)."""
        reqs = self.program.agree[self.a].reqs if self.a >= 0 else self.reqs  # type: ignore[index]
        if not reqs:
            os.sched_yield()
            return
        try:
            _Waitall(reqs)
        except MPI.Exception as exc:
            if exc.Get_error_class() in _TRUNCATE:
                self.broken = True  # (completed, so the next poll's Testall no longer reports it)
            else:
                self._fail(exc)

    def sleep_in_child(self) -> bool:
        """Where the step in flight waits on one nested run only (no shared counters: a reproducible sum's
        steps, a composite's) and this run's own agreement is not in flight, block in that run's own wait
        instead of backing off: in its compiled lane, or in MPI on its requests (the GIL released either way).
        False, without waiting, where the step waits on anything else.

        Not while the agreement is in flight: its next round is started here, in Python, and a peer may sleep
        on it (a Bruck alltoallv's rounds built at run time, 5 ranks on nodes of 2 + 2 + 1, hung so: one rank
        asleep in the nested run's receive, its peers asleep on the agreement round it had not started)."""
        children = self.children
        steps = self.program.steps
        if (children is None or len(children) != 1 or self.a >= 0 or not 0 <= self.k < len(steps)
                or steps[self.k].syncs):
            return False
        child = children[0]
        if child.done or child.waits_on_memory():
            return False
        if child.lane is not None and child.k >= 0 and not child.broken:
            child.poll(True)
        else:
            child.sleep()
        return True

    def waits_on_memory(self) -> bool:
        """Whether the step in flight waits on shared counters or nested runs (not only on MPI requests)."""
        steps = self.program.steps
        if 0 <= self.k < len(steps):
            step = steps[self.k]
            return bool(step.syncs) or self.children is not None
        return False

    def raise_error(self) -> None:
        if self.error is not None:
            raise self.error


def nap(runs: Sequence[Run], waiters: Sequence[int], seconds: float, gap: float) -> bool:
    """Poll *runs* (each the head of its queue, whose lock the caller holds; each :meth:`Run.napping`) in their
    compiled lanes without the GIL, for up to *seconds* (the progress thread's wait): until one moves, or another
    thread waits for one of the queues (the int64 at that queue's address in *waiters* is non-zero); polls at most
    *gap* seconds apart. True if a run moved (or finished)."""
    i, r = _lane.nap([(run.lane, run.k, w) for run, w in zip(runs, waiters)], seconds, gap)
    if i < 0:
        return False
    run = runs[i]
    before = (run.k, run.a)
    try:
        if run._decoded(run.lane, r) is None:
            run._poll()
    except Exception as exc:  # noqa: BLE001 - as in Run.poll
        run._failed(exc)
    except BaseException as exc:
        run._fail(exc)
    return run.done or (run.k, run.a) != before


def _Testall_or_truncated(reqs: Sequence[Any], run: Run) -> bool:
    """``MPI_Testall``, where a message longer than its receive (a peer that runs another call) completes that
    receive and marks *run* broken. A truncation raises once per request - over a network, one at a time - so
    every one is taken before the answer is given."""
    for _ in range(len(reqs) + 1):
        try:
            return _Testall(reqs)
        except MPI.Exception as exc:
            if exc.Get_error_class() not in _TRUNCATE:
                raise
            run.broken = True
    return _Testall(reqs)


def complete(run: Run, watchdog: Any = None) -> None:
    """Drive *run* to its end on this thread: poll, and between polls sleep in MPI (:meth:`Run.sleep`) or back off.

    *watchdog*: a :class:`mpicomm.engine.watchdog.Watchdog` (``MPICOMM_TIMEOUT``)
    that aborts the job when the wait lasts too long; then the wait polls
    instead of sleeping in MPI.
    """
    poll = run.poll
    if run.lane is not None and watchdog is None and poll(True):
        return
    for _ in range(SPINS):
        if poll():
            return
    nap = 0.0
    started = time.perf_counter()
    while not poll():
        if watchdog is not None:
            watchdog.pause([run])
            continue
        if run.waits_on_memory():
            if run.sleep_in_child():
                continue
            waited = time.perf_counter() - started
            if waited < 2e-4:
                continue
            if waited < 2e-3:
                os.sched_yield()
                continue
            nap = min(2 * nap if nap else 2e-5, 1e-3)
            time.sleep(nap)
            continue
        run.sleep()
