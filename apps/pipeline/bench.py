"""``python -m apps.pipeline bench``: the schedules, activation strategies and one rank, measured in one run.

At this job's N ranks the pipeline has S = N stages (T = D = 1) and runs, on the
same model, global batch and M micro-batches:

* every schedule - naive, GPipe, 1F1B, interleaved 1F1B and looped BFS (V = 2,
  where the blocks and M allow it), ZB-H1, ZB-H2, ZB-V and DualPipeV -
  activations stored: the measured bubble (idle share of the step on each rank,
  averaged over ranks) against the planned one (the simulated timetable) and
  the formula, and the first rank's peak activations (bytes, and micro-batches
  in flight against the plan and the papers' count);
* 1F1B with activations recomputed and offloaded (parked in the next rank's
  node-shared window where it shares the node, its RMA window otherwise;
  fetched back ahead of each backward): their memory and step time against
  store, side by side in one line under the table;
* the same model and batch on ONE rank (a sub-communicator of rank 0; the other
  ranks wait sleeping): the throughput ratio of S stages against one rank.

Each row runs ``--steps`` steps after an untimed warm-up row; the first step of
every row is not counted. The table goes to stdout and, with ``--out``, to a
Markdown file beside the command that made it; ``--json`` writes the rows;
``--plot`` draws the planned and measured charts of the 1F1B row.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from mpi4py import MPI

import mpicomm
from apps import report as json_report
from mpicomm import cli

from .config import Config
from .engine import wait_sleeping
from .measure import summary
from .model import ModelSpec
from .timeline import FORMULAS, MEMORY, memory
from .train import train

__all__ = ["bench", "ROWS"]

#: (schedule, chunks, activations) of each row, in table order.
ROWS = (("naive", 1, "store"), ("gpipe", 1, "store"), ("1f1b", 1, "store"), ("interleaved", 2, "store"),
        ("looped-bfs", 2, "store"), ("zb-h1", 1, "store"), ("zb-h2", 1, "store"), ("zb-v", 2, "store"),
        ("dualpipev", 2, "store"), ("1f1b", 1, "recompute"), ("1f1b", 1, "offload"))


def _config(args: argparse.Namespace, stages: int, schedule: str, chunks: int, activations: str) -> Config:
    spec = ModelSpec(features=args.features, width=args.width, hidden=args.hidden, blocks=args.blocks,
                     classes=args.classes, activation=args.activation)
    return Config(stages=stages, micro=args.micro, schedule=schedule, chunks=chunks, activations=activations,
                  spec=spec, batch=args.batch, steps=args.steps, optimizer=args.optimizer, lr=args.lr,
                  dtype=args.dtype, seed=args.seed, backend=args.backend, progress=False)


def _runnable(cfg: Config, world: int) -> str | None:
    try:
        cfg.check(world)
    except ValueError as exc:
        return str(exc)
    return None


def _median_run(comm: Any, cfg: Config, repeat: int) -> tuple[dict[str, Any], Any]:
    best: list[tuple[float, dict[str, Any], Any]] = []
    for _ in range(repeat):
        result = train(comm, cfg)
        summ = summary(cfg, result.ranks) if comm.Get_rank() == 0 else {}
        best.append((summ.get("step_s", 0.0), summ, result))
    best.sort(key=lambda item: item[0])
    _, summ, result = best[len(best) // 2]
    return summ, result


def bench(comm: Any, args: argparse.Namespace, say: Callable[[str], None]) -> int:
    """Run the rows (collective); rank 0 prints and writes the table."""
    world, rank = comm.Get_size(), comm.Get_rank()
    rows: list[dict[str, Any]] = []
    why = {r: _runnable(_config(args, world, *r), world) for r in ROWS}
    plans = [r for r in ROWS if why[r] is None]
    skipped = [(r, why[r]) for r in ROWS if why[r] is not None]
    progress = cli.Progress(len(plans) + 2, "bench", show=rank == 0 and not args.quiet)
    train(comm, _config(args, world, "1f1b", 1, "store"))  # warm-up: caches, BLAS, MPI connections
    progress.step("warm-up")
    chart = None
    for schedule, chunks, activations in plans:
        cfg = _config(args, world, schedule, chunks, activations)
        summ, result = _median_run(comm, cfg, args.repeat)
        if rank == 0:
            first = summ["per_rank"][0]
            rows.append({"schedule": schedule, "S": world, "M": cfg.micro, "V": chunks, "activations": activations,
                         "bubble": summ["bubble"], "planned": summ["planned"], "formula": summ["formula"],
                         "peak_bytes": first["peak_bytes"], "peak_micro": first["peak_micro"],
                         "planned_peak": first["planned_peak"], "memory": memory(schedule, world, cfg.micro, chunks),
                         "offload_bytes": first["offload_bytes"], "offload_window": first["offload_window"],
                         "step_s": summ["step_s"],
                         "samples_per_s": summ["samples_per_s"]})
            if schedule == "1f1b" and activations == "store":
                chart = (cfg, result.ranks, summ)
        progress.step(f"{schedule} {activations}")
    # One rank, same model and global batch.
    one = None
    sub = comm.Split(0 if rank == 0 else MPI.UNDEFINED, 0)
    if sub != MPI.COMM_NULL:
        c = mpicomm.Comm(sub)
        cfg = _config(args, 1, "1f1b", 1, "store")
        summ, _ = _median_run(c, cfg, args.repeat)
        one = {"schedule": "one rank", "S": 1, "M": cfg.micro, "V": 1, "activations": "store",
               "bubble": summ["bubble"], "planned": 0.0, "formula": 0.0,
               "peak_bytes": summ["per_rank"][0]["peak_bytes"], "peak_micro": summ["per_rank"][0]["peak_micro"],
               "planned_peak": 1, "memory": 1, "offload_bytes": 0, "step_s": summ["step_s"],
               "samples_per_s": summ["samples_per_s"]}
        c.Free()
    wait_sleeping(comm.Ibarrier())  # the other ranks sleep while rank 0 runs alone
    progress.step("one rank")
    if rank != 0:
        return 0
    if one is not None:
        rows.append(one)
    lines = _table(args, world, rows, skipped)
    for line in lines:
        say(line)
    if args.out:
        cli.write_out(args.out, "\n".join(lines), args.append)
        say(f"wrote {args.out}")
    if args.json:
        json_report.write_json(args.json, "python -m apps.pipeline", args.argv, world, rows)
        say(f"wrote {args.json}")
    if args.plot and chart is not None:
        from .plots import run_chart

        run_chart(args.plot, *chart)
        say(f"wrote {args.plot}")
    return 0


def _table(args: argparse.Namespace, world: int, rows: list[dict[str, Any]], skipped: list) -> list[str]:
    store = next((r for r in rows if r["schedule"] == "1f1b" and r["activations"] == "store"), None)
    one = next((r for r in rows if r["schedule"] == "one rank"), None)
    command = f"mpiexec -n {world} {cli.command_line('python -m apps.pipeline', args.argv)}"
    lines = [
        f"### Pipeline schedules at S = {world}, M = {args.micro}",
        "",
        f"`{command}` ({os.cpu_count()} cores, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}; "
        f"mpicomm {cli.versions()['mpicomm']}, NumPy {cli.versions()['numpy']})",
        "",
        f"Model: {args.blocks} blocks {args.width}→{args.hidden}→{args.width}, {args.features} features, "
        f"{args.classes} classes, {args.dtype}; global batch {args.batch}; {args.steps} steps per row (the first "
        f"not counted). Bubble: idle share of the step, averaged over the ranks; planned: the simulated timetable "
        f"(F = 1, B = 2, I = W = 1; a chunk's costs halved at V = 2); off by: measured against planned; peak: "
        f"activations held by rank 0 (the first stage, and in a V the last), in bytes and in micro-batches of one "
        f"stage (of one chunk at V = 2) - measured (planned) and the papers' count.",
        "",
        "| schedule | V | activations | bubble measured | planned | formula | off by | peak activations rank 0 "
        "| in flight (plan) | papers | step | samples/s | vs 1F1B store |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        off = (r["bubble"] - r["planned"]) / r["planned"] if r["planned"] else float("nan")
        ratio = (r["step_s"] / store["step_s"]) if store and store["step_s"] else float("nan")
        formula = FORMULAS.get(r["schedule"], "-")
        paper = f"{r['memory']} `{MEMORY[r['schedule']]}`" if r["schedule"] in MEMORY else "-"
        lines.append(
            f"| {r['schedule']} | {r['V']} | {r['activations']} | {r['bubble']:.1%} | {r['planned']:.1%} | "
            f"{r['formula']:.1%} `{formula}` | {off:+.0%} | {r['peak_bytes'] / 1024:,.0f} KiB | {r['peak_micro']} "
            f"({r['planned_peak']}) | {paper} | {cli.format_time(r['step_s'])} | {r['samples_per_s']:,.0f} | "
            f"{ratio:.2f}× time |")
    strategies = {r["activations"]: r for r in rows if r["schedule"] == "1f1b"}
    if len(strategies) > 1:
        lines += ["", "Activations at 1F1B, side by side (step time, and the first rank's peak activations): " + "; ".join(
            f"{name}" + (f" ({r['offload_window']} window" + (", prefetched" if r.get("prefetched") else "") + ")"
                         if r.get("offload_window") else "")
            + f" {cli.format_time(r['step_s'])}"
            + (f" ({r['step_s'] / store['step_s']:.2f}× store)" if store and store["step_s"] and name != "store" else "")
            + f", {r['peak_bytes'] / 1024:,.0f} KiB" for name, r in strategies.items()) + "."]
    if one and store:
        lines += ["", f"Throughput of S = {world} stages against one rank on the same model and global batch: "
                      f"{store['samples_per_s'] / one['samples_per_s']:.2f}× ({store['samples_per_s']:,.0f} against "
                      f"{one['samples_per_s']:,.0f} samples/s)."]
    for (schedule, chunks, activations), why in skipped:
        lines.append(f"\nNot run: {schedule} V={chunks} {activations}: {why}")
    return lines
