"""The command line of the SGD application: ``train``, ``bench`` and ``plot``.

The conventions of :mod:`mpicomm.cli` and :mod:`apps.options`: sizes as 4096,
64K, 64KiB, 1M or 1e6 (``--bucket``); ``--json FILE`` writes one document
(schema, command, machine, versions, date, results); ``--out`` is the
benchmark's Markdown report only (an existing one is kept unless ``--append`` or
``--force``); ``--plot FILE.png`` draws; the checkpoint options are every
application's (``--checkpoint-dir``, default ``checkpoints/sgd``). Settings are
checked before the work starts; what depends on the ranks (the batch against the
workers, the data, memory) once it has, with the same verdict on every rank.
"""

from __future__ import annotations

import argparse
import csv
import sys
from typing import Any

from mpicomm import cli

PROG = "python -m apps.sgd"

EXAMPLES = """examples:
  mpiexec -n 2 python -m apps.sgd train                                  # DDP on digits, >= 95 % test accuracy
  mpiexec -n 4 python -m apps.sgd train --mode zero2 --optimizer adamw
  mpiexec -n 3 python -m apps.sgd train --mode ps-async --servers 1 --staleness 2
  mpiexec -n 4 python -m apps.sgd train --mode ps-sync --servers colocated   # every rank serves a shard
  mpiexec -n 2 python -m apps.sgd train --no-overlap --bucket 1M --log metrics.csv --plot curves.png --json run.json
  mpiexec -n 2 python -m apps.sgd train --checkpoint-every 20 --checkpoint-dir ckpt   # and after a crash:
  mpiexec -n 2 python -m apps.sgd train --checkpoint-every 20 --checkpoint-dir ckpt --restart
  mpiexec -n 2 python -m apps.sgd bench --out jobs/results/sgd-bench.md --force --json sgd-bench.json
  python -m apps.sgd plot a.csv b.csv --plot curves.png
"""


def _staleness(text: str) -> int | None:
    if text.lower() in ("none", "inf", "unbounded"):
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer >= 0, or 'none' (unbounded)") from None


def _servers(text: str) -> int:
    """``--servers``: K dedicated servers, or 0 / ``colocated`` (every rank serves a shard: apps.sgd.ps.COLOCATED)."""
    if text.lower() in ("colocated", "co-located"):
        return 0
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of servers K >= 1, or 0 / 'colocated' "
                                         f"(every rank serves one shard)") from None


def add_model_options(p: argparse.ArgumentParser) -> None:
    """Options shared by ``train`` and ``bench``: model, data, optimizer, communication."""
    from apps import options
    from apps.sgd.train import Config

    d = Config()
    g = p.add_argument_group("data and model")
    g.add_argument("--data", choices=("digits", "teacher", "file"), default=d.data,
                   help="digits: scikit-learn's bundled 8x8 digits (1437 train / 360 test); teacher: synthetic "
                        "samples labelled by a fixed random network, each rank generating only its share; "
                        f"file: --data-file (default: {d.data})")
    g.add_argument("--data-file", metavar="NPZ", default=None,
                   help="--data file: a NumPy .npz with x_train, y_train, x_test, y_test")
    g.add_argument("--samples", type=int, default=d.samples, help=f"teacher: training samples (default: {d.samples})")
    g.add_argument("--features", type=int, default=d.features, help=f"teacher: input features (default: {d.features})")
    g.add_argument("--hidden", type=options.hidden_widths, default=d.hidden, metavar="W[,W…]",
                   help=f"the width of each hidden layer (default: {','.join(map(str, d.hidden))})")
    g.add_argument("--activation", choices=("relu", "gelu"), default=d.activation, help="(default: relu)")
    g.add_argument("--layernorm", action="store_true", help="LayerNorm after each hidden Linear")
    g.add_argument("--dropout", type=float, default=d.dropout, help="dropout after each activation (default: 0)")
    g.add_argument("--dtype", choices=("float32", "float64"), default=d.dtype, help=f"(default: {d.dtype})")
    g.add_argument("--backend", choices=options.BACKENDS, default=d.backend, help="array module (default: numpy)")
    g.add_argument("--seed", type=int, default=d.seed, help="model initialisation and data order (default: 0)")
    g = p.add_argument_group("optimization")
    g.add_argument("--batch", type=int, default=d.batch, help=f"GLOBAL batch, split over the workers (default: {d.batch})")
    g.add_argument("--epochs", type=int, default=d.epochs, help=f"(default: {d.epochs})")
    g.add_argument("--steps", type=int, default=None, help="optimizer steps (overrides --epochs)")
    g.add_argument("--optimizer", choices=("sgd", "adam", "adamw"), default=d.optimizer, help=f"(default: {d.optimizer})")
    g.add_argument("--lr", type=float, default=d.lr, help=f"learning rate (default: {d.lr:g})")
    g.add_argument("--momentum", type=float, default=d.momentum, help=f"sgd momentum (default: {d.momentum:g})")
    g.add_argument("--weight-decay", type=float, default=d.weight_decay, help="(default: 0)")
    g = p.add_argument_group("communication")
    g.add_argument("--algorithm", default=d.algorithm,
                   help="mpicomm allreduce / reduce_scatter algorithm (python -m mpicomm algorithms; default: auto)")
    cap = g.add_mutually_exclusive_group()
    cap.add_argument("--bucket", type=cli.size_arg, default=None, metavar="SIZE",
                     help=f"bucket cap after the first 1 MiB bucket, e.g. 25M, 512KiB or 4e6 bytes "
                          f"(default: {d.bucket_mb:g}M)")
    cap.add_argument("--bucket-mb", type=float, default=d.bucket_mb, metavar="MIB",
                     help="the same cap in MiB, as DDP's bucket_cap_mb")
    g.add_argument("--no-overlap", dest="overlap", action="store_false",
                   help="all-reduce after the whole backward instead of during it")
    g.add_argument("--per-parameter", action="store_true", help="one all-reduce per parameter tensor (no buckets)")
    g.add_argument("--compress", choices=("none", "fp16", "bf16"), default="none",
                   help="ddp: buckets travel in half precision (bf16 needs ml_dtypes; default: none)")
    g.add_argument("--accumulate", type=int, default=d.accumulate, metavar="K",
                   help="split each step's batch into K micro-batches; synchronize only on the last (default: 1)")
    g.add_argument("--servers", type=_servers, default=d.servers, metavar="K",
                   help="ps modes: the last K ranks are dedicated parameter servers, the others workers; 0 or "
                        "'colocated': every rank is a worker and the server of one shard of the parameters "
                        "(default: 1)")
    g.add_argument("--staleness", type=_staleness, default=None, metavar="S",
                   help="ps-async: a worker may run at most S steps ahead of the weights it uses "
                        "(0 = synchronous; default for ps-async: none = unbounded)")


def parser() -> argparse.ArgumentParser:
    """The command line's parser, with its ``train``, ``bench`` and ``plot`` sub-commands."""
    from apps import options
    from apps.sgd.train import MODES, Config

    parser = cli.Parser(
        prog=PROG,
        description="Distributed SGD on mpicomm's collectives: data parallelism with overlapped bucketed all-reduce "
                    "(ddp), ZeRO stages 1-3, parameter servers (sync, async, bounded staleness).",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{train,bench,plot}")

    t = sub.add_parser("train", help="train a model (under mpiexec)", epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("--mode", choices=MODES, default="ddp",
                   help="ddp: all-reduce of gradient buckets; zero1/zero2/zero3: sharded optimizer state (and "
                        "gradients, and parameters); ps-sync/ps-async: parameter servers (default: ddp)")
    add_model_options(t)
    g = t.add_argument_group("run")
    g.add_argument("--uneven", action="store_true",
                   help="test of uneven inputs: worker r runs r fewer steps and joins the others' all-reduces "
                        "with zeros (PyTorch's Join)")
    g.add_argument("--reproducible", action="store_true",
                   help="ddp and zero modes: cut each global batch into --micro-batches fixed micro-batches and sum "
                        "their gradients reproducibly, so that runs at any number of ranks end with the same "
                        "parameters, bit for bit")
    g.add_argument("--micro-batches", type=int, default=Config.micro_batches, metavar="M",
                   help=f"with --reproducible: micro-batches per global batch, at least the number of ranks "
                        f"(default: {Config.micro_batches})")
    options.add_checkpoint_options(g, "sgd", "steps")
    g.add_argument("--eval-every", type=int, default=0, metavar="K",
                   help="evaluate, print progress and log every K steps (default: once per epoch)")
    g.add_argument("--log", metavar="CSV", default=None, help="metrics per evaluation (rank 0)")
    cli.add_json(g, "the settings and the run's report")
    g.add_argument("--plot", metavar="FILE.png", default=None, help="loss and accuracy against step and wall time")
    g.add_argument("--plot-timeline", metavar="FILE.png", default=None,
                   help="one step per rank: layers' backward, bucket collectives, waits")
    g.add_argument("--timeline-step", type=int, default=None, metavar="S",
                   help="the step --plot-timeline draws (default: the middle one)")
    g.add_argument("--quiet", action="store_true", help="no progress lines")

    b = sub.add_parser("bench", help="the modes side by side: step time, bytes, memory, overlap (under mpiexec)",
                       description="The modes side by side, measured in one run (python -m apps.sgd.bench's "
                                   "docstring says how); each timed run follows an untimed warm-up run.")
    from apps.sgd.bench import add_options

    add_options(b)

    pl = sub.add_parser("plot", help="draw metrics CSVs (from train --log) as loss/accuracy curves (no MPI)",
                        description="Draw metrics CSVs (from train --log) as loss/accuracy curves in one picture.")
    pl.add_argument("csv", nargs="+", help="metrics files; each is labelled by its file name")
    pl.add_argument("--plot", metavar="FILE.png", dest="png", required=True, help="the picture to write")
    cli.renamed(pl, "--out", "--plot", "--out is for Markdown reports")
    return parser


def parse(argv: list[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The parsed and checked command line; usage errors exit with status 2 before the work starts."""
    top = parser()
    args = top.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # for the command line in --json and --out
    own = cli.subparser(top, args.command)
    if args.command == "plot":
        try:
            args.curves = {_label(p): _read_csv(p) for p in args.csv}
        except OSError as exc:
            own.error(f"{exc.filename}: {exc.strerror}; give the metrics CSV files that train --log wrote")
        except (ValueError, TypeError, csv.Error) as exc:
            own.error(f"not a metrics CSV of train --log ({exc}); give the files that train --log wrote")
    if args.command == "bench":
        from apps.sgd.bench import check_options

        check_options(own, args)
    elif args.command == "train":
        from apps import options
        from apps.sgd.train import check_settings

        options.check_checkpoint_options(own, args)
        _check_pairs(own, args)
        if args.data == "digits":
            cli.require(own, "--data digits", "sklearn")
        if args.timeline_step is not None and args.timeline_step < 0:
            own.error(f"--timeline-step must be >= 0, got {args.timeline_step}")
        if args.timeline_step is not None and not args.plot_timeline:
            own.error("--timeline-step chooses the step --plot-timeline draws: add --plot-timeline FILE.png")
        if args.plot_timeline and args.mode.startswith("ps"):
            own.error("--plot-timeline draws bucket collectives: use it with --mode ddp, zero1, zero2 or zero3")
        try:
            check_settings(config_from(args))
        except ValueError as exc:
            own.error(str(exc))
    return top, args


def _check_pairs(own: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``train``'s options that one mode, data set or optimizer uses: given with another, a usage error."""
    ps = args.mode.startswith("ps")
    cli.refuse_unless(own, args, args.mode == "ps-async", "--mode ps-async", "--staleness")
    cli.refuse_unless(own, args, ps, "--mode ps-sync or ps-async", "--servers")
    cli.refuse_unless(own, args, not ps, "--mode ddp, zero1, zero2 or zero3", "--algorithm", "--bucket",
                      "--bucket-mb", "--no-overlap", "--per-parameter", "--accumulate")
    cli.refuse_unless(own, args, args.data == "file", "--data file", "--data-file")
    cli.refuse_unless(own, args, args.data == "teacher", "--data teacher", "--samples", "--features")
    cli.refuse_unless(own, args, args.optimizer == "sgd", "--optimizer sgd", "--momentum")
    cli.refuse_unless(own, args, not ps, "--mode ddp, zero1, zero2 or zero3", "--reproducible")
    cli.refuse_unless(own, args, getattr(args, "reproducible", False), "--reproducible", "--micro-batches")
    if args.steps is not None and args.epochs != own.get_default("epochs"):
        own.error(f"--epochs {args.epochs} and --steps {args.steps}: --steps sets the run's length alone; give one")


def config_from(args: argparse.Namespace) -> Any:
    """A :class:`apps.sgd.train.Config` from parsed options."""
    from apps.sgd.train import Config

    mode = getattr(args, "mode", "ddp")
    staleness = args.staleness
    if mode == "ps-sync":
        staleness = 0
    return Config(
        mode=mode, data=args.data, data_file=args.data_file, samples=args.samples, features=args.features, hidden=args.hidden,
        activation=args.activation, layernorm=args.layernorm, dropout=args.dropout, dtype=args.dtype,
        backend=args.backend, batch=args.batch, epochs=args.epochs, steps=args.steps, optimizer=args.optimizer,
        lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay, seed=args.seed,
        algorithm=args.algorithm, overlap=args.overlap, per_parameter=args.per_parameter,
        bucket_mb=args.bucket / 2**20 if getattr(args, "bucket", None) else args.bucket_mb,
        compress=None if args.compress == "none" else args.compress, accumulate=args.accumulate,
        uneven=getattr(args, "uneven", False), servers=args.servers, staleness=staleness,
        reproducible=getattr(args, "reproducible", False),
        micro_batches=getattr(args, "micro_batches", Config.micro_batches),
        checkpoint_every=getattr(args, "checkpoint_every", 0), checkpoint_dir=getattr(args, "checkpoint_dir", "checkpoints/sgd"),
        keep=getattr(args, "keep", 2), restart=getattr(args, "restart", False), log=getattr(args, "log", None),
        eval_every=getattr(args, "eval_every", 0), progress=not getattr(args, "quiet", False),
    )


def run(argv: list[str] | None = None) -> int:
    from apps import options

    parser, args = options.parse_or_exit(parse, argv)
    if args.command == "plot":
        from apps.sgd.plots import curves

        curves(args.curves, args.png)
        print(f"wrote {args.png}")
        return 0

    import mpicomm
    from apps.checkpoint import CheckpointError

    comm = mpicomm.Comm()
    rank = comm.Get_rank()

    def say(text: str) -> None:
        if rank == 0:
            print(text, flush=True)

    prog = f"{parser.prog} {args.command}"
    try:
        if args.command == "bench":
            from apps.sgd.bench import bench

            return bench(comm, args, say)
        return _train(comm, args, say)
    except (ValueError, CheckpointError, OSError) as exc:
        # The same settings give the same error on every rank (checkpoint directory, data and memory
        # verdicts are agreed on by every rank first): said once, every rank exits with status 2.
        options.exit_error(prog, str(exc), rank, comm.Get_size())
    return 0


def _train(comm: Any, args: argparse.Namespace, say: Any) -> int:
    from apps.sgd.train import preflight, train

    cfg = config_from(args)
    if args.plot_timeline:
        cfg.timeline_step = args.timeline_step
    # Settings, checkpoint directory, data, batch and memory: checked before anything is allocated,
    # with the same verdict on every rank.
    source = preflight(comm, cfg)
    if cfg.timeline_step is None and args.plot_timeline:
        cfg.timeline_step = _middle_step(cfg, comm, source.n_train)
    say(f"apps.sgd: {cfg.mode} on {comm.Get_size()} ranks, data {cfg.data}, global batch {cfg.batch}, "
        f"{cfg.optimizer} lr {cfg.lr:g}, algorithm {cfg.algorithm}")
    report = train(comm, cfg, say, source=source)
    timelines = comm.gather(report.timeline, root=0) if args.plot_timeline else None
    if comm.Get_rank() != 0:
        return 0
    hidden = report.hidden_fraction
    say(f"done: {report.steps - report.start_step} steps in {cli.format_time(report.seconds)}, "
        f"{report.samples_per_s:,.0f} samples/s; test accuracy {report.test_accuracy:.4f}, "
        f"test loss {report.test_loss:.4f}")
    if cfg.mode.startswith("ps"):
        say(f"communication: {cli.format_time(report.exposed_s)} waiting for pushes and pulls; "
            f"compute {cli.format_time(report.compute_s)}; "
            f"busiest server link {report.bytes_per_step / 1024:.1f} KiB per step")
    elif hidden is not None:
        say(f"communication: {cli.format_time(report.comm_s)} in bucket collectives, "
            f"{cli.format_time(report.exposed_s)} exposed ({hidden:.0%} hidden behind backward); "
            f"compute {cli.format_time(report.compute_s)}")
    say(f"parameter digest {_digest(report.model.params)}")
    mem = report.memory
    say("memory per rank: " + ", ".join(f"{k} {v / 1024:.1f} KiB" for k, v in mem.items())
        + f"; total {sum(mem.values()):,} B")
    if report.memory_formula is not None:
        text, where, value = report.memory_formula
        say(f"memory formula: {text} = {value:,} B ({where})")
    if args.json:
        from dataclasses import asdict

        body = {k: v for k, v in vars(report).items() if k not in ("model", "timeline")}
        results = {"config": asdict(cfg), "report": body, "hidden_fraction": hidden,
                   "digest": _digest(report.model.params)}
        from apps import report as json_report

        json_report.write_json(args.json, PROG, args.argv, comm.Get_size(), results)
    if args.plot:
        from apps.sgd.plots import curves

        curves({cfg.mode: report.history}, args.plot)
        say(f"wrote {args.plot}")
    if args.plot_timeline:
        from apps.sgd.plots import timeline

        timeline(timelines, args.plot_timeline, title=f"{cfg.mode}, step {cfg.timeline_step}")
        say(f"wrote {args.plot_timeline}")
    return 0


def _digest(params: Any) -> str:
    """SHA-256 of the final parameters' bytes (equal digests: bit-identical models)."""
    import hashlib

    from apps.nn.xp import to_host

    return hashlib.sha256(to_host(params).tobytes()).hexdigest()[:32]


def _middle_step(cfg: Any, comm: Any, n_train: int) -> int:
    from apps.sgd.train import Sampler

    per_epoch = Sampler(n_train, cfg.batch, comm.Get_size(), 0, shuffle=False).steps_per_epoch
    total = cfg.steps if cfg.steps is not None else cfg.epochs * per_epoch
    return max(0, total // 2)


def _label(path: str) -> str:
    import os

    return os.path.splitext(os.path.basename(path))[0]


def _read_csv(path: str) -> list[dict[str, float]]:
    with open(path, newline="") as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]
