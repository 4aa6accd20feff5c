"""The command line of ``python -m apps.torchddp``: ``train`` and ``bench``.

The conventions of :mod:`mpicomm.cli` and :mod:`apps.options`: progress lines
``[i/N]`` on stderr from rank 0, ``--json FILE`` one document (schema, command,
machine, versions, date, results), ``--out FILE.md`` for the benchmark's report
only (an existing one is kept unless ``--append`` or ``--force``), the
checkpoint options every application has (``--checkpoint-dir``, default
``checkpoints/torchddp``, ``--restart``, ``--keep``, ``--checkpoint-every``).
``--dist-backend`` chooses the process group's backend (``--backend`` is the
array module in the other commands). Bad options are usage errors (status 2)
on every rank; what only the run can find out (a global batch smaller than the
ranks, a foreign checkpoint) is reported as ``<prog>: error: rank r of N: …``
by every rank, status 2. ``--check`` failing, or the benchmark's two models
disagreeing, is status 1.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from typing import Any

from mpicomm import cli

__all__ = ["PROG", "parser", "parse", "run", "spec_from", "config_from"]

PROG = "python -m apps.torchddp"

INSTALL = ("pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu (the CPU wheel), then "
           "pip install -e '.[torch]'")

EXAMPLES = """examples:
  mpiexec -n 2 python -m apps.torchddp train                        # the MLP, 200 steps on the mpicomm backend
  mpiexec -n 4 python -m apps.torchddp train --model transformer --steps 300 --check
  mpiexec -n 2 python -m apps.torchddp train --dist-backend gloo --batch 256 --bucket-mb 4 --json run.json
  mpiexec -n 2 python -m apps.torchddp train --checkpoint-every 50 --checkpoint-dir ckpt   # and later, to continue:
  mpiexec -n 2 python -m apps.torchddp train --checkpoint-every 50 --checkpoint-dir ckpt --steps 400 --restart
  mpiexec -n 2 python -m apps.torchddp bench --out jobs/results/torchddp-bench.md --force --json bench.json
"""


def _wrap(text: str) -> str:
    """A description paragraph wrapped to the terminal's usual width (the examples keep their own lines)."""
    return textwrap.fill(" ".join(text.split()), 79)


def _train_options(t: argparse.ArgumentParser) -> None:
    from apps import options

    g = t.add_argument_group("model (a fixed random teacher labels the synthetic data: see --help's description)")
    g.add_argument("--model", choices=("mlp", "transformer"), default="mlp",
                   help="mlp: Linear+ReLU layers on Gaussian features; transformer: a TransformerEncoder "
                        "classifier over token sequences (default: mlp)")
    g.add_argument("--classes", type=int, default=10, help="classes of the teacher and the model (default: 10)")
    g.add_argument("--features", type=int, default=32, help="mlp: input features (default: 32)")
    g.add_argument("--hidden", type=options.hidden_widths, default=(256, 256), metavar="W[,W…]",
                   help="mlp: the width of each hidden layer (default: 256,256)")
    g.add_argument("--vocab", type=int, default=256, help="transformer: vocabulary size (default: 256)")
    g.add_argument("--seq", type=int, default=32, help="transformer: tokens per sequence (default: 32)")
    g.add_argument("--d-model", type=int, default=64, help="transformer: width (default: 64)")
    g.add_argument("--heads", type=int, default=4, help="transformer: attention heads (default: 4)")
    g.add_argument("--layers", type=int, default=2, help="transformer: encoder layers (default: 2)")
    g.add_argument("--ff", type=int, default=256, help="transformer: feed-forward width (default: 256)")
    g = t.add_argument_group("optimization")
    g.add_argument("--steps", type=int, default=200,
                   help="optimizer steps in all, resumed ones included (default: 200)")
    g.add_argument("--batch", type=int, default=64,
                   help="GLOBAL batch per step, split over the ranks in contiguous blocks (default: 64)")
    g.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw",
                   help="adamw, or sgd with --momentum (default: adamw)")
    g.add_argument("--lr", type=float, default=None, help="learning rate (default: 0.001 for adamw, 0.05 for sgd)")
    g.add_argument("--momentum", type=float, default=0.9, help="sgd momentum (default: 0.9)")
    g.add_argument("--weight-decay", type=float, default=0.0, help="(default: 0)")
    g.add_argument("--dtype", choices=("float32", "float64"), default=None,
                   help="parameters and inputs (default: float32; float64 with --check)")
    g.add_argument("--seed", type=int, default=0, help="model initialisation and the sample streams (default: 0)")
    g = t.add_argument_group("communication")
    g.add_argument("--dist-backend", choices=("mpicomm", "gloo"), default="mpicomm",
                   help="the torch.distributed backend of the default process group: mpicomm (mpicomm's "
                        "collectives) or gloo (PyTorch's; rank and rendezvous still come from MPI) (default: mpicomm)")
    cli.renamed(g, "--backend", "--dist-backend", "the process group's backend; --backend is the array module "
                                                  "in the other commands")
    g.add_argument("--bucket-mb", type=float, default=25.0, metavar="MIB",
                   help="DDP's bucket_cap_mb: gradients are all-reduced in buckets of this size (default: 25)")
    g.add_argument("--threads", type=int, default=None,
                   help="torch threads per rank (default: $OMP_NUM_THREADS, else 1 as torchrun sets)")
    g = t.add_argument_group("run")
    g.add_argument("--eval-samples", type=int, default=1024, metavar="N",
                   help="held-out samples scored at the end (default: 1024)")
    cli.renamed(g, "--eval", "--eval-samples", "--eval-every K is a rhythm in apps.sgd")
    g.add_argument("--check", action="store_true",
                   help="train in float64, then compare the parameters with one process (rank 0) trained on the "
                        "whole global batch from the same initial parameters on the same data; exit status 1 if "
                        "they differ beyond float64 summation-order tolerance (per tensor: max |difference| <= "
                        "1e-8 x its largest magnitude). Rank 0 retrains the whole run alone for it: about p times "
                        "the training's compute")
    options.add_checkpoint_options(
        g, "torchddp", every="save model and optimizer state every K steps and at the end, to "
                             "DIR/torchddp-<step>.ckpt, atomically, with a SHA-256 verified on load (default: 0, never)",
        restart="continue from the newest valid checkpoint in --checkpoint-dir, bit for bit as if never stopped (at "
                "the same rank count); start at step 0 if there is none yet. A checkpoint of another model, "
                "optimizer, batch, seed or dtype is refused on every rank")
    cli.renamed(g, "--checkpoint", "--checkpoint-dir")
    cli.renamed(g, "--resume", "--restart")
    g.add_argument("--progress-every", type=int, default=None, metavar="K",
                   help="a progress line every K steps (default: about ten lines)")
    cli.renamed(g, "--log-every", "--progress-every", "--log names a metrics file in apps.sgd and apps.pipeline")
    g.add_argument("--quiet", action="store_true", help="no progress lines")
    cli.add_json(g, "the settings and the run's report")
    g.add_argument("--plot", metavar="FILE.png", default=None,
                   help="train loss and accuracy of each progress interval against step and wall time (rank 0)")


def parser() -> argparse.ArgumentParser:
    """The command line's parser, with its ``train`` and ``bench`` sub-commands (:func:`parse` checks the values)."""
    parser = cli.Parser(
        prog=PROG,
        description=_wrap("PyTorch DistributedDataParallel on the mpicomm torch.distributed backend "
                          "(import mpicomm.torch; dist.init_process_group('mpicomm')), under mpiexec or srun."),
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{train,bench}")
    t = sub.add_parser(
        "train", help="train an MLP or a Transformer with DDP (under mpiexec)", epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=_wrap("Train with torch.nn.parallel.DistributedDataParallel on synthetic data that a fixed "
                          "random teacher network labels (so loss and accuracy mean something): mlp - Gaussian "
                          "features; transformer - token sequences labelled by their bag of tokens. Every rank makes "
                          "the same global batch from (seed, step) and trains on its block; progress on stderr "
                          "(rank 0), a summary (loss, accuracy, steps/s, samples/s) on stdout."))
    _train_options(t)
    b = sub.add_parser(
        "bench", help="DDP's training step on mpicomm against gloo, in the same run (under mpiexec)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=_wrap("DDP's training step with the mpicomm backend (the default group) against gloo "
                          "(dist.new_group(backend='gloo')) in the same run: two identical models, one DDP wrapper "
                          "per group, interleaved rounds; steps/s of each, the ratio, and a check that both end with "
                          "the same parameters (status 1 otherwise). In the same rounds, the control: the same step "
                          "of a model without DDP (compute alone) plus the MPI library's own MPI_Allreduce of DDP's "
                          "buckets (mpi4py), each timed alone; each backend's step time over the control's (the "
                          "target: at most 1.0 in the default progress mode). Configurations: mlp (MLP "
                          "256-1024-1024-10, "
                          "global batch 256), wide-mlp (MLP 256-2048-2048-2048-10, global batch 8: "
                          "communication-bound), transformer (4 layers, d 256, seq 32, global batch 16)."),
        epilog="example:\n  mpiexec -n 2 python -m apps.torchddp bench --out bench.md --json bench.json\n")
    _bench_options(b)
    return parser


def parse(argv: list[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The parsed command line; usage errors exit with status 2 (argparse's)."""
    top = parser()
    args = top.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # for the command line in --json and --out
    own = cli.subparser(top, args.command)
    if args.command == "train":
        _check_train(own, args)
    else:
        _check_bench(own, args)
    cli.at_least(own, args, 1, "--threads")
    if args.json and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
        own.error(f"--json {args.json}: its directory does not exist")
    return top, args


def _bench_options(b: argparse.ArgumentParser) -> None:
    try:
        from apps.torchddp.bench import add_options
    except ImportError as exc:  # PyTorch missing: the options need its models
        b.set_defaults(missing=str(exc))
        return
    add_options(b)


def _check_bench(b: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if getattr(args, "missing", None):
        b.error(f"PyTorch is not importable ({args.missing}): {INSTALL}")
    from apps.torchddp.bench import check_options

    check_options(b, args)


def _check_train(t: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    from apps import options

    cli.at_least(t, args, 1, "--steps", "--batch", "--progress-every", "--eval-samples")
    if args.lr is not None and not args.lr > 0:
        t.error(f"--lr must be > 0, got {args.lr:g}")
    if not args.bucket_mb > 0:
        t.error(f"--bucket-mb must be > 0, got {args.bucket_mb:g}")
    cli.at_least(t, args, 0, "--momentum", "--weight-decay")
    options.check_checkpoint_options(t, args)
    cli.refuse_unless(t, args, args.model == "mlp", "--model mlp", "--features", "--hidden")
    cli.refuse_unless(t, args, args.model == "transformer", "--model transformer", "--vocab", "--seq", "--d-model",
                      "--heads", "--layers", "--ff")
    cli.refuse_unless(t, args, args.optimizer == "sgd", "--optimizer sgd", "--momentum")
    if args.check and args.dtype == "float32":
        t.error("--check compares in float64 (float32 rounding would hide or fake a difference): drop --dtype float32")
    args.dtype = args.dtype or ("float64" if args.check else "float32")
    try:
        spec_from(args)
    except ValueError as exc:
        t.error(str(exc))
    except ImportError as exc:
        t.error(f"PyTorch is not importable ({exc}): {INSTALL}")


def spec_from(args: argparse.Namespace) -> Any:
    """The :class:`~apps.torchddp.models.ModelSpec` of ``train``'s options."""
    from apps.torchddp.models import ModelSpec

    return ModelSpec(kind=args.model, classes=args.classes, features=args.features, hidden=args.hidden,
                     vocab=args.vocab, seq=args.seq, d_model=args.d_model, heads=args.heads, layers=args.layers,
                     ff=args.ff)


def config_from(args: argparse.Namespace) -> Any:
    """The :class:`~apps.torchddp.train.Config` of ``train``'s options."""
    from apps.torchddp.train import Config

    return Config(spec=spec_from(args), backend=args.dist_backend, steps=args.steps, batch=args.batch,
                  optimizer=args.optimizer, lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay,
                  bucket_mb=args.bucket_mb, dtype=args.dtype, seed=args.seed, eval_samples=args.eval_samples,
                  check=args.check, checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
                  keep=args.keep, restart=args.restart, log_every=args.progress_every, progress=not args.quiet)


def _threads(requested: int | None) -> int:
    """``--threads``, else ``$OMP_NUM_THREADS``, else 1 (torchrun's default for several processes per node)."""
    if requested:
        return requested
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "1")))
    except ValueError:
        return 1


def run(argv: list[str] | None = None) -> int:
    """Parse, start the process group, run the command; every rank exits with the same status."""
    from apps import options
    from apps import report as json_report
    from mpicomm.runtime import exit_together

    parser, args = options.parse_or_exit(parse, argv)
    settings = json_report.environment()  # as the user set it (importing mpicomm.torch adds variables of its own)
    import torch
    import torch.distributed as dist

    import mpicomm.torch  # noqa: F401 - starts MPI, registers the backend, fills RANK, WORLD_SIZE, MASTER_ADDR/PORT
    from apps.torchddp.checkpoint import CheckpointError

    threads = _threads(args.threads)
    torch.set_num_threads(threads)
    dist.init_process_group(args.dist_backend if args.command == "train" else "mpicomm")
    rank, p = dist.get_rank(), dist.get_world_size()
    prog = f"{PROG} {args.command}"

    def say(text: str) -> None:
        if rank == 0:
            print(text, flush=True)

    try:
        if args.command == "bench":
            from apps.torchddp.bench import bench

            code = bench(args, json_report.command(PROG, args.argv, p, settings), settings, threads, say)
        else:
            code = _train(args, settings, threads, say)
    except (ValueError, CheckpointError) as exc:
        # The same settings and the same broadcast verdicts give the same error on every rank.
        _finish()
        options.exit_error(prog, str(exc), rank, p)
    _finish()
    if code:
        exit_together(code)
    return 0


def _finish() -> None:
    """Destroy the process groups, then let gloo's worker threads release their last work objects.

    A gloo worker thread drops its reference to a finished work just after
    completing it, and that work's saved thread-local state holds a Python
    object: releasing it takes the GIL. If the main thread reaches interpreter
    shutdown first, the worker's GIL request ends its thread from inside a C++
    destructor and the process aborts ("terminate called without an active
    exception", SIGABRT: in about one run in ten here, with DDP on gloo;
    pytorch/pytorch#179291 describes the same race). Sleeping releases the
    GIL, so those releases happen now, while the interpreter is whole.
    """
    import time

    import torch.distributed as dist

    dist.destroy_process_group()
    time.sleep(0.05)


def _train(args: argparse.Namespace, settings: dict[str, str], threads: int, say: Any) -> int:
    import torch
    import torch.distributed as dist

    from apps import report as json_report
    from apps.torchddp.train import train

    cfg = config_from(args)
    p = dist.get_world_size()
    if cfg.batch < p:
        raise ValueError(f"--batch {cfg.batch}: the global batch is smaller than the {p} ranks; give at least {p}")
    from mpi4py import MPI

    from apps.blocks import blocks
    from apps.torchddp.sizes import check as check_memory

    check_memory(MPI.COMM_WORLD, cfg, p)  # before anything is allocated: the same verdict on every rank
    counts, _ = blocks(cfg.batch, p)
    per_rank = f"{counts[0]} per rank" if counts[0] == counts[-1] else f"{counts[-1]}-{counts[0]} per rank"
    say(f"apps.torchddp train: {cfg.spec.describe()} on {p} ranks, backend {cfg.backend}, global batch {cfg.batch} "
        f"({per_rank}), {cfg.optimizer} lr {cfg.learning_rate:g}, {cfg.dtype}, bucket_cap_mb {cfg.bucket_mb:g}, "
        f"{threads} thread(s) per rank")
    report = train(cfg, say)
    trained = report.steps - report.start_step
    say(f"done: {trained} steps in {cli.format_time(report.seconds)}: {report.steps_per_s:,.1f} steps/s, "
        f"{report.samples_per_s:,.0f} samples/s; Ψ = {report.parameters:,} parameters")
    if trained:
        say(f"train loss {report.train_loss:.4f}, accuracy {report.train_accuracy:.3f} (the last progress interval); "
            f"eval loss {report.eval_loss:.4f}, accuracy {report.eval_accuracy:.3f} on {cfg.eval_samples:,} held-out "
            f"samples (chance {1 / cfg.spec.classes:.3f})")
    else:
        say(f"eval loss {report.eval_loss:.4f}, accuracy {report.eval_accuracy:.3f} on {cfg.eval_samples:,} held-out "
            f"samples")
    say(f"parameter digest {report.digest}")
    if report.checkpoint:
        say(f"checkpoint: {report.checkpoint} (step {report.steps})")
    code = 0
    if report.check is not None:
        c = report.check
        if c["passed"]:
            say(f"check: PASS - the parameters equal one process's on the whole global batch (float64, "
                f"{c['tensors']} tensors, max |Δ| {c['max_abs_diff']:.2e}, within rtol {c['rtol']:g} "
                f"atol {c['atol']:g})")
        else:
            why = c.get("reason") or (f"max |Δ| {c['max_abs_diff']:.3e}, {c['worst_vs_tolerance']:.3g}× the "
                                      f"tolerance (rtol {c['rtol']:g}, atol {c['atol']:g})")
            say(f"check: FAIL - the parameters differ from one process's on the whole global batch: {why}")
            code = 1
    if args.json and dist.get_rank() == 0:
        from dataclasses import asdict

        config = {**{k: v for k, v in asdict(cfg).items() if k != "spec"}, **cfg.spec.identity(),
                  "lr": cfg.learning_rate, "threads": threads}
        json_report.write_json(args.json, PROG, args.argv, p, {"config": config, "report": asdict(report)},
                               settings=settings, environment=settings, torch=torch.__version__)
        say(f"wrote {args.json}")
    if args.plot and dist.get_rank() == 0:
        from apps.sgd.plots import curves

        curves({cfg.spec.kind: report.history}, args.plot, title=f"apps.torchddp train: {cfg.spec.describe()}")
        say(f"wrote {args.plot}")
    return code
