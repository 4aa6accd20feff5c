"""``mpiexec -n N python -m mpicomm.torch.bench``: ``dist.all_reduce`` on the mpicomm backend against gloo.

In one run, interleaved round by round so that the machine's noise hits every
variant alike, at each size:

* ``gloo`` - ``dist.all_reduce(t, group=gloo)``, PyTorch's CPU backend;
* ``mpicomm`` - ``dist.all_reduce(t)`` on the mpicomm backend (the default
  group), mpicomm's ``auto`` algorithm;
* ``Comm.Allreduce`` - ``mpicomm.Comm.Allreduce`` on the tensor's NumPy view,
  the same call without PyTorch: the difference is the backend's overhead;
* ``native`` - the MPI library's own ``MPI_Allreduce`` through mpi4py.

Each variant's time is the median over ``--rounds`` rounds of the mean over
the round's iterations; the slowest rank's time is reported (as OSU does).
The table, ``--out FILE.md`` (Markdown, never replacing a file without
``--append``/``--force``) and ``--json FILE`` carry the command and machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

from .. import cli
from ..bench.report import markdown_table
from ..comm import Comm
from ..config import describe_cpu

__all__ = ["main", "measure"]

PROG = "python -m mpicomm.torch.bench"
DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64}


def _iterations(size: int, requested: int | None) -> int:
    if requested:
        return requested
    return 400 if size <= 8192 else max(10, min(200, (8 << 20) // size))


def _time(fn: Callable[[], object], iters: int, world: MPI.Intracomm) -> float:
    """Seconds per call on the slowest rank (a barrier first, so every rank starts together)."""
    world.Barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return world.allreduce((time.perf_counter() - start) / iters, op=MPI.MAX)


def measure(sizes: list[int], dtype: torch.dtype, rounds: int, iters: int | None,
            progress: cli.Progress) -> list[dict]:
    """One row per size: the median seconds of each variant, and the checks that they agree."""
    world = MPI.COMM_WORLD
    gloo = dist.new_group(backend="gloo")
    comm = Comm(world.Dup())
    itemsize = torch.empty(0, dtype=dtype).element_size()
    rows = []
    for size in sizes:
        n = max(1, size // itemsize)
        t = torch.zeros(n, dtype=dtype)  # zeros: repeated in-place sums stay finite
        a = t.numpy()
        variants = {
            "Comm.Allreduce": lambda: comm.Allreduce(MPI.IN_PLACE, a),
            "mpicomm": lambda: dist.all_reduce(t),
            "native": lambda: world.Allreduce(MPI.IN_PLACE, a),
            "gloo": lambda: dist.all_reduce(t, group=gloo),
        }
        count = _iterations(n * itemsize, iters)
        per_round = max(1, count // rounds)
        times: dict[str, list[float]] = {k: [] for k in variants}
        for fn in variants.values():  # warm-up: plans, scratch, connections
            for _ in range(max(2, per_round // 10)):
                fn()
        for _ in range(rounds):
            for name, fn in variants.items():
                times[name].append(_time(fn, per_round, world))
        # correctness on data that depends on rank and index: the backend against gloo
        x = (torch.arange(n, dtype=torch.float64) % 1000 + 1000 * world.Get_rank()).to(dtype)
        y = x.clone()
        dist.all_reduce(x)
        dist.all_reduce(y, group=gloo)
        wrong = int((x != y).sum())
        row = {"bytes": n * itemsize, "count": n, "iterations": per_round * rounds, "wrong": wrong}
        row.update({k: statistics.median(v) for k, v in times.items()})
        rows.append(row)
        progress.step(f"{cli.format_size(n * itemsize)}: mpicomm {cli.format_time(row['mpicomm'])}, "
                      f"gloo {cli.format_time(row['gloo'])}")
    dist.destroy_process_group(gloo)
    comm.Free()
    return rows


def table(rows: list[dict]) -> str:
    header = ["Size (B)", f"gloo ({cli.US})", f"mpicomm ({cli.US})", "gloo / mpicomm",
              f"Comm.Allreduce ({cli.US})", f"backend overhead ({cli.US})", f"native MPI ({cli.US})", "#wrong"]
    cells = [[str(r["bytes"]), f"{r['gloo'] * 1e6:.1f}", f"{r['mpicomm'] * 1e6:.1f}", f"{r['gloo'] / r['mpicomm']:.1f}",
              f"{r['Comm.Allreduce'] * 1e6:.1f}", f"{(r['mpicomm'] - r['Comm.Allreduce']) * 1e6:.1f}",
              f"{r['native'] * 1e6:.1f}", str(r["wrong"])] for r in rows]
    return markdown_table(header, cells)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                     epilog="Run under the launcher, e.g. mpiexec -n 2 python -m mpicomm.torch.bench "
                                            "--sizes 8:16M --out torch-allreduce.md")
    parser.add_argument("--sizes", type=cli.sizes_arg, default=cli.parse_sizes("8:16M"),
                        help="message sizes in bytes: LOW:HIGH (doubling) or a list (default: 8:16M)")
    parser.add_argument("--dtype", choices=DTYPES, default="float32", help="element type (default: float32)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per size (default: 5)")
    parser.add_argument("--iters", type=int, default=None,
                        help="calls per variant and size over all rounds (default: 400 up to 8 KiB, fewer above)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    cli.add_out(parser, "the table")
    cli.add_json(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: must be >= 1")
    if args.iters is not None and args.iters < args.rounds:
        parser.error(f"--iters {args.iters}: must be >= --rounds ({args.rounds})")
    cli.check_out(parser, args)
    if not dist.is_initialized():
        dist.init_process_group("mpicomm")
    world = MPI.COMM_WORLD
    rank, p = world.Get_rank(), world.Get_size()
    progress = cli.Progress(len(args.sizes), "torch.bench", show=rank == 0 and not args.quiet)
    rows = measure(args.sizes, DTYPES[args.dtype], args.rounds, args.iters, progress)
    code = 1 if any(r["wrong"] for r in rows) else 0
    if rank == 0:
        command = f"mpiexec -n {p} {cli.command_line(PROG, argv)}"
        text = table(rows)
        title = f"dist.all_reduce, {args.dtype}, {p} ranks: mpicomm backend against gloo (torch {torch.__version__})"
        print(f"# {title}\n{text}")
        if args.out:
            body = [f"## {title}", "", f"Command: `{command}`", "", f"Machine: {describe_cpu()}, {MPI.Get_library_version().splitlines()[0].strip()}",
                    "", text, ""]
            with open(args.out, "a" if args.append else "w") as f:
                f.write("\n".join(body) + "\n")
        if args.json:
            cli.write_json(args.json, command, rows, ranks=p, dtype=args.dtype, torch=torch.__version__)
    dist.destroy_process_group()
    return world.allreduce(code, op=MPI.MAX)


if __name__ == "__main__":
    sys.exit(main())
