"""Failures end the whole job: a killed rank, an uncaught exception, a non-zero exit, a failing test."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests import mpirun

pytestmark = pytest.mark.launches


def test_a_rank_killed_with_sigkill_ends_the_job():
    result = mpirun.run(3, [sys.executable, "-m", "tests.programs", "sigkill"], timeout=60)
    assert not result.timed_out
    assert result.returncode != 0
    assert result.seconds < 30, f"the job took {result.seconds:.1f} s to end after a rank was killed"


def test_an_uncaught_exception_aborts_every_rank():
    result = mpirun.run(3, [sys.executable, "-m", "tests.programs", "uncaught"], timeout=60)
    assert not result.timed_out and result.seconds < 30
    assert result.returncode != 0
    assert "rank 1 fails on purpose" in result.stderr
    assert "mpicomm: rank 1 of 3" in result.stderr and "aborting the job" in result.stderr


def test_a_nonzero_exit_on_one_rank_aborts_every_rank():
    result = mpirun.run(3, [sys.executable, "-m", "tests.programs", "exits"], timeout=60)
    assert not result.timed_out and result.seconds < 30
    assert result.returncode != 0
    assert "mpicomm: rank 2 of 3" in result.stderr and "exit status 3" in result.stderr


def test_the_harness_aborts_when_ranks_run_different_tests(tmp_path):
    (tmp_path / "conftest.py").write_text(textwrap.dedent("""
        from mpi4py import MPI
        from tests.mpi_harness import *  # noqa

        def pytest_collection_modifyitems(items):
            if MPI.COMM_WORLD.rank == 1:
                items.reverse()  # a per-process reordering, as a random-order plugin would do
    """))
    (tmp_path / "test_order.py").write_text("def test_a():\n    pass\n\ndef test_b():\n    pass\n")
    argv = [sys.executable, "-m", "mpi4py", "-m", "pytest", "--with-mpi", "-p", "no:cacheprovider",
            "--rootdir", str(tmp_path), str(tmp_path)]
    result = mpirun.run(2, argv, timeout=90, env={"MPICOMM_TEST_LOG_DIR": str(tmp_path / "logs")})
    assert not result.timed_out and result.returncode != 0
    assert "ranks ran different tests" in result.stderr, result.stdout + result.stderr
    assert "rank 0: test_order.py::test_a" in result.stderr and "rank 1: test_order.py::test_b" in result.stderr


def test_single_rank_failure_is_an_ordinary_exit():
    result = mpirun.run(1, [sys.executable, "-c", "from mpicomm.runtime import main\nmain(lambda: 1/0)"], timeout=60)
    assert result.returncode == 1
    assert "ZeroDivisionError" in result.stderr and "aborting" not in result.stderr


def test_the_harness_aborts_a_test_that_fails_on_one_rank_while_others_wait(tmp_path):
    """A test failing on rank 1 while rank 0 waits for it: the job ends, and the report says why."""
    (tmp_path / "conftest.py").write_text("from tests.mpi_harness import *  # noqa\n")
    (tmp_path / "test_sample.py").write_text(textwrap.dedent("""
        import numpy as np
        import pytest
        from mpi4py import MPI

        @pytest.mark.mpi(min_size=2)
        def test_fails_on_rank_1_only():
            comm = MPI.COMM_WORLD
            if comm.rank == 1:
                assert 1 + 1 == 3, "rank 1 is wrong"
            comm.Recv(np.empty(1), source=1)  # rank 0 would wait forever

        @pytest.mark.mpi(min_size=2)
        def test_fails_on_rank_1_and_all_arrive():
            assert MPI.COMM_WORLD.rank != 1, "rank 1 disagrees"
    """))
    argv = [sys.executable, "-m", "mpi4py", "-m", "pytest", "--with-mpi", "-p", "no:cacheprovider",
            "-o", "timeout=120", "--rootdir", str(tmp_path), str(tmp_path)]
    env = {"MPICOMM_TEST_FENCE_TIMEOUT": "3", "MPICOMM_TEST_LOG_DIR": str(tmp_path / "logs")}

    first = mpirun.run(2, argv + ["-k", "only"], timeout=90, env=env)
    assert not first.timed_out and first.seconds < 60
    assert first.returncode != 0
    assert "failed on rank 1" in first.stderr and "aborting the job" in first.stderr, first.stdout + first.stderr
    assert "rank 1 is wrong" in first.stderr
    # ... and the records the runner's summary reads name the test, also after the abort
    from tests.__main__ import _where

    assert _where(str(tmp_path / "logs")) == ["failed: test_sample.py::test_fails_on_rank_1_only"]

    second = mpirun.run(2, argv + ["-k", "all_arrive"], timeout=90, env=env)
    assert second.returncode != 0
    assert "failed on rank(s) 1" in second.stdout and "rank 1 disagrees" in second.stdout  # in rank 0's report
    assert _where(str(tmp_path / "logs")) == ["failed: test_sample.py::test_fails_on_rank_1_and_all_arrive",
                                              "failed: test_sample.py::test_fails_on_rank_1_only"]


def test_demo_runs_and_checks_itself(tmp_path):
    import json
    import re

    import mpicomm

    js = tmp_path / "demo.json"
    argv = ["--count", "1001", "--iters", "5", "--json", str(js)]
    result = mpirun.run(3, [sys.executable, "-m", "apps.demo", *argv], timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count(": ok") == 4  # push, one-sided, rendezvous, collectives
    assert "all checks passed" in result.stdout
    assert "3 ranks on 1 node(s)" in result.stdout
    # 3 ranks on this machine's cores: the line that says the timings measure the scheduler, exactly when crowded
    cores = os.cpu_count() or 1
    note = f"note: 3 ranks share {cores} cores on a node, so the timings below measure how the OS scheduler"
    assert (note in result.stdout) == (cores < 3), result.stdout
    if cores < 3:
        assert f"run at the core count: mpiexec -n {cores} python -m apps.demo --count 1001 --iters 5" in result.stdout

    # the collectives section: one line per collective, auto's choice and the fastest of the others, as in the JSON
    rows = json.loads(js.read_text())["results"]["collectives"]
    section = result.stdout.split("\n6. collectives")[1]
    for collective in ("allreduce", "allgather", "alltoall"):
        mine = [r for r in rows if r["collective"] == collective]
        registered = set(mpicomm.algorithms(collective))
        assert {r["algorithm"] for r in mine} == registered | {"auto"}  # every algorithm checked, timed or skipped
        auto = next(r for r in mine if r["algorithm"] == "auto")
        assert auto["chose"] in registered and auto["source"] and auto["us"] > 0 and auto["mpi_us"] > 0
        others = [r for r in mine if "us" in r and r["algorithm"] not in ("auto", auto["chose"])]
        fastest = min(others, key=lambda r: r["us"])
        assert [r["algorithm"] for r in mine if r.get("fastest_other")] == [fastest["algorithm"]]
        line = re.search(rf"^  {collective} +(\S+) +([\d.]+) +([\d.]+) +([\d.]+)x +(\S+) +([\d.]+)$", section, re.M)
        assert line, section
        assert line.group(1) == auto["chose"] and line.group(5) == fastest["algorithm"]
        assert [float(line.group(i)) for i in (2, 3, 6)] == [round(auto["us"], 1), round(auto["mpi_us"], 1),
                                                             round(fastest["us"], 1)]
        assert float(line.group(4)) == round(auto["us"] / auto["mpi_us"], 2)
        for r in others:  # the other algorithms are in the JSON, not on screen
            assert not re.search(rf"^  {collective} +{r['algorithm']} ", section, re.M)


def test_demo_says_when_ranks_outnumber_cores(monkeypatch):
    from apps import demo

    class Node:  # a communicator's facts, as every rank of a job would agree on them (allreduce returns them)
        def __init__(self, local_size: int, nodes: int):
            self.local_size, self.nodes = local_size, nodes

        def allreduce(self, value, op):
            return value

    monkeypatch.setattr(demo.os, "cpu_count", lambda: 2)
    assert demo._crowded(Node(2, 1), ["--count", "7"]) == ""
    line = demo._crowded(Node(3, 1), ["--count", "7"])
    assert line.startswith("note: 3 ranks share 2 cores on a node") and "\n" not in line
    assert line.endswith("run at the core count: mpiexec -n 2 python -m apps.demo --count 7")
    assert demo._crowded(Node(4, 2), []).endswith("mpiexec -n 4 python -m apps.demo")  # 2 nodes of 2 cores
    monkeypatch.setattr(demo.os, "cpu_count", lambda: 8)
    assert demo._crowded(Node(4, 2), []) == ""


def test_demo_refuses_bad_arguments():
    for argv, message in ((["--count", "-4"], "--count must be >= 0, got -4"),
                          (["--iters", "0"], "--iters must be >= 1, got 0")):
        result = mpirun.run(1, [sys.executable, "-m", "apps.demo", *argv], timeout=60)
        assert result.returncode == 2
        assert f"python -m apps.demo: error: {message}" in result.stderr, result.stderr
        assert result.stdout == ""  # nothing printed as if accepted


def test_demo_batch_script_runs_outside_slurm():
    env = mpirun.job_env({"MPICOMM_NTASKS": "2", "PYTHON": sys.executable,
                          "PATH": os.path.dirname(mpirun.mpiexec_path()) + os.pathsep + os.environ.get("PATH", "")},
                         timeout=100)
    env.pop("SLURM_JOB_ID", None)
    out = subprocess.run(["bash", "jobs/demo.sbatch", "--count", "10", "--iters", "3"], cwd=mpirun.REPO,
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "2 ranks" in out.stdout and "all checks passed" in out.stdout


def test_info_command():
    two_hosts = mpirun.flavor() == "hydra"  # hydra can pretend to be two hosts
    result = mpirun.run(2, [sys.executable, "-m", "mpicomm", "info"], timeout=60,
                        launcher="fork" if two_hosts else None, hosts="a:1,b:1" if two_hosts else None)
    assert result.returncode == 0, result.stderr
    assert f"ranks          2 on {2 if two_hosts else 1} node(s)" in result.stdout
    assert "CUDA-aware" in result.stdout


def test_the_runner_summary_says_where_a_job_without_recorded_failures_ended(tmp_path):
    """A pass killed by its time limit records no failure: the summary names the test each rank was in."""
    from tests.__main__ import _where

    for rank, test in [(0, "t.py::test_x"), (1, "t.py::test_y"), (2, "t.py::test_x")]:
        (tmp_path / f"running-rank{rank}").write_text(test + "\n")
    assert _where(str(tmp_path)) == ["ended in: t.py::test_x (ranks 0, 2)", "ended in: t.py::test_y (rank 1)"]
