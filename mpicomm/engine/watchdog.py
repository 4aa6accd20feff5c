"""The hang watchdog (``MPICOMM_TIMEOUT=seconds``): a wait that lasts too long names what it waits for, then
aborts the job.

While it is on, blocking waits poll instead of sleeping in MPI; once a wait
has lasted the timeout, the rank writes which operation it is stuck in (for a
collective: its name, sequence number and algorithm, count, element type, op
and root), which step, and which peers never sent what it waits for or never
took what it sent; for a collective, a roll call (:meth:`Watchdog.roll_call`)
adds which ranks are in the same call, which are in another one and which
never arrived, and every reporting rank's flight recorder (its last few calls
on that communicator). Then it aborts the whole job, so a mismatched program
fails in seconds instead of eating its allocation.

What it reads of a stuck operation is duck-typed, so this module needs
nothing above the executor: a :class:`~mpicomm.engine.executor.Run` (a
collective: ``program.state``, ``seq``, ``details``, the step in flight and
its ``peers``), a request with a ``run`` (a nonblocking collective), a
generator request (``_label``, ``_step``, ``_reqs``), or a tuple ``(label,
step index, requests)``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from mpi4py import MPI

from .. import config

if TYPE_CHECKING:
    from ..state import State

__all__ = ["Watchdog", "recorder", "describe"]


class Watchdog:
    """See the module docstring; :meth:`start` returns None when ``MPICOMM_TIMEOUT`` is unset."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self.clock = time.monotonic
        self.sleep = time.sleep
        self.started = self.clock()
        self.naps = 0

    @classmethod
    def start(cls) -> Watchdog | None:
        try:
            timeout = config.timeout()
        except ValueError:  # refused on every rank where settings are checked (making a Comm); no watchdog here
            return None
        return None if timeout is None else cls(timeout)

    def pause(self, stuck: Sequence[Any]) -> None:
        """Nap briefly (the caller polls again), or report *stuck* and abort once time is up."""
        if self.clock() - self.started > self.timeout:
            self.abort(stuck)
        self.naps += 1
        self.sleep(0 if self.naps < 100 else 0.001)

    def abort(self, stuck: Sequence[Any]) -> None:
        world = MPI.COMM_WORLD.Get_rank()
        lines = [f"mpicomm watchdog: rank {world} of MPI_COMM_WORLD waited more than {self.timeout:g} s "
                 f"(MPICOMM_TIMEOUT) and aborts the job."]
        for item in stuck:
            lines.append("  " + describe(item))
        lines.extend(self.roll_call(stuck))
        os.write(sys.stderr.fileno(), ("\n".join(lines) + "\n").encode())
        self.sleep(0.5)  # let the other stuck ranks write their own reports
        from ..cleanup import remove_own_segments

        remove_own_segments()  # MPI_Abort skips MPI_Finalize, which would have removed them from /dev/shm
        MPI.COMM_WORLD.Abort(3)

    def roll_call(self, stuck: Sequence[Any]) -> list[str]:
        """Report lines: for each communicator a stuck collective runs on, who else is stuck where.

        Every stuck rank sends the others (on the communicator's private
        duplicate, with a tag no collective uses) the call it waits in and its
        flight recorder, then listens for theirs for a grace period (between 2
        and 10 s). A rank in the same call *arrived*; one that reports another
        call is out of step; one that never reports is not waiting in mpicomm
        with the watchdog on (it never called, is busy elsewhere, or has
        finished).
        """
        calls: list[Any] = []
        for item in stuck:
            call = _call_of(item)
            state = _state_of(call)
            if state is not None and hasattr(state, "watch_tag") and all(_state_of(c) is not state for c in calls):
                calls.append(call)
        lines: list[str] = []
        grace = min(10.0, max(2.0, self.timeout / 2))
        for call in calls:
            try:
                lines.extend(self._roll_call_one(call, grace))
            except Exception as exc:  # noqa: BLE001 - the report must still be written, and the job aborted
                lines.append(f"  (roll call on {call} failed: {type(exc).__name__}: {exc})")
        return lines

    def _roll_call_one(self, call: Any, grace: float) -> list[str]:
        state = _state_of(call)
        comm, tag = state.library_comm, state.watch_tag
        rank, p = comm.Get_rank(), comm.Get_size()
        collective = _collective_of(call)
        mine = (call.seq, collective, _details(call), recorder(state))
        sent = [comm.isend(mine, r, tag) for r in range(p) if r != rank]
        heard: dict[int, tuple] = {}
        status = MPI.Status()
        deadline = self.clock() + grace
        while len(heard) < p - 1 and self.clock() < deadline:
            if comm.iprobe(MPI.ANY_SOURCE, tag, status):
                source = status.Get_source()
                heard[source] = comm.recv(source=source, tag=tag)
            else:
                self.sleep(0.01)
        del sent  # (never waited: the job aborts)
        same = sorted([rank] + [r for r, (seq, coll, _, _) in heard.items() if (seq, coll) == (call.seq, collective)])
        elsewhere = {r: text for r, (seq, coll, text, _) in heard.items() if (seq, coll) != (call.seq, collective)}
        silent = [r for r in range(p) if r != rank and r not in heard]
        lines = [f"  roll call on this communicator ({p} ranks; its own rank numbers): in {call}: "
                 f"rank(s) {_ranks(same)}"]
        for r, text in sorted(elsewhere.items()):
            lines.append(f"  rank {r} is stuck in another call: {text}")
        if silent:
            lines.append(f"  never arrived: rank(s) {_ranks(silent)} (no report within {grace:g} s: not waiting in "
                         f"a collective on this communicator with MPICOMM_TIMEOUT set - it never called this "
                         f"collective, waits elsewhere, or has finished)")
        lines.append(f"  flight recorder, rank {rank} (last calls on this communicator, oldest first): "
                     + ("; ".join(mine[3]) or "none"))
        for r in sorted(heard):
            lines.append(f"  flight recorder, rank {r}: " + ("; ".join(heard[r][3]) or "none"))
        return lines


def recorder(state: State) -> list[str]:
    """The flight recorder of a communicator's state: one line per recent collective call, oldest first."""
    return [f"{_details(c)} [{getattr(c, 'status', '?')}]" for c in list(getattr(state, "recent", ()))]


def _ranks(ranks: Sequence[int]) -> str:
    return ", ".join(map(str, ranks[:16])) + (", …" if len(ranks) > 16 else "")


def _call_of(item: Any) -> Any:
    """The collective run (or label object) behind a stuck item."""
    run = getattr(item, "run", None)
    if run is not None:
        return run
    if hasattr(item, "program"):
        return item
    label = getattr(item, "_label", None)
    if label is not None:
        return label
    return item[0] if isinstance(item, tuple) else item


def _state_of(call: Any) -> Any:
    program = getattr(call, "program", None)
    if program is not None:
        return program.state
    return getattr(call, "state", None)


def _collective_of(call: Any) -> str:
    program = getattr(call, "program", None)
    if program is not None:
        return getattr(program.label, "collective", str(program.label))
    return getattr(call, "collective", str(call))


def _details(label: Any) -> str:
    """The label with what the call moves, where the label says (a run's or a call's ``details``)."""
    details = getattr(label, "details", None)
    return details if isinstance(details, str) else str(label)


def describe(item: Any) -> str:
    """What a stuck operation is and which of its peers it waits for."""
    run = getattr(item, "run", None) or (item if hasattr(item, "program") else None)
    if run is not None:
        return _describe_run(run)
    if isinstance(item, tuple):
        label, step, reqs = _details(item[0]), item[1], item[2]
    else:
        label, step, reqs = _details(item._label), item._step, item._reqs
    peers = getattr(reqs, "peers", [])
    if any(kind == "all" for kind, _ in peers) and any(bool(r) for r in reqs):
        return (f"stuck in {label}, step {step + 1}: waiting for every rank to enter it "
                f"(the argument agreement): some rank has not called this collective (the roll call below "
                f"says which)")
    if any(kind == "library" for kind, _ in peers) and any(bool(r) for r in reqs):
        return (f"stuck in {label}, step {step + 1}: in the MPI library's own collective (a buffer spec "
                f"mpicomm hands on); some rank has not called this collective")
    return _pending(label, step, reqs, peers)


def _pending(label: str, step: int, reqs: Sequence[Any], peers: Sequence[tuple[str, int]]) -> str:
    pending = [bool(r) and not r.Get_status() for r in reqs]  # Get_status: done yet, without freeing it
    missing_from = sorted({peer for (kind, peer), wait in zip(peers, pending) if kind == "recv" and wait})
    untaken_by = sorted({peer for (kind, peer), wait in zip(peers, pending) if kind == "send" and wait})
    parts = [f"stuck in {label}, step {step + 1}"]
    if missing_from:
        parts.append("never arrived from rank(s) " + ", ".join(map(str, missing_from)))
    if untaken_by:
        parts.append("not yet taken by rank(s) " + ", ".join(map(str, untaken_by)))
    if not peers:
        parts.append(f"{sum(1 for r in reqs if r and not r.Get_status())} MPI request(s) pending")
    return ": ".join(parts[:1]) + (": " + "; ".join(parts[1:]) if parts[1:] else "")


def _describe_run(run: Any) -> str:
    label = _details(run)
    if not run.started:
        return f"stuck in {label}: queued behind earlier collectives on its communicator that have not completed"
    if run.a >= 0 and run.program.agree:
        step = run.program.agree[run.a]
        peers = [("recv", step.peer)] * sum(1 for _ in step.reqs[:1]) + [("send", step.peer)]
        text = _pending(label, run.a, step.reqs, peers[: len(step.reqs)])
        return (text + " - in the argument agreement (every rank checks it was given the same call): some rank "
                "has not called this collective")
    if run.k < 0:
        return (f"stuck in {label}: waiting for every rank to agree on the call before it starts (some rank has "
                f"not called this collective: the roll call below says which)")
    steps = run.program.steps
    if run.k >= len(steps):
        return f"stuck in {label}: finished its messages, waiting for the agreement"
    step = steps[run.k]
    if run.k <= run.program.verdict_at:  # the ranks' digests travel in this step's messages
        return (_pending(label, run.k, list(run.reqs or ()), list(getattr(step, "peers", ()) or ()))
                + " - these messages carry the argument agreement too: some rank has not called this collective")
    if step.syncs:
        return (f"stuck in {label}, step {run.k + 1}: waiting in shared memory for the ranks of its node "
                f"({step.text or 'counters'})")
    if run.children:
        inner = [c for c in run.children if not c.done]
        if inner:
            return f"stuck in {label}, step {run.k + 1}, inside: " + _describe_run(inner[0])
    return _pending(label, run.k, list(run.reqs or ()), list(getattr(step, "peers", ()) or ()))
