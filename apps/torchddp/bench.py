"""``mpiexec -n N python -m apps.torchddp bench``: DDP's training step on the mpicomm backend against gloo, one run.

The default process group is mpicomm's; ``dist.new_group(backend="gloo")``
makes a gloo group over the same ranks. For each configuration two identical
models (same seed) are wrapped in DistributedDataParallel, one per group, with
the same bucket cap, optimizer and batch; beside them, the control's two parts
(below). After ``--warmup`` untimed steps of each (DDP rebuilds its buckets in
the second step's forward, so at least two), ``--repeat`` rounds each time
``--steps`` steps of every variant, reversing their order every other round, so
the machine's noise hits all alike:

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

The control, measured in the same rounds (``VARIANTS``), is the sum of two
parts, each timed alone, per step:

* **compute alone** — the same step (forward, backward, optimizer step, same
  block of the same batch) of a third identical model *not* wrapped in DDP: no
  communication at all. It takes the mpicomm model's parameters and optimizer
  state after every round too, so it follows the same trajectory;
* **the library's reduction of the same bytes** — ``MPI.COMM_WORLD.Allreduce
  (MPI.IN_PLACE, buf)`` (mpi4py: the MPI library's own ``MPI_Allreduce``) on
  one buffer per DDP bucket, of the bucket's size and dtype, one after another,
  as DDP reduces them (the buckets as DDP rebuilt them, read after the warm-up
  through its reducer; one flat buffer of every gradient if that fails: the
  JSON says which, ``allreduce_of``). The buffers hold zeros: the sum's speed
  does not depend on the values, and zeros stay zero over repeated in-place
  sums (growing values would end in infinities).

``step / control`` (mpicomm's and gloo's: the median of the rounds' ratios of
the step time to that round's compute + all-reduce) is the issue's target
(≤ 1.0 with ``MPICOMM_TORCH_PROGRESS`` at its default; the run records the
mode, ``sync`` is measured the same way). Why the control is the floor that
overlap must reach: a backend that added nothing to the MPI library's own
reduction and overlapped nothing would take exactly compute + all-reduce per
step. Everything DDP and a real backend add (copies into the buckets, hooks,
Python, dispatch, a progress thread) makes the step longer; only overlapping
the buckets' reductions with backward makes it shorter. A ratio ≤ 1.0
therefore says the overlap wins back at least everything they cost; the most
it could win is bounded by perfect overlap, max(compute, all-reduce). gloo's
ratio is the same measure of PyTorch's own backend.

Configurations (``--configs``):

* ``mlp`` — MLP 256→1024→1024→10, global batch 256: compute matters;
* ``wide-mlp`` — MLP 256→2048→2048→2048→10 (Ψ ≈ 8.9 M, 36 MiB of fp32
  gradients), global batch 8 (or one sample per rank, if more): many parameters
  for little compute, the all-reduce takes a third to a half of the step;
* ``transformer`` — 4 pre-norm encoder layers, d 256, 4 heads, ff 1024, seq 32,
  vocabulary 1024 (Ψ ≈ 3.4 M), global batch 16.

``--out FILE.md`` writes the table with the command and the machine (an
existing file is kept unless ``--append`` or ``--force``); ``--json FILE``
one row per configuration and backend, each with its configuration's control.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

from apps.blocks import block
from mpicomm import cli, config

from .data import Teacher
from .models import ModelSpec, build, count_parameters
from .train import DTYPES, Config, make_optimizer, train_step

__all__ = ["Preset", "PRESETS", "BACKENDS", "VARIANTS", "TARGET", "CONTROL_TARGET", "TOLERANCE", "MIN_WARMUP",
           "add_options", "check_options", "agreement", "reduction_buffers", "bench", "measure"]

#: The process groups compared.
BACKENDS = ("mpicomm", "gloo")
#: What each round times, in the order of the first round (the next reverses it): the two DDP steps, then the
#: control's parts - the step of a model without DDP, and the MPI library's all-reduce of DDP's buckets.
VARIANTS = (*BACKENDS, "compute", "allreduce")
#: The goal on the communication-bound configuration: mpicomm's steps/s over gloo's.
TARGET = ("wide-mlp", 1.5)
#: The goal on every configuration, in the default progress mode: mpicomm's step time over the control's
#: (compute alone + the library's MPI_Allreduce of the same buckets) at most this.
CONTROL_TARGET = 1.0
#: Untimed steps at least: DDP reduces every gradient in one bucket in the first step and rebuilds its buckets
#: in the second one's forward; the control all-reduces the rebuilt buckets.
MIN_WARMUP = 2
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
    p.add_argument("--steps", type=int, default=10, help="timed steps per variant and round (default: 10)")
    cli.add_repeat(p, 3, "the measurement (--steps timed steps of each variant - mpicomm, gloo, compute alone, "
                         "MPI_Allreduce of the buckets - in the reverse order every other round)")
    cli.renamed(p, "--rounds", "--repeat")
    p.add_argument("--warmup", type=int, default=3, metavar="N",
                   help=f"untimed steps (or all-reduces) of each variant before the timed ones, at least "
                        f"{MIN_WARMUP} (default: 3)")
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
    if args.warmup < MIN_WARMUP:
        parser.error(f"--warmup must be >= {MIN_WARMUP}, got {args.warmup} (DDP rebuilds its buckets in the second "
                     f"step; neither of the first two steps may be timed)")
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


def reduction_buffers(ddp: torch.nn.parallel.DistributedDataParallel) -> tuple[list[np.ndarray], str]:
    """The buffers the control all-reduces, and what they are: one of zeros per DDP bucket, of its size and dtype
    (``"DDP's buckets"``), else - when the reducer does not show its buckets - one flat buffer with as many
    elements as the gradients (``"one flat buffer"``).

    The buckets are read from DDP's reducer (``_get_zeros_like_grad_buckets``, which DDP's own communication
    hooks use): the buckets as they are now, so after DDP rebuilt them (the second step).
    """
    params = [q for q in ddp.module.parameters() if q.requires_grad]
    total = sum(q.numel() for q in params)
    try:
        buckets = [b.buffer() for b in ddp.reducer._get_zeros_like_grad_buckets()]
    except (AttributeError, RuntimeError):  # a PyTorch without it
        buckets = []
    if buckets and sum(b.numel() for b in buckets) == total:
        return [b.detach().contiguous().numpy() for b in buckets], "DDP's buckets"
    return [torch.zeros(total, dtype=params[0].dtype).numpy()], "one flat buffer"


def measure(name: str, preset: Preset, groups: dict[str, Any], args: argparse.Namespace,
            progress: cli.Progress) -> list[dict[str, Any]]:
    """One configuration: a row per backend (steps/s of each round, medians, the ratios to gloo and to the control,
    the control's parts, the parameter check)."""
    rank, p = dist.get_rank(), dist.get_world_size()
    batch = max(preset.batch, p)  # at least one sample per rank
    dtype = DTYPES[args.dtype]
    cfg = Config(spec=preset.spec, batch=batch, optimizer=args.optimizer, lr=args.lr, momentum=0.0)
    models = {v: build(preset.spec, 0, dtype) for v in (*BACKENDS, "compute")}
    ddps = {b: torch.nn.parallel.DistributedDataParallel(models[b], process_group=groups[b],
                                                         bucket_cap_mb=args.bucket_mb) for b in BACKENDS}
    trained: dict[str, torch.nn.Module] = {**ddps, "compute": models["compute"]}  # compute: no DDP, no communication
    opts = {v: make_optimizer(trained[v].parameters(), cfg) for v in trained}
    x, y = Teacher(preset.spec, 0).batch(0, batch, dtype)  # one batch for every step: no data making in the timing
    mine = slice(*block(batch, p, rank))
    xm, ym, scale = x[mine], y[mine], p / batch
    world = MPI.COMM_WORLD
    buffers: list[np.ndarray] = []  # the control's all-reduces: DDP's buckets once rebuilt (after the warm-up)

    def run(variant: str, steps: int) -> None:
        if variant == "allreduce":
            for _ in range(steps):
                for buf in buffers:
                    world.Allreduce(MPI.IN_PLACE, buf)
            return
        for _ in range(steps):
            train_step(trained[variant], opts[variant], xm, ym, scale)

    rtol, atol = TOLERANCE[dtype]
    checks: list[dict[str, Any]] = []
    identical = True
    origin = [q.detach().clone() for q in models["mpicomm"].parameters()]  # where both models left from

    def check_and_align() -> None:
        """Compare the models after the steps just taken, then start every model from the mpicomm model's state."""
        nonlocal identical, origin
        ours, theirs = list(models["mpicomm"].parameters()), list(models["gloo"].parameters())
        checks.append(agreement(theirs, ours, origin, rtol, atol))
        identical = identical and all(torch.equal(a, b) for a, b in zip(ours, theirs))
        for other in ("gloo", "compute"):
            with torch.no_grad():
                for a, b in zip(models[other].parameters(), ours):
                    a.copy_(b)
            # a copy: load_state_dict keeps the very tensors it is given (AdamW's moments and step count), and
            # two optimizers sharing them would each advance the other's state
            opts[other].load_state_dict(copy.deepcopy(opts["mpicomm"].state_dict()))
        origin = [q.detach().clone() for q in ours]

    for v in (*BACKENDS, "compute"):
        run(v, args.warmup)
    found, reduced = reduction_buffers(ddps["mpicomm"])
    buffers.extend(found)
    run("allreduce", args.warmup)
    check_and_align()
    seconds: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in range(args.repeat):
        for v in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
            dist.barrier()
            start = time.perf_counter()
            run(v, args.steps)
            seconds[v].append(_slowest(time.perf_counter() - start))
        check_and_align()
        progress.step(f"{name}: " + ", ".join(f"{b} {args.steps / seconds[b][-1]:.1f} steps/s"
                                              for b in (*BACKENDS, "compute"))
                      + f", MPI_Allreduce {cli.format_time(seconds['allreduce'][-1] / args.steps)}/step")
    passed = all(c["passed"] for c in checks)
    max_abs = max(c["max_abs_diff"] for c in checks)
    worst = max(c["worst_vs_tolerance"] for c in checks)
    ratios = [g / m for m, g in zip(seconds["mpicomm"], seconds["gloo"])]
    per_step = {v: [s / args.steps for s in seconds[v]] for v in VARIANTS}
    control = [c + a for c, a in zip(per_step["compute"], per_step["allreduce"])]
    compute_rates = [1 / s for s in per_step["compute"]]
    rows = []
    for b in BACKENDS:
        rates = [1 / s for s in per_step[b]]
        vs_control = [s / c for s, c in zip(per_step[b], control)]
        rows.append({
            "config": name, "backend": b, "model": preset.spec.describe(), "parameters": count_parameters(models[b]),
            "global_batch": batch, "steps": args.steps, "repeat": args.repeat,
            "steps_per_s": statistics.median(rates), "steps_per_s_rounds": rates,
            "samples_per_s": statistics.median(rates) * batch,
            "vs_gloo": statistics.median(ratios) if b == "mpicomm" else 1.0,
            "vs_gloo_rounds": ratios if b == "mpicomm" else None,
            "vs_control": statistics.median(vs_control), "vs_control_rounds": vs_control,
            "control_s": statistics.median(control), "control_s_rounds": control,
            "compute_steps_per_s": statistics.median(compute_rates), "compute_steps_per_s_rounds": compute_rates,
            "allreduce_s": statistics.median(per_step["allreduce"]), "allreduce_s_rounds": per_step["allreduce"],
            "allreduce_of": reduced, "allreduce_counts": [int(buf.size) for buf in buffers],
            "same_parameters": passed, "identical_parameters": identical, "max_abs_diff": max_abs,
            "worst_vs_tolerance": worst,
        })
    return rows


def _table(rows: list[dict[str, Any]]) -> str:
    header = ["config", "Ψ", "global batch", "mpicomm steps/s", "gloo steps/s", "compute steps/s",
              "MPI_Allreduce per step", "mpicomm / gloo", "mpicomm step / control", "gloo step / control",
              "mpicomm samples/s", "parameters"]
    cells = []
    by = {(r["config"], r["backend"]): r for r in rows}
    for name in dict.fromkeys(r["config"] for r in rows):
        m, g = by[name, "mpicomm"], by[name, "gloo"]
        # no "|" in a cell: it would split the Markdown column
        delta = f"max Δ {m['max_abs_diff']:.1e}"
        same = ("identical" if m["identical_parameters"]
                else f"equal, {delta}" if m["same_parameters"] else f"DIFFER, {delta}")
        buffers = len(m["allreduce_counts"])
        of = f"{buffers} bucket{'s' if buffers > 1 else ''}" if m["allreduce_of"] == "DDP's buckets" else "flat"
        cells.append([name, f"{m['parameters'] / 1e6:.2f} M", str(m["global_batch"]), _rate(m), _rate(g),
                      _rate(m, "compute_steps_per_s"), f"{cli.format_time(m['allreduce_s'])} ({of})",
                      f"{m['vs_gloo']:.2f}×", f"{m['vs_control']:.2f}", f"{g['vs_control']:.2f}",
                      f"{m['samples_per_s']:,.0f}", same])
    return cli.markdown_table(header, cells)


def _rate(row: dict[str, Any], key: str = "steps_per_s") -> str:
    """The median steps/s of *key*, (min–max) over the rounds."""
    rates = row[f"{key}_rounds"]
    return f"{row[key]:.1f} ({min(rates):.1f}–{max(rates):.1f})"


def _notes(rows: list[dict[str, Any]], args: argparse.Namespace, p: int, threads: int, mode: str) -> list[str]:
    models = {r["config"]: r["model"] for r in rows}
    notes = [
        "Models: " + "; ".join(f"{name} = {model}" for name, model in models.items()) + ".",
        f"DistributedDataParallel (bucket_cap_mb {args.bucket_mb:g}) on the mpicomm backend (the default group) and on "
        f"gloo (`dist.new_group(backend=\"gloo\")`), {p} ranks, {threads} torch thread(s) per rank, {args.dtype}, "
        f"{args.optimizer} lr {args.lr:g}, `MPICOMM_TORCH_PROGRESS={mode}`. Each of {args.repeat} rounds times "
        f"{args.steps} steps of every variant (mpicomm, gloo, compute alone, MPI_Allreduce), in the reverse order "
        f"every other round, after {args.warmup} untimed ones of each; steps/s = steps / the slowest rank's time, "
        f"median over the rounds (min–max in brackets); mpicomm / gloo = median of the rounds' ratios. "
        f"Parameters: compared after the warm-up and after every round (then the gloo model takes the mpicomm "
        f"model's state): `identical` = equal bit for bit every time; `equal, max Δ` = within float tolerance "
        f"(sums in another order): per tensor, the two updates of a round differ by at most "
        f"{TOLERANCE[DTYPES[args.dtype]][0]:g} × the update's norm; max Δ = the largest element difference seen.",
        "Control = compute alone + MPI_Allreduce, per step, timed in the same rounds: compute alone = the same step "
        "(forward, backward, optimizer) of an identical model without DDP, no communication; MPI_Allreduce = "
        "`MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, buf)` (the MPI library's own, through mpi4py) on one buffer per "
        "DDP bucket (\"flat\": one buffer of every gradient), one after another; step / control = median of the "
        "rounds' ratios of the step's time to that round's control. A backend that added nothing to the library's "
        "reduction and overlapped nothing would take the control: below 1.00, overlapping the buckets' reductions "
        "with backward wins back more than the backend adds.",
    ]
    name, goal = TARGET
    target = [r for r in rows if r["config"] == name and r["backend"] == "mpicomm"]
    if target:
        ratio = target[0]["vs_gloo"]
        notes.append(f"Target: mpicomm ≥ {goal}× gloo's steps/s on {name} (communication-bound): "
                     f"{'met' if ratio >= goal else 'missed'} ({ratio:.2f}×).")
    mine = {r["config"]: r["vs_control"] for r in rows if r["backend"] == "mpicomm"}
    missed = [n for n, ratio in mine.items() if ratio > CONTROL_TARGET]
    ratios = ", ".join(f"{n} {ratio:.2f}" for n, ratio in mine.items())
    verdict = f"missed on {', '.join(missed)} ({ratios})" if missed else f"met ({ratios})"
    if mode != "async":
        verdict += f"; this run is `MPICOMM_TORCH_PROGRESS={mode}`, the target is the default mode's"
    notes.append(f"Target: mpicomm's step ≤ {CONTROL_TARGET:.1f} × the control with `MPICOMM_TORCH_PROGRESS` at its "
                 f"default (async), on every configuration: {verdict}.")
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
    mode = config.torch_progress()  # how the backend completes DDP's all-reduces: async (default) or sync
    table, notes = _table(rows), _notes(rows, args, p, threads, mode)
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
                       bucket_mb=args.bucket_mb, progress=mode, torch=torch.__version__, environment=settings)
        say(f"wrote {args.json}")
    differ = [r["config"] for r in rows if r["backend"] == "mpicomm" and not r["same_parameters"]]
    if differ:
        say(cli.error_line("python -m apps.torchddp bench", f"the mpicomm and gloo models' parameters differ beyond "
                                                            f"float tolerance in {', '.join(differ)}"))
        return 1
    return 0
