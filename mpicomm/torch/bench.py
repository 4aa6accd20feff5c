"""``mpiexec -n N python -m mpicomm.torch.bench``: ``dist.all_reduce`` on the mpicomm backend against gloo.

In one run, interleaved round by round so that the machine's noise hits every
variant alike, at each size:

* ``gloo`` - ``dist.all_reduce(t, group=gloo)``, PyTorch's CPU backend;
* ``passthrough`` (the baseline; ``--baseline none`` leaves it out) -
  ``dist.all_reduce(t, group=passthrough)`` on :class:`PassThrough`, the
  smallest backend over mpi4py: a ``ProcessGroup`` whose ``allreduce`` calls
  mpi4py's own ``comm.Allreduce(MPI.IN_PLACE, tensor.numpy())`` and returns a
  completed Work with a set future. What PyTorch's dispatch plus the MPI
  library's all-reduce cost: the floor a Python backend starts from;
* ``mpicomm`` - ``dist.all_reduce(t)`` on the mpicomm backend (the default
  group), mpicomm's ``auto`` algorithm;
* ``Comm.Allreduce`` - ``mpicomm.Comm.Allreduce`` on the tensor's NumPy view,
  the same call without PyTorch: the difference is the backend's overhead;
* ``native`` - the MPI library's own ``MPI_Allreduce`` through mpi4py.

Each size's measurement times ``--iters`` calls of every variant in turn
(after ``--warmup`` untimed calls): the slowest rank's mean per call. It runs
``--repeat`` times (default 3), the variants interleaved repeat by repeat, and
a variant's time is the median of its repeats.
The table also gives mpicomm / passthrough (below 1: faster than the
baseline) and gloo / mpicomm (above 1: faster than gloo) per size.
The table, ``--out FILE.md`` (Markdown, never replacing a file without
``--append``/``--force``) and ``--json FILE`` carry the command and machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import torch
import torch.distributed as dist
from mpi4py import MPI

from .. import cli
from ..bench.report import settings
from ..comm import Comm
from ..config import describe_cpu

if TYPE_CHECKING:
    from torch.distributed.distributed_c10d import GroupName

__all__ = ["main", "measure", "PassThrough", "PASSTHROUGH"]

PROG = "python -m mpicomm.torch.bench"
DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64}
#: The name the baseline backend is registered under (``dist.new_group(backend="passthrough")``).
PASSTHROUGH = "passthrough"


# ---------------------------------------------------------------- the baseline: a pass-through backend


class _Completed(dist.Work):
    """A Work that completed inside its call, with its future already set."""

    def __init__(self, future: torch.futures.Future[list[torch.Tensor]]):
        super().__init__()
        self._future = future

    def wait(self, timeout: object = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def get_future(self) -> torch.futures.Future[list[torch.Tensor]]:
        return self._future


class PassThrough(dist.ProcessGroup):
    """The benchmark's baseline: all_reduce straight to mpi4py's ``Allreduce`` on the tensor's NumPy view.

    Sums (the benchmark's only op; no op mapping, no checks, CPU tensors only): the least a Python backend
    can do per call.
    """

    def __init__(self, comm: MPI.Intracomm, rank: int, size: int):
        super().__init__(rank, size)  # type: ignore[call-arg]  # the binding's (rank, size) overload; stubs omit it
        self.comm = comm

    def getBackendName(self) -> str:
        return PASSTHROUGH

    # the name PyTorch gives a group is kept on its C++ backends, which a Python group has none of
    def _set_group_name(self, name: GroupName) -> None:
        self._name = name

    @property
    def group_name(self) -> GroupName:
        return self._name

    def allreduce(self, tensors: list[torch.Tensor],  # type: ignore[override]  # torch passes (tensors, opts) only
                  opts: object = None) -> dist.Work:
        for t in tensors:
            self.comm.Allreduce(MPI.IN_PLACE, t.numpy(), MPI.SUM)
        future: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()
        future.set_result(tensors)
        return _Completed(future)


def _create_passthrough(store: object, rank: int, size: int, timeout: object) -> PassThrough:
    """The creator ``dist.new_group(backend="passthrough")`` calls: a group of the whole job only (the Split is
    collective over ``MPI.COMM_WORLD``; PyTorch's group ranks are the job's, as the bench's default group makes
    them)."""
    # Split returns a communicator of its receiver's class (an Intracomm here); mpi4py's stub says Comm
    return PassThrough(cast(MPI.Intracomm, MPI.COMM_WORLD.Split(0, rank)), rank, size)


def _register_passthrough() -> None:
    if PASSTHROUGH.upper() not in getattr(dist.Backend, "_plugins", {}):
        dist.Backend.register_backend(PASSTHROUGH, _create_passthrough, devices=["cpu"])


# ---------------------------------------------------------------- the measurement


def _iterations(size: int, requested: int | None) -> int:
    """Timed calls of each variant in one measurement: *requested*, else 80 up to 8 KiB and, above it, as many
    as 2 MiB / size, between 2 and 40."""
    if requested:
        return requested
    return 80 if size <= 8192 else max(2, min(40, (2 << 20) // size))


def _time(fn: Callable[[], object], iters: int, world: MPI.Intracomm) -> float:
    """Seconds per call on the slowest rank (a barrier first, so every rank starts together)."""
    world.Barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    slowest: float = world.allreduce((time.perf_counter() - start) / iters, op=MPI.MAX)
    return slowest


def measure(sizes: list[int], dtype: torch.dtype, repeat: int, iters: int | None,
            progress: cli.Progress, baseline: str = PASSTHROUGH, warmup: int | None = None) -> list[dict[str, float]]:
    """One row per size: the median seconds of each variant over *repeat* measurements of *iters* calls, the
    variants interleaved measurement by measurement, and the checks that they agree. *warmup*: untimed calls of
    each variant first (default: a tenth of *iters*, at least 2)."""
    world = MPI.COMM_WORLD
    gloo = dist.new_group(backend="gloo")
    passthrough = None
    if baseline == PASSTHROUGH:
        _register_passthrough()
        passthrough = dist.new_group(backend=PASSTHROUGH)
    comm = Comm(world.Dup())
    itemsize = torch.empty(0, dtype=dtype).element_size()
    rows = []
    for size in sizes:
        n = max(1, size // itemsize)
        t = torch.zeros(n, dtype=dtype)  # zeros: repeated in-place sums stay finite
        a = t.numpy()
        variants = {  # (each binds this size's arrays)
            "Comm.Allreduce": lambda a=a: comm.Allreduce(MPI.IN_PLACE, a),
            "mpicomm": lambda t=t: dist.all_reduce(t),
            "native": lambda a=a: world.Allreduce(MPI.IN_PLACE, a),
            "gloo": lambda t=t: dist.all_reduce(t, group=gloo),
        }
        if passthrough is not None:
            variants["passthrough"] = lambda t=t: dist.all_reduce(t, group=passthrough)
        count = _iterations(n * itemsize, iters)
        times: dict[str, list[float]] = {k: [] for k in variants}
        for fn in variants.values():  # warm-up: plans, scratch, connections
            for _ in range(max(2, count // 10) if warmup is None else warmup):
                fn()
        for _ in range(repeat):
            for name, fn in variants.items():
                times[name].append(_time(fn, count, world))
        # correctness on data that depends on rank and index: the backend against gloo
        x = (torch.arange(n, dtype=torch.float64) % 1000 + 1000 * world.Get_rank()).to(dtype)
        y = x.clone()
        dist.all_reduce(x)
        dist.all_reduce(y, group=gloo)
        wrong = int((x != y).sum())
        if passthrough is not None:
            z = (torch.arange(n, dtype=torch.float64) % 1000 + 1000 * world.Get_rank()).to(dtype)
            dist.all_reduce(z, group=passthrough)
            wrong += int((z != y).sum())
        row: dict[str, float] = {"bytes": n * itemsize, "count": n, "iterations": count,
                                 "repeat": repeat, "wrong": wrong}
        row.update({k: statistics.median(v) for k, v in times.items()})
        rows.append(row)
        progress.step(f"{cli.format_size(n * itemsize)}: mpicomm {cli.format_time(row['mpicomm'])}, "
                      f"gloo {cli.format_time(row['gloo'])}")
    dist.destroy_process_group(gloo)
    if passthrough is not None:
        dist.destroy_process_group(passthrough)
        passthrough.comm.Free()
    comm.Free()
    return rows


def table(rows: list[dict[str, float]]) -> str:
    """The Markdown table (the pass-through columns when the rows have them)."""
    base = bool(rows) and "passthrough" in rows[0]
    header = ["Size (B)", f"gloo ({cli.US})"]
    if base:
        header += [f"passthrough ({cli.US})"]
    header += [f"mpicomm ({cli.US})"]
    if base:
        header += ["mpicomm / passthrough"]
    header += ["gloo / mpicomm", f"Comm.Allreduce ({cli.US})", f"backend overhead ({cli.US})",
               f"native MPI ({cli.US})", "#wrong"]
    cells = []
    for r in rows:
        row = [str(r["bytes"]), f"{r['gloo'] * 1e6:.1f}"]
        if base:
            row += [f"{r['passthrough'] * 1e6:.1f}"]
        row += [f"{r['mpicomm'] * 1e6:.1f}"]
        if base:
            row += [f"{r['mpicomm'] / r['passthrough']:.2f}"]
        row += [f"{r['gloo'] / r['mpicomm']:.1f}", f"{r['Comm.Allreduce'] * 1e6:.1f}",
                f"{(r['mpicomm'] - r['Comm.Allreduce']) * 1e6:.1f}", f"{r['native'] * 1e6:.1f}", str(r["wrong"])]
        cells.append(row)
    return cli.markdown_table(header, cells)


def _method(args: argparse.Namespace) -> str:
    """How the table was measured, in words (for --out and --json)."""
    calls = f"{args.iters} calls" if args.iters else "80 calls up to 8 KiB, 2 MiB / size (2 to 40) above"
    warm = args.warmup if args.warmup is not None else "a tenth as many (at least 2)"
    return (f"A measurement times {calls} of each variant, the slowest rank's mean per call; every size is "
            f"measured {args.repeat} times, the variants taking turns measurement by measurement, after {warm} "
            "untimed calls; a time is the median of the measurements. gloo / mpicomm above 1: the "
            "mpicomm backend is faster; backend overhead = mpicomm - Comm.Allreduce; #wrong: elements of the "
            "backend's (and the pass-through's) result that differ from gloo's on rank- and index-dependent data (rank "
            "0's count; a difference on any rank makes the exit status 1).")


def _parser() -> argparse.ArgumentParser:
    parser = cli.Parser(prog=PROG, description=__doc__.split("\n\n")[0],
                        epilog="Run under the launcher, e.g. mpiexec -n 2 python -m mpicomm.torch.bench "
                               "--sizes 8:16M --out torch-allreduce.md")
    parser.add_argument("--sizes", type=cli.sizes_arg, default=cli.parse_sizes("8:16M"),
                        help="message sizes in bytes: LOW:HIGH (doubling) or a list (default: 8:16M)")
    parser.add_argument("--dtype", choices=DTYPES, default="float32", help="element type (default: float32)")
    parser.add_argument("--iters", type=int, default=None, metavar="N",
                        help="timed calls of each variant per size, in each measurement (default: 80 up to 8 KiB, "
                             "above it 2 MiB / size, between 2 and 40)")
    parser.add_argument("--warmup", type=int, default=None, metavar="N",
                        help="untimed calls of each variant before each size's timed ones (default: a tenth of "
                             "--iters, at least 2)")
    parser.add_argument("--repeat", type=int, default=3, metavar="N",
                        help="run each size's measurement N times, the variants taking turns measurement by "
                             "measurement, and report the median (default: 3)")
    cli.renamed(parser, "--rounds", "--repeat N", "N measurements per size, interleaved, and their median")
    parser.add_argument("--baseline", choices=(PASSTHROUGH, "none"), default=PASSTHROUGH,
                        help="passthrough (the default): also time the pass-through backend over mpi4py "
                             "(PassThrough), the floor a Python backend starts from; none: leave it out")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr (shown by default)")
    cli.add_out(parser, "the table")
    cli.add_json(parser)
    return parser


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = _parser()
    args = parser.parse_args(argv)
    cli.at_least(parser, args, 1, "--repeat", "--iters")
    cli.at_least(parser, args, 0, "--warmup")
    cli.check_out(parser, args)
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = cli.parse_or_exit(_parse, argv)
    variables = settings()
    if not dist.is_initialized():
        dist.init_process_group("mpicomm")
    world = MPI.COMM_WORLD
    rank, p = world.Get_rank(), world.Get_size()
    progress = cli.Progress(len(args.sizes), "torch.bench", show=rank == 0 and not args.quiet)
    rows = measure(args.sizes, DTYPES[args.dtype], args.repeat, args.iters, progress, args.baseline, args.warmup)
    code = 1 if any(r["wrong"] for r in rows) else 0
    if rank == 0:
        command = f"mpiexec -n {p} {cli.command_line(PROG, argv)}"
        text = table(rows)
        against = "gloo and the pass-through baseline" if args.baseline == PASSTHROUGH else "gloo"
        title = f"dist.all_reduce, {args.dtype}, {p} ranks: mpicomm backend against {against} (torch {torch.__version__})"
        print(f"# {title}\n{text}")
        if args.out:
            library = " ".join(MPI.Get_library_version().splitlines()[0].split())
            body = [f"## {title}", "", f"Command: `{command}`", "", f"Machine: {describe_cpu()}, {library}", ""]
            if variables:
                body += [f"Settings: `{variables}`", ""]
            body += [_method(args), "", text, ""]
            with open(args.out, "a" if args.append else "w") as f:
                f.write("\n".join(body) + "\n")
        if args.json:
            cli.write_json(args.json, command, rows, ranks=p, dtype=args.dtype, torch=torch.__version__,
                           iters=args.iters, warmup=args.warmup, repeat=args.repeat, method=_method(args),
                           settings=variables)
    dist.destroy_process_group()
    worst: int = world.allreduce(code, op=MPI.MAX)
    return worst


if __name__ == "__main__":
    sys.exit(main())
