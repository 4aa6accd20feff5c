"""Pipeline schedules as data: each rank's ordered actions, from pure generators (no MPI, no arrays).

Vocabulary (used in names and docstrings alike): ``p`` ranks in the pipeline, ``m``
micro-batches, ``v`` model chunks per rank, so ``p·v`` *stages*. Two layouts
(:func:`rank_of`): the *loop* (Megatron's): stage ``s`` lives on rank ``s % p``
as its chunk ``s // p``, so rank 0 holds stages 0, p, 2p...; the *V* (ZB-V,
DualPipeV; v = 2): chunk 0 runs down the ranks and chunk 1 back up, so rank r
holds stages r and 2p − 1 − r, and the first and last stages share rank 0::

    loop, p = 3, v = 2     rank 0: 0 3   rank 1: 1 4   rank 2: 2 5
    V,    p = 3            rank 0: 0 5   rank 1: 1 4   rank 2: 2 3

Where two neighbouring stages share a rank (the bottom of the V, or any
neighbours at p = 1) the hand-off is local: no message. An :class:`Action` is
one step of one rank::

    2F0      forward of micro-batch 0 on stage 2
    2B0      backward (input and weight gradient together)
    2I0      backward for the input only (zero-bubble's B)
    2W0      backward for the weights only (deferred; zero-bubble's W)
    SEND_F 2F0 →3   send stage 2's output for micro-batch 0 to rank 3
    RECV_B 2B0 ←3   receive the gradient of stage 2's output from rank 3
    2F4&            forward overlapped with the backward right after it (DualPipeV's F&B pair)

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
rank - 1F1B's peak on the first rank), ``looped-bfs`` (breadth-first, Lamy-Poirier
2022, PyTorch's ``ScheduleLoopedBFS``: every micro-batch through chunk 0, then
chunk 1...; backwards from the last chunk, GPipe-like memory), ``zb-h2`` (zero
bubble with more memory: 2(p − rank) − 1 warm-up forwards, so the first
gradient arrives just as the warm-up ends; up to 2p − 1 micro-batches in
flight; the same construction as ZB-H1 with a larger cap), ``zb-v`` (zero
bubble in a V, Qi et al.: two chunks per rank, 1F1B's memory; PyTorch's
``ScheduleZBVZeroBubble`` order) and ``dualpipev``
(DeepSeek's DualPipe cut in half: the V layout, the steady state made of
pairs - a forward of one chunk overlapped with a backward of the other - and
the backward split into I and W only where W can fill a bubble; DeepSeek's
``dualpipev.py`` step order).

Pairs: the F of an overlapped F&B pair carries ``pair=True``; its receives
come before the pair and its sends after it, as DualPipe posts them. The
executor runs the two halves back to back (on a CPU there is nothing for the
forward's communication to overlap with, and no second stream); a GPU engine
could run them concurrently from the same rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["Action", "SCHEDULES", "COMPUTE", "compute_order", "with_comms", "actions", "table", "check_shape",
           "ScheduleError", "splits_backward", "backward_ops", "rank_of", "stages_of", "default_chunks", "CHUNKED",
           "V_SHAPED", "equal_chunks"]

#: The schedules, by ``--schedule`` name.
SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved", "looped-bfs", "zb-h1", "zb-h2", "zb-v", "dualpipev")
#: Schedules that take ``--chunks V`` (loop layout).
CHUNKED = ("interleaved", "looped-bfs")
#: Schedules with two chunks per rank in a V.
V_SHAPED = ("zb-v", "dualpipev")
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
    pair: bool = field(default=False, compare=False)  # an F overlapped with the backward right after it

    @property
    def is_compute(self) -> bool:
        return self.op in COMPUTE

    def __str__(self) -> str:
        if self.is_compute:
            return f"{self.stage}{self.op}{self.mb}" + ("&" if self.pair else "")
        kind = self.op[-1]
        arrow = "→" if self.op.startswith("SEND") else "←"
        return f"{self.op} {self.stage}{kind}{self.mb} {arrow}{self.peer}"


def backward_ops(name: str) -> str:
    """The backward ops schedule *name* uses: ``"B"``, ``"IW"`` (split), or ``"BIW"`` (DualPipeV: both)."""
    if name in ("zb-h1", "zb-h2", "zb-v"):
        return "IW"
    return "BIW" if name == "dualpipev" else "B"


def splits_backward(name: str) -> bool:
    """Whether schedule *name* splits (some of) its backwards into I and W (the zero-bubble family, DualPipeV)."""
    return "W" in backward_ops(name)


def default_chunks(name: str) -> int:
    """Chunks per rank when ``--chunks`` is not given: 2 for the V schedules, else 1."""
    return 2 if name in V_SHAPED else 1


def equal_chunks(name: str) -> bool:
    """Whether schedule *name* needs its stages to hold equal numbers of blocks (the loop-layout chunked ones)."""
    return name in CHUNKED


def rank_of(name: str, p: int, stage: int) -> int:
    """The rank that holds *stage* under schedule *name*'s layout (module docstring)."""
    if name in V_SHAPED:
        return stage if stage < p else 2 * p - 1 - stage
    return stage % p


def stages_of(name: str, p: int, v: int, rank: int) -> list[int]:
    """The stages rank *rank* holds, chunk 0 first."""
    if name in V_SHAPED:
        return [rank, 2 * p - 1 - rank]
    return [c * p + rank for c in range(v)]


def check_shape(name: str, p: int, m: int, v: int = 1) -> None:
    """ScheduleError unless schedule *name* can run p ranks, m micro-batches, v chunks."""
    if name not in SCHEDULES:
        raise ScheduleError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
    for label, value in (("stages", p), ("micro-batches", m), ("chunks", v)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ScheduleError(f"{label} must be an integer >= 1, got {value!r}")
    if name == "interleaved" and m % p:
        raise ScheduleError(f"interleaved 1F1B needs the micro-batches ({m}) to be a multiple of the stages ({p}); "
                            f"use --micro {max(p, m - m % p)} or {m + p - m % p}")
    if name in V_SHAPED:
        if v != 2:
            raise ScheduleError(f"{name} places exactly two chunks on each rank (a V), not --chunks {v}; "
                                f"use --chunks 2 or drop --chunks")
        if name == "dualpipev" and m < 2 * p:
            raise ScheduleError(f"dualpipev needs at least twice as many micro-batches as stages (m >= 2p = {2 * p}), "
                                f"got {m}; use --micro {2 * p} or more")
    elif name not in CHUNKED and v != 1:
        raise ScheduleError(f"--chunks {v} applies to the interleaved and looped-bfs schedules only (zb-v and "
                            f"dualpipev always have 2); drop it or use --schedule interleaved")


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


def _zero_bubble(p: int, m: int, warmup: list[int], cap: list[int], name: str) -> list[list[Action]]:
    """ZB-H1 and ZB-H2 for every rank: 1F1B's order of F and I, with each W placed where the rank would wait.

    Built by one simulation with F = I = W = 1 time unit (the paper's assumption, and
    true of a Linear layer: x·W, dy·Wᵀ and xᵀ·dy cost the same): at each unit a rank
    runs its next F or I if its input has arrived, unless that F would put more
    than ``cap[rank]`` micro-batches in flight (forward done, W not yet), in which
    case it runs its oldest pending W; when the next F or I is not ready it also
    runs a pending W rather than idle. ``warmup[rank]`` is the 1F1B warm-up (the
    forwards before the first F-I pair). The order, not the times, is the schedule.

    ZB-H1: warm-up p − r − 1 and cap p (1F1B's memory). ZB-H2: warm-up
    2(p − r − 1), so rank r runs 2(p − r) − 1 forwards before its first I - exactly
    until the first gradient can reach it (F down to the last rank and I back take
    2p − 1 − r units from its first forward at r) - and cap 2p − 1 on every rank,
    so the last ranks too can defer their W's to the tail, where they let the I's
    run through first (a cap of 2(p − r) − 1 would leave the last rank F, I, W in
    turn and the first rank idle at the end).
    """
    base = [list(_one_f_one_b([(mb, r) for mb in range(m)], [(mb, r) for mb in range(m)], warmup[r], "I"))
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
                    allowed = inflight[r] < cap[r]
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
            raise ScheduleError(f"{name} construction did not finish for p={p}, m={m}")
    return order


def _zb_v(p: int, m: int, rank: int) -> Iterator[Action]:
    """ZB-V on rank *rank*: PyTorch's ``ScheduleZBVZeroBubble`` order (the zero-bubble authors' V schedule).

    Chunk 0 is stage r, chunk 1 stage 2p − 1 − r. Warm-up: 2(p − r) − 1 forwards of
    chunk 0, then r pairs (F chunk 1, F chunk 0), then p − r rounds of F, I, W on
    chunk 1; steady state: F, I, W of chunk 0, then of chunk 1, until every forward
    ran; cool-down: the remaining I's (the last ranks' two chunks in turn, then I
    and W of chunk 0), the remaining W's last. Built for max(m, 2p − 1)
    micro-batches, the extra ones dropped (fewer micro-batches than the V holds).
    At F = I = W, rank 0 holds at most 2p chunk micro-batches: p stages' worth,
    1F1B's peak.
    """
    n = max(2 * p - 1, m)
    s0, s1 = rank, 2 * p - 1 - rank
    out: list[Action] = []
    f0 = f1 = b0 = b1 = 0
    for _ in range(2 * (p - rank) - 1):
        out.append(Action("F", f0, s0))
        f0 += 1
    for _ in range(rank):
        out += [Action("F", f1, s1), Action("F", f0, s0)]
        f0, f1 = f0 + 1, f1 + 1
    for _ in range(p - rank):
        out += [Action("F", f1, s1), Action("I", b1, s1), Action("W", b1, s1)]
        f1, b1 = f1 + 1, b1 + 1
    while f1 < f0 or f0 < n:
        if f0 < n:
            out.append(Action("F", f0, s0))
            f0 += 1
        out += [Action("I", b0, s0), Action("W", b0, s0), Action("F", f1, s1), Action("I", b1, s1),
                Action("W", b1, s1)]
        b0, f1, b1 = b0 + 1, f1 + 1, b1 + 1
    w0, w1 = b0, b1
    for _ in range(rank):
        out += [Action("I", b0, s0), Action("I", b1, s1)]
        b0, b1 = b0 + 1, b1 + 1
    for _ in range(p - rank):
        out += [Action("I", b0, s0), Action("W", w0, s0)]
        b0, w0 = b0 + 1, w0 + 1
    out += [Action("W", k, s1) for k in range(w1, b1)] + [Action("W", k, s0) for k in range(w0, b0)]
    yield from (a for a in out if a.mb < m)


def _dualpipev(p: int, m: int, rank: int) -> Iterator[Action]:
    """DualPipeV on rank *rank*: the eight steps of DeepSeek's ``dualpipev.py``, compute actions only.

    Phase 0 is chunk 0 (stage r, data flowing down the ranks), phase 1 chunk 1
    (stage 2p − 1 − r, flowing back up; the loss on rank 0). Each phase takes its
    forwards and its backwards in micro-batch order. A backward is whole (B)
    unless marked zero-bubble, which runs I now and queues W; ``W`` pops the
    oldest queued. The steps, with their repeat counts::

        1  nF0            2(p − r − 1)   F chunk 0
        2  nF0F1          r + 1          F 0, F 1
        3  nB1W1F1        p − r − 1      I 1, W, F 1            (zero bubble)
        4  nF0B1F1B0      m − 2p + r + 1 F 0 & B 1, F 1 & B 0   (overlapped pairs)
        5  nB1F1B0        p − r − 1      B 1, F 1 & B 0
        6  nB1B0          r + 1          B 1, B 0; the second half as I (zero bubble)
        7  nWB0           p − r − 1      W, I 0
        8  nW             r + 1          W

    DeepSeek's step 4 on the last rank runs its first pair without overlap
    (same order here, where pairs run back to back anyway).
    """
    s = (rank, 2 * p - 1 - rank)
    fwd, bwd = [0, 0], [0, 0]
    queue: list[tuple[int, int]] = []
    out: list[Action] = []

    def f(phase: int, pair: bool = False) -> None:
        out.append(Action("F", fwd[phase], s[phase], pair=pair))
        fwd[phase] += 1

    def b(phase: int, zb: bool = False) -> None:
        if zb:
            out.append(Action("I", bwd[phase], s[phase]))
            queue.append((bwd[phase], s[phase]))
        else:
            out.append(Action("B", bwd[phase], s[phase]))
        bwd[phase] += 1

    def w() -> None:
        mb, stage = queue.pop(0)
        out.append(Action("W", mb, stage))

    for _ in range(2 * (p - rank - 1)):  # 1
        f(0)
    for _ in range(rank + 1):  # 2
        f(0)
        f(1)
    for _ in range(p - rank - 1):  # 3
        b(1, zb=True)
        w()
        f(1)
    for _ in range(m - 2 * p + rank + 1):  # 4
        f(0, pair=True)
        b(1)
        f(1, pair=True)
        b(0)
    for _ in range(p - rank - 1):  # 5
        b(1)
        f(1, pair=True)
        b(0)
    steps = rank + 1  # 6
    zb = False
    for i in range(steps):
        if i == steps // 2 and rank % 2 == 1:
            zb = True
        b(1, zb)
        if i == steps // 2 and rank % 2 == 0:
            zb = True
        b(0, zb)
    for _ in range(p - rank - 1):  # 7
        w()
        b(0, zb=True)
    for _ in range(rank + 1):  # 8
        w()
    yield from out


def _looped_bfs(p: int, m: int, v: int, rank: int) -> Iterator[Action]:
    """Looped BFS (PyTorch's ``ScheduleLoopedBFS``): all micro-batches through each chunk in turn, then back."""
    stages = [c * p + rank for c in range(v)]
    for s in stages:
        for mb in range(m):
            yield Action("F", mb, s)
    for s in reversed(stages):
        for mb in reversed(range(m)):
            yield Action("B", mb, s)


def compute_order(name: str, p: int, m: int, v: int = 1, rank: int = 0) -> Iterator[Action]:
    """Yield rank *rank*'s compute actions (F, B or I/W) for schedule *name*, in execution order."""
    check_shape(name, p, m, v)
    if not 0 <= rank < p:
        raise ScheduleError(f"rank {rank} is not in a pipeline of {p} ranks; use 0..{p - 1}")
    stages = stages_of(name, p, v, rank)
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
    elif name == "looped-bfs":
        yield from _looped_bfs(p, m, v, rank)
    elif name == "zb-h1":
        yield from _zero_bubble(p, m, [p - r - 1 for r in range(p)], [p] * p, name)[rank]
    elif name == "zb-h2":
        yield from _zero_bubble(p, m, [2 * (p - r - 1) for r in range(p)], [2 * p - 1] * p, name)[rank]
    elif name == "zb-v":
        yield from _zb_v(p, m, rank)
    else:  # dualpipev
        yield from _dualpipev(p, m, rank)


def with_comms(compute: Iterator[Action], p: int, v: int = 1, name: str = "1f1b") -> Iterator[Action]:
    """Add the sends and receives around a rank's compute actions (*name* gives the layout).

    Before a forward of stage s > 0: receive its input from the rank of stage s−1;
    after it, unless s is the last stage, send the output to the rank of s+1.
    Before a backward (B or I) of a stage below the last: receive the output's
    gradient from the rank of s+1; after it, for s > 0, send the input's gradient
    to the rank of s−1. W needs and sends nothing; nor does a hand-off between
    two stages of the same rank. An overlapped pair (an F with ``pair``, and the
    backward after it) receives both inputs before the F and sends both results
    after the backward.
    """
    last = p * v - 1
    me: int | None = None

    def recv(a: Action) -> list[Action]:
        if a.op == "F" and a.stage > 0 and rank_of(name, p, a.stage - 1) != me:
            return [Action("RECV_F", a.mb, a.stage, rank_of(name, p, a.stage - 1))]
        if a.op in ("B", "I") and a.stage < last and rank_of(name, p, a.stage + 1) != me:
            return [Action("RECV_B", a.mb, a.stage, rank_of(name, p, a.stage + 1))]
        return []

    def send(a: Action) -> list[Action]:
        if a.op == "F" and a.stage < last and rank_of(name, p, a.stage + 1) != me:
            return [Action("SEND_F", a.mb, a.stage, rank_of(name, p, a.stage + 1))]
        if a.op in ("B", "I") and a.stage > 0 and rank_of(name, p, a.stage - 1) != me:
            return [Action("SEND_B", a.mb, a.stage, rank_of(name, p, a.stage - 1))]
        return []

    held: Action | None = None  # the F of a pair, waiting for its backward
    for a in compute:
        if me is None:
            me = rank_of(name, p, a.stage)
        if held is not None:
            if a.op not in ("B", "I"):
                raise ScheduleError(f"{held} is marked as overlapped with the next action, but {a} is no backward")
            yield from recv(held) + recv(a)
            yield held
            yield a
            yield from send(held) + send(a)
            held = None
        elif a.pair:
            held = a
        else:
            yield from recv(a)
            yield a
            yield from send(a)
    if held is not None:
        raise ScheduleError(f"{held} is marked as overlapped with the next action, but it is the last one")


def actions(name: str, p: int, m: int, v: int = 1, rank: int = 0) -> Iterator[Action]:
    """Rank *rank*'s whole schedule: compute actions with their sends and receives."""
    yield from with_comms(compute_order(name, p, m, v, rank), p, v, name)


def table(name: str, p: int, m: int, v: int = 1, *, comms: bool = False) -> list[list[str]]:
    """Every rank's schedule as printed strings (``"0F1"``...): the form the literal-table tests compare."""
    rows = []
    for r in range(p):
        gen = actions(name, p, m, v, r) if comms else compute_order(name, p, m, v, r)
        rows.append([str(a) for a in gen])
    return rows
