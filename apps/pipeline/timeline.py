"""Run schedules on paper: the validator, the planned timetable, and the bubble formulas (pure, no MPI).

:func:`simulate` plays every rank's action list at once, as the executor will:
a send never blocks (the executor's sends are nonblocking and waited at the end
of the step), a receive blocks until the matching send has happened, a compute
action takes its cost. If at some moment no rank can move while some have
actions left, the schedule would hang, and :class:`ScheduleError` names each
waiting rank and what it waits for - the check that catches the crossed
sends/receives of interleaved schedules and the m < p cases where real systems
have hung. :func:`validate` adds the static rules: each micro-batch exactly once
per stage and op, every forward before its backward, I before W, sends and
receives in matching pairs.

The bubble of a timetable is the idle share of ``p · makespan``; the formulas
(uniform stages, communication free) are those of the literature, see
:func:`formula`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .schedules import Action, ScheduleError, actions, splits_backward

__all__ = ["Slot", "Timetable", "simulate", "validate", "formula", "FORMULAS", "plan", "DEFAULT_COSTS"]

#: Relative costs: a backward costs two forwards (input and weight gradients), I and W one each.
DEFAULT_COSTS = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}

#: The bubble formulas, as printed next to the measured ones.
FORMULAS = {
    "naive": "(p-1)/p",
    "gpipe": "(p-1)/(m+p-1)",
    "1f1b": "(p-1)/(m+p-1)",
    "interleaved": "(p-1)/(v*m+p-1)",
    "zb-h1": "(p-1)/(3m+p-1)",
}


@dataclass(frozen=True)
class Slot:
    """One compute action of one rank placed in time."""

    rank: int
    action: Action
    start: float
    end: float


@dataclass
class Timetable:
    """What :func:`simulate` returns: the slots per rank and the step's makespan."""

    p: int
    slots: list[list[Slot]]
    makespan: float

    def busy(self, rank: int) -> float:
        return sum(s.end - s.start for s in self.slots[rank])

    def bubble(self, rank: int | None = None) -> float:
        """Idle share of the makespan: of one rank, or over all ranks (None)."""
        if self.makespan <= 0:
            return 0.0
        if rank is not None:
            return 1.0 - self.busy(rank) / self.makespan
        return 1.0 - sum(self.busy(r) for r in range(self.p)) / (self.p * self.makespan)

    def peak_in_flight(self, rank: int) -> int:
        """Most micro-batches whose activations rank *rank* holds at once (forward done, backward not)."""
        live, peak = 0, 0
        release = "W" if any(s.action.op == "W" for s in self.slots[rank]) else "B"
        for s in self.slots[rank]:
            if s.action.op == "F":
                live += 1
                peak = max(peak, live)
            elif s.action.op == release:
                live -= 1
        return peak


def simulate(rows: list[list[Action]], costs: dict[str, float] | None = None, *,
             stage_cost: list[float] | None = None, latency: float = 0.0) -> Timetable:
    """Play every rank's actions; ScheduleError naming the stuck ranks if the schedule would deadlock.

    *costs* per op (default :data:`DEFAULT_COSTS`), scaled per stage by
    *stage_cost* (default 1 each); a message arrives *latency* after its send.
    """
    costs = {**DEFAULT_COSTS, **(costs or {})}
    p = len(rows)
    ptr = [0] * p
    clock = [0.0] * p
    sent: dict[tuple[str, int, int], float] = {}  # (kind, mb, producing stage) -> arrival time
    slots: list[list[Slot]] = [[] for _ in range(p)]
    remaining = sum(len(r) for r in rows)
    while remaining:
        moved = False
        for r in range(p):
            while ptr[r] < len(rows[r]):
                a = rows[r][ptr[r]]
                if a.op == "RECV_F":
                    key = ("F", a.mb, a.stage - 1)
                elif a.op == "RECV_B":
                    key = ("B", a.mb, a.stage + 1)
                else:
                    key = None
                if key is not None:
                    if key not in sent:
                        break
                    clock[r] = max(clock[r], sent[key])
                elif a.op == "SEND_F":
                    sent[("F", a.mb, a.stage)] = clock[r] + latency
                elif a.op == "SEND_B":
                    sent[("B", a.mb, a.stage)] = clock[r] + latency
                else:
                    scale = 1.0 if stage_cost is None else stage_cost[a.stage]
                    start = clock[r]
                    clock[r] = start + costs[a.op] * scale
                    slots[r].append(Slot(r, a, start, clock[r]))
                ptr[r] += 1
                remaining -= 1
                moved = True
        if not moved:
            stuck = "; ".join(f"rank {r} waits at {rows[r][ptr[r]]}" for r in range(p) if ptr[r] < len(rows[r]))
            raise ScheduleError(f"the schedule deadlocks: {stuck}")
    makespan = max(clock) if clock else 0.0
    return Timetable(p, slots, makespan)


def validate(rows: list[list[Action]], p: int, m: int, v: int, split: bool) -> Timetable:
    """Check the static rules and simulate (no deadlock); return the unit-cost timetable. ScheduleError otherwise."""
    if len(rows) != p:
        raise ScheduleError(f"{len(rows)} rows for {p} ranks")
    needed = ("F", "I", "W") if split else ("F", "B")
    stages = p * v
    for r, row in enumerate(rows):
        seen: dict[tuple[str, int, int], int] = {}
        for i, a in enumerate(row):
            if a.stage % p != r:
                raise ScheduleError(f"rank {r} runs {a}, but stage {a.stage} lives on rank {a.stage % p}")
            if not 0 <= a.mb < m:
                raise ScheduleError(f"rank {r}: {a} names micro-batch {a.mb}, outside 0..{m - 1}")
            if a.is_compute:
                if a.op not in needed:
                    raise ScheduleError(f"rank {r}: {a} is not an op of this schedule (expected {'/'.join(needed)})")
                key = (a.op, a.mb, a.stage)
                if key in seen:
                    raise ScheduleError(f"rank {r} runs {a} twice (positions {seen[key]} and {i})")
                seen[key] = i
        for s in range(r, stages, p):
            for mb in range(m):
                where = {op: seen.get((op, mb, s)) for op in needed}
                missing = [op for op, at in where.items() if at is None]
                if missing:
                    raise ScheduleError(f"rank {r} never runs {', '.join(f'{s}{op}{mb}' for op in missing)}")
                back = where["I"] if split else where["B"]
                if where["F"] > back:
                    raise ScheduleError(f"rank {r} runs the backward of {s}F{mb} before its forward")
                if split and where["I"] > where["W"]:
                    raise ScheduleError(f"rank {r} runs {s}W{mb} before {s}I{mb}")
    sends = Counter((a.op[-1], a.mb, a.stage + (1 if a.op == "SEND_F" else -1), r, a.peer)
                    for r, row in enumerate(rows) for a in row if a.op.startswith("SEND"))
    recvs = Counter((a.op[-1], a.mb, a.stage, a.peer, r)
                    for r, row in enumerate(rows) for a in row if a.op.startswith("RECV"))
    if sends != recvs:
        extra = (sends - recvs) + (recvs - sends)
        first = next(iter(extra))
        raise ScheduleError(f"sends and receives do not pair up ({sum(extra.values())} unmatched), "
                            f"e.g. {first[0]} of micro-batch {first[1]} for stage {first[2]} from rank {first[3]} "
                            f"to rank {first[4]}")
    return simulate(rows)


def plan(name: str, p: int, m: int, v: int = 1, costs: dict[str, float] | None = None,
         stage_cost: list[float] | None = None) -> Timetable:
    """The validated timetable of schedule *name* (costs per op; F=1, B=2 by default)."""
    rows = [list(actions(name, p, m, v, r)) for r in range(p)]
    validate(rows, p, m, v, splits_backward(name))
    if v > 1 and costs is None:  # a chunk is 1/v of a rank's layers
        costs = {k: c / v for k, c in DEFAULT_COSTS.items()}
    return simulate(rows, costs, stage_cost=stage_cost)


def formula(name: str, p: int, m: int, v: int = 1) -> float:
    """The bubble fraction the literature gives for schedule *name* (idle share of the step; uniform stages).

    naive (p−1)/p; GPipe and 1F1B (p−1)/(m+p−1); interleaved (p−1)/(v·m+p−1) (the
    bubble relative to ideal time shrinks by v); ZB-H1 with F = B = W:
    (p−1)/(3m+p−1), about a third of 1F1B's.
    """
    if min(p, m, v) < 1:
        raise ScheduleError(f"formula needs p, m, v >= 1, got p={p}, m={m}, v={v}")
    if name == "naive":
        return (p - 1) / p
    if name in ("gpipe", "1f1b"):
        return (p - 1) / (m + p - 1)
    if name == "interleaved":
        return (p - 1) / (v * m + p - 1)
    if name == "zb-h1":
        return (p - 1) / (3 * m + p - 1)
    raise ScheduleError(f"unknown schedule {name!r}")
