"""``mpiexec -n N python -m apps.torchddp bench``: DDP's training step on the mpicomm backend against gloo, one run.

The default process group is mpicomm's; ``dist.new_group(backend="gloo")``
makes a gloo group over the same ranks. For each configuration two identical
models (same seed) are wrapped in DistributedDataParallel, one per group, with
the same bucket cap, optimizer and batch. After ``--warmup`` untimed steps of
each (DDP rebuilds its buckets after the first), ``--repeat`` rounds each time
``--steps`` steps of both, alternating which goes first, so the machine's noise
hits both alike:

* every step trains on the same batch (made once: data making stays out of the
  timing), with plain SGD by default (``--optimizer``);
* steps/s = steps / the slowest rank's time for them, median over the rounds;
* mpicomm / gloo = the median of the rounds' ratios (paired rounds: steadier
  than the ratio of two medians on a busy machine);
* parameters: both models start from the same parameters and take the same
  steps on the same data, so after the warm-up and after every round they must
  be equal — bit for bit when every sum has the same order (two ranks: a + b),
  else within float tolerance (:func:`agreement`); then the gloo model takes the
  mpicomm model's parameters and optimizer state, so rounding differences
  cannot grow over the run (a ReLU that flips on a rounding difference would
  make them grow past any tolerance). The run exits with status 1 if they
  differ beyond it.

Configurations (``--configs``):

* ``mlp`` — MLP 256→1024→1024→10, global batch 256: compute matters;
* ``wide-mlp`` — MLP 256→2048→2048→2048→10 (Ψ ≈ 8.9 M, 36 MiB of fp32
  gradients), global batch 8 (or one sample per rank, if more): many parameters
  for little compute, the all-reduce takes a third to a half of the step;
* ``transformer`` — 4 pre-norm encoder layers, d 256, 4 heads, ff 1024, seq 32,
  vocabulary 1024 (Ψ ≈ 3.4 M), global batch 16.

``--out FILE.md`` writes the table with the command and the machine (an
existing file is kept unless ``--append`` or ``--force``); ``--json FILE``
one row per configuration and backend.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from apps.blocks import block
from mpicomm import cli

from .data import Teacher
from .models import ModelSpec, build, count_parameters
from .train import DTYPES, Config, make_optimizer, train_step

__all__ = ["Preset", "PRESETS", "BACKENDS", "TARGET", "TOLERANCE", "add_options", "check_options", "agreement",
           "bench", "measure"]

#: The process groups compared, in the order of the first round.
BACKENDS = ("mpicomm", "gloo")
#: The goal on the communication-bound configuration: mpicomm's steps/s over gloo's.
TARGET = ("wide-mlp", 1.5)
#: (rtol, atol) of :func:`agreement` per dtype: how far the two backends' updates of a round may differ,
#: relative to the update itself. Sums in another order differ in the last bits, and in float32 a ReLU
#: that flips on such a difference moves one row of a weight matrix by a step's worth: up to about 1 %
#: of a round's update was seen on the models here (4 ranks). A real fault - a bucket not reduced, a
#: wrong divisor - differs by the order of the update itself.
TOLERANCE = {torch.float32: (0.1, 1e-7), torch.float64: (1e-6, 1e-12)}


@dataclass(frozen=True)
class Preset:
    """A benchmark configuration: a model, a global batch, and what it shows."""

    spec: ModelSpec
    batch: int
    shows: str


PRESETS: dict[str, Preset] = {
    "mlp": Preset(ModelSpec("mlp", features=256, hidden=(1024, 1024)), 256, "compute matters"),
    "wide-mlp": Preset(ModelSpec("mlp", features=256, hidden=(2048, 2048, 2048)), 8,
                       "communication-bound: many parameters, a small batch"),
    "transformer": Preset(ModelSpec("transformer", vocab=1024, seq=32, d_model=256, heads=4, layers=4, ff=1024), 16,
                          "a small TransformerEncoder classifier"),
}


def _configs(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [n for n in names if n not in PRESETS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(PRESETS)} (comma-separated)")
    return names


def add_options(p: argparse.ArgumentParser) -> None:
    """The ``bench`` options."""
    p.add_argument("--configs", type=_configs, default=list(PRESETS), metavar="NAME[,NAME…]",
                   help=f"configurations to measure: {', '.join(PRESETS)} (default: all)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per backend and round (default: 10)")
    cli.add_repeat(p, 3, "the measurement (--steps timed steps of each backend, alternating which goes first)")
    cli.renamed(p, "--rounds", "--repeat")
    p.add_argument("--warmup", type=int, default=3, metavar="N",
                   help="untimed steps of each backend before the timed ones (default: 3)")
    p.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd",
                   help="sgd (plain, the cheapest update: the step is mostly forward, backward and all-reduce) or "
                        "adamw (default: sgd)")
    p.add_argument("--lr", type=float, default=0.01, help="learning rate (default: 0.01)")
    p.add_argument("--bucket-mb", type=float, default=25.0, metavar="MIB",
                   help="DDP's bucket_cap_mb for both wrappers (default: 25, PyTorch's)")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="float32", help="(default: float32)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads per rank (default: $OMP_NUM_THREADS, else 1 as torchrun sets)")
    cli.add_out(p, "the table")
    cli.add_json(p, "one row per configuration and backend")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def check_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Usage errors of ``bench`` that need no MPI."""
    cli.at_least(parser, args, 1, "--steps", "--repeat")
    if args.warmup < 1:
        parser.error(f"--warmup must be >= 1, got {args.warmup} (DDP rebuilds its buckets after the first step; "
                     f"that step must not be timed)")
    if not args.lr > 0:
        parser.error(f"--lr must be > 0, got {args.lr:g}")
    if not args.bucket_mb > 0:
        parser.error(f"--bucket-mb must be > 0, got {args.bucket_mb:g}")
    cli.check_out(parser, args)


def agreement(got: list[torch.Tensor], expected: list[torch.Tensor], start: list[torch.Tensor], rtol: float,
              atol: float) -> dict[str, Any]:
    """Whether two models that left *start* together took the same steps: per tensor
    ‖got − expected‖ ≤ atol·√n + rtol·‖expected − start‖ (Euclidean norms); the largest differences.
    """
    max_abs, worst = 0.0, 0.0
    for a, b, s in zip(got, expected, start):
        a, b, s = (t.detach().to(torch.float64) for t in (a, b, s))
        gap = a - b
        max_abs = max(max_abs, float(gap.abs().max()) if gap.numel() else 0.0)
        bound = atol * gap.numel() ** 0.5 + rtol * float((b - s).norm())
        worst = max(worst, float(gap.norm()) / bound if bound else (0.0 if not gap.any() else float("inf")))
    return {"passed": worst <= 1.0, "max_abs_diff": max_abs, "worst_vs_tolerance": worst}


def _slowest(seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def measure(name: str, preset: Preset, groups: dict[str, Any], args: argparse.Namespace,
            progress: cli.Progress) -> list[dict[str, Any]]:
    """One configuration: a row per backend (steps/s of each round, medians, the ratio, the parameter check)."""
    rank, p = dist.get_rank(), dist.get_world_size()
    batch = max(preset.batch, p)  # at least one sample per rank
    dtype = DTYPES[args.dtype]
    cfg = Config(spec=preset.spec, batch=batch, optimizer=args.optimizer, lr=args.lr, momentum=0.0)
    models = {b: build(preset.spec, 0, dtype) for b in BACKENDS}
    ddps = {b: torch.nn.parallel.DistributedDataParallel(models[b], process_group=groups[b],
                                                         bucket_cap_mb=args.bucket_mb) for b in BACKENDS}
    opts = {b: make_optimizer(ddps[b].parameters(), cfg) for b in BACKENDS}
    x, y = Teacher(preset.spec, 0).batch(0, batch, dtype)  # one batch for every step: no data making in the timing
    mine = slice(*block(batch, p, rank))
    xm, ym, scale = x[mine], y[mine], p / batch

    def run(backend: str, steps: int) -> None:
        for _ in range(steps):
            train_step(ddps[backend], opts[backend], xm, ym, scale)

    rtol, atol = TOLERANCE[dtype]
    checks: list[dict[str, Any]] = []
    identical = True
    origin = [q.detach().clone() for q in models["mpicomm"].parameters()]  # where both models left from

    def check_and_align() -> None:
        """Compare the models after the steps just taken, then start both from the mpicomm model's state."""
        nonlocal identical, origin
        ours, theirs = list(models["mpicomm"].parameters()), list(models["gloo"].parameters())
        checks.append(agreement(theirs, ours, origin, rtol, atol))
        identical = identical and all(torch.equal(a, b) for a, b in zip(ours, theirs))
        with torch.no_grad():
            for a, b in zip(theirs, ours):
                a.copy_(b)
        opts["gloo"].load_state_dict(opts["mpicomm"].state_dict())
        origin = [q.detach().clone() for q in ours]

    for b in BACKENDS:
        run(b, args.warmup)
    check_and_align()
    seconds: dict[str, list[float]] = {b: [] for b in BACKENDS}
    for r in range(args.repeat):
        for b in BACKENDS if r % 2 == 0 else BACKENDS[::-1]:
            dist.barrier()
            start = time.perf_counter()
            run(b, args.steps)
            seconds[b].append(_slowest(time.perf_counter() - start))
        check_and_align()
        progress.step(f"{name}: " + ", ".join(f"{b} {args.steps / seconds[b][-1]:.1f} steps/s" for b in BACKENDS))
    passed = all(c["passed"] for c in checks)
    max_abs = max(c["max_abs_diff"] for c in checks)
    worst = max(c["worst_vs_tolerance"] for c in checks)
    ratios = [g / m for m, g in zip(seconds["mpicomm"], seconds["gloo"])]
    rows = []
    for b in BACKENDS:
        rates = [args.steps / s for s in seconds[b]]
        rows.append({
            "config": name, "backend": b, "model": preset.spec.describe(), "parameters": count_parameters(models[b]),
            "global_batch": batch, "steps": args.steps, "repeat": args.repeat,
            "steps_per_s": statistics.median(rates), "steps_per_s_rounds": rates,
            "samples_per_s": statistics.median(rates) * batch,
            "vs_gloo": statistics.median(ratios) if b == "mpicomm" else 1.0,
            "vs_gloo_rounds": ratios if b == "mpicomm" else None,
            "same_parameters": passed, "identical_parameters": identical, "max_abs_diff": max_abs,
            "worst_vs_tolerance": worst,
        })
    return rows


def _table(rows: list[dict[str, Any]]) -> str:
    header = ["config", "Ψ", "global batch", "mpicomm steps/s", "gloo steps/s", "mpicomm / gloo", "mpicomm samples/s",
              "parameters"]
    cells = []
    by = {(r["config"], r["backend"]): r for r in rows}
    for name in dict.fromkeys(r["config"] for r in rows):
        m, g = by[name, "mpicomm"], by[name, "gloo"]
        # no "|" in a cell: it would split the Markdown column
        delta = f"max Δ {m['max_abs_diff']:.1e}"
        same = ("identical" if m["identical_parameters"]
                else f"equal, {delta}" if m["same_parameters"] else f"DIFFER, {delta}")
        cells.append([name, f"{m['parameters'] / 1e6:.2f} M", str(m["global_batch"]), _rate(m), _rate(g),
                      f"{m['vs_gloo']:.2f}×", f"{m['samples_per_s']:,.0f}", same])
    return cli.markdown_table(header, cells)


def _rate(row: dict[str, Any]) -> str:
    rates = row["steps_per_s_rounds"]
    return f"{row['steps_per_s']:.1f} ({min(rates):.1f}–{max(rates):.1f})"


def _notes(rows: list[dict[str, Any]], args: argparse.Namespace, p: int, threads: int) -> list[str]:
    models = {r["config"]: r["model"] for r in rows}
    notes = [
        "Models: " + "; ".join(f"{name} = {model}" for name, model in models.items()) + ".",
        f"DistributedDataParallel (bucket_cap_mb {args.bucket_mb:g}) on the mpicomm backend (the default group) and on "
        f"gloo (`dist.new_group(backend=\"gloo\")`), {p} ranks, {threads} torch thread(s) per rank, {args.dtype}, "
        f"{args.optimizer} lr {args.lr:g}. Each of {args.repeat} rounds times {args.steps} steps of both, alternating "
        f"which goes first, after {args.warmup} untimed steps of each; steps/s = steps / the slowest rank's time, "
        f"median over the rounds (min–max in brackets); mpicomm / gloo = median of the rounds' ratios. "
        f"Parameters: compared after the warm-up and after every round (then the gloo model takes the mpicomm "
        f"model's state): `identical` = equal bit for bit every time; `equal, max Δ` = within float tolerance "
        f"(sums in another order): per tensor, the two updates of a round differ by at most "
        f"{TOLERANCE[DTYPES[args.dtype]][0]:g} × the update's norm; max Δ = the largest element difference seen.",
    ]
    name, goal = TARGET
    target = [r for r in rows if r["config"] == name and r["backend"] == "mpicomm"]
    if target:
        ratio = target[0]["vs_gloo"]
        notes.append(f"Target: mpicomm ≥ {goal}× gloo's steps/s on {name} (communication-bound): "
                     f"{'met' if ratio >= goal else 'missed'} ({ratio:.2f}×).")
    return notes


def bench(args: argparse.Namespace, command: str, settings: dict[str, str], threads: int,
          say: Callable[[str], None]) -> int:
    """Every ``--configs`` configuration; the table on rank 0; status 1 if parameters differ.

    *command* is the command line as the report and the JSON document show it, *settings* the environment
    variables that change what is measured (``MPICOMM_*``, ``MPIR_CVAR_*``, ``OMP_NUM_THREADS``).
    """
    rank, p = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    groups = {"mpicomm": None, "gloo": gloo}  # None: the default group (mpicomm)
    progress = cli.Progress(len(args.configs) * args.repeat, "torchddp bench", show=rank == 0 and not args.quiet)
    rows: list[dict[str, Any]] = []
    for name in args.configs:
        rows += measure(name, PRESETS[name], groups, args, progress)
    if rank != 0:
        return 0 if all(r["same_parameters"] for r in rows) else 1
    table, notes = _table(rows), _notes(rows, args, p, threads)
    say(table)
    say("")
    for note in notes:
        say(note)
    if args.out:
        doc = cli.document(command, rows)
        library = doc["versions"].get("mpi_library", "MPI")
        text = "\n".join([
            f"## apps.torchddp bench, {p} ranks ({doc['date'][:10]})", "",
            f"Command: `{command}`", "",
            f"Machine: {doc['machine']}; {library}; PyTorch {torch.__version__}.", "",
            table, "", *[n + "\n" for n in notes],
        ])
        cli.write_out(args.out, text, args.append)
        say(f"wrote {args.out}")
    if args.json:
        cli.write_json(args.json, command, rows, ranks=p, threads=threads, steps=args.steps, repeat=args.repeat,
                       warmup=args.warmup, dtype=args.dtype, optimizer=args.optimizer, lr=args.lr,
                       bucket_mb=args.bucket_mb, torch=torch.__version__, environment=settings)
        say(f"wrote {args.json}")
    differ = [r["config"] for r in rows if r["backend"] == "mpicomm" and not r["same_parameters"]]
    if differ:
        say(cli.error_line("python -m apps.torchddp bench", f"the mpicomm and gloo models' parameters differ beyond "
                                                            f"float tolerance in {', '.join(differ)}"))
        return 1
    return 0
