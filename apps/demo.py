"""A tour of mpicomm across N ranks: topology, push, pull (one-sided and rendezvous), barriers, collectives.

    mpiexec -n 4 python -m apps.demo [--count 100000] [--backend numpy|cupy] [--iters 200] [--warmup 5] [--json F]

Every transfer is checked against the data the sender must have sent (values
depend on rank and index); the program prints what it did, how long it took,
and exits non-zero if any check failed. An uncaught error on one rank aborts
the whole job instead of leaving the others waiting. Every timed loop starts
after ``--warmup`` untimed calls (first-call set-up stays out of the times);
``--json`` writes the checks and timings as one document (:mod:`mpicomm.cli`).
"""

from __future__ import annotations

import argparse
import importlib
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
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="A tour of mpicomm: topology, push, pull, barriers and collectives, each checked.",
        epilog=f"example: {USAGE_EXAMPLE} --count 64K --iters 50 --json demo.json",
    )
    parser.add_argument("--count", type=_count, default=100_000, metavar="N",
                        help="float64 elements per array, e.g. 100000, 64K or 1e6 (default: 100000)")
    parser.add_argument("--backend", choices=["numpy", "cupy"], default="numpy", help="array module (default: numpy)")
    parser.add_argument("--iters", type=int, default=200,
                        help="calls of each timed barrier loop; the ring exchange and the collectives make a tenth "
                             "as many (default: 200)")
    parser.add_argument("--warmup", type=int, default=5, metavar="N",
                        help="untimed calls before every timed loop (default: 5)")
    cli.add_json(parser, "the checks and timings")
    args = parser.parse_args(argv)
    if args.count < 0:
        parser.error(f"--count {args.count}: must be >= 0")
    if args.iters < 1:
        parser.error(f"--iters {args.iters}: must be >= 1")
    if args.warmup < 0:
        parser.error(f"--warmup {args.warmup}: must be >= 0")
    if args.backend == "cupy":
        from mpicomm.device import cupy_module, visible_devices

        if cupy_module() is None or visible_devices() == 0:
            parser.error("--backend cupy: needs CuPy and a visible GPU (pip install -e '.[cuda12]' or '.[cuda13]')")
    return args


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
    args = parse(argv)
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
    out.say(f"MPI: {MPI.Get_library_version().splitlines()[0].strip()}")
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
        per = timed(max(1, args.iters // 10), lambda: comm.sendrecv_array(x, right, left, buf=got), warm)
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

    out.say(f"\n6. collectives: every algorithm against the MPI library's own ({max(1, args.iters // 10)} calls each, "
            f"after {warm} untimed)")
    out.say(f"  {'collective':<14} {'algorithm':<20} {cli.US + '/call':>9}  {'MPI ' + cli.US:>8}")
    x = data(rank, n, xp)
    from mpicomm import registry

    facts = {"p": p, "nodes": comm.nodes, "commutative": True, "device": args.backend == "cupy", "blocking": True}
    cases = {
        "allreduce": (lambda: x, lambda: xp.empty_like(x), "Allreduce"),
        "allgather": (lambda: x[: n // p], lambda: xp.empty((n // p) * p, x.dtype), "Allgather"),
        "alltoall": (lambda: x[: (n // p) * p], lambda: xp.empty((n // p) * p, x.dtype), "Alltoall"),
    }
    for collective, (make_send, make_recv, method) in cases.items():
        send, expected, got = make_send(), make_recv(), make_recv()
        getattr(MPI.COMM_WORLD, method)(send, expected)  # the library's own answer (host or CUDA-aware)
        calls = max(1, args.iters // 10)
        native = comm.allreduce(timed(calls, lambda m=method, s=send, e=expected: getattr(MPI.COMM_WORLD, m)(s, e), warm),
                                op=MPI.MAX)
        for algorithm in mpicomm.algorithms(collective):
            why = registry.allowed(registry.lookup(collective, algorithm), facts)
            if why:  # e.g. shm on a communicator that spans nodes
                out.say(f"  {collective:<14} {algorithm:<20} skipped: it {why}")
                results["collectives"].append({"collective": collective, "algorithm": algorithm, "skipped": why})
                continue
            getattr(comm, method)(send, got, algorithm=algorithm)
            out.check(bool(xp.allclose(got, expected)), f"{collective}/{algorithm}")
            per = comm.allreduce(timed(calls, lambda m=method, s=send, g=got, a=algorithm: getattr(comm, m)(s, g, algorithm=a),
                                       warm),
                                 op=MPI.MAX)
            out.say(f"  {collective:<14} {algorithm:<20} {per * 1e6:9.1f}  {native * 1e6:8.1f}")
            results["collectives"].append({"collective": collective, "algorithm": algorithm, "us": per * 1e6,
                                           "mpi_us": native * 1e6})
    out.verdict("every algorithm's result equals MPI's")

    seconds = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
    out.say(f"\n{'all checks passed' if not out.bad else f'{out.bad} check(s) FAILED'} in {cli.format_time(seconds)}")
    if args.json and rank == 0:
        results.update(checks=out.checks, failed=out.bad, passed=not out.bad, seconds=seconds)
        cli.write_json(args.json, f"mpiexec -n {p} {cli.command_line(PROG, argv)}", results, ranks=p)
    return 0 if not out.bad else 1


if __name__ == "__main__":
    from mpicomm.runtime import main

    sys.exit(main(run))
