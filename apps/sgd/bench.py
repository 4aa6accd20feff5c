"""``mpiexec -n N python -m apps.sgd bench``: the modes side by side, measured in one run.

Parts (``--parts``, all by default):

* ``scaling`` - the compute-bound configuration on 1 rank (rank 0 alone on
  ``COMM_SELF`` while the others wait) and on all N ranks, interleaved
  ``--repeat`` times: samples/s and the speed-up;
* ``modes`` - one model, every mode: step time; the step split into compute,
  exposed and hidden communication (from timestamps around backward and the
  waits); bytes each rank sends per step (from the algorithm's schedule for the
  collectives, counted by the application for the parameter servers); memory per
  rank for parameters, gradients and optimizer state next to ZeRO's formulas;
* ``ps`` - the parameter server's bottleneck: bytes through the busiest server
  link per step as the workers go from 1 to N−1, next to all-reduce's 2(N−1)/N;
* ``async`` - test accuracy against wall time on digits for ps-sync, ps-async
  unbounded and ps-async with a staleness bound (``--plot`` draws it).

Timings exclude evaluation, checkpoints and one-time costs: every timed run
follows an untimed two-step run of the same configuration (allocations,
first-touch, the algorithms' plans, the first collectives). ``OMP_NUM_THREADS=1``
keeps each rank on one core, so one rank and N ranks compare like for like.

``--out FILE.md`` writes the tables (an existing file is kept unless
``--append`` or ``--force``); ``--json FILE`` the same figures as data; progress
is one ``[i/N]`` line per repetition on stderr from rank 0.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from mpi4py import MPI

import mpicomm
from apps import report as json_report
from apps.sgd.train import Config, Report, train
from mpicomm import cli

__all__ = ["add_options", "check_options", "bench", "PARTS"]

PARTS = ("scaling", "modes", "ps", "async")


def add_options(p: argparse.ArgumentParser) -> None:
    """The ``bench`` options."""
    from apps import options

    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated parts: {', '.join(PARTS)} (default: all)")
    cli.add_repeat(p, 3, "each measurement (interleaved with the others)")
    p.add_argument("--steps", type=int, default=20, help="measured steps per run (default: 20)")
    p.add_argument("--features", type=int, default=256, help="teacher input features (default: 256)")
    p.add_argument("--hidden", type=options.hidden_widths, default=(1024, 1024), metavar="W[,W…]",
                   help="the width of each hidden layer of the benchmark model (default: 1024,1024)")
    p.add_argument("--batch", type=int, default=2048,
                   help="global batch (default: 2048: compute-bound, the replicated update and the all-reduce are small next to it)")
    p.add_argument("--algorithm", default="ring",
                   help="collective algorithm (default: ring, whose bytes per rank are known exactly)")
    p.add_argument("--async-epochs", type=int, default=6, help="digits epochs for the async part (default: 6)")
    cli.add_out(p, "the tables")
    cli.add_json(p, "every part's figures")
    p.add_argument("--plot", metavar="FILE.png", default=None, help="accuracy against wall time for the async part")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def check_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The usage errors of ``bench`` (no MPI needed)."""
    parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    bad = [x for x in parts if x not in PARTS]
    if bad or not parts:
        parser.error(f"--parts must be a comma-separated list of {', '.join(PARTS)}; got {args.parts!r}")
    cli.at_least(parser, args, 1, "--repeat", "--steps", "--features", "--batch", "--async-epochs")
    cli.check_out(parser, args)


def _model_cfg(args: argparse.Namespace, **kw: Any) -> Config:
    base = Config(data="teacher", features=args.features, hidden=tuple(args.hidden), batch=args.batch, steps=args.steps,
                  samples=max(args.batch * (args.steps + 4), 4096), optimizer="adam", lr=1e-3,
                  algorithm=args.algorithm, progress=False, eval_every=10 ** 9)
    return replace(base, **kw)


def _warm_up(comm: Any, cfg: Config) -> None:
    """A short untimed run of *cfg* (allocations, first-touch, the algorithms' plans, the first collectives)."""
    train(comm, replace(cfg, steps=2, epochs=1, log=None, checkpoint_every=0), lambda s: None)


def _run(comm: Any, cfg: Config) -> Report:
    """:func:`_warm_up`, then the measured run."""
    _warm_up(comm, cfg)
    return train(comm, cfg, lambda s: None)


def _progress(comm: Any, args: argparse.Namespace, total: int, part: str) -> cli.Progress:
    """Rank 0's ``[i/N]`` lines for one part (none with --quiet)."""
    return cli.Progress(total, f"bench {part}", show=comm.Get_rank() == 0 and not args.quiet)


def _fmt_bytes(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def scaling(comm: Any, args: argparse.Namespace, say: Callable[[str], None]) -> tuple[list[str], dict]:
    """One rank alone vs all ranks, interleaved: the table's lines and its figures (rank 0)."""
    p, rank = comm.Get_size(), comm.Get_rank()
    cfg = _model_cfg(args, mode="ddp")
    alone, together = [], []
    self_comm = mpicomm.Comm(MPI.COMM_SELF) if rank == 0 else None
    progress = _progress(comm, args, args.repeat, "scaling")
    for _ in range(args.repeat):
        if rank == 0:
            alone.append(_run(self_comm, cfg).samples_per_s)
        comm.Barrier()
        together.append(_run(comm, cfg).samples_per_s)
        progress.step(f"1 rank {alone[-1] if alone else 0:,.0f} samples/s, {p} ranks {together[-1]:,.0f} samples/s")
    if rank != 0:
        return [], {}
    a, t = _median(alone), _median(together)
    data = {"ranks": p, "samples_per_s_1_rank": alone, "samples_per_s_all_ranks": together,
            "median_1_rank": a, "median_all_ranks": t, "speedup": t / a}
    return [
        f"### Scaling: the compute-bound configuration, 1 rank vs {p} ranks (ddp, overlapped, medians of {args.repeat})",
        "",
        f"Model: MLP {args.features}→{'→'.join(map(str, args.hidden))}→10 on the teacher data, fp32 Adam, global batch "
        f"{args.batch}, {args.steps} steps after a warm-up, algorithm {args.algorithm}.",
        "",
        "| ranks | samples/s (median) | runs | speed-up |",
        "|---:|---:|---|---:|",
        f"| 1 | {a:,.0f} | {', '.join(f'{x:,.0f}' for x in alone)} | 1.00× |",
        f"| {p} | {t:,.0f} | {', '.join(f'{x:,.0f}' for x in together)} | {t / a:.2f}× |",
        "",
    ], data


def _collective_bytes(mode: str, n_bytes: float, p: int, algorithm: str) -> float | None:
    """Bytes one rank sends per step, from the algorithm's schedule (ring; None when not known here)."""
    if p == 1:
        return 0.0
    if algorithm != "ring":
        return None
    if mode in ("per-parameter", "bucketed", "overlapped", "fp16"):
        return 2 * (p - 1) / p * n_bytes  # reduce-scatter + all-gather of every bucket
    if mode in ("zero1", "zero2"):
        return 2 * (p - 1) / p * n_bytes  # reduce-scatter of gradients + all-gather of parameters
    if mode == "zero3":
        return 3 * (p - 1) / p * n_bytes  # all-gathers of parameters in forward and backward + reduce-scatter
    return None


def modes(comm: Any, args: argparse.Namespace, say: Callable[[str], None]) -> tuple[list[str], dict]:
    """Every mode on one model: step time, overlap, bytes, memory (the lines and the figures, rank 0)."""
    p = comm.Get_size()
    runs = [("per-parameter", dict(mode="ddp", per_parameter=True, overlap=False)),
            ("bucketed", dict(mode="ddp", overlap=False)),
            ("overlapped", dict(mode="ddp")),
            ("fp16", dict(mode="ddp", compress="fp16")),
            ("zero1", dict(mode="zero1")),
            ("zero2", dict(mode="zero2")),
            ("zero3", dict(mode="zero3"))]
    if p >= 2:
        runs += [("ps-sync", dict(mode="ps-sync", servers=1)), ("ps-async", dict(mode="ps-async", servers=1, staleness=None))]
    results: dict[str, list[Report]] = {name: [] for name, _ in runs}
    progress = _progress(comm, args, args.repeat, "modes")
    for _ in range(args.repeat):
        for name, kw in runs:
            results[name].append(_run(comm, _model_cfg(args, **kw)))
        progress.step(f"{len(runs)} modes")
    if comm.Get_rank() != 0:
        return [], {}
    data: dict[str, Any] = {"ranks": p, "params": 0, "modes": []}
    first = results["overlapped"][0]
    psi = first.params
    data["params"] = psi
    grad_bytes = psi * 4
    lines = [
        f"### Modes on one model ({p} ranks, medians of {args.repeat})",
        "",
        f"Model: MLP {args.features}→{'→'.join(map(str, args.hidden))}→10, Ψ = {psi:,} fp32 parameters "
        f"({_fmt_bytes(grad_bytes)} of gradients), Adam, global batch {args.batch}, {args.steps} steps, "
        f"algorithm {args.algorithm}. Step = compute (forward + backward) + exposed communication (waiting "
        f"after backward, and ZeRO's reduce-scatter/all-gather) + the update; hidden = bucket collective time "
        f"that ran during backward. Bytes: sent by each rank per step (ring schedule: 2(p−1)/p · n for an "
        f"all-reduce or a reduce-scatter + all-gather, 3(p−1)/p · n for zero3's two all-gathers and reduce-scatter); "
        f"the parameter-server rows count what the busiest server link carries.",
        "",
        "| mode | step (ms) | compute (ms) | exposed comm (ms) | hidden comm (ms) | hidden | bytes/rank/step | "
        "params | grads | optimizer | total | formula (fp32 Adam) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, _ in runs:
        reps = results[name]
        steps = reps[0].steps
        step_ms = _median([r.step_s / steps * 1e3 for r in reps])
        compute = _median([r.compute_s / steps * 1e3 for r in reps])
        exposed = _median([r.exposed_s / steps * 1e3 for r in reps])
        hidden_ms = _median([max(0.0, r.comm_s - r.exposed_s) / steps * 1e3 for r in reps]) \
            if name in ("overlapped", "fp16", "zero2", "zero3") else 0.0
        frac = _median([r.hidden_fraction or 0.0 for r in reps]) if hidden_ms else None
        mem = reps[0].memory
        total = sum(mem.values())
        n_bytes = grad_bytes / 2 if name == "fp16" else grad_bytes
        sent = reps[0].bytes_per_step if name.startswith("ps") else _collective_bytes(name, n_bytes, p, args.algorithm)
        formula = "server-side state" if reps[0].memory_formula is None else \
            f"{reps[0].memory_formula[0]} = {_fmt_bytes(reps[0].memory_formula[2])}"
        lines.append(
            f"| {name} | {step_ms:.1f} | {compute:.1f} | {exposed:.1f} | {hidden_ms:.1f} | "
            f"{'' if frac is None else f'{frac:.0%}'} | {'' if sent is None else _fmt_bytes(sent)} | "
            f"{_fmt_bytes(mem.get('params', 0) + mem.get('param_layers', 0))}"
            f"{' (' + _fmt_bytes(mem['param_layers']) + ' layers)' if mem.get('param_layers') else ''} | "
            f"{_fmt_bytes(mem.get('grads', 0) + mem.get('grad_buckets', 0))}"
            f"{' (' + _fmt_bytes(mem['grad_buckets']) + ' buckets)' if mem.get('grad_buckets') else ''} | "
            f"{_fmt_bytes(mem.get('optimizer', 0))} | {_fmt_bytes(total)} | {formula} |")
        data["modes"].append({"mode": name, "step_ms": step_ms, "compute_ms": compute, "exposed_ms": exposed,
                              "hidden_ms": hidden_ms, "hidden_fraction": frac, "bytes_per_rank_per_step": sent,
                              "memory": dict(mem), "memory_total": total})
    lines.append("")
    return lines, data


def ps_links(comm: Any, args: argparse.Namespace, say: Callable[[str], None]) -> tuple[list[str], dict]:
    """Bytes through the busiest server link per step with 1 server and 1..N−1 workers (sub-communicators).

    Bytes are counted, not timed: no warm-up run.
    """
    p, rank = comm.Get_size(), comm.Get_rank()
    if p < 2:
        return [], {}
    rows = []
    progress = _progress(comm, args, p - 1, "ps")
    for ranks in range(2, p + 1):
        sub = comm.Split(0 if rank < ranks else MPI.UNDEFINED, rank)
        if sub != MPI.COMM_NULL:
            c = mpicomm.Comm(sub)
            report = train(c, _model_cfg(args, mode="ps-sync", servers=1, steps=10), lambda s: None)
            rows.append((ranks - 1, report.bytes_per_step, report.params * 4))
            c.Free()
        comm.Barrier()
        progress.step(f"{ranks - 1} worker(s)")
    if rank != 0:
        return [], {}
    lines = [
        "### Parameter-server bottleneck: the busiest server link (1 server)",
        "",
        "Bytes per step through the server's link (gradients in + weights out, over 10 steps, so the first pull of the "
        "initial weights adds 0.1× the model), counted by the application, next to "
        "what one rank sends in a ring all-reduce of the same gradients, 2(N−1)/N · n (N = workers).",
        "",
        "| workers | server link / step | × gradient size | all-reduce per rank / step | × gradient size |",
        "|---:|---:|---:|---:|---:|",
    ]
    data: dict[str, Any] = {"servers": 1, "rows": []}
    for workers, link, n in rows:
        ar = 2 * (workers - 1) / workers * n if workers > 1 else 0.0
        lines.append(f"| {workers} | {_fmt_bytes(link)} | {link / n:.2f} | {_fmt_bytes(ar)} | {ar / n:.2f} |")
        data["rows"].append({"workers": workers, "server_link_bytes_per_step": link, "gradient_bytes": n,
                             "allreduce_bytes_per_rank_per_step": ar})
    lines.append("")
    return lines, data


def async_part(comm: Any, args: argparse.Namespace, say: Callable[[str], None]) -> tuple[list[str], dict, dict]:
    """ps-sync, ps-async unbounded and ps-async with staleness 2 on digits: accuracy against wall time.

    The table's lines, the figures (rank 0) and the accuracy histories (for ``--plot``).
    """
    p = comm.Get_size()
    if p < 2:
        return [], {}, {}
    runs = [("ps-sync", dict(mode="ps-sync", staleness=0)),
            ("ps-async (unbounded)", dict(mode="ps-async", staleness=None)),
            ("ps-async (staleness 2)", dict(mode="ps-async", staleness=2))]
    histories: dict[str, list] = {}
    lines = [
        f"### Synchronous vs asynchronous parameter server on digits ({p - 1} workers, 1 server, "
        f"{args.async_epochs} epochs, global batch 64)",
        "",
        "| run | wall (s) | final test accuracy | test accuracy after each epoch |",
        "|---|---:|---:|---|",
    ]
    data: dict[str, Any] = {"workers": p - 1, "servers": 1, "epochs": args.async_epochs, "runs": []}
    progress = _progress(comm, args, len(runs), "async")
    for name, kw in runs:
        cfg = Config(data="digits", epochs=args.async_epochs, progress=False, servers=1, **kw)
        _warm_up(comm, cfg)  # the wall time is reported: one-time costs stay out of it
        report = train(comm, cfg, lambda s: None)
        histories[name] = report.history
        if comm.Get_rank() == 0:
            lines.append(f"| {name} | {report.seconds:.2f} | {report.test_accuracy:.4f} | "
                         + ", ".join(f"{r['test_accuracy']:.3f}" for r in report.history) + " |")
            data["runs"].append({"run": name, "seconds": report.seconds, "test_accuracy": report.test_accuracy,
                                 "history": report.history})
        progress.step(name)
    lines.append("")
    return lines, data, histories


def bench(comm: Any, args: argparse.Namespace, say: Callable[[str], None]) -> int:
    parts = [x.strip() for x in args.parts.split(",") if x.strip()]  # checked by check_options
    if os.environ.get("OMP_NUM_THREADS") != "1":
        say("note: OMP_NUM_THREADS is not 1, so NumPy's BLAS may use several cores per rank and the 1-rank and "
            "N-rank figures are not like for like")
    p = comm.Get_size()
    say(f"apps.sgd bench on {p} ranks: {', '.join(parts)}")
    argv = getattr(args, "argv", sys.argv[1:])
    command = json_report.command("python -m apps.sgd", argv, p)
    lines = [f"## apps.sgd bench, {p} ranks ({time.strftime('%Y-%m-%d')})", "", f"Command: `{command}`", ""]
    histories: dict = {}
    figures: dict[str, Any] = {}
    for part in parts:
        say(f"{part}:")
        if part == "scaling":
            more, figures[part] = scaling(comm, args, say)
        elif part == "modes":
            more, figures[part] = modes(comm, args, say)
        elif part == "ps":
            more, figures[part] = ps_links(comm, args, say)
        else:
            more, figures[part], histories = async_part(comm, args, say)
        lines += more
    if comm.Get_rank() == 0:
        text = "\n".join(lines) + "\n"
        print(text)
        if args.out:
            cli.write_out(args.out, text, args.append)
            print(f"wrote {args.out}")
        if args.json:
            results = {"parts": parts, "repeat": args.repeat, "steps": args.steps, "features": args.features,
                       "hidden": list(args.hidden), "batch": args.batch, "algorithm": args.algorithm, **figures}
            cli.write_json(args.json, command, results, ranks=p)
            print(f"wrote {args.json}")
        if args.plot and histories:
            from apps.sgd.plots import curves

            curves(histories, args.plot, title="parameter server: sync vs async on digits")
            print(f"wrote {args.plot}")
    return 0
