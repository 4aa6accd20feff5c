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
receives in matching pairs, a hand-off between two stages of one rank in order.

The bubble of a timetable is the idle share of ``p · makespan``; the formulas
(uniform stages, communication free, a step whose ranks start together) are
those of the literature, see :func:`formula` (and :data:`PUBLISHED` for the
papers' own, per iteration); :func:`memory` gives the papers' peak of
micro-batches in flight, which :meth:`Timetable.peak_in_flight` meets.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .schedules import Action, ScheduleError, actions, backward_ops, rank_of

__all__ = ["Slot", "Timetable", "simulate", "validate", "formula", "FORMULAS", "PUBLISHED", "MEMORY", "memory",
           "plan", "DEFAULT_COSTS"]

#: Relative costs: a backward costs two forwards (input and weight gradients), I and W one each.
DEFAULT_COSTS = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}

#: The bubble formulas of a step whose ranks start and end together (F = I = W, B = I + W; uniform stages), as
#: printed next to the measured ones; :data:`PUBLISHED` gives the papers' own figures where they count otherwise.
FORMULAS = {
    "naive": "(p-1)/p",
    "gpipe": "(p-1)/(m+p-1)",
    "1f1b": "(p-1)/(m+p-1)",
    "interleaved": "(p-1)/(v*m+p-1)",
    "looped-bfs": "(p-1)/(v*m+p-1)",
    "zb-h1": "(p-1)/(3m+p-1)",
    "zb-h2": "(p-1)/(3m+p-1)",
    "zb-v": "(p-1)/(6m+p-1)",
    "dualpipev": "(p-1)/(3m+p-1)",
}

#: What the papers give, per rank and iteration (F, B, W: one chunk's forward, whole backward, weight gradient).
#: Zero-bubble's figures count the bubble of iterations that follow each other without a synchronisation
#: (post-validation), so the fill at a step's start overlaps the previous step's drain; in a step whose
#: ranks start together the fill, (p-1) chunk forwards on the last rank, remains (:data:`FORMULAS`).
PUBLISHED = {
    "naive": "(p-1)(F+B) per micro-batch",
    "gpipe": "(p-1)(F+B)",
    "1f1b": "(p-1)(F+B)",
    "interleaved": "(p-1)(F+B)/v",
    "looped-bfs": "(p-1)(F+B)/v",
    "zb-h1": "(p-1)(F+B-W)",
    "zb-h2": "(p-1)(F+B-2W) (0 at F=B=W)",
    "zb-v": "(p-1)(F+B-2W) of chunks (0 at F=B=W)",
    "dualpipev": "(p-1)(F&B+B-3W) of chunks",
}

#: Peak activations on rank 0, in micro-batches of one stage (of one chunk when a rank holds v > 1): the papers'.
MEMORY = {
    "naive": "1",
    "gpipe": "m",
    "1f1b": "p",
    "interleaved": "vp+p-1",
    "looped-bfs": "vm",
    "zb-h1": "p",
    "zb-h2": "2p-1",
    "zb-v": "2p",
    "dualpipev": "2p+1",
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

    def peak_waiting(self, rank: int) -> int:
        """Most micro-batches rank *rank* holds between their I and their W at once (0 without a split backward)."""
        live, peak = 0, 0
        for s in self.slots[rank]:
            if s.action.op == "I":
                live += 1
                peak = max(peak, live)
            elif s.action.op == "W":
                live -= 1
        return peak

    def peak_in_flight(self, rank: int) -> int:
        """Most micro-batches whose activations rank *rank* holds at once (forward done, backward not)."""
        live, peak = 0, 0
        for s in self.slots[rank]:
            if s.action.op == "F":
                live += 1
                peak = max(peak, live)
            elif s.action.op in ("B", "W"):  # the micro-batch's last gradient pass on this stage
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


def validate(rows: list[list[Action]], p: int, m: int, v: int, backward: str = "B", *,
             name: str = "1f1b") -> Timetable:
    """Check the static rules and simulate (no deadlock); return the unit-cost timetable. ScheduleError otherwise.

    *backward*: the backward ops the schedule may use (:func:`apps.pipeline.schedules.backward_ops`): ``"B"``,
    ``"IW"``, or ``"BIW"`` (each micro-batch and stage either B, or I then W); *name* gives the stages' layout.
    """
    if len(rows) != p:
        raise ScheduleError(f"{len(rows)} rows for {p} ranks")
    allowed = ("F", *backward)
    stages = p * v
    for r, row in enumerate(rows):
        seen: dict[tuple[str, int, int], int] = {}
        for i, a in enumerate(row):
            home = rank_of(name, p, a.stage)
            if home != r:
                raise ScheduleError(f"rank {r} runs {a}, but stage {a.stage} lives on rank {home}")
            if not 0 <= a.mb < m:
                raise ScheduleError(f"rank {r}: {a} names micro-batch {a.mb}, outside 0..{m - 1}")
            if a.is_compute:
                if a.op not in allowed:
                    raise ScheduleError(f"rank {r}: {a} is not an op of this schedule (expected {'/'.join(allowed)})")
                key = (a.op, a.mb, a.stage)
                if key in seen:
                    raise ScheduleError(f"rank {r} runs {a} twice (positions {seen[key]} and {i})")
                seen[key] = i
        for s in (s for s in range(stages) if rank_of(name, p, s) == r):
            for mb in range(m):
                where = {op: seen.get((op, mb, s)) for op in "FBIW"}
                whole = where["B"] is not None
                needed = ["F", "B"] if whole or backward == "B" else ["F", "I", "W"]
                if whole and (where["I"] is not None or where["W"] is not None):
                    raise ScheduleError(f"rank {r} runs both {s}B{mb} and the split {s}I{mb}/{s}W{mb}")
                missing = [op for op in needed if where[op] is None]
                if missing:
                    raise ScheduleError(f"rank {r} never runs {', '.join(f'{s}{op}{mb}' for op in missing)}")
                back = where["B"] if whole else where["I"]
                assert where["F"] is not None and back is not None
                if where["F"] > back:
                    raise ScheduleError(f"rank {r} runs the backward of {s}F{mb} before its forward")
                if not whole and back > where["W"]:
                    raise ScheduleError(f"rank {r} runs {s}W{mb} before {s}I{mb}")
                # a hand-off between two stages of this rank is local: the producer must come first
                if s > 0 and rank_of(name, p, s - 1) == r and seen[("F", mb, s - 1)] > where["F"]:
                    raise ScheduleError(f"rank {r} runs {s}F{mb} before {s - 1}F{mb}, whose output it needs")
                if s < stages - 1 and rank_of(name, p, s + 1) == r:
                    later = seen.get(("B", mb, s + 1), seen.get(("I", mb, s + 1)))
                    if later is not None and later > back:
                        raise ScheduleError(f"rank {r} runs the backward of {s}F{mb} before that of stage {s + 1}, "
                                            f"whose input gradient it needs")
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
    validate(rows, p, m, v, backward_ops(name), name=name)
    if v > 1 and costs is None:  # a chunk is 1/v of a rank's layers
        costs = {k: c / v for k, c in DEFAULT_COSTS.items()}
    return simulate(rows, costs, stage_cost=stage_cost)


def formula(name: str, p: int, m: int, v: int = 1) -> float:
    """The bubble fraction of schedule *name* in a step whose ranks start and end together (uniform stages).

    naive (p−1)/p; GPipe and 1F1B (p−1)/(m+p−1); interleaved and looped BFS
    (p−1)/(v·m+p−1) (the fill shrinks by v); ZB-H1 with F = I = W: (p−1)/(3m+p−1),
    about a third of 1F1B's; ZB-H2 the same at F = I = W - its extra memory lets W
    fill the tail whatever I and W cost, which ZB-H1's cannot when I > W; ZB-V
    (p−1)/(6m+p−1): half ZB-H1's, the fill is chunk forwards, half a stage each;
    DualPipeV (p−1)/(3m+p−1): DeepSeek's (p−1)(F&B + B − 3W) per rank with chunk
    costs F = W = ½, B = 1, and F&B = F + B (the pair run back to back). Every
    one of them but naive is the fill of the last rank, (p−1) forwards (of a chunk
    for the chunked schedules), where m is large enough for the steady state (m ≥ p;
    DualPipeV m ≥ 2p); the planned timetable (:func:`plan`) equals them there.
    """
    if min(p, m, v) < 1:
        raise ScheduleError(f"formula needs p, m, v >= 1, got p={p}, m={m}, v={v}")
    if name == "naive":
        return (p - 1) / p
    if name in ("gpipe", "1f1b"):
        return (p - 1) / (m + p - 1)
    if name in ("interleaved", "looped-bfs"):
        return (p - 1) / (v * m + p - 1)
    if name in ("zb-h1", "zb-h2", "dualpipev"):
        return (p - 1) / (3 * m + p - 1)
    if name == "zb-v":
        return (p - 1) / (6 * m + p - 1)
    raise ScheduleError(f"unknown schedule {name!r}")


def memory(name: str, p: int, m: int, v: int = 1) -> int:
    """The papers' peak of micro-batches in flight on rank 0 (of one chunk each when v > 1): :data:`MEMORY`."""
    if min(p, m, v) < 1:
        raise ScheduleError(f"memory needs p, m, v >= 1, got p={p}, m={m}, v={v}")
    peaks = {"naive": 1, "gpipe": m, "1f1b": p, "interleaved": v * p + p - 1, "looped-bfs": v * m, "zb-h1": p,
             "zb-h2": 2 * p - 1, "zb-v": 2 * p, "dualpipev": 2 * p + 1}
    if name not in peaks:
        raise ScheduleError(f"unknown schedule {name!r}")
    return min(peaks[name], v * m)
