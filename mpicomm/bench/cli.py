"""The command line: ``python -m mpicomm.bench BENCHMARK [options]``, one sub-command per benchmark.

Each sub-command measures (:mod:`mpicomm.bench.measure`) on every rank and
reports (:mod:`mpicomm.bench.report`) on rank 0; this module only wires
the two to argparse and to the exit status every rank agrees on.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from .. import cli as shared
from .backend import BACKENDS, mpi_problem, problem
from .measure import ROUNDS, _requested, collective_run, pingpong_rows
from .metrics import COLLECTIVES, DTYPES, OPS, WINDOW, MeasuredCollective
from .report import Report, _bandwidth_text, collective_report, finish, pingpong_report

__all__ = ["BENCHMARKS", "Benchmark", "benchmark", "main", "PROG"]

PROG = "python -m mpicomm.bench"


@dataclass(frozen=True)
class Benchmark:
    """A sub-command: *run* measures and returns a :class:`Report` (the same on every rank that prints)."""

    name: str
    run: Callable[[argparse.Namespace], Report]
    summary: str
    description: str = ""
    collective: bool = False



BENCHMARKS: dict[str, Benchmark] = {}


def benchmark(name: str) -> Callable:
    """Register a benchmark sub-command (its docstring's first line is its help)."""

    def register(fn: Callable) -> Callable:
        doc = (fn.__doc__ or name).strip()
        BENCHMARKS[name] = Benchmark(name, fn, doc.splitlines()[0], doc)
        return fn

    return register


@benchmark("pingpong")
def pingpong(args: argparse.Namespace) -> Report:
    """Ranks 0 and 1: osu_latency and osu_bw, mpi4py Send/Recv (Isend/Irecv) against mpicomm send_array/recv_array.

    Latency: one way (half a round trip), the mean over a measurement's round
    trips (with --repeat N, the median of N measurements), Min and Max of
    single round trips; by default osu_latency's 10,000 round trips up to 8
    KiB and 1,000 above, after 100 and 10 untimed, native and mpicomm taking
    turns in 5 rounds. Bandwidth: as osu_bw, a window of non-blocking sends
    (--window, default 64) answered by a one-byte acknowledgement, in MB/s
    (10^6 B/s); by default osu_bw's 100 windows up to 8 KiB and 20 above, after
    10 and 2 untimed. Needs at least 2 ranks; ranks beyond the first two wait.
    """
    return pingpong_report(args, pingpong_rows(args))


def _collective(spec: MeasuredCollective, args: argparse.Namespace) -> Report:
    """Measure *spec* at every size (see :mod:`mpicomm.bench`) and build its report."""
    return collective_report(spec, args, collective_run(spec, args))


def _describe(spec: MeasuredCollective) -> str:
    from mpicomm import registry

    names = ", ".join(registry.algorithms(spec.registry))
    text = (f"Benchmark {spec.name}: mpicomm.Comm.{spec.method}(..., algorithm=NAME) for every algorithm ({names}) "
            f"and auto, against MPI.COMM_WORLD.{spec.method} (native), interleaved. Size: {spec.describe_size()}.")
    if spec.name != "barrier":
        text += f" {_bandwidth_text(spec)}."
    return text



for _spec in COLLECTIVES.values():
    BENCHMARKS[_spec.name] = Benchmark(
        _spec.name, (lambda s: lambda args: _collective(s, args))(_spec),
        f"{_spec.name}: every algorithm and auto against native MPI",
        collective=True,
    )


# ---------------------------------------------------------------- command line


_ITERS_HELP = {
    "collective": "timed calls of each variant per size, in each measurement (default: OSU's collective "
                  "benchmarks', 1000 up to 8 KiB and 100 above); the variants take turns in "
                  f"{ROUNDS} rounds of iters/{ROUNDS} calls each",
    "pingpong": "timed round trips of each variant per size, and bandwidth windows per size, in each measurement "
                "(default: osu_latency's 10000 round trips up to 8 KiB and 1000 above; osu_bw's 100 windows and "
                f"20); native and mpicomm take turns in {ROUNDS} rounds",
}
_WARMUP_HELP = {
    "collective": "untimed calls of each variant before each size's timed ones (default: OSU's, 100 up to 8 KiB "
                  "and 10 above, never more than --iters)",
    "pingpong": "untimed round trips and windows of each variant before each size's timed ones (default: OSU's, "
                "100 round trips up to 8 KiB and 10 above; osu_bw's 10 windows and 2; never more than --iters)",
}
_REPEAT_HELP = ("run each size's measurement N times and report the median of the N means (default: 1, one "
                "measurement: its mean, OSU's Avg)")
_FORMAT_HELP = ("what to print: markdown (default) the table; osu OSU micro-benchmarks' text (# OSU MPI ... Test, "
                "# Size  Avg Latency(us)  Min Latency(us)  Max Latency(us)  Iterations, then numbers), one table per "
                "variant, native MPI first, each starting with its own '# OSU MPI' line (--out stays Markdown)")


def _parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The command line: one sub-command per benchmark (returned too, by name, for their own errors)."""
    parser = shared.Parser(
        prog=PROG,
        description="Benchmarks of mpicomm against native MPI (mpi4py), measured interleaved in the same run.",
        epilog="Run under the launcher, e.g. mpiexec -n 2 python -m mpicomm.bench allreduce --validate; "
               "python -m mpicomm.bench BENCHMARK --help for a benchmark's options.",
    )
    sub = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True,
                                help=f"one of: {', '.join(BENCHMARKS)}")
    subs = {}
    for name, bench in BENCHMARKS.items():
        description = bench.description
        spec = COLLECTIVES.get(name)
        if bench.collective:
            try:
                description = _describe(COLLECTIVES[name])
            except (ImportError, ValueError):  # the registry cannot load: still parse; the run reports it
                description = bench.summary
        p = subs[name] = sub.add_parser(name, help=bench.summary, description=description)
        kind = "collective" if bench.collective else "pingpong"
        if name != "barrier":
            p.add_argument("--sizes", type=shared.sizes_arg, default=shared.parse_sizes("8:1M"),
                           help="sizes in bytes: LOW:HIGH (powers of two) or a list, e.g. 8:1M (default) or "
                                "8,4K,64M (K, M, G: powers of 1024)")
        else:
            p.add_argument("--sizes", action=_Refused, why="barrier moves no data: it has no sizes")
        p.add_argument("--iters", type=int, default=None, metavar="N", help=_ITERS_HELP[kind])
        p.add_argument("--warmup", type=int, default=None, metavar="N", help=_WARMUP_HELP[kind])
        p.add_argument("--repeat", type=int, default=1, metavar="N", help=_REPEAT_HELP)
        shared.renamed(p, "--rounds", "--repeat N",
                       f"the variants always take turns in {ROUNDS} rounds; --repeat N repeats the whole "
                       "measurement and reports the median")
        p.add_argument("--backend", default="numpy", choices=BACKENDS,
                       help="where the buffers live: numpy (host memory, default) or cupy (GPU memory: needs CuPy, "
                            "a GPU per rank and a CUDA-aware MPI library)")
        p.add_argument("--format", default="markdown", choices=("markdown", "osu"), help=_FORMAT_HELP)
        shared.add_out(p, "the table")
        shared.add_json(p, "the rows")
        p.add_argument("--quiet", action="store_true", help="no progress lines on stderr (shown by default)")
        if spec is None:
            p.add_argument("--window", type=int, default=WINDOW, metavar="N",
                           help=f"bandwidth test: non-blocking sends per window (default: {WINDOW}, osu_bw's)")
            continue
        p.add_argument("--algorithms", default="all", metavar="all|NAME,...",
                       help="algorithms to measure: all (default: every registered one and auto) or a "
                            "comma-separated list (auto included)")
        if name != "barrier":
            p.add_argument("--dtype", default="float64", choices=DTYPES,
                           help="element type of the data (default: float64)")
        else:
            p.add_argument("--dtype", action=_Refused, why="barrier moves no data: it has no element type")
        if spec.op:
            p.add_argument("--op", default="sum", choices=OPS, help="reduction op (default: sum)")
        if spec.in_place:
            p.add_argument("--inplace", action="store_true",
                           help="also measure every variant with MPI.IN_PLACE (nccl-tests' in-place pass), in the "
                                "same rounds: the in-place columns")
        else:
            p.add_argument("--inplace", action=_Refused,
                           why=f"{name} has no MPI.IN_PLACE form ("
                               + ("it is in place by nature)" if name == "bcast" else "it moves no data)"))
        p.add_argument("--validate", action="store_true",
                       help="after each size, check every algorithm's result against native MPI (exit 1 if any "
                            "differs)")
        p.add_argument("--plot", metavar="FILE.png",
                       help="latency vs size, log-log, one line per algorithm and native, with its min-max band "
                            "(barrier: one bar per algorithm; needs matplotlib)")
        if _has_shm(spec):
            p.add_argument("--pool", action="store_true",
                           help="also measure the shm algorithm on buffers from the shared-memory pool "
                                "(row shm+pool)")
        else:
            p.add_argument("--pool", action=_Refused, why=f"{name} has no shm algorithm to measure on pool buffers")
        p.add_argument("--persistent", action="store_true",
                       help="also measure a persistent request (comm.<Method>_init once, then Start and Wait "
                            "per call; row persistent)")
        if name in _REPRODUCIBLE:
            p.add_argument("--reproducible", action="store_true",
                           help="also measure the reproducible sum (auto, reproducible=True; row reproducible: the "
                                "same bits for every algorithm, order and rank count; --op sum on float32/64)")
        else:
            p.add_argument("--reproducible", action=_Refused, why=f"{name} has no reproducible sum (allreduce, reduce, "
                           f"reduce_scatter and reduce_scatter_block have)")
    return parser, subs


_REPRODUCIBLE = ("allreduce", "reduce", "reduce_scatter", "reduce_scatter_block")  #: what --reproducible measures


class _Refused(argparse.Action):
    """An option this benchmark has no use for: giving it is a usage error saying why (not silently ignored)."""

    def __init__(self, option_strings: list[str], dest: str, why: str = "", **kwargs: object):
        super().__init__(option_strings, dest=argparse.SUPPRESS, nargs="?", default=argparse.SUPPRESS,
                         help=argparse.SUPPRESS)
        self.why = why

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        parser.error(f"{option_string}: {self.why}")


def _has_shm(spec: MeasuredCollective) -> bool:
    """Whether *spec* has a registered ``shm`` algorithm (what ``--pool`` measures)."""
    from mpicomm import registry

    try:
        return "shm" in registry.algorithms(spec.registry)
    except (ImportError, ValueError):  # the registry cannot load: offer the option; the run reports it
        return True


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, run the benchmark on every rank, print and write the results on rank 0."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = shared.parse_or_exit(_parse, argv)
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    bench = BENCHMARKS[args.benchmark]
    code = 0
    try:
        report = bench.run(args)
        code = report.code
        if world.Get_rank() == 0:
            try:
                finish(args, argv, report)
            except OSError as exc:  # an output path that cannot be written: say so, exit 1 everywhere
                print(shared.error_line(PROG, f"cannot write the results: {exc}"), file=sys.stderr, flush=True)
                code = 1
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        if world.Get_size() > 1:  # the other ranks may be waiting in a collective: end the job
            print(shared.error_line(PROG, f"the {args.benchmark} benchmark failed; aborting the job", world.Get_rank(),
                                    world.Get_size()), file=sys.stderr, flush=True)
            world.Abort(1)
        raise
    return world.allreduce(code, op=MPI.MAX)


def _parse(argv: list[str]) -> argparse.Namespace:
    """The checked command line: every usage error before any benchmark starts (MPI's own checks included)."""
    parser, subs = _parser()
    args = parser.parse_args(argv)
    parser = subs[args.benchmark]  # errors from here on show the benchmark's own usage
    shared.at_least(parser, args, 1, "--iters", "--repeat", *(("--window",) if hasattr(args, "window") else ()))
    shared.at_least(parser, args, 0, "--warmup")
    if not hasattr(args, "sizes"):
        args.sizes = [0]  # barrier: no data
    shared.check_out(parser, args)
    why = problem(args.backend)
    if why:
        parser.error(why)
    bench = BENCHMARKS[args.benchmark]
    if bench.collective:
        try:
            names = _requested(COLLECTIVES[args.benchmark], args.algorithms)
        except ValueError as exc:
            parser.error(str(exc))
        if getattr(args, "pool", False) and "shm" not in names:
            parser.error(f"--pool measures the shm algorithm, which --algorithms {args.algorithms} leaves out: "
                         "add shm to --algorithms or drop --pool")
        if getattr(args, "pool", False) and args.backend != "numpy":
            parser.error("--pool measures buffers of the host's shared-memory pool; it does not go with --backend "
                         f"{args.backend}: drop --pool or use --backend numpy")

    from mpi4py import MPI

    # every rank asks its library: all exit alike (the collectives' native rows stage device buffers by hand on a
    # library that is not CUDA-aware; pingpong's hand them to MPI)
    why = None if bench.collective else mpi_problem(args.backend)
    if why:
        parser.error(why)
    world = MPI.COMM_WORLD
    if not bench.collective and world.Get_size() < 2:  # one rank: only it can say so
        parser.error(f"pingpong needs at least 2 ranks, got {world.Get_size()}: "
                     f"mpiexec -n 2 {PROG} pingpong {' '.join(argv[1:])}".rstrip())
    return args
