"""A tour of mpicomm across N ranks: topology, push, pull (one-sided and rendezvous), barriers, collectives.

    mpiexec -n 4 python -m apps.demo [--count 100000] [--backend numpy|cupy] [--iters 50] [--warmup 5] [--json F]

Every transfer is checked against the data the sender must have sent (values
depend on rank and index); the program prints what it did, how long it took,
and exits non-zero if any check failed. An uncaught error on one rank aborts
the whole job instead of leaving the others waiting. Every timed loop makes
``--iters`` calls after ``--warmup`` untimed ones (first-call set-up stays out
of the times); ``--json`` writes the checks and timings as one document
(:mod:`mpicomm.cli`).

The collectives section shows what a user's call gets: the algorithm
``auto`` chooses, timed next to the MPI library's own call, and the fastest
of the other registered algorithms (every one of them is checked and timed,
and all are in ``--json``). When a node has more ranks than cores, a line says
that the timings measure how the operating system shares the cores, and gives
the command that runs at the core count.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

import numpy as np

from mpicomm import cli

PROG = "python -m apps.demo"
USAGE_EXAMPLE = "mpiexec -n 4 python -m apps.demo"


def _count(text: str) -> int:
    """``--count``: elements as 100000, 64K or 1e6 (a negative number reaches the range check in :func:`parse`)."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return cli.parse_size(text, "--count", minimum=0)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = cli.Parser(
        prog=PROG,
        description="A tour of mpicomm: topology, push, pull, barriers and collectives, each checked.",
        epilog=f"example: {USAGE_EXAMPLE} --count 64K --iters 50 --json demo.json",
    )
    parser.add_argument("--count", type=_count, default=100_000, metavar="N",
                        help="float64 elements per array, e.g. 100000, 64K or 1e6 (default: 100000)")
    parser.add_argument("--backend", choices=["numpy", "cupy"], default="numpy", help="array module (default: numpy)")
    parser.add_argument("--iters", type=int, default=50, metavar="N",
                        help="timed calls of every timed loop: the ring exchange, each barrier algorithm, each "
                             "collective algorithm and the MPI library's call (default: 50)")
    parser.add_argument("--warmup", type=int, default=5, metavar="N",
                        help="untimed calls before every timed loop (default: 5)")
    cli.add_json(parser, "the checks and timings")
    args = parser.parse_args(argv)
    cli.at_least(parser, args, 0, "--count")
    cli.at_least(parser, args, 1, "--iters")
    cli.at_least(parser, args, 0, "--warmup")
    if args.backend == "cupy":
        from mpicomm.device import cupy_module, visible_devices

        if cupy_module() is None or visible_devices() == 0:
            parser.error("--backend cupy: needs CuPy and a visible GPU (pip install -e '.[cuda12]' or '.[cuda13]')")
    return args


#: The collectives the demo times: (the send buffer, a receive buffer, the method), from x (count elements).
_CASES = {
    "allreduce": (lambda x, p: x, lambda x, p, xp: xp.empty_like(x), "Allreduce"),
    "allgather": (lambda x, p: x[: x.size // p], lambda x, p, xp: xp.empty((x.size // p) * p, x.dtype), "Allgather"),
    "alltoall": (lambda x, p: x[: (x.size // p) * p], lambda x, p, xp: xp.empty((x.size // p) * p, x.dtype),
                 "Alltoall"),
}


def _crowded(comm, argv: list[str] | None) -> str:
    """One line when a node has more ranks than cores (the timings then measure the OS scheduler), else ""."""
    from mpi4py import MPI

    most = comm.allreduce(comm.local_size, op=MPI.MAX)
    fewest_cores = comm.allreduce(os.cpu_count() or 1, op=MPI.MIN)
    if most <= fewest_cores:
        return ""
    return (f"note: {most} ranks share {fewest_cores} cores on a node, so the timings below measure how the OS "
            f"scheduler shares the cores, not the algorithms; to time them, run at the core count: "
            f"mpiexec -n {fewest_cores * comm.nodes} {cli.command_line(PROG, argv)}")


#: Interleaved rounds of the collectives' timing: every variant in turn, --iters / ROUNDS calls each.
ROUNDS = 5


def _interleaved(comm, calls: dict, iters: int, warmup: int) -> dict[str, float]:
    """Seconds per call of each of *calls* (name → call), timed in :data:`ROUNDS` interleaved rounds after
    *warmup* untimed calls each: the median over rounds of the slowest rank's mean (noise hits every variant
    alike, and one noisy round does not decide)."""
    from mpi4py import MPI

    rounds = min(ROUNDS, iters)
    per = max(1, iters // rounds)
    for fn in calls.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            times[name].append(comm.allreduce(timed(per, fn), op=MPI.MAX))
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()}


def _time_collective(comm, collective: str, method: str, send, expected, got, args, out, xp) -> list[dict]:
    """Check every allowed algorithm of *collective* and auto against the library's call, then time them all,
    interleaved (every rank).

    Returns one row per algorithm: ``us`` and ``mpi_us`` (µs per call, see :func:`_interleaved`), ``chose`` and
    ``source`` for auto; ``skipped`` (why) for an algorithm whose restrictions exclude this run.
    """
    from mpi4py import MPI

    import mpicomm
    from mpicomm import registry
    from mpicomm.bench import COLLECTIVES, auto_choice
    from mpicomm.facts import Facts

    facts = Facts(p=comm.size, nodes=comm.nodes, device=args.backend == "cupy", blocking=True)
    rows: list[dict] = []
    calls = {"MPI": lambda: getattr(MPI.COMM_WORLD, method)(send, expected)}
    for algorithm in [*mpicomm.algorithms(collective), "auto"]:
        if algorithm != "auto":
            why = registry.allowed(registry.lookup(collective, algorithm), facts)
            if why:  # e.g. shm on a communicator that spans nodes
                rows.append({"collective": collective, "algorithm": algorithm, "skipped": why})
                continue
        got[...] = -1
        getattr(comm, method)(send, got, algorithm=algorithm)
        out.check(bool(xp.allclose(got, expected)), f"{collective}/{algorithm}")
        calls[algorithm] = lambda a=algorithm: getattr(comm, method)(send, got, algorithm=a)
    seconds = _interleaved(comm, calls, args.iters, args.warmup)
    for algorithm in calls:
        if algorithm == "MPI":
            continue
        row = {"collective": collective, "algorithm": algorithm, "us": seconds[algorithm] * 1e6,
               "mpi_us": seconds["MPI"] * 1e6}
        if algorithm == "auto":
            chose, source = auto_choice(comm, COLLECTIVES[collective], (send, got))
            row.update(chose=chose, source=source)
        rows.append(row)
    return rows


def data(rank: int, count: int, xp):
    """What rank *rank* sends: rank·10⁶ + index, so misplaced data is caught."""
    return xp.arange(count, dtype=np.float64) + rank * 1_000_000.0


def timed(iters: int, fn, warmup: int = 0) -> float:
    """Mean seconds per call of *fn* over *iters* calls, after *warmup* untimed calls."""
    for _ in range(warmup):
        fn()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters


class Report:
    """Rank 0 prints; every rank's checks count."""

    def __init__(self, comm):
        self.comm = comm
        self.failures: list[str] = []
        self.bad = 0
        self.checks: list[dict] = []  #: every verdict, for --json

    def say(self, text: str = "") -> None:
        if self.comm.rank == 0:
            print(text, flush=True)

    def check(self, ok: bool, what: str) -> None:
        if not ok:
            self.failures.append(what)

    def verdict(self, title: str) -> None:
        failed = self.comm.allgather(self.failures)
        bad = [(r, f) for r, fs in enumerate(failed) for f in fs]
        self.say(f"  {title}: " + ("ok" if not bad else "FAILED " + "; ".join(f"rank {r}: {f}" for r, f in bad)))
        self.checks.append({"check": title, "passed": not bad, "failures": [f"rank {r}: {f}" for r, f in bad]})
        self.failures = []
        self.bad += len(bad)


def run(argv: list[str] | None = None) -> int:
    args = cli.parse_or_exit(parse, argv)
    xp = importlib.import_module(args.backend)
    from mpi4py import MPI

    import mpicomm

    comm = mpicomm.Comm()
    if args.backend == "cupy":
        comm.bind_device()
    p, rank, n = comm.size, comm.rank, args.count
    right, left = (rank + 1) % p, (rank - 1) % p
    out = Report(comm)
    start = time.perf_counter()
    warm = args.warmup
    results: dict = {"ranks": p, "nodes": comm.nodes, "count": n, "backend": args.backend, "iters": args.iters,
                     "warmup": warm, "topology": [], "ring": None, "barrier": [], "collectives": []}

    out.say(f"mpicomm demo: {p} ranks on {comm.nodes} node(s), {n} float64 per array ({n * 8 / 1e6:.2f} MB), {args.backend}")
    out.say(f"MPI: {' '.join(MPI.Get_library_version().splitlines()[0].split())}")
    crowded = _crowded(comm, argv)
    if crowded:
        out.say(crowded)
    results["oversubscribed"] = bool(crowded)
    launch = mpicomm.launch_info()
    rows = comm.gather((rank, comm.local_rank, comm.local_size, comm.node, comm.host, comm.device, launch.launcher), root=0)
    out.say("\n1. topology (from MPI; the launcher's environment agrees)")
    out.say(f"  {'rank':>4} {'local':>7} {'node':>4}  {'host':<16} {'gpu':>4}  launcher")
    for r, lr, ls, node, host, dev, launcher in rows or []:
        out.say(f"  {r:>4} {lr:>3}/{ls:<3} {node:>4}  {host:<16} {str(dev):>4}  {launcher}")
        results["topology"].append({"rank": r, "local_rank": lr, "local_size": ls, "node": node, "host": host,
                                    "device": dev, "launcher": launcher})
    out.check(launch.rank == rank and launch.size == p, f"launcher says rank {launch.rank}/{launch.size}")

    out.say("\n2. push: every rank sends to its right neighbour (send_array / recv_array)")
    send = comm.isend_array(data(rank, n, xp), right, tag=1)
    got = comm.recv_array(source=left, tag=1, xp=xp)
    send.Wait()
    out.check(bool((got == data(left, n, xp)).all()) and got.shape == (n,), "ring data")
    out.verdict(f"received {n} values from rank {left} on every rank, dtype and shape carried")
    if p > 1:
        x = data(rank, n, xp)
        per = timed(args.iters, lambda: comm.sendrecv_array(x, right, left, buf=got), warm)
        out.say(f"  ring exchange: {cli.format_time(per)} per step, {2 * x.nbytes / per / 1e9:.2f} GB/s per rank "
                f"(in+out)")
        results["ring"] = {"us": per * 1e6, "gbs_per_rank": 2 * x.nbytes / per / 1e9}

    out.say("\n3. pull, one-sided: each rank exposes an array; everyone gets a slice from everyone (RMA window)")
    mine = data(rank, n, xp)
    with comm.expose(mine) as win:
        comm.Barrier()
        half = n // 2
        for target in range(p):
            piece = win.get(target, offset=half, count=n - half)
            out.check(bool((piece == data(target, n, xp)[half:]).all()), f"window slice of rank {target}")
        comm.Barrier()
    out.verdict(f"got elements [{n // 2}, {n}) of each of the {p} windows")

    out.say("\n4. pull, rendezvous: the puller asks, the owner answers (keys published when ready)")
    with comm.rendezvous() as rdv:
        rdv.publish(f"weights/{rank}", data(rank, n, xp))
        pulled = rdv.pull(f"weights/{right}", owner=right, xp=xp)
        out.check(bool((pulled == data(right, n, xp)).all()), "rendezvous data")
    out.verdict(f"every rank pulled 'weights/<right>' ({n} values) from its right neighbour")

    out.say(f"\n5. barriers ({args.iters} each, after {warm} untimed)")
    for algorithm in mpicomm.algorithms("barrier"):
        comm.Barrier(algorithm=algorithm)
        per = comm.allreduce(timed(args.iters, lambda a=algorithm: comm.Barrier(algorithm=a), warm), op=MPI.MAX)
        out.say(f"  {algorithm:<14} {cli.format_time(per):>10}")
        results["barrier"].append({"algorithm": algorithm, "us": per * 1e6})

    out.say("\n6. collectives: the algorithm auto chooses against the MPI library's own call, and the fastest other "
            "algorithm\n   (every algorithm checked and timed: "
            f"{args.iters} calls each after {warm} untimed, interleaved in {min(ROUNDS, args.iters)} rounds; "
            "the median round, slowest rank)")
    out.say(f"  {'collective':<12} {'auto chose':<20} {cli.US + '/call':>9} {'MPI ' + cli.US:>9} {'vs MPI':>7}  "
            f"{'fastest other':<20} {cli.US + '/call':>9}")
    x = data(rank, n, xp)
    for collective, (make_send, make_recv, method) in _CASES.items():
        send, expected, got = make_send(x, p), make_recv(x, p, xp), make_recv(x, p, xp)
        getattr(MPI.COMM_WORLD, method)(send, expected)  # the library's own answer (host or CUDA-aware)
        rows = _time_collective(comm, collective, method, send, expected, got, args, out, xp)
        results["collectives"] += rows
        timed_rows = [r for r in rows if "us" in r]
        auto = next(r for r in timed_rows if r["algorithm"] == "auto")
        others = [r for r in timed_rows if r["algorithm"] not in ("auto", auto["chose"])]
        fastest = min(others, key=lambda r: r["us"], default=None)
        if fastest is not None:
            fastest["fastest_other"] = True
        out.say(f"  {collective:<12} {auto['chose']:<20} {auto['us']:9.1f} {auto['mpi_us']:9.1f} "
                f"{auto['us'] / auto['mpi_us']:6.2f}x  "
                + (f"{fastest['algorithm']:<20} {fastest['us']:9.1f}" if fastest else f"{'-':<20} {'-':>9}"))
    out.verdict("every algorithm's result (auto's too) equals MPI's")

    seconds = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
    out.say(f"\n{'all checks passed' if not out.bad else f'{out.bad} check(s) FAILED'} in {cli.format_time(seconds)}")
    if args.json and rank == 0:
        results.update(checks=out.checks, failed=out.bad, passed=not out.bad, seconds=seconds)
        cli.write_json(args.json, f"mpiexec -n {p} {cli.command_line(PROG, argv)}", results, ranks=p)
    return 0 if not out.bad else 1


if __name__ == "__main__":
    from mpicomm.runtime import main

    sys.exit(main(run))
