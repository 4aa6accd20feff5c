"""Benchmarks, run under mpiexec: ``python -m mpicomm.bench <name> [options]``.

    mpiexec -n 2 python -m mpicomm.bench pingpong --sizes 8:1M --out BENCHMARKS-pingpong.md

Each benchmark prints an OSU-style table (size, latency in µs, iterations)
with mpi4py's native call and mpicomm's measured **in the same run,
interleaved** (rounds alternate between them, so both see the same machine
noise), plus their ratio; ``--out`` also writes the table, with the command
that made it and the machine, as Markdown.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from typing import Callable

import numpy as np

__all__ = ["BENCHMARKS", "benchmark", "parse_sizes", "main"]

BENCHMARKS: dict[str, Callable[[argparse.Namespace], list[tuple]]] = {}


def benchmark(name: str) -> Callable:
    """Register a benchmark sub-command."""

    def register(fn: Callable) -> Callable:
        BENCHMARKS[name] = fn
        return fn

    return register


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _bytes(text: str) -> int:
    text = text.strip().upper().removesuffix("B")
    unit = text[-1] if text and text[-1] in "KMG" else ""
    try:
        value = int(text[: len(text) - len(unit)]) * _UNITS[unit]
    except ValueError:
        value = -1
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size; use bytes with an optional K, M or G (e.g. 64K)")
    return value


def parse_sizes(text: str) -> list[int]:
    """``"8:1M"`` → powers of two from 8 B to 1 MiB; ``"8,100,4K"`` → those sizes."""
    if ":" in text:
        low, high = (_bytes(t) for t in text.split(":", 1))
        if low > high:
            raise argparse.ArgumentTypeError(f"--sizes {text}: the first size is larger than the last")
        sizes, size = [], low
        while size <= high:
            sizes.append(size)
            size *= 2
        return sizes
    return [_bytes(t) for t in text.split(",")]


def _iterations(size: int, requested: int | None) -> int:
    return requested if requested else (1000 if size <= 8192 else 100)  # OSU's defaults


@benchmark("pingpong")
def pingpong(args: argparse.Namespace) -> list[tuple]:
    """Ranks 0 and 1 bounce a message: mpi4py Send/Recv against mpicomm send_array/recv_array."""
    import mpicomm

    comm = mpicomm.Comm()
    if comm.size < 2:
        raise SystemExit("pingpong needs 2 ranks: mpiexec -n 2 python -m mpicomm.bench pingpong")
    rank = comm.rank
    peer = 1 - rank if rank < 2 else None  # ranks beyond the first two only wait
    rows = []
    for size in args.sizes:
        iters = _iterations(size, args.iters)
        x = np.zeros(size, np.uint8)
        y = np.empty(size, np.uint8)

        def bounce(send: Callable, recv: Callable) -> Callable[[], None]:
            """One round trip: rank 0 sends then receives, rank 1 the other way round."""
            if rank == 0:
                return lambda: (send(x, peer), recv(y, peer))
            return lambda: (recv(y, peer), send(x, peer))

        native = bounce(comm.Send, comm.Recv)
        typed = bounce(comm.send_array, comm.recv_array)
        totals = {"native": 0.0, "mpicomm": 0.0}
        if rank < 2:
            rounds = 5
            for name, fn in (("native", native), ("mpicomm", typed)):
                for _ in range(max(1, iters // 10)):  # warm-up
                    fn()
            for _ in range(rounds):
                for name, fn in (("native", native), ("mpicomm", typed)):
                    start = time.perf_counter()
                    for _ in range(max(1, iters // rounds)):
                        fn()
                    totals[name] += time.perf_counter() - start
        per = {k: v / (max(1, iters // rounds) * rounds) / 2 * 1e6 for k, v in totals.items()} if rank < 2 else {}
        per = comm.bcast(per, root=0)
        rows.append((size, per["native"], per["mpicomm"], per["mpicomm"] / per["native"], iters))
        if comm.rank == 0 and args.progress:
            print(f"  {size} B done", file=sys.stderr, flush=True)
    comm.Barrier()
    return rows


HEADER = ("Size (B)", "native MPI (us)", "mpicomm (us)", "ratio", "Iterations")


def table(rows: list[tuple]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---:|" * len(HEADER)]
    for size, native, ours, ratio, iters in rows:
        lines.append(f"| {size} | {native:.2f} | {ours:.2f} | {ratio:.2f} | {iters} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpicomm.bench", description=__doc__.splitlines()[0])
    parser.add_argument("benchmark", choices=sorted(BENCHMARKS), help="which benchmark")
    parser.add_argument("--sizes", type=parse_sizes, default=parse_sizes("8:1M"),
                        help="message sizes: LOW:HIGH (powers of two) or a list, e.g. 8:1M (default) or 8,64K")
    parser.add_argument("--iters", type=int, default=None,
                        help="iterations per size (default: OSU's, 1000 up to 8 KiB, 100 above)")
    parser.add_argument("--out", help="also write the table, the command and the machine to this Markdown file")
    parser.add_argument("--progress", action="store_true", help="report each size on stderr as it finishes")
    args = parser.parse_args(argv)
    if args.iters is not None and args.iters < 1:
        parser.error(f"--iters {args.iters}: must be >= 1")

    rows = BENCHMARKS[args.benchmark](args)
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_rank() != 0:
        return 0
    text = table(rows)
    print(text)
    if args.out:
        command = f"mpiexec -n {MPI.COMM_WORLD.Get_size()} python -m mpicomm.bench " + " ".join(
            argv if argv is not None else sys.argv[1:]
        )
        machine = (
            f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}, Python {platform.python_version()}, "
            f"{' '.join(MPI.Get_library_version().splitlines()[0].split())}"
        )
        with open(args.out, "w") as f:
            f.write(f"# {args.benchmark}\n\nCommand: `{command}`\n\nMachine: {machine}\n\n"
                    f"One-way latency (half a round trip), mean over iterations; native and mpicomm "
                    f"interleaved in 5 rounds per size.\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
