"""Run the whole test suite: serially, then under mpiexec at 2, 3 and 4 ranks.

    python -m tests                       # the README's test command
    python -m tests --ranks 5,7           # the slower tier
    python -m tests --ranks 3 -- -k p2p   # pytest arguments after --

Each pass is ``python -m pytest --with-mpi tests/`` (1 rank) or
``mpiexec -n N python -m mpi4py -m pytest --with-mpi tests/``: ``-m mpi4py``
aborts the whole job if a rank dies of an uncaught exception, the harness in
tests/mpi_harness.py aborts it if a test fails on one rank while others wait,
pytest-timeout ends a hung test, and every pass has a wall-clock limit. With more
ranks than cores, MPICH is asked to sleep briefly when it polls without progress
(MPIR_CVAR_CH4_PROGRESS_THROTTLE=1), which halves the oversubscribed passes.
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import time

from tests import mpirun


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="1,2,3,4", help="comma-separated rank counts (default: 1,2,3,4; 1 = serial)")
    parser.add_argument("--timeout", type=float, default=1200, help="wall-clock limit per pass in seconds (default: 1200)")
    parser.add_argument("--slow", action="store_true", help="also run the slower tier (tests marked slow: >2 GiB messages)")
    parser.add_argument("--exitfirst", action="store_true", help="stop after the first failing pass")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (put them after --)")
    args = parser.parse_args(argv)
    try:
        counts = [int(n) for n in args.ranks.split(",") if n.strip()]
    except ValueError:
        parser.error(f"--ranks {args.ranks!r}: expected comma-separated integers such as 1,2,3,4")
    if not counts or min(counts) < 1:
        parser.error(f"--ranks {args.ranks!r}: rank counts must be >= 1")

    paths = [a for a in args.pytest_args if not a.startswith("-") and os.path.exists(a.split("::")[0])]
    default = [] if paths else [os.path.join(mpirun.REPO, "tests")]
    # Every rank must collect the same tests in the same order: no per-process random order.
    pytest_argv = ["-m", "pytest", "--with-mpi", "-p", "no:randomly", *default, *args.pytest_args]
    results = []
    for n in counts:
        print(f"\n==== mpicomm tests at {n} rank{'s' if n > 1 else ''} " + "=" * 40, flush=True)
        logs = os.path.join(mpirun.REPO, ".pytest_cache", f"rank-logs-{n}")
        os.makedirs(logs, exist_ok=True)
        for old in glob.glob(os.path.join(logs, "rank*.log")):
            os.remove(old)
        env = {"MPICOMM_TEST_LOG_DIR": logs}
        if args.slow:
            env["MPICOMM_SLOW_TESTS"] = "1"
        if n > (os.cpu_count() or 1) and "MPIR_CVAR_CH4_PROGRESS_THROTTLE" not in os.environ:
            # More ranks than cores: MPICH's busy polling starves the rank that has work;
            # a 1 µs sleep after idle polls lets it run (no effect on other MPI libraries).
            env["MPIR_CVAR_CH4_PROGRESS_THROTTLE"] = "1"
        start = time.monotonic()
        if n == 1:
            try:
                code = subprocess.run(
                    [sys.executable, *pytest_argv], cwd=mpirun.REPO, env=mpirun.job_env(env), timeout=args.timeout
                ).returncode
                timed_out = False
            except subprocess.TimeoutExpired:
                code, timed_out = 124, True
        else:
            result = mpirun.run(n, [sys.executable, "-m", "mpi4py", *pytest_argv], timeout=args.timeout, env=env, capture=False)
            code, timed_out = result.returncode, result.timed_out
        seconds = time.monotonic() - start
        if code != 0:
            for log in sorted(glob.glob(os.path.join(logs, "rank*.log"))):
                with open(log) as f:
                    tail = f.read().splitlines()[-80:]
                print(f"\n---- {os.path.relpath(log, mpirun.REPO)} (last {len(tail)} lines) ----")
                print("\n".join(tail))
        status = "timed out" if timed_out else ("passed" if code == 0 else f"failed ({code})")
        results.append((n, status, seconds))
        if code != 0 and args.exitfirst:
            break

    print("\n==== summary " + "=" * 40)
    print(f"{'ranks':>5}  {'result':<12} {'seconds':>8}")
    for n, status, seconds in results:
        print(f"{n:>5}  {status:<12} {seconds:>8.1f}")
    return 0 if all(status == "passed" for _, status, _ in results) and len(results) == len(counts) else 1


if __name__ == "__main__":
    sys.exit(main())
