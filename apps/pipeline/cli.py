"""The command line of the pipeline application: ``schedule``, ``train`` and ``bench``.

The conventions of :mod:`mpicomm.cli` and :mod:`apps.options`: ``--json FILE``
writes one document (schema, command, machine, versions, date, results);
``--out`` is a benchmark's Markdown report (an existing one is kept unless
``--append`` or ``--force``); ``--plot FILE.png`` draws; the checkpoint options
are every application's (``--checkpoint-dir``, default ``checkpoints/pipeline``).
Options that cannot run together are usage errors (status 2, before MPI
starts); what depends on the rank count exits with status 2 and a message
naming the options, on every rank.
"""

from __future__ import annotations

import argparse
from typing import Any

from mpicomm import cli

PROG = "python -m apps.pipeline"

EXAMPLES = """examples:
  python -m apps.pipeline schedule --stages 4 --micro 8 --schedule 1f1b --plot 1f1b.png
  python -m apps.pipeline schedule --stages 4 --micro 8 --schedule interleaved --chunks 2
  python -m apps.pipeline schedule --stages 4 --micro 8 --schedule dualpipev --comms --plot dualpipev.png
  mpiexec -n 2 python -m apps.pipeline train                                  # 1F1B, 2 stages, 8 micro-batches
  mpiexec -n 4 python -m apps.pipeline train --stages 4 --micro 16 --schedule zb-h1 --plot run.png
  mpiexec -n 2 python -m apps.pipeline train --schedule zb-v --check           # two chunks per rank, in a V
  mpiexec -n 4 python -m apps.pipeline train --stages 2 --tensor 2 --activations recompute   # T x S = 2 x 2
  mpiexec -n 4 python -m apps.pipeline train --stages 2 --checkpoint-every 5 --checkpoint-dir ckpt [--restart]
  mpiexec -n 2 python -m apps.pipeline bench --out jobs/results/pipeline-bench.md --force --json pipeline-bench.json
"""


#: ``--check``: relative difference allowed against one process, by dtype (only the summation order differs).
CHECK_TOLERANCE = {"float64": 1e-12, "float32": 1e-4}

#: ``bench``'s model: heavy enough that one action (a forward of a stage on one micro-batch) takes
#: milliseconds, so the bubble measured is the schedule's and not Python's per-message overhead.
BENCH_MODEL = {"width": 256, "hidden": 1024, "batch": 2048, "steps": 20}


def add_model_options(p: argparse.ArgumentParser, **defaults: Any) -> None:
    """The model, data and optimizer options (shared by ``train`` and ``bench``; *defaults* override)."""
    from dataclasses import replace

    from apps import options
    from apps.pipeline.config import Config
    from apps.pipeline.model import ModelSpec

    m = replace(ModelSpec(), **{k: v for k, v in defaults.items() if k in ModelSpec.__dataclass_fields__})
    c = replace(Config(), **{k: v for k, v in defaults.items() if k in Config.__dataclass_fields__})
    g = p.add_argument_group("model and data")
    g.add_argument("--blocks", type=int, default=m.blocks,
                   help=f"MLP blocks (Linear, act, Linear, act) that stages split (default: {m.blocks})")
    g.add_argument("--width", type=int, default=m.width, help=f"width between blocks (default: {m.width})")
    g.add_argument("--hidden", type=options.hidden_width, default=m.hidden, metavar="W",
                   help=f"the width of each block's hidden layer (a block is Linear --width -> W, activation, Linear "
                        f"W -> --width, activation); a multiple of --tensor (default: {m.hidden})")
    g.add_argument("--features", type=int, default=m.features, help=f"input features (default: {m.features})")
    g.add_argument("--classes", type=int, default=m.classes, help=f"output classes (default: {m.classes})")
    g.add_argument("--activation", choices=("relu", "gelu"), default=m.activation, help="(default: relu)")
    g.add_argument("--batch", type=int, default=c.batch,
                   help=f"GLOBAL batch per step, split over the D replicas, then into --micro (default: {c.batch})")
    g.add_argument("--steps", type=int, default=c.steps, help=f"optimizer steps (default: {c.steps})")
    g.add_argument("--optimizer", choices=("sgd", "adam", "adamw"), default=c.optimizer,
                   help=f"(default: {c.optimizer})")
    g.add_argument("--lr", type=float, default=c.lr, help=f"learning rate (default: {c.lr:g})")
    g.add_argument("--dtype", choices=("float32", "float64"), default=c.dtype, help=f"(default: {c.dtype})")
    g.add_argument("--seed", type=int, default=c.seed, help="initialisation and data (default: 0)")
    g.add_argument("--backend", choices=options.BACKENDS, default=c.backend,
                   help="array module: cupy keeps parameters, activations and messages on the GPU (default: numpy)")


def add_split_options(p: argparse.ArgumentParser, *, schedule_only: bool = False) -> None:
    from apps.pipeline.config import Config
    from apps.pipeline.schedules import SCHEDULES

    c = Config()
    g = p.add_argument_group("schedule")
    g.add_argument("--stages", type=int, default=c.stages, help=f"pipeline stages S (ranks per pipeline; default: {c.stages})")
    g.add_argument("--micro", type=int, default=c.micro, help=f"micro-batches M per step (default: {c.micro})")
    g.add_argument("--schedule", choices=SCHEDULES, default=c.schedule,
                   help=f"naive: one micro-batch at a time; gpipe: all forwards, then all backwards; 1f1b: "
                        f"one forward, one backward; interleaved: 1F1B over --chunks model chunks per rank; "
                        f"looped-bfs: every micro-batch through each chunk in turn; zb-h1: zero bubble, backward "
                        f"split into input and weight gradients, 1F1B's memory; zb-h2: zero bubble with up to 2S-1 "
                        f"micro-batches in flight; zb-v: zero bubble on two chunks per rank placed in a V, 1F1B's "
                        f"memory; dualpipev: DeepSeek's DualPipe cut in half, a V of forward-backward pairs "
                        f"(default: {c.schedule})")
    g.add_argument("--chunks", type=int, default=None, metavar="V",
                   help="model chunks per rank: interleaved and looped-bfs take any V (default 1; 2 or more to "
                        "interleave); zb-v and dualpipev have 2; the others 1")
    if schedule_only:
        return
    from apps.pipeline.stage import STRATEGIES

    g.add_argument("--tensor", type=int, default=c.tensor, metavar="T",
                   help="tensor-parallel ranks per stage (Megatron column/row split of each block; N = T x S x D; "
                        "default: 1)")
    g.add_argument("--activations", choices=STRATEGIES, default=c.activations,
                   help="store: keep them; recompute: keep the stage input, run the forward again in backward; "
                        "offload: park them in the next rank's memory (default: store)")
    from apps.pipeline.offload import WINDOWS

    g.add_argument("--offload-window", choices=WINDOWS, default=c.offload_window,
                   help="offload: where the next rank holds them - shared: a node-shared window (both ranks on one "
                        "node; parking and fetching are memory copies); rma: its RMA window (passive-target put and "
                        "get); auto: shared where the two ranks share a node, else rma (default: auto)")
    g.add_argument("--balance", choices=("params", "time"), default=c.balance,
                   help="split blocks by parameter count, or by each block's measured time (default: params)")


def parser() -> argparse.ArgumentParser:
    """The command line's parser, with its ``schedule``, ``train`` and ``bench`` sub-commands."""
    from apps import options

    parser = cli.Parser(
        prog=PROG,
        description="Pipeline training on mpicomm's point-to-point, one-sided windows and collectives: GPipe, 1F1B, "
                    "interleaved 1F1B, looped BFS, zero-bubble (H1, H2, V) and DualPipeV schedules as data, tensor and "
                    "data parallelism "
                    "(N = T x S x D ranks), activations stored, recomputed or offloaded; bubbles and memory measured.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{schedule,train,bench}")

    s = sub.add_parser("schedule", help="print and draw a schedule's planned timetable (no MPI)",
                       description="Each rank's actions (2F0: stage 2, forward, micro-batch 0), validated (each "
                                   "micro-batch once per stage, F before B, I before W, sends matching receives, no "
                                   "deadlock in a simulated run), with the planned bubble next to the formula.",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_split_options(s, schedule_only=True)
    s.add_argument("--comms", action="store_true", help="print the sends and receives too")
    s.add_argument("--chart", action="store_true",
                   help="draw the planned timetable as text: one line per rank, F3 = forward of micro-batch 3, "
                        "lower case for a rank's second chunk, '-' while an action lasts, '·' idle")
    s.add_argument("--plot", metavar="FILE.png", default=None, help="the planned timetable as a Gantt chart")
    cli.add_json(s, "the schedule, its timetable and bubbles")

    t = sub.add_parser("train", help="train the MLP split over the ranks (under mpiexec)", epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_split_options(t)
    add_model_options(t)
    g = t.add_argument_group("run")
    g.add_argument("--check", action="store_true",
                   help="also train the unsplit model in one process on the same micro-batches and compare losses "
                        "and parameters (exit status 1 if they differ by more than 1e-12 relative in float64, "
                        "1e-4 in float32: sums in another order round differently)")
    options.add_checkpoint_options(g, "pipeline", "steps")
    g.add_argument("--log", metavar="CSV", default=None, help="loss, accuracy and seconds per step (rank 0)")
    g.add_argument("--plot", metavar="FILE.png", default=None,
                   help="the measured Gantt chart of the last step beside the planned one")
    cli.add_json(g, "the settings, losses and the per-stage measurements")
    g.add_argument("--quiet", action="store_true", help="no progress lines")

    b = sub.add_parser("bench", help="the benchmark table: bubbles, memory and throughput measured (under mpiexec)",
                       description="Measured in one run at this job's rank count: every schedule's bubble against "
                                   "its planned timetable and formula, its first rank's peak activations against the "
                                   "papers' count, at the same (S, M); the activation strategies' memory and time, "
                                   "and S stages against one rank on the same model and batch.")
    add_model_options(b, **BENCH_MODEL)
    b.add_argument("--micro", type=int, default=8, help="micro-batches (default: 8)")
    cli.add_repeat(b, 3, "each row (the run with the median step time is reported)")
    cli.add_out(b)
    cli.add_json(b, "the table's rows")
    b.add_argument("--plot", metavar="FILE.png", default=None, help="planned and measured charts of the 1F1B row")
    b.add_argument("--quiet", action="store_true", help="no progress lines")
    return parser


def parse(argv: list[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The parsed and checked command line: usage errors exit with status 2 before the work starts."""
    from apps.pipeline.config import ConfigError
    from apps.pipeline.schedules import ScheduleError, check_shape

    top = parser()
    args = top.parse_args(argv)
    args.argv = list(argv) if argv is not None else None
    own = cli.subparser(top, args.command)
    if getattr(args, "chunks", 0) is None:  # the schedule's own: 2 for the V schedules, else 1
        from apps.pipeline.schedules import default_chunks

        args.chunks = default_chunks(args.schedule)
    if args.command == "schedule":
        cli.at_least(own, args, 1, "--stages", "--micro", "--chunks")
        try:
            check_shape(args.schedule, args.stages, args.micro, args.chunks)
        except ScheduleError as exc:
            own.error(str(exc))
    elif args.command == "train":
        from apps import options

        options.check_checkpoint_options(own, args)
        cli.refuse_unless(own, args, args.activations == "offload", "--activations offload", "--offload-window")
        try:
            config_from(args).check_values()
        except ConfigError as exc:
            own.error(str(exc))
    else:
        cli.at_least(own, args, 1, "--micro", "--repeat", "--steps", "--batch")
        cli.check_out(own, args)
    return top, args


def run(argv: list[str] | None = None) -> int:
    from apps import options

    parser, args = options.parse_or_exit(parse, argv)
    if args.command == "schedule":
        from apps.pipeline.schedules import ScheduleError

        try:
            return _schedule(args)
        except (ScheduleError, ValueError) as exc:
            parser.exit(2, cli.error_line(f"{PROG} schedule", f"{exc}\n"))

    import mpicomm
    from apps.checkpoint import CheckpointError

    comm = mpicomm.Comm()
    rank = comm.Get_rank()

    def say(text: str) -> None:
        if rank == 0:
            print(text, flush=True)

    try:
        if args.command == "bench":
            from apps.pipeline.bench import bench

            return bench(comm, args, say)
        return _train(comm, args, say)
    except (ValueError, CheckpointError, OSError) as exc:
        options.exit_error(f"{PROG} {args.command}", str(exc), rank, comm.Get_size())
    return 0


def _schedule(args: argparse.Namespace) -> int:
    from apps.pipeline.schedules import splits_backward, table
    from apps.pipeline.timeline import FORMULAS, MEMORY, PUBLISHED, formula, memory, plan

    p, m, v, name = args.stages, args.micro, args.chunks, args.schedule
    tt = plan(name, p, m, v)  # validated here, before anything is printed
    rows = table(name, p, m, v, comms=args.comms)
    f = formula(name, p, m, v)
    print(f"{name}: p={p} stages(ranks), m={m} micro-batches" + (f", v={v} chunks" if v > 1 else "")
          + " - validated: every micro-batch once per stage, F before B"
          + (", I before W" if splits_backward(name) else "") + ", sends match receives, no deadlock")
    for r, row in enumerate(rows):
        print(f"rank {r}: " + " ".join(row))
    if args.chart:
        from apps.pipeline.plots import text_chart
        from apps.pipeline.schedules import stages_of

        chunk = {st: c for r in range(p) for c, st in enumerate(stages_of(name, p, v, r))}
        print("\nplanned timetable (one column pair per " + ("half " if v > 1 else "") + "forward):")
        for line in text_chart(tt, chunk.get if v > 1 else None):
            print(line)
    print()
    print(f"{'rank':>4}  {'busy':>6}  {'bubble':>7}  {'peak in flight':>14}")
    for r in range(p):
        print(f"{r:>4}  {tt.busy(r):>6.1f}  {tt.bubble(r):>7.1%}  {tt.peak_in_flight(r):>14}")
    print(f"\nplanned bubble {tt.bubble():.1%} of {p} x {tt.makespan:g} units (F=1, B=2, I=W=1"
          + (f", chunk costs /{v}" if v > 1 else "") + f"); formula {FORMULAS[name]} = {f:.1%}; published, "
          f"per rank and iteration: {PUBLISHED[name]}")
    print(f"planned peak in flight on rank 0: {tt.peak_in_flight(0)}" + (" chunk" if v > 1 else "")
          + f" micro-batches; published {MEMORY[name]} = {memory(name, p, m, v)}")
    if args.plot:
        from apps.pipeline.plots import gantt

        planned = [[(s.action.op, s.action.mb, s.action.stage, s.start, s.end) for s in row] for row in tt.slots]
        gantt(args.plot, planned, None, title=f"{name}, p={p}, m={m}" + (f", v={v}" if v > 1 else ""),
              planned_note=f"bubble {tt.bubble():.1%} (formula {f:.1%})", label_stage=v > 1)
        print(f"wrote {args.plot}")
    if args.json:
        results = {"schedule": name, "p": p, "m": m, "v": v, "rows": table(name, p, m, v, comms=True),
                   "bubble": tt.bubble(), "formula": f, "makespan": tt.makespan, "memory": memory(name, p, m, v),
                   "per_rank": [{"rank": r, "busy": tt.busy(r), "bubble": tt.bubble(r),
                                 "peak_in_flight": tt.peak_in_flight(r)} for r in range(p)]}
        cli.write_json(args.json, cli.command_line(PROG, args.argv), results)
        print(f"wrote {args.json}")
    return 0


def config_from(args: argparse.Namespace) -> Any:
    from apps.pipeline.config import Config
    from apps.pipeline.model import ModelSpec

    spec = ModelSpec(features=args.features, width=args.width, hidden=args.hidden, blocks=args.blocks,
                     classes=args.classes, activation=args.activation)
    return Config(stages=args.stages, micro=args.micro, schedule=args.schedule, chunks=args.chunks,
                  tensor=args.tensor, activations=args.activations, offload_window=args.offload_window,
                  backend=args.backend, balance=args.balance, spec=spec,
                  batch=args.batch, steps=args.steps, optimizer=args.optimizer, lr=args.lr, dtype=args.dtype,
                  seed=args.seed, log=args.log, checkpoint_every=args.checkpoint_every,
                  checkpoint_dir=args.checkpoint_dir, keep=args.keep, restart=args.restart,
                  progress=not args.quiet)


def stage_table(summary: dict[str, Any]) -> list[str]:
    """The per-rank lines of a run's summary (see :func:`apps.pipeline.train.summary`)."""
    lines = [f"{'rank':>4}  {'stages':<8} {'busy/step':>10}  {'bubble':>7}  {'planned':>7}  {'formula':>7}  "
             f"{'peak activations':>17}  {'in flight (plan)':>16}  {'hosts for a peer':>16}  "
             f"{'sent to stages/step':>19}  {'all-gathered/step':>17}"]
    for r in summary["per_rank"]:
        stages = ",".join(map(str, r["stages"]))
        lines.append(f"{r['rank']:>4}  {stages:<8} {cli.format_time(r['busy_s'] / max(summary['steps'], 1)):>10}  "
                     f"{r['bubble']:>7.1%}  {r['planned']:>7.1%}  {summary['formula']:>7.1%}  "
                     f"{r['peak_bytes'] / 1024:>13.1f} KiB  {r['peak_micro']:>8} ({r['planned_peak']})  "
                     f"{r['hosted_bytes'] / 1024:>12.1f} KiB  {r['sent_bytes'] / 1024:>15.1f} KiB  "
                     f"{r['gathered_bytes'] / 1024:>13.1f} KiB")
    return lines


def _train(comm: Any, args: argparse.Namespace, say: Any) -> int:
    import numpy as np

    from apps.pipeline.config import array_module
    from apps.pipeline.data import reference
    from apps.pipeline.measure import summary
    from apps.pipeline.timeline import FORMULAS
    from apps.pipeline.train import train

    cfg = config_from(args)
    topo = cfg.check(comm.Get_size())
    array_module(comm, cfg.backend)  # a missing CuPy is refused on every rank before anything is printed
    say(f"apps.pipeline: {cfg.schedule} on {comm.Get_size()} ranks = T {topo.T} x S {topo.S} x D {topo.D}"
        + (f", {cfg.chunks} chunks per rank" if cfg.chunks > 1 else "")
        + f"; {cfg.micro} micro-batches of a global batch of {cfg.batch}; activations {cfg.activations}; "
          f"{cfg.spec.blocks} blocks of {cfg.spec.width}->{cfg.spec.hidden}->{cfg.spec.width}, {cfg.dtype}")
    result = train(comm, cfg)
    summ = summary(cfg, result.ranks) if comm.Get_rank() == 0 else {}
    failed = False
    if comm.Get_rank() == 0:
        if summ:
            say("")
            for line in stage_table(summ):
                say(line)
            say(f"\nbubble measured {summ['bubble']:.1%}, planned {summ['planned']:.1%}, formula "
                f"{FORMULAS[cfg.schedule]} = {summ['formula']:.1%}; step {cli.format_time(summ['step_s'])}, "
                f"{summ['samples_per_s']:,.0f} samples/s (steps after the first)")
        if result.losses:
            say(f"final loss {result.losses[-1]:.6f}, accuracy {result.accuracy[-1]:.4f}")
        if args.check:
            losses, params = reference(cfg, replicas=topo.D, steps=cfg.steps)
            losses = losses[result.start_step:]
            lerr = max((abs(a - b) / max(abs(b), 1e-300) for a, b in zip(result.losses, losses)), default=0.0)
            perr = float(np.max(np.abs(result.full - params)) / max(np.max(np.abs(params)), 1e-300))
            tol = CHECK_TOLERANCE[cfg.dtype]
            failed = not (lerr <= tol and perr <= tol)
            say(f"check against one process on the same micro-batches: loss relative error {lerr:.2e}, "
                f"parameters {perr:.2e} (tolerance {tol:g}) - {'FAILED' if failed else 'equal'}")
    if args.json and comm.Get_rank() == 0:
        from dataclasses import asdict

        results = {"config": asdict(cfg), "losses": result.losses, "accuracy": result.accuracy, "summary": summ,
                   "ranks": result.ranks}
        from apps import report as json_report

        json_report.write_json(args.json, PROG, args.argv, comm.Get_size(), results)
        say(f"wrote {args.json}")
    if args.plot and comm.Get_rank() == 0:
        from apps.pipeline.plots import run_chart

        run_chart(args.plot, cfg, result.ranks, summ)
        say(f"wrote {args.plot}")
    failed = comm.bcast(failed, root=0)
    return 1 if failed else 0
