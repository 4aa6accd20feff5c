"""``mpiexec -n 2 python -m mpicomm.bench.lane``: the compiled lane against the executor's Python loop, side by side.

Two tables, one run:

* **the route** (rank 0 alone, on a duplicate of ``MPI.COMM_SELF``): one round
  of a prepared persistent send to itself and its receive, started, waited
  for and the 8 bytes added, three ways - mpi4py's calls from Python
  (``Startall``, ``Waitall``, ``np.add``: what the executor's Python loop
  makes), the same MPI functions called through ctypes, and the lane (one
  call into C). The best of 5 timings of ``--calls`` rounds each. This is the
  measurement behind docs/engine.md's choice of route.
* **the lane's effect** (every rank): a blocking ``Allreduce`` of float64 on
  the same arrays at each size, with ``auto``, against the MPI library's own
  call, and the same plan with its lane removed (the executor's Python loop);
  and a persistent request (``Allreduce_init``, ``Start`` + ``Wait``) with
  and without its lane. The variants take turns in 5 rounds; each cell is the
  median of the rounds' means (µs, rank 0's clock, every round between two
  barriers), with its ratio to native.

``--out FILE.md`` writes both tables with the command and the machine.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import cli

__all__ = ["main", "route", "effect"]

PROG = "python -m mpicomm.bench.lane"
ROUNDS = 5


def _best(fn: Callable[[], None], calls: int) -> float:
    best = float("inf")
    for _ in range(5):
        began = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - began) / calls)
    return best


def route(calls: int) -> list[list[str]]:
    """The route table's rows: (way, ns per round)."""
    from mpi4py import MPI

    from ..engine import lane

    comm = MPI.COMM_SELF.Dup()
    a, b = np.zeros(1), np.ones(1)
    reqs = [comm.Recv_init(a, 0, 1), comm.Send_init(b, 0, 1)]
    startall, waitall = MPI.Prequest.Startall, MPI.Request.Waitall

    def through_mpi4py() -> None:
        startall(reqs)
        waitall(reqs)
        np.add(a, b, out=a)

    ways: list[tuple[str, Callable[[], None]]] = [("mpi4py calls from Python (the executor's Python loop)",
                                                   through_mpi4py)]
    if lane.available():
        library = lane._library()
        handles = ctypes.create_string_buffer(lane._handles(reqs), 2 * lane._HANDLE)
        statuses = ctypes.create_string_buffer(2 * MPI._sizeof(MPI.Status))
        c_startall, c_waitall = library.MPI_Startall, library.MPI_Waitall

        def through_ctypes() -> None:
            c_startall(2, handles)
            c_waitall(2, handles, statuses)
            np.add(a, b, out=a)

        one = lane.Lane([(lane._handles(reqs), 2, [], [], [lane.combine(1, a, b, a)], False)], [], [a, b])
        ways += [("ctypes calls into the same MPI library", through_ctypes),
                 ("the lane: one call into C, the GIL released", lambda: one.start(64, True))]
    rows = [[name, f"{_best(fn, calls) * 1e9:.0f}"] for name, fn in ways]
    for r in reqs:
        r.Free()
    comm.Free()
    return rows


def effect(sizes: list[int], calls: int) -> list[list[str]]:
    """The effect table's rows (every rank measures; rank 0's rows are returned)."""
    from mpi4py import MPI

    import mpicomm

    world = MPI.COMM_WORLD
    rows = []
    for size in sizes:
        count = max(1, size // 8)
        comm = mpicomm.Comm(world)
        python = comm.Dup()
        x = np.arange(count, dtype=np.float64) + world.rank
        outs = [np.empty_like(x) for _ in range(4)]
        for _ in range(2):  # (the second call on the same arrays compiles their own plan: the first runs a staged one)
            comm.Allreduce(x, outs[0])
            python.Allreduce(x, outs[1])
        for plan in python._state.plans.values():
            plan.program.lane = None  # the same plan, run by the executor's Python loop
        with_lane = comm.Allreduce_init(x, outs[2])
        without = python.Allreduce_init(x, outs[3])
        assert with_lane._plan is not None and without._plan is not None
        without._plan.program.lane = None
        n = calls if size < 65536 else max(10, calls // 10) if size < 1 << 20 else max(5, calls // 100)

        variants: dict[str, Callable[[], None]] = {
            "native": _blocking(world, x, outs[0]), "lane": _blocking(comm, x, outs[0]),
            "Python loop": _blocking(python, x, outs[1]), "persistent, lane": _persistent(with_lane),
            "persistent, Python loop": _persistent(without)}
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(ROUNDS):
            for name, fn in variants.items():
                fn()
                world.Barrier()
                began = time.perf_counter()
                for _ in range(n):
                    fn()
                times[name].append((time.perf_counter() - began) / n)
                world.Barrier()
        median = {name: statistics.median(t) for name, t in times.items()}
        native = median["native"]
        rows.append([str(size)]
                    + [f"{median[name] * 1e6:.1f}" + ("" if name == "native" else f" ({median[name] / native:.2f}×)")
                       for name in variants])
        with_lane.Free()
        without.Free()
        python.Free()
    return rows


def _blocking(comm: Any, x: np.ndarray, out: np.ndarray) -> Callable[[], None]:
    return lambda: comm.Allreduce(x, out)


def _persistent(request: Any) -> Callable[[], None]:
    def once() -> None:
        request.Start()
        request.Wait()
    return once


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = cli.Parser(prog=PROG, description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    parser.add_argument("--sizes", type=cli.sizes_arg, default=cli.parse_sizes("8,64K,1M,16M"),
                        help="message sizes in bytes for the effect table (default: 8,64K,1M,16M)")
    parser.add_argument("--calls", type=int, default=20000, metavar="N",
                        help="calls per timing at the smallest sizes (default: 20000; a tenth from 64 KiB, a "
                             "hundredth from 1 MiB)")
    cli.add_out(parser, "both tables")
    args = parser.parse_args(argv)
    cli.at_least(parser, args, 1, "--calls")
    cli.check_out(parser, args)
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = cli.parse_or_exit(_parse, argv)
    from mpi4py import MPI

    from ..engine import lane
    from .report import publish

    world = MPI.COMM_WORLD
    ways = route(args.calls) if world.rank == 0 else []
    world.Barrier()
    rows = effect(args.sizes, args.calls)
    if world.rank != 0:
        return 0
    publish(args, argv, f"mpiexec -n {world.size} {PROG}", [
        f"Lane: {'built' if lane.available() else 'off (' + lane.why_not + ')'}",
        "One round of a prepared persistent send to itself and its receive, started, waited for and 8 bytes added "
        "(rank 0, best of 5):",
        cli.markdown_table(["route", "ns per round"], ways),
        f"Blocking and persistent Allreduce of float64 on the same arrays, auto, at {world.size} ranks (µs per call, "
        f"median of {ROUNDS} interleaved rounds; ratio to native):",
        cli.markdown_table(["bytes", "native", "lane", "Python loop", "persistent, lane", "persistent, Python loop"],
                           rows)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
