"""What a run measured: each rank's totals over the steps after the first, and the per-stage summary rank 0 prints.

Bubble of a rank in a step = 1 − (its busy time) / (the step's makespan), the
makespan being the longest any pipeline rank of replica 0 took from the common
start (the ranks start each step together); the run reports the median over
its steps (after the first), and the step time is the median makespan. Busy is the sum of the rank's
compute actions (F, B, I, W); everything else - waits, the messages'
bookkeeping - is bubble, as the formula counts it.

Communication per step and rank: ``sent_bytes``, what it sent to other stages
(with T > 1 its block of each activation and gradient: 1/T of it), and
``gathered_bytes``, what its tensor group's all-gathers completed those blocks
with; ``offload_bytes``, what offloading moved (parked and fetched back).
"""

from __future__ import annotations

from typing import Any

from .engine import StepRecord
from .timeline import formula

__all__ = ["local_stats", "summary"]


def local_stats(run: Any, records: list[StepRecord]) -> dict[str, Any]:
    """This rank's measurements over the steps after the first (warm-up): busy, elapsed, peaks."""
    use = records[1:] if len(records) > 1 else records
    busy = sum(r.busy for r in use)
    waits = sum(e.end - e.start for r in use for e in r.events if e.op == "wait")
    return {
        "t": run.t, "s": run.s, "d": run.d, "stages": sorted(run.stages),
        "steps": len(use), "busy": busy, "wait": waits, "elapsed": [r.elapsed for r in use],
        "busy_steps": [r.busy for r in use],
        "peak_bytes": max((r.peak_bytes for r in use), default=0),
        "peak_micro": max((r.peak_micro for r in use), default=0),
        "planned_bubble": run.plan.bubble(run.s), "planned_peak": run.plan.peak_in_flight(run.s),
        "offload_bytes": getattr(getattr(run, "offload", None), "bytes_moved", 0) / max(len(records), 1),
        "prefetched": getattr(getattr(run, "offload", None), "prefetched", 0),
        "offload_window": getattr(getattr(getattr(run, "offload", None), "target", None), "kind", None),
        "sent_bytes": sum(r.sent_bytes for r in use) / max(len(use), 1),
        "gathered_bytes": sum(r.gathered_bytes for r in use) / max(len(use), 1),
        "hosted_bytes": getattr(run, "hosted_bytes", 0),
        "events": [[e.op, e.mb, e.stage, e.start, e.end] for e in (use[-1].events if use else [])],
    }


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return 0.0
    return ordered[n // 2] if n % 2 else 0.5 * (ordered[n // 2 - 1] + ordered[n // 2])


def summary(cfg: Any, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """Per pipeline rank (replica 0, tensor rank 0): busy, bubble measured and planned, memory; and the totals.

    A step's bubble is computed from that step alone (its makespan, each rank's
    busy time in it); the run's is the median over the steps, so one step that
    the machine slowed - another process taking a core - does not stand for the
    schedule. ``bubble_total`` is the same over the steps' sums, for comparison.
    """
    rows = sorted((r for r in ranks if r["d"] == 0 and r["t"] == 0), key=lambda r: r["s"])
    if not rows:
        return {}
    steps = rows[0]["steps"]
    makespans = [max(r["elapsed"][i] for r in rows) for i in range(steps)]
    total = sum(makespans)
    per = []
    for r in rows:
        per.append({
            "rank": r["s"], "stages": r["stages"], "busy_s": r["busy"],
            "bubble": _median([1.0 - b / m for b, m in zip(r["busy_steps"], makespans) if m > 0]),
            "bubble_total": 1.0 - r["busy"] / total if total else 0.0, "planned": r["planned_bubble"],
            "peak_bytes": r["peak_bytes"], "peak_micro": r["peak_micro"], "planned_peak": r["planned_peak"],
            "offload_bytes": r["offload_bytes"], "hosted_bytes": r["hosted_bytes"],
            "sent_bytes": r["sent_bytes"], "gathered_bytes": r["gathered_bytes"],
            "offload_window": r["offload_window"], "prefetched": r["prefetched"],
        })
    step_bubbles = [1.0 - sum(r["busy_steps"][i] for r in rows) / (len(rows) * makespans[i])
                    for i in range(steps) if makespans[i] > 0]
    topo_d = max(r["d"] for r in ranks) + 1
    step_s = _median(makespans)
    return {
        "schedule": cfg.schedule, "stages": cfg.stages, "micro": cfg.micro, "chunks": cfg.chunks,
        "tensor": cfg.tensor, "replicas": topo_d, "activations": cfg.activations,
        "formula": formula(cfg.schedule, cfg.stages, cfg.micro, cfg.chunks),
        "bubble": _median(step_bubbles),
        "bubble_total": sum(p["bubble_total"] for p in per) / len(per),
        "planned": sum(p["planned"] for p in per) / len(per),
        "steps": steps, "step_s": step_s, "samples_per_s": cfg.batch / step_s if step_s else 0.0, "per_rank": per,
    }
