"""Run the whole test suite: serially, then under mpiexec at 2, 3 and 4 ranks, and on 2 simulated nodes of 2.

    python -m tests                       # the README's test command
    python -m tests --ranks 5,7           # the slower tier
    python -m tests --ranks 3 -- -k p2p   # pytest arguments after --
    python -m tests --ranks 2x2,1x3       # simulated nodes: 2 nodes of 2 ranks, 3 nodes of 1 rank
    python -m tests --ranks 2+2+1         # uneven nodes: 5 ranks on nodes of 2, 2 and 1

A pass written ``NxM`` runs N·M ranks as M "nodes" of N ranks each (hydra's
``-launcher fork -hosts nodeA:N,nodeB:N,…``: MPI then reports M nodes, so
node-local and hierarchical code runs as on a cluster, on this one machine);
``A+B+C`` runs A+B+C ranks on nodes of A, B and C ranks. MPICH's traffic
between simulated nodes goes over TCP (``tests.mpirun.NETWORK``).

Every pass runs the whole suite, but for one rule that keeps each test to one
run per rank count: where the same run has a one-node pass and a simulated-nodes
pass of one size (the default's 4 and 2x2), the one-node pass runs only the
tests whose code depends on where ranks live (tests/coll, tests/test_shm.py).

Each pass is ``python -m pytest --with-mpi tests/`` (1 rank) or
``mpiexec -n N python -m mpi4py -m pytest --with-mpi tests/``: ``-m mpi4py``
aborts the whole job if a rank dies of an uncaught exception, the harness in
tests/mpi_harness.py aborts it if a test fails on one rank while others wait,
pytest-timeout ends a hung test, and every pass has a wall-clock limit. With more
ranks than cores, MPICH is asked to sleep briefly when it polls without progress
(MPIR_CVAR_CH4_PROGRESS_THROTTLE=1), which halves the oversubscribed passes.

After each pass, the MPICH shared-memory segments that the jobs it aborted or
killed on purpose left in /dev/shm are removed (``python -m mpicomm
cleanup``: only this user's, only those no live process uses).
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import time

from tests import mpirun

#: The tests whose code depends on where ranks live (a one-node pass beside a simulated-nodes one runs only these).
NODE_TESTS = [os.path.join(mpirun.REPO, "tests", "coll"), os.path.join(mpirun.REPO, "tests", "test_shm.py")]


def _layout(text: str) -> tuple[int, ...]:
    """The ranks of each simulated node: ``"4"`` → (4,): one node; ``"2x3"`` → (2, 2, 2): 3 nodes of 2 ranks;
    ``"2+2+1"`` → (2, 2, 1): uneven nodes."""
    text = text.strip().lower()
    if "+" in text:
        return tuple(int(n) for n in text.split("+"))
    per_node, _, nodes = text.partition("x")
    return (int(per_node),) * int(nodes or 1)


def _cleanup_shm() -> None:
    """Remove the stale MPICH segments a pass left (tests abort and kill jobs on purpose); never fails the run."""
    try:
        result = subprocess.run([sys.executable, "-m", "mpicomm", "cleanup"], cwd=mpirun.REPO,
                                env=mpirun.clean_env(), capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"shm cleanup: skipped ({exc})", flush=True)
        return
    lines = (result.stdout or result.stderr).strip().splitlines()
    print(f"shm cleanup: {lines[-1] if lines else f'exit status {result.returncode}'}", flush=True)


def _where(logs: str) -> list[str]:
    """What a failed pass's records say: the tests that failed, else the test each rank was in when it ended."""
    def read(kind: str) -> dict[int, list[str]]:
        found = {}
        for path in glob.glob(os.path.join(logs, f"{kind}-rank*")):
            with open(path) as f:
                found[int(path.rsplit("rank", 1)[1])] = [line for line in f.read().splitlines() if line]
        return found

    failed = list(dict.fromkeys(t for _, tests in sorted(read("failed").items()) for t in tests))
    if failed:
        return [f"failed: {t}" for t in failed[:20]] + ([f"... and {len(failed) - 20} more"] if len(failed) > 20 else [])
    running = {}
    for rank, tests in sorted(read("running").items()):
        running.setdefault(tests[-1] if tests else "(none)", []).append(rank)
    return [f"ended in: {t} (rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))})" for t, r in running.items()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="1,2,3,4,2x2",
                        help="comma-separated passes: rank counts, or NxM for M simulated nodes of N ranks "
                             "(default: 1,2,3,4,2x2; 1 = serial)")
    parser.add_argument("--timeout", type=float, default=1200, help="wall-clock limit per pass in seconds (default: 1200)")
    parser.add_argument("--slow", action="store_true", help="also run the slower tier (tests marked slow: >2 GiB messages)")
    parser.add_argument("--exitfirst", action="store_true", help="stop after the first failing pass")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (put them after --)")
    args = parser.parse_args(argv)
    try:
        passes = [_layout(n) for n in args.ranks.split(",") if n.strip()]
    except ValueError:
        parser.error(f"--ranks {args.ranks!r}: expected comma-separated rank counts, NxM node layouts or "
                     f"uneven ones (A+B+C), such as 1,2,3,4,2x2,2+2+1")
    if not passes or min(min(layout) for layout in passes) < 1:
        parser.error(f"--ranks {args.ranks!r}: rank and node counts must be >= 1")

    paths = [a for a in args.pytest_args if not a.startswith("-") and os.path.exists(a.split("::")[0])]
    default = [] if paths else [os.path.join(mpirun.REPO, "tests")]
    # Every rank must collect the same tests in the same order: no per-process random order.
    pytest_argv = ["-m", "pytest", "--with-mpi", "-p", "no:randomly", *default, *args.pytest_args]
    results = []
    spread = {sum(layout) for layout in passes if len(layout) > 1}  # sizes that run on simulated nodes too
    for layout in passes:
        n, nodes = sum(layout), len(layout)
        uneven = len(set(layout)) > 1
        name = str(n) if nodes == 1 else "+".join(map(str, layout)) if uneven else f"{layout[0]}x{nodes}"
        where = "" if nodes == 1 else f" on {nodes} simulated nodes"
        print(f"\n==== mpicomm tests at {n} rank{'s' if n > 1 else ''}{where} " + "=" * 40, flush=True)
        logs = os.path.join(mpirun.REPO, ".pytest_cache", f"rank-logs-{name}")
        os.makedirs(logs, exist_ok=True)
        for old in glob.glob(os.path.join(logs, "*rank*")):
            os.remove(old)
        env = {"MPICOMM_TEST_LOG_DIR": logs}
        if args.slow:
            env["MPICOMM_SLOW_TESTS"] = "1"
        if n > (os.cpu_count() or 1) and "MPIR_CVAR_CH4_PROGRESS_THROTTLE" not in os.environ:
            # More ranks than cores: MPICH's busy polling starves the rank that has work;
            # a 1 µs sleep after idle polls lets it run (no effect on other MPI libraries).
            env["MPIR_CVAR_CH4_PROGRESS_THROTTLE"] = "1"
        start = time.monotonic()
        if nodes > 1:
            # Between simulated nodes, MPICH's OFI network module over TCP, as between real ones: its default
            # UCX module lost wildcard (MPI.ANY_SOURCE) receives between them here, which hangs a user's own
            # wildcard receive (tests/test_p2p.py; mpicomm's protocols post none: docs/push-pull.md).
            for variable, value in mpirun.NETWORK.items():
                env.setdefault(variable, os.environ.get(variable, value))
            hosts = ",".join(f"node{chr(65 + k)}:{per_node}" for k, per_node in enumerate(layout))
            result = mpirun.run(n, [sys.executable, "-m", "mpi4py", *pytest_argv], timeout=args.timeout, env=env,
                                capture=False, hosts=hosts, launcher="fork")
            code, timed_out = result.returncode, result.timed_out
        elif n == 1:
            try:
                code = subprocess.run(
                    [sys.executable, *pytest_argv], cwd=mpirun.REPO, env=mpirun.job_env(env), timeout=args.timeout
                ).returncode
                timed_out = False
            except subprocess.TimeoutExpired:
                code, timed_out = 124, True
        else:
            argv = pytest_argv
            if not paths and n in spread:  # the whole suite runs at this size on simulated nodes
                argv = [a for a in pytest_argv if a not in default] + NODE_TESTS
            result = mpirun.run(n, [sys.executable, "-m", "mpi4py", *argv], timeout=args.timeout, env=env, capture=False)
            code, timed_out = result.returncode, result.timed_out
        seconds = time.monotonic() - start
        _cleanup_shm()
        if code != 0:
            for log in sorted(glob.glob(os.path.join(logs, "rank*.log"))):
                with open(log) as f:
                    tail = f.read().splitlines()[-80:]
                print(f"\n---- {os.path.relpath(log, mpirun.REPO)} (last {len(tail)} lines) ----")
                print("\n".join(tail))
        status = "timed out" if timed_out else ("passed" if code == 0 else f"failed ({code})")
        results.append((name, status, seconds, [] if code == 0 else _where(logs)))
        if code != 0 and args.exitfirst:
            break

    print("\n==== summary " + "=" * 40)
    print(f"{'ranks':>5}  {'result':<12} {'seconds':>8}")
    for n, status, seconds, where in results:
        print(f"{n:>5}  {status:<12} {seconds:>8.1f}")
        for line in where:
            print(f"{'':>7}{line}")
    return 0 if all(r[1] == "passed" for r in results) and len(results) == len(passes) else 1


if __name__ == "__main__":
    sys.exit(main())
