"""Pipeline schedules as data: each rank's ordered actions, from pure generators (no MPI, no arrays).

Vocabulary (used in names and docstrings alike): ``p`` ranks in the pipeline, ``m``
micro-batches, ``v`` model chunks per rank (interleaved), so ``p·v`` *stages*;
stage ``s`` lives on rank ``s % p`` as its chunk ``s // p`` (Megatron's layout:
rank 0 holds stages 0, p, 2p...). An :class:`Action` is one step of one rank::

    2F0      forward of micro-batch 0 on stage 2
    2B0      backward (input and weight gradient together)
    2I0      backward for the input only (zero-bubble's B)
    2W0      backward for the weights only (deferred; zero-bubble's W)
    SEND_F 2F0 →3   send stage 2's output for micro-batch 0 to rank 3
    RECV_B 2B0 ←3   receive the gradient of stage 2's output from rank 3

The printed form is PyTorch pipelining's (``"2F0"``). A schedule is built in two
layers: :func:`compute_order` yields a rank's compute actions (what differs between
schedules), :func:`with_comms` puts each receive right before the compute that
needs it and each send right after the compute that produced it (the same for
every schedule). The executor posts receives ahead and never blocks on a send,
so a schedule is deadlock-free exactly when its receive dependencies have no
cycle, which :func:`apps.pipeline.timeline.validate` checks by simulation.

Diagram of 1F1B at p = 4, m = 8 (warm-up, steady state, cool-down)::

    rank 0  F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7
    rank 3           F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 ...

Schedules: ``naive`` (one micro-batch at a time through the whole pipeline: no
overlap), ``gpipe`` (all forwards, then all backwards), ``1f1b`` (PipeDream-flush:
``p − rank − 1`` warm-up forwards, then one forward and one backward in turn),
``interleaved`` (Megatron's interleaved 1F1B with ``v`` chunks per rank; m a
multiple of p), ``zb-h1`` (zero bubble, Qi et al. 2023: backward split into I and
W, W deferred into what would be bubbles, at most p micro-batches in flight per
rank - 1F1B's peak on the first rank).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["Action", "SCHEDULES", "COMPUTE", "compute_order", "with_comms", "actions", "table", "check_shape",
           "ScheduleError", "splits_backward"]

#: The schedules, by ``--schedule`` name.
SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved", "zb-h1")
#: Compute operations: forward, backward, backward for inputs, backward for weights.
COMPUTE = ("F", "B", "I", "W")
_COMMS = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")


class ScheduleError(ValueError):
    """A schedule asked for with parameters it cannot run (the message names them and the fix)."""


@dataclass(frozen=True, order=True)
class Action:
    """One step of one rank: ``op`` on micro-batch ``mb`` of stage ``stage``; ``peer`` is the other rank of a send/receive."""

    op: str
    mb: int
    stage: int
    peer: int = -1

    @property
    def is_compute(self) -> bool:
        return self.op in COMPUTE

    def __str__(self) -> str:
        if self.is_compute:
            return f"{self.stage}{self.op}{self.mb}"
        kind = self.op[-1]
        arrow = "→" if self.op.startswith("SEND") else "←"
        return f"{self.op} {self.stage}{kind}{self.mb} {arrow}{self.peer}"


def splits_backward(name: str) -> bool:
    """Whether schedule *name* splits the backward into I and W (the zero-bubble family)."""
    return name == "zb-h1"


def check_shape(name: str, p: int, m: int, v: int = 1) -> None:
    """ScheduleError unless schedule *name* can run p ranks, m micro-batches, v chunks."""
    if name not in SCHEDULES:
        raise ScheduleError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
    for label, value in (("stages", p), ("micro-batches", m), ("chunks", v)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ScheduleError(f"{label} must be an integer >= 1, got {value!r}")
    if name == "interleaved":
        if m % p:
            raise ScheduleError(f"interleaved 1F1B needs the micro-batches ({m}) to be a multiple of the stages ({p}); "
                                f"use --micro {max(p, m - m % p)} or {m + p - m % p}")
    elif v != 1:
        raise ScheduleError(f"--chunks {v} applies to the interleaved schedule only; drop it or use --schedule interleaved")


def _one_f_one_b(forwards: list[tuple[int, int]], backwards: list[tuple[int, int]], warmup: int,
                 bop: str = "B") -> Iterator[Action]:
    """Warm-up forwards, then one forward and one backward in turn, then the remaining backwards."""
    warmup = min(warmup, len(forwards))
    for mb, stage in forwards[:warmup]:
        yield Action("F", mb, stage)
    steady = len(forwards) - warmup
    for i in range(steady):
        mb, stage = forwards[warmup + i]
        yield Action("F", mb, stage)
        mb, stage = backwards[i]
        yield Action(bop, mb, stage)
    for mb, stage in backwards[steady:]:
        yield Action(bop, mb, stage)


def _interleaved_item(k: int, p: int, v: int, forward: bool) -> tuple[int, int]:
    """(micro-batch, chunk) of a rank's k-th forward (or backward) in Megatron's interleaved order.

    Micro-batches go in groups of p: the group's p forwards on chunk 0, then the
    same p on chunk 1..., then the next group; backwards visit the chunks from the last.
    """
    group, within = divmod(k, p * v)
    chunk = within // p
    if not forward:
        chunk = v - 1 - chunk
    return group * p + within % p, chunk


def _zero_bubble(p: int, m: int) -> list[list[Action]]:
    """ZB-H1 for every rank: 1F1B's order of F and I, with each W placed where the rank would wait.

    Built by one simulation with F = I = W = 1 time unit (the paper's assumption, and
    true of a Linear layer: x·W, dy·Wᵀ and xᵀ·dy cost the same): at each unit a rank
    runs its next F or I if its input has arrived, unless that F would put more
    than p micro-batches in flight (forward done, W not yet), in which case it runs
    its oldest pending W; when the next F or I is not ready it also runs a pending W
    rather than idle. The order, not the times, is the schedule.
    """
    base = [list(_one_f_one_b([(mb, r) for mb in range(m)], [(mb, r) for mb in range(m)], p - r - 1, "I"))
            for r in range(p)]
    done: dict[tuple[str, int, int], int] = {}  # (op, mb, stage) -> finish time
    order: list[list[Action]] = [[] for _ in range(p)]
    ptr = [0] * p
    pending: list[list[int]] = [[] for _ in range(p)]  # micro-batches whose I is done, W not
    inflight = [0] * p
    t = 0
    while any(ptr[r] < len(base[r]) or pending[r] for r in range(p)):
        finished = []
        for r in range(p):
            choice = None
            if ptr[r] < len(base[r]):
                nxt = base[r][ptr[r]]
                if nxt.op == "F":
                    ready = r == 0 or done.get(("F", nxt.mb, r - 1), t + 1) <= t
                    allowed = inflight[r] < p
                else:
                    ready = r == p - 1 or done.get(("I", nxt.mb, r + 1), t + 1) <= t
                    allowed = True
                if ready and allowed:
                    choice = nxt
                    ptr[r] += 1
            if choice is None and pending[r]:
                choice = Action("W", pending[r].pop(0), r)
            if choice is None:
                continue
            order[r].append(choice)
            if choice.op == "F":
                inflight[r] += 1
            elif choice.op == "I":
                pending[r].append(choice.mb)
            else:
                inflight[r] -= 1
            finished.append(((choice.op, choice.mb, r), t + 1))
        done.update(finished)
        t += 1
        if t > 10 * (3 * m + p) + 10:  # cannot happen for a valid (p, m); a guard, not a timeout
            raise ScheduleError(f"zb-h1 construction did not finish for p={p}, m={m}")
    return order


def compute_order(name: str, p: int, m: int, v: int = 1, rank: int = 0) -> Iterator[Action]:
    """Yield rank *rank*'s compute actions (F, B or I/W) for schedule *name*, in execution order."""
    check_shape(name, p, m, v)
    if not 0 <= rank < p:
        raise ScheduleError(f"rank {rank} is not in a pipeline of {p} ranks; use 0..{p - 1}")
    stages = [c * p + rank for c in range(v)]
    if name == "naive":
        for mb in range(m):
            for s in stages:
                yield Action("F", mb, s)
            for s in reversed(stages):
                yield Action("B", mb, s)
    elif name == "gpipe":
        for mb in range(m):
            yield Action("F", mb, rank)
        for mb in range(m):
            yield Action("B", mb, rank)
    elif name == "1f1b":
        items = [(mb, rank) for mb in range(m)]
        yield from _one_f_one_b(items, items, p - rank - 1)
    elif name == "interleaved":
        forwards = [_interleaved_item(k, p, v, True) for k in range(m * v)]
        backwards = [_interleaved_item(k, p, v, False) for k in range(m * v)]
        warmup = 2 * (p - rank - 1) + (v - 1) * p
        yield from _one_f_one_b([(mb, c * p + rank) for mb, c in forwards],
                                [(mb, c * p + rank) for mb, c in backwards], warmup)
    else:  # zb-h1
        yield from _zero_bubble(p, m)[rank]


def with_comms(compute: Iterator[Action], p: int, v: int = 1) -> Iterator[Action]:
    """Add the sends and receives around a rank's compute actions.

    Before a forward of stage s > 0: receive its input from the rank of stage s−1;
    after it, unless s is the last stage, send the output to the rank of s+1.
    Before a backward (B or I) of a stage below the last: receive the output's
    gradient from the rank of s+1; after it, for s > 0, send the input's gradient
    to the rank of s−1. W needs and sends nothing.
    """
    last = p * v - 1
    for a in compute:
        if a.op == "F" and a.stage > 0:
            yield Action("RECV_F", a.mb, a.stage, (a.stage - 1) % p)
        elif a.op in ("B", "I") and a.stage < last:
            yield Action("RECV_B", a.mb, a.stage, (a.stage + 1) % p)
        yield a
        if a.op == "F" and a.stage < last:
            yield Action("SEND_F", a.mb, a.stage, (a.stage + 1) % p)
        elif a.op in ("B", "I") and a.stage > 0:
            yield Action("SEND_B", a.mb, a.stage, (a.stage - 1) % p)


def actions(name: str, p: int, m: int, v: int = 1, rank: int = 0) -> Iterator[Action]:
    """Rank *rank*'s whole schedule: compute actions with their sends and receives."""
    yield from with_comms(compute_order(name, p, m, v, rank), p, v)


def table(name: str, p: int, m: int, v: int = 1, *, comms: bool = False) -> list[list[str]]:
    """Every rank's schedule as printed strings (``"0F1"``...): the form the literal-table tests compare."""
    rows = []
    for r in range(p):
        gen = actions(name, p, m, v, r) if comms else compute_order(name, p, m, v, r)
        rows.append([str(a) for a in gen])
    return rows
