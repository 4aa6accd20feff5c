"""``mpiexec -n 2 python -m mpicomm.bench.first_call``: what a call on arrays mpicomm has not seen costs, per collective.

A program that makes new arrays for every call (``y = np.empty_like(x)``, a
fresh ``np.zeros`` per iteration, a new slice) never reaches the fast path of
a repeated call on the same arrays: each call finds no plan bound to its
arrays. For each collective and size, four ways, each over ``--calls`` calls
on that many distinct pairs of arrays (every call the first on its arrays),
the ways taking turns in 5 rounds:

* **native** - the MPI library's own call (mpi4py);
* **new arrays** - mpicomm's default: up to 64 KiB, the staged plan of the
  call's shape (compiled once, the arrays copied in and out); above that a
  plan compiled for the arrays;
* **compiled each call** - the same calls with staging off: the plan compile
  (prepared requests, scratch, the agreement) on every call, the first-call
  cost of a plan;
* **same arrays** - one pair of arrays for every call: the fast path, for
  comparison.

Each cell is the median of the rounds' means (µs, rank 0's clock, every
round between two barriers), with its ratio to native. ``--out FILE.md``
writes the table with the command and the machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import cli

__all__ = ["main", "table", "COLLECTIVES"]

PROG = "python -m mpicomm.bench.first_call"
ROUNDS = 5
#: The collectives measured, with the counts of their send and receive arrays for c elements per block at p ranks.
COLLECTIVES: dict[str, Callable[[int, int], tuple[int, int]]] = {
    "allreduce": lambda c, p: (c, c),
    "bcast": lambda c, p: (0, c),
    "reduce": lambda c, p: (c, c),
    "allgather": lambda c, p: (c, c * p),
    "alltoall": lambda c, p: (c * p, c * p),
    "reduce_scatter_block": lambda c, p: (c * p, c),
    "scan": lambda c, p: (c, c),
    "gather": lambda c, p: (c, c * p),
}


def _call(comm: Any, collective: str) -> Callable[[Any, Any], None]:
    """``fn(send, recv)``: *collective* on *comm* (mpi4py's or mpicomm's), root 0."""
    if collective == "bcast":
        return lambda send, recv: comm.Bcast(recv, root=0)
    if collective in ("reduce", "gather"):
        method = getattr(comm, collective.capitalize())
        return lambda send, recv: method(send, recv, root=0)
    method = getattr(comm, collective.capitalize() if collective != "reduce_scatter_block" else "Reduce_scatter_block")
    return lambda send, recv: method(send, recv)


def _timed(world: Any, fn: Callable[[Any, Any], None], pairs: list[tuple[Any, Any]], fresh: bool) -> float:
    """Seconds per call of ``fn`` over *pairs* (each call on its own arrays), or on the first pair every time."""
    world.Barrier()
    began = time.perf_counter()
    for i in range(len(pairs)):
        fn(*pairs[i if fresh else 0])
    spent = (time.perf_counter() - began) / len(pairs)
    world.Barrier()
    return spent


def _compiled(fn: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
    """*fn* with staging off: a plan compiled on every call on new arrays."""
    from ..front import dispatch

    def call(send: Any, recv: Any) -> None:
        most = dispatch.STAGE_MOST
        dispatch.STAGE_MOST = 0
        try:
            fn(send, recv)
        finally:
            dispatch.STAGE_MOST = most
    return call


def table(collectives: list[str], sizes: list[int], calls: int) -> list[list[str]]:
    """The table's rows (every rank measures; rank 0's rows are returned)."""
    from mpi4py import MPI

    import mpicomm

    world = MPI.COMM_WORLD
    p = world.size
    comm = mpicomm.Comm(world.Dup())
    state = comm._state
    rows = []
    for collective in collectives:
        for size in sizes:
            count = max(1, size // 8)
            nsend, nrecv = COLLECTIVES[collective](count, p)
            n = calls if size < 65536 else max(10, calls // 10)
            pairs = [(np.full(max(nsend, 1), world.rank + i, np.float64), np.zeros(nrecv)) for i in range(n)]
            ours = _call(comm, collective)
            ways = [("native", _call(world, collective), True), ("new arrays", ours, True),
                    ("compiled each call", _compiled(ours), True), ("same arrays", ours, False)]
            times: dict[str, list[float]] = {name: [] for name, _, _ in ways}
            for _ in range(ROUNDS):
                for name, fn, fresh in ways:
                    state.plans.clear()  # (every round's calls are first calls again)
                    state.fast.clear()
                    state.seen.clear()
                    times[name].append(_timed(world, fn, pairs, fresh))
            median = {name: statistics.median(t) for name, t in times.items()}
            base = median["native"]
            rows.append([collective, str(size)]
                        + [f"{median[name] * 1e6:.1f}" + ("" if name == "native" else f" ({median[name] / base:.2f}×)")
                           for name, _, _ in ways])
    comm.Free()
    return rows


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = cli.Parser(prog=PROG, description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    parser.add_argument("--collectives", default=",".join(COLLECTIVES), metavar="NAME,...",
                        help=f"collectives to measure (default: all of {', '.join(COLLECTIVES)})")
    parser.add_argument("--sizes", type=cli.sizes_arg, default=cli.parse_sizes("8,4K,64K,1M"),
                        help="message sizes in bytes, per block (default: 8,4K,64K,1M)")
    parser.add_argument("--calls", type=int, default=200, metavar="N",
                        help="calls per timing, each on its own arrays (default: 200; a tenth from 64 KiB)")
    cli.add_out(parser, "the table")
    args = parser.parse_args(argv)
    cli.at_least(parser, args, 1, "--calls")
    cli.check_out(parser, args)
    unknown = [c for c in args.collectives.split(",") if c not in COLLECTIVES]
    if unknown:
        parser.error(f"--collectives: unknown {', '.join(unknown)}; choose from {', '.join(COLLECTIVES)}")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = cli.parse_or_exit(_parse, argv)
    from mpi4py import MPI

    from .report import publish

    world = MPI.COMM_WORLD
    rows = table(args.collectives.split(","), args.sizes, args.calls)
    if world.rank != 0:
        return 0
    publish(args, argv, f"mpiexec -n {world.size} {PROG}", [
        f"Calls on arrays not seen before, float64, auto, at {world.size} ranks (µs per call, median of {ROUNDS} "
        f"interleaved rounds; ratio to native). new arrays: mpicomm's default (a staged plan up to 64 KiB); "
        f"compiled each call: the plan compile on every call; same arrays: the fast path.",
        cli.markdown_table(["collective", "bytes per block", "native", "new arrays", "compiled each call",
                            "same arrays"], rows)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
