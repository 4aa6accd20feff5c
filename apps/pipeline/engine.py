"""The executor: one rank follows its row of a schedule, with nonblocking point-to-point between stages.

A plan object (:class:`Executor`): the rank's actions, its stages, the shapes of
every message and the tags are fixed once; each training step then runs
:meth:`Executor.step`:

* ``RECV_F``/``RECV_B`` are posted ahead (``irecv_array`` into a buffer of the
  known shape) as soon as the rank is within ``lookahead`` compute actions of
  the one that needs them, and waited for right before it;
* ``SEND_F``/``SEND_B`` start an ``isend_array`` and never block; they are
  completed when the step ends. So a rank only ever waits for data, and
  :func:`apps.pipeline.timeline.validate` proves no two ranks wait for each other;
* every message has its own tag ``(kind, stage, micro-batch)`` on the pipeline
  communicator, so the order in which neighbours post them does not matter;
* where the next stage (or, backward, the previous one) is on this rank too -
  the bottom of a V (ZB-V, DualPipeV), or every stage at S = 1 - the output
  is handed over in memory, with no message;
* an overlapped F&B pair (DualPipeV) runs its two halves back to back: its
  receives are waited for before the forward, its sends start after the backward;
* with tensor parallelism (T > 1) a message is this tensor rank's block of the
  activation or gradient, and the stage all-gathers the blocks when it has
  received its own (:class:`apps.pipeline.tensor.ScatterGather`): the bytes
  sent between stages are counted per step (``StepRecord.sent_bytes``);
* with offloaded activations, before each compute action the stage of the next
  backward (B or I) in the row starts fetching that micro-batch's activations
  (:meth:`apps.pipeline.stage.Stage.prefetch`), so the fetch overlaps the
  computation in between instead of waiting at the backward's start.

Waiting sleeps instead of spinning: a rank that waits polls its request with
``Test`` and sleeps between polls (20 µs, then 40, then 50 µs), so with
more ranks than cores an idle stage gives its core to a computing one. (A
blocking wait inside MPI does not: MPICH's progress engine polls in
``MPI_Waitany``, at full speed unless ``MPIR_CVAR_CH4_PROGRESS_THROTTLE`` asks it
to nap.) Every compute action and every wait is
recorded as an :class:`Event` (start and end on this rank's clock, measured from
the step's start), and goes to ``MPICOMM_TRACE`` when tracing is on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mpicomm import trace

from .schedules import Action
from .stage import Stage
from .tensor import ScatterGather

__all__ = ["Executor", "Event", "StepRecord", "wait_sleeping"]


@dataclass(frozen=True)
class Event:
    """A compute action (``op`` F/B/I/W) or a wait (``op`` "wait") of this rank, in seconds from the step's start."""

    op: str
    mb: int
    stage: int
    start: float
    end: float


@dataclass
class StepRecord:
    """What one step of one rank did: its events, its loss terms (last stage), its activation memory peaks."""

    events: list[Event] = field(default_factory=list)
    loss_sum: float = 0.0  # Σ over this rank's last-stage micro-batches of (mean loss × rows)
    correct: int = 0
    peak_bytes: int = 0
    peak_micro: int = 0
    elapsed: float = 0.0
    sent_bytes: int = 0  # bytes this rank sent to other stages (activations and gradients)
    gathered_bytes: int = 0  # bytes it received from its tensor group completing them (T > 1)

    @property
    def busy(self) -> float:
        return sum(e.end - e.start for e in self.events if e.op != "wait")


def wait_sleeping(request: Any) -> Any:
    """Wait for an mpicomm request without busy-polling: Test, sleep, back off (see the module docstring)."""
    delay = 2e-5
    while True:
        done, value = request.test()
        if done:
            return value
        time.sleep(delay)
        delay = min(delay * 2, 5e-5)


class Executor:
    """Run this rank's schedule row on its stages (see the module docstring)."""

    def __init__(self, comm: Any, row: list[Action], stages: dict[int, Stage], last_stage: int,
                 shapes: Callable[[str, int, int], tuple[int, ...]], dtype: Any, *,
                 lookahead: int = 2, hooks: dict[int, Callable[[int], None]] | None = None,
                 on_last_backward: Callable[[int], None] | None = None, link: ScatterGather | None = None,
                 xp: Any = np) -> None:
        if lookahead < 0:
            raise ValueError(f"lookahead {lookahead}: must be >= 0 (compute actions ahead of which receives are posted)")
        meters = {id(st.meter) for st in stages.values()}
        if len(meters) > 1:
            raise ValueError("a rank's stages must share one Meter (pass meter= to each Stage)")
        self.comm = comm
        self.row = list(row)
        self.stages = stages
        self.meter = next(iter(stages.values())).meter
        self.last_stage = last_stage
        self.shapes = shapes  # (kind "F"/"B", stage, mb) -> shape of the array that arrives
        self.dtype = np.dtype(dtype)
        self.link = link  # tensor parallelism: send a block, all-gather on arrival
        self.xp = xp  # the array module of the messages' buffers
        self.lookahead = lookahead
        self.hooks = hooks or {}
        self.on_last_backward = on_last_backward
        self.micro = 1 + max((a.mb for a in self.row), default=0)
        self.stage_count = last_stage + 1
        # The final gradient pass of each stage: its last B or W: the moment its gradients are complete.
        final = {}
        for i, a in enumerate(self.row):
            if a.op in ("B", "W"):
                final[a.stage] = i
        self._final = set(final.values())
        # Before compute action i: the (stage, mb) of the next backward (B or I) after it, to prefetch.
        self._ahead: dict[int, tuple[int, int]] = {}
        upcoming = None
        for i in range(len(self.row) - 1, -1, -1):
            a = self.row[i]
            if a.is_compute:
                if upcoming is not None:
                    self._ahead[i] = upcoming
                if a.op in ("B", "I"):
                    upcoming = (a.stage, a.mb)
        # Receives to post before each position (lookahead over compute actions).
        self._post_at: list[list[int]] = [[] for _ in self.row]
        computes = [i for i, a in enumerate(self.row) if a.is_compute]
        order = {i: k for k, i in enumerate(computes)}
        next_compute = len(computes)
        for i in range(len(self.row) - 1, -1, -1):
            if self.row[i].is_compute:
                next_compute = order[i]
            if self.row[i].op.startswith("RECV"):
                post_before = computes[max(0, next_compute - lookahead)] if computes else 0
                self._post_at[min(post_before, i)].append(i)

    def _tag(self, kind: str, stage: int, mb: int) -> int:
        return ((0 if kind == "F" else 1) * self.stage_count + stage) * self.micro + mb

    def step(self, inputs: Callable[[int], Any], loss: Callable[[int, Any], tuple[float, int, Any]],
             key: Callable[[int], tuple[int, ...]]) -> StepRecord:
        """Run the row once. *inputs(mb)*: the first stage's input; *loss(mb, logits)* → (loss×rows, correct, dlogits)."""
        rec = StepRecord()
        self.meter.reset()
        posted: dict[int, Any] = {}
        sends: list[Any] = []
        outputs: dict[tuple[int, int], Any] = {}  # (stage, mb) -> activation to send, or input gradient
        grads: dict[tuple[int, int], Any] = {}  # (stage, mb) -> gradient of the stage's output
        arrived: dict[tuple[str, int, int], Any] = {}
        t0 = time.perf_counter()
        tracing = trace.ON

        def note(op: str, mb: int, stage: int, start: float, end: float) -> None:
            rec.events.append(Event(op, mb, stage, start - t0, end - t0))
            if tracing:
                name = f"{stage}{op}{mb}" if op != "wait" else f"wait {stage}/{mb}"
                trace.record(name, "pipeline", start, end, stage=stage, mb=mb)

        for i, a in enumerate(self.row):
            for j in self._post_at[i]:
                r = self.row[j]
                kind = r.op[-1]
                shape = self.shapes(kind, r.stage, r.mb)
                if self.link is not None:
                    lo, hi = self.link.part(int(np.prod(shape)))
                    shape = (hi - lo,)
                buf = self.xp.empty(shape, self.dtype)
                posted[j] = self.comm.irecv_array(buf, r.peer, self._tag(kind, r.stage, r.mb))
            op = a.op
            if op.startswith("RECV"):
                kind = op[-1]
                request = posted.pop(i)
                start = time.perf_counter()
                if not request.Test():
                    got = wait_sleeping(request)
                    note("wait", a.mb, a.stage, start, time.perf_counter())
                else:
                    got = request.wait()
                if self.link is not None:  # this rank's block: the tensor group completes it
                    own = got.nbytes
                    got = self.link.gather(got, self.shapes(kind, a.stage, a.mb))
                    rec.gathered_bytes += got.nbytes - own
                arrived[(kind, a.stage, a.mb)] = got
                continue
            if op.startswith("SEND"):
                kind = op[-1]
                data = outputs.pop((a.stage, a.mb))
                if self.link is not None:
                    data = self.link.scatter(data)
                rec.sent_bytes += data.nbytes
                source_stage = a.stage + 1 if kind == "F" else a.stage - 1
                sends.append(self.comm.isend_array(data, a.peer, self._tag(kind, source_stage, a.mb)))
                continue
            stage = self.stages[a.stage]
            hook = self.hooks.get(a.stage) if i in self._final else None
            if i in self._ahead:
                ahead_stage, ahead_mb = self._ahead[i]
                self.stages[ahead_stage].prefetch(ahead_mb)
            start = time.perf_counter()
            if op == "F":
                x = inputs(a.mb) if a.stage == 0 else arrived.pop(("F", a.stage, a.mb))
                y = stage.forward(a.mb, x, key(a.mb))
                if a.stage == self.last_stage:
                    loss_sum, correct, dy = loss(a.mb, y)
                    rec.loss_sum += loss_sum
                    rec.correct += correct
                    grads[(a.stage, a.mb)] = dy
                elif a.stage + 1 in self.stages:  # the next stage is here: a local hand-off
                    arrived[("F", a.stage + 1, a.mb)] = y
                else:
                    outputs[(a.stage, a.mb)] = y
            elif op in ("B", "I"):
                dy = grads.pop((a.stage, a.mb)) if a.stage == self.last_stage else arrived.pop(("B", a.stage, a.mb))
                dx = stage.backward(a.mb, dy, hook) if op == "B" else stage.backward_input(a.mb, dy)
                if a.stage - 1 in self.stages:
                    arrived[("B", a.stage - 1, a.mb)] = dx
                elif a.stage > 0:
                    outputs[(a.stage, a.mb)] = dx
            else:  # W
                stage.backward_weight(a.mb, hook)
            end = time.perf_counter()
            note(op, a.mb, a.stage, start, end)
            if sends:
                sends = [s for s in sends if not s.Test()]
            if i in self._final and self.on_last_backward is not None:
                self.on_last_backward(a.stage)
        for s in sends:
            wait_sleeping(s)
        rec.peak_bytes, rec.peak_micro = self.meter.peak_bytes, self.meter.peak_micro
        rec.elapsed = time.perf_counter() - t0
        return rec
