"""Run the whole test suite: serially, then under mpiexec at 2, 3 and 4 ranks, and on 2 simulated nodes of 2.

    python -m tests                       # the README's test command
    python -m tests --ranks 5,7           # the slower tier
    python -m tests --ranks 3 -- -k p2p   # pytest arguments after --
    python -m tests --ranks 2x2,1x3       # simulated nodes: 2 nodes of 2 ranks, 3 nodes of 1 rank
    python -m tests --ranks 2+2+1         # uneven nodes: 5 ranks on nodes of 2, 2 and 1
    python -m tests --gpu                 # the GPU tier, at 1, 2 and 4 ranks sharing the GPU(s)

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

The GPU tier (``--gpu``) runs, at each rank count (1, 2 and 4 unless
``--ranks`` says otherwise; ranks share the visible GPUs, ``local_rank %
GPUs``): every test with "cupy" or "gpu" in its name, parameters or marks
(every CuPy-parametrized test, the stream-contract tests, each application's
cupy backend), then the torch backend's tests with CUDA tensors
(``MPICOMM_TEST_TORCH_DEVICE=cuda``: its CPU matrix and DDP against
single-process training, on the GPU). Without a visible GPU it runs nothing,
says why, and exits 0: the normal tiers skip the same tests with the same
reason.

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
#: The GPU tier's rank counts (several ranks share one GPU) and its two runs per count: (label, pytest
#: arguments, the tests it runs (paths after ``--`` narrow it to those inside), environment).
GPU_RANKS = "1,2,4"
GPU_RUNS = [
    ("cupy", ["-k", "cupy or gpu"], os.path.join(mpirun.REPO, "tests"), {}),
    ("torch-cuda", [], os.path.join(mpirun.REPO, "tests", "torch"), {"MPICOMM_TEST_TORCH_DEVICE": "cuda"}),
]


def _and_keywords(ours: list[str], theirs: list[str]) -> list[str]:
    """Pytest arguments *ours* then *theirs*, with one ``-k`` that both select by (pytest keeps only the last)."""
    def split(argv: list[str]) -> tuple[list[str], str | None]:
        rest, keyword, i = [], None, 0
        while i < len(argv):
            if argv[i] == "-k" and i + 1 < len(argv):
                keyword, i = argv[i + 1], i + 2
            elif argv[i].startswith("-k") and len(argv[i]) > 2:
                keyword, i = argv[i][2:], i + 1
            else:
                rest, i = [*rest, argv[i]], i + 1
        return rest, keyword

    (mine, a), (yours, b) = split(ours), split(theirs)
    keyword = f"({a}) and ({b})" if a and b else a or b
    return [*mine, *yours, *(["-k", keyword] if keyword else [])]


def gpu_missing() -> str | None:
    """Why the GPU tier cannot run here, or None when CuPy sees a GPU (asked in a child process, so this one
    never initialises CUDA before it starts MPI jobs)."""
    probe = ("from mpicomm.device import cupy_module, visible_devices\n"
             "print('no-cupy' if cupy_module() is None else visible_devices())")
    try:
        result = subprocess.run([sys.executable, "-c", probe], cwd=mpirun.REPO, env=mpirun.clean_env(),
                                capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the GPU probe did not finish ({exc})"
    answer = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    if result.returncode != 0 or not answer:
        return f"the GPU probe failed: {(result.stderr.strip().splitlines() or ['no output'])[-1]}"
    if answer == "no-cupy":
        return "CuPy is not installed (pip install -e '.[cuda12]' or '.[cuda13]')"
    if answer == "0":
        return "CuPy is installed but sees no CUDA device (no GPU or no driver; check nvidia-smi and " \
               "CUDA_VISIBLE_DEVICES)"
    return None


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
    parser.add_argument("--ranks", default=None,
                        help="comma-separated passes: rank counts, or NxM for M simulated nodes of N ranks "
                             "(default: 1,2,3,4,2x2, or 1,2,4 with --gpu; 1 = serial)")
    parser.add_argument("--timeout", type=float, default=1200, help="wall-clock limit per pass in seconds (default: 1200)")
    parser.add_argument("--slow", action="store_true", help="also run the slower tier (tests marked slow: >2 GiB messages)")
    parser.add_argument("--gpu", action="store_true",
                        help=f"the GPU tier instead: CuPy, stream-contract, application and torch-on-CUDA tests at "
                             f"{GPU_RANKS} ranks (exits 0, saying why, without a GPU)")
    parser.add_argument("--exitfirst", action="store_true", help="stop after the first failing pass")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (put them after --)")
    args = parser.parse_args(argv)
    if args.gpu:
        reason = gpu_missing()
        if reason is not None:
            print(f"GPU tier: nothing ran: {reason}.", flush=True)
            return 0
    if args.ranks is None:
        args.ranks = GPU_RANKS if args.gpu else "1,2,3,4,2x2"
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
    # (--durations: each pass ends with its slowest tests, so what to move to the slower tier shows in CI's log)
    base_argv = ["-m", "pytest", "--with-mpi", "-p", "no:randomly", "--durations=15", "--durations-min=5"]
    if args.gpu:
        runs = []
        for label, extra, where, extra_env in GPU_RUNS:
            inside = [a for a in paths if os.path.abspath(a.split("::")[0]).startswith(where)]
            if paths and not inside:
                continue
            options = _and_keywords(extra, [a for a in args.pytest_args if a not in paths])
            runs.append((label, [*base_argv, *options, *(inside or [where])], extra_env))
        if not runs:
            parser.error(f"--gpu: none of the tests named after -- ({', '.join(paths)}) is in tests/")
    else:
        runs = [("", [*base_argv, *default, *args.pytest_args], {})]
    results = []
    spread = {sum(layout) for layout in passes if len(layout) > 1}  # sizes that run on simulated nodes too
    for layout, (label, pytest_argv, extra_env) in ((p, r) for p in passes for r in runs):
        n, nodes = sum(layout), len(layout)
        uneven = len(set(layout)) > 1
        shape = str(n) if nodes == 1 else "+".join(map(str, layout)) if uneven else f"{layout[0]}x{nodes}"
        name = shape + (f" {label}" if label else "")
        where = "" if nodes == 1 else f" on {nodes} simulated nodes"
        what = f" ({label})" if label else ""
        print(f"\n==== mpicomm tests{what} at {n} rank{'s' if n > 1 else ''}{where} " + "=" * 40, flush=True)
        logs = os.path.join(mpirun.REPO, ".pytest_cache", f"rank-logs-{name.replace(' ', '-')}")
        os.makedirs(logs, exist_ok=True)
        for old in glob.glob(os.path.join(logs, "*rank*")):
            os.remove(old)
        env = {"MPICOMM_TEST_LOG_DIR": logs, **extra_env}
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
            if not paths and not args.gpu and n in spread:  # the whole suite runs at this size on simulated nodes
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
    width = max(5, *(len(r[0]) for r in results)) if results else 5
    print(f"{'ranks':>{width}}  {'result':<12} {'seconds':>8}")
    for n, status, seconds, where in results:
        print(f"{n:>{width}}  {status:<12} {seconds:>8.1f}")
        for line in where:
            print(f"{'':>7}{line}")
    return 0 if all(r[1] == "passed" for r in results) and len(results) == len(passes) * len(runs) else 1


if __name__ == "__main__":
    sys.exit(main())
