"""Measuring collectives into rules: time every algorithm of each collective, write the fastest per size as rules.

``mpiexec -n N python -m mpicomm.tune --collectives`` (:mod:`mpicomm.tune.command`)
runs :func:`measure_collectives`: every registered algorithm of each collective
that can run at this p and layout is timed on plain NumPy float64 arrays over
the sizes, all of them interleaved in rounds per size, each taking its median
round (:func:`mpicomm.bench.measure.time_algorithms`). The fastest at each size
becomes a rule (:func:`mpicomm.rules.decide`: ``max_bytes`` ranges, host
buffers), and the rules are saved as a rules file for the host and layout
(:mod:`mpicomm.rules`), with the measurements. Every ``mpicomm.Comm`` of that
host and layout loads it, and ``auto`` follows it before the default rules.

The same measurements correct the fitted model (:func:`model_corrections`):
per (collective, algorithm), measured / predicted, which predictions and
``--explain`` then use.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any

from .. import cli, model, rules

__all__ = ["measure_collectives", "collective_iterations", "auto_closeness", "model_corrections"]


def collective_iterations(nbytes: int, requested: int | None = None) -> int:
    """Calls per algorithm and size when deciding: *requested*, else 200 for small messages down to 10 from 400 KiB
    (about 4 MiB moved per algorithm, so the large sizes do not take minutes on a small machine)."""
    return requested if requested else max(10, min(200, (4 << 20) // max(nbytes, 1)))


def auto_closeness(points: Sequence[dict], tolerance: float = 0.10) -> tuple[int, int]:
    """(points where ``auto`` was within *tolerance* of the fastest algorithm, points with ``auto`` measured).

    *points*: rows of :func:`mpicomm.bench.time_algorithms` (``us`` by name, ``auto`` among them)."""
    close = total = 0
    for pt in points:
        times = {n: t for n, t in pt["us"].items() if n != "auto"}
        if "auto" not in pt["us"] or not times:
            continue
        total += 1
        close += pt["us"]["auto"] <= (1 + tolerance) * min(times.values())
    return close, total


def measure_collectives(comm: Any, collectives: Sequence[str], sizes: Sequence[int], iters: int | None = None,
                        rounds: int = 5, show: bool = True) -> tuple[rules.Rules, list[str]]:
    """Time every usable algorithm of each of *collectives* (``python -m mpicomm.bench`` names) at *sizes* and
    write the fastest per size as rules (:func:`mpicomm.rules.decide`, host buffers); COLLECTIVE over *comm* (an
    ``mpicomm.Comm``). *iters*: timed calls of each algorithm per size in each of the *rounds* interleaved
    measurements (default: :func:`collective_iterations` in all, spread over the rounds). Returns the rules of
    this layout, with the measurements (the same on every rank), and lines of text describing what was
    measured (on rank 0; empty elsewhere)."""
    from mpi4py import MPI

    from ..bench import measure as bench_measure
    from ..bench.metrics import COLLECTIVES

    plain = MPI.Intracomm(comm)
    rank, p = plain.Get_rank(), plain.Get_size()
    host = plain.bcast(comm.host, root=0)
    decided: dict[str, list[dict]] = {}
    measured: dict[str, list[dict]] = {}
    lines: list[str] = []
    close = total = kept = compared = 0
    loaded = getattr(getattr(comm, "_state", None), "rules", None)  # the measured rules auto followed here
    progress = cli.Progress(len(collectives), "mpicomm.tune --collectives", show=show and rank == 0)
    for name in collectives:
        spec = COLLECTIVES[name]
        names, notes = bench_measure.usable_algorithms(spec, comm)
        progress.note(f"{name}: {', '.join(names)}" + "".join(f"; {n}" for n in notes))
        rows = bench_measure.time_algorithms(
            comm, spec, names + ["auto"], sizes, iters=lambda n: collective_iterations(n, iters * rounds if iters else None), rounds=rounds,
            progress=progress.note if show else None)
        points = [{"bytes": r["bytes"], "us": {n: round(t, 3) for n, t in r["us"].items() if n != "auto"}}
                  for r in rows]
        decided[spec.registry] = rules.decide(points, device=False)  # measured on host arrays
        measured[spec.registry] = points
        near, count = auto_closeness(rows)
        close, total = close + near, total + count
        if loaded is not None:  # the earlier measured rules, judged on this run's times
            near, count = auto_closeness([{"us": {**pt["us"], "auto": pt["us"][pick]}} for pt in points
                                          if (pick := loaded.algorithm_for(spec.registry, pt["bytes"])) in pt["us"]])
            kept, compared = kept + near, compared + count
        if rank == 0:
            lines += _collective_lines(spec.registry, names, rows, decided[spec.registry], notes)
        progress.step(f"{name} decided")
    if rank == 0 and total:
        lines.append(f"auto as this run chose it (measured rules or default rules; its own timed calls): within "
                     f"10 % of the fastest algorithm at {close} of {total} points")
    if rank == 0 and loaded is not None:
        lines.append(f"the rules this run loaded (measured {loaded.measured or '?'}): their algorithm within "
                     f"10 % of this run's fastest at {kept} of {compared} points they cover")
    result = rules.Rules(decided, p, comm.nodes, comm.ppn, host, model.now(), measurements=measured)
    return result, lines


def model_corrections(measured: dict[str, list[dict]], machine: model.Machine, p: int,
                      validation: bool) -> tuple[tuple[str, str, float], ...]:
    """Per (collective, algorithm): the median over measured sizes ≥ 64 KiB of measured / predicted communication.

    *measured*: ``{collective: [{"bytes": n, "us": {algorithm: µs per call}}, ...]}`` (what
    :func:`measure_collectives` keeps). The measured communication time is a call's time less the
    machine's per-call overhead (and validation's, when it was on); the prediction is the formula
    without any earlier correction. The median keeps one noisy size from deciding; factors are kept
    within 0.2-20 (beyond that the formula, not its constants, is wrong). Sizes below 64 KiB are left
    out: there the per-call overhead, not the formula, decides.
    """
    from .. import registry

    plain = dataclasses.replace(machine, corrections=())
    fixed = machine.overhead + (machine.validation if validation else 0.0)
    out = []
    for collective, points in measured.items():
        by_algorithm: dict[str, list[float]] = {}
        for point in points:
            nbytes = point.get("bytes")
            if nbytes is None or nbytes < 65536:
                continue
            for name, us in point["us"].items():
                try:
                    predicted = registry.communication(collective, name, nbytes, p, plain)
                except ValueError:  # no cost function for it
                    continue
                if predicted > 0:
                    by_algorithm.setdefault(name, []).append(max(us * 1e-6 - fixed, 0.0) / predicted)
        for name, ratios in sorted(by_algorithm.items()):
            out.append((collective, name, round(min(20.0, max(0.2, statistics.median(ratios))), 4)))
    return tuple(out)


def _collective_lines(collective: str, names: list[str], rows: list[dict], decided: Sequence[dict],
                      notes: list[str]) -> list[str]:
    """One collective's measurements (median µs per call, mean over ranks) and the rules decided from them."""

    header = ["bytes", *names, "auto", "fastest"]
    cells = []
    for r in rows:
        best = min(names, key=r["us"].__getitem__)
        auto = r.get("auto", {})
        cells.append([str(r["bytes"] if r["bytes"] is not None else "-"), *(f"{r['us'][n]:.1f}" for n in names),
                      f"{r['us']['auto']:.1f} ({auto.get('algorithm', '?')}, {auto.get('source', '?')})", best])
    return ["", f"{collective} (median {cli.US} per call over rounds, mean over ranks):",
            cli.markdown_table(header, cells), *(f"note: {n}" for n in notes),
            f"decided: {'; '.join(rules.describe(rule) for rule in decided)}"]
