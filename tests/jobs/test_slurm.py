"""Every jobs/ script submitted to a real Slurm on this machine: one node, then two simulated nodes.

Users submit jobs/ scripts unchanged on clusters, so CI proves they work on a
real Slurm: jobs/cluster/slurm.sh brings up a private one (munged, slurmctld,
slurmd started by hand from a generated slurm.conf in a temporary directory),
each script is submitted with ``sbatch --wait`` at small sizes, and its exit
status, log and files are checked; a failing job fails its test. The second
class brings up two slurmd as two hosts (nodeA, nodeB) in network namespaces
and checks what a ``-N 2`` job sees: two nodes, and the hierarchical allreduce
running its leaders' (inter-node) step.

This needs root, the Debian packages slurmctld slurmd slurm-client munge, and
(for two nodes) network namespaces: without them the tests are skipped with
the reason. They start their own jobs, so they run in the serial pass only.
"""

from __future__ import annotations

import csv
import glob
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass

import pytest

from tests import mpirun
from tests.jobs.test_scripts import sgd_digest

pytestmark = pytest.mark.serial  # the checks without a cluster: one run is enough, not one per rank

REPO = mpirun.REPO
JOBS = os.path.join(REPO, "jobs")
SLURM_SH = os.path.join(JOBS, "cluster", "slurm.sh")
PROBE = os.path.join(REPO, "tests", "jobs", "nodes_probe.py")

#: The scripts this file submits; test_every_script_is_submitted keeps it equal to jobs/*.sbatch.
SUBMITTED = ("bench.sbatch", "demo.sbatch", "mapreduce.sbatch", "pipeline.sbatch", "scaling.sbatch", "sgd.sbatch",
             "stencil.sbatch", "torchddp.sbatch", "tune.sbatch")

#: What a Slurm cluster on this machine needs, and what two simulated nodes need on top.
SLURM_COMMANDS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "srun", "sinfo", "squeue", "scontrol", "scancel")
NAMESPACE_COMMANDS = ("ip", "nsenter", "unshare")
INSTALL = "apt-get install slurmctld slurmd slurm-client munge iproute2"


def _which(command: str) -> str | None:
    return shutil.which(command, path=os.environ.get("PATH", "") + os.pathsep + "/usr/sbin:/sbin")


def _unavailable(nodes: int) -> str | None:
    """Why a Slurm of *nodes* nodes cannot run here (the skip reason), or None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "a private Slurm needs root (its daemons run as root; two nodes need network namespaces)"
    missing = [c for c in SLURM_COMMANDS + (NAMESPACE_COMMANDS if nodes > 1 else ()) if _which(c) is None]
    if missing:
        return f"Slurm is not installed here ({', '.join(missing)} missing); install: {INSTALL}"
    if nodes > 1:
        probe = subprocess.run([_which("unshare") or "unshare", "--net", "--uts", "--mount", "true"],
                               capture_output=True, text=True, timeout=30)
        if probe.returncode != 0:
            return f"network/UTS/mount namespaces are not available here: {probe.stderr.strip()}"
    return None


def _free_port_pair() -> int:
    """A port P with P and P + 1 free on this host (slurmctld and slurmd listen on them)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        if port >= 65534:
            continue
        with socket.socket() as s:
            try:
                s.bind(("", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two consecutive free TCP ports found for slurmctld and slurmd")


def _job_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment jobs are submitted with (sbatch passes it on to the job).

    No Slurm variables of an enclosing job (they would name a job of another
    cluster), this Python and its mpiexec first on PATH, the project importable,
    and MPICH told to yield while it polls: the machine may have fewer cores
    than the jobs have ranks.
    """
    env = {k: v for k, v in mpirun.clean_env().items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
    env["PATH"] = os.path.dirname(mpirun.mpiexec_path()) + os.pathsep + env.get("PATH", "")
    env["PYTHON"] = sys.executable
    env["MPIR_CVAR_CH4_PROGRESS_THROTTLE"] = "1"
    env["MPICOMM_TIMEOUT"] = "120"  # a hung collective aborts the job with a report, well before the test's limit
    env.update(extra or {})
    return env


@dataclass
class Job:
    """A finished batch job: sbatch's exit status (the job's), its log(s) and where it ran."""

    id: str
    returncode: int
    log: str
    submit_dir: str
    seconds: float

    def files(self, pattern: str) -> list[str]:
        return sorted(glob.glob(os.path.join(self.submit_dir, pattern)))


class Cluster:
    """A running private Slurm (jobs/cluster/slurm.sh up), and how to talk to it."""

    def __init__(self, nodes: int, state_dir: str, name: str, port: int):
        self.nodes, self.dir, self.name, self.port = nodes, state_dir, name, port
        self.hub: str | None = None

    def script(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", SLURM_SH, *args, "--dir", self.dir, "--nodes", str(self.nodes), "--name", self.name,
             "--port", str(self.port)],
            capture_output=True, text=True, timeout=timeout, env=_job_env(),
        )

    def start(self) -> None:
        out = self.script("up")
        if out.returncode != 0:
            self.script("down")
            raise AssertionError(f"slurm.sh up failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
        with open(os.path.join(self.dir, "cluster.env")) as f:
            values = dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)
        self.hub = values.get("HUB") or None

    def stop(self) -> subprocess.CompletedProcess:
        return self.script("down")

    @property
    def conf(self) -> str:
        return os.path.join(self.dir, "slurm.conf")

    def client(self, argv: list[str]) -> list[str]:
        """*argv* as a client command of this cluster (in the hub namespace for two nodes)."""
        return (["nsenter", f"--net=/run/netns/{self.hub}"] if self.hub else []) + argv

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = _job_env(extra)
        env["SLURM_CONF"] = self.conf
        if self.nodes > 1:
            # Both "nodes" share one kernel: MPICH's OFI netmod over TCP keeps their traffic on the network
            # (UCX would try shared memory across the namespaces; restricted to TCP it loses wildcard receives).
            for key, value in mpirun.NETWORK.items():
                env.setdefault(key, value)
        return env

    def logs(self) -> str:
        parts = []
        for path in sorted(glob.glob(os.path.join(self.dir, "log", "*.log"))):
            with open(path, errors="replace") as f:
                parts.append(f"---- {os.path.basename(path)} (tail)\n" + "".join(f.readlines()[-20:]))
        return "\n".join(parts)

    def run(self, argv: list[str], *, env: dict[str, str] | None = None, cwd: str | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(self.client(argv), capture_output=True, text=True, timeout=timeout,
                              env=self.env(env), cwd=cwd or REPO)

    def submit(self, script: str, args: list[str] | tuple[str, ...] = (), *, submit_dir: str,
               options: list[str] | tuple[str, ...] = (), env: dict[str, str] | None = None, timeout: float = 180,
               while_running=None) -> Job:
        """``sbatch --wait jobs/<script> args`` from *submit_dir*; the job's status, log and files.

        *while_running*, if given, is called with the job id once the job is
        submitted (the requeue test uses it). A job still running after
        *timeout* seconds is cancelled and the test fails with the logs.
        """
        cmd = self.client(["sbatch", "--wait", "--parsable", "--time=5", *options, os.path.join(JOBS, script), *args])
        start = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=submit_dir, env=self.env(env), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        job_id = proc.stdout.readline().strip().split(";")[0] if ready else ""
        try:
            if job_id and while_running is not None:
                while_running(job_id)
            rest, err = proc.communicate(timeout=max(1.0, timeout - (time.monotonic() - start)))
        except BaseException as exc:
            if job_id:
                self.run(["scancel", job_id])
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            if not isinstance(exc, (subprocess.TimeoutExpired, AssertionError)):
                raise
            what = f"did not finish within {timeout:.0f} s" if isinstance(exc, subprocess.TimeoutExpired) else exc
            raise AssertionError(f"job {job_id or '(not submitted)'} of {script}: {what}; cancelled.\n"
                                 f"{_logs(submit_dir, job_id)}\n{self.logs()}") from exc
        seconds = time.monotonic() - start
        assert job_id.isdigit(), f"sbatch did not print a job id: {job_id!r} {rest} {err}"
        return Job(job_id, proc.returncode, _logs(submit_dir, job_id) + err, submit_dir, seconds)


def _logs(submit_dir: str, job_id: str) -> str:
    """Every log file of the job (arrays have one per task), named, in order."""
    text = []
    for path in sorted(glob.glob(os.path.join(submit_dir, f"*-{job_id}*.out"))):
        with open(path, errors="replace") as f:
            text.append(f"==== {os.path.basename(path)}\n{f.read()}")
    return "\n".join(text)


def _state_dir() -> str:
    """A state directory every user can search into (munged's requirement), outside pytest's private tree."""
    path = tempfile.mkdtemp(prefix="mpicomm-slurm-")
    os.chmod(path, 0o755)
    return path


def _cluster(nodes: int):
    reason = _unavailable(nodes)
    if reason:
        pytest.skip(reason)
    state = _state_dir()
    cluster = Cluster(nodes, os.path.join(state, "state"), f"mct{os.getpid() % 100000}", _free_port_pair())
    try:
        cluster.start()
        yield cluster
    finally:
        down = cluster.stop()
        shutil.rmtree(state, ignore_errors=True)
        assert down.returncode == 0, f"slurm.sh down failed:\n{down.stdout}\n{down.stderr}"


@pytest.fixture(scope="class")
def one_node():
    """A one-node Slurm for the tests of one class (torn down after them)."""
    yield from _cluster(1)


@pytest.fixture(scope="class")
def two_nodes():
    """A two-node Slurm (nodeA, nodeB) for the tests of one class (torn down after them)."""
    yield from _cluster(2)


def _requeue_once_checkpointed(cluster, submit_dir, app: str, within: float):
    """A job's *while_running*: once its first checkpoint (a .json in runs/<app>-<job>/checkpoints) exists, requeue it."""
    def requeue(job_id: str) -> None:
        checkpoints = submit_dir / "runs" / f"{app}-{job_id}" / "checkpoints"
        deadline = time.monotonic() + within
        while not (checkpoints.is_dir() and any(p.suffix == ".json" for p in checkpoints.iterdir())):
            assert time.monotonic() < deadline, f"no checkpoint appeared in {checkpoints} within {within:g} s"
            time.sleep(0.05)
        out = cluster.run(["scontrol", "requeue", job_id])
        assert out.returncode == 0, out.stdout + out.stderr
    return requeue


def _ok(job: Job) -> None:
    assert job.returncode == 0, f"job {job.id} exited with {job.returncode}:\n{job.log}"


def test_every_script_is_submitted():
    scripts = sorted(os.path.basename(p) for p in glob.glob(os.path.join(JOBS, "*.sbatch")))
    assert scripts == sorted(SUBMITTED), (
        f"jobs/ has {scripts}, this file submits {sorted(SUBMITTED)}: add a test for the new script and name it in SUBMITTED"
    )


def test_the_skip_reason_names_what_is_missing(monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "_which", lambda command: None)
    reason = _unavailable(2)
    if os.geteuid() == 0:
        assert reason.startswith("Slurm is not installed here (munged, mungekey, slurmctld") and INSTALL in reason
        assert "ip, nsenter, unshare missing" in reason
    else:
        assert "needs root" in reason


@pytest.mark.launches
class TestOneNode:
    """Every script on a one-node Slurm (16 CPUs declared, so a job of 4 tasks never waits)."""

    @pytest.fixture
    def cluster(self, one_node):
        return one_node

    def test_bring_up_is_repeatable(self, cluster):
        # (how long bring-up takes is the machine's, not tested: "already up" says the second call redid nothing)
        again = cluster.script("up")
        assert again.returncode == 0 and "already up" in again.stdout, again.stdout + again.stderr
        state = cluster.run(["sinfo", "-h", "-o", "%T %D"])
        assert state.stdout.split() == ["idle", "1"], state.stdout + state.stderr

    def test_demo(self, cluster, tmp_path):
        job = cluster.submit("demo.sbatch", ["--count", "1000", "--iters", "5"], submit_dir=str(tmp_path))
        _ok(job)
        assert "mpicomm demo: 4 ranks on 1 node(s)" in job.log
        assert "launch: srun --mpi=pmi2" in job.log
        assert "all checks passed" in job.log

    def test_a_failing_program_fails_the_job(self, cluster, tmp_path):
        job = cluster.submit("demo.sbatch", ["--iters", "0"], submit_dir=str(tmp_path))
        assert job.returncode != 0, job.log
        assert "python -m apps.demo: error: --iters must be >= 1, got 0" in job.log

    def test_demo_through_mpiexec_in_the_allocation(self, cluster, tmp_path):
        job = cluster.submit("demo.sbatch", ["--count", "1000", "--iters", "5"], submit_dir=str(tmp_path),
                             options=["--ntasks=2"], env={"MPICOMM_LAUNCH": "mpiexec"})
        _ok(job)
        assert "launch: mpiexec -n 2" in job.log
        assert "mpicomm demo: 2 ranks on 1 node(s)" in job.log and "all checks passed" in job.log

    def test_bench_with_algorithm_and_trace_from_the_environment(self, cluster, tmp_path):
        # Variables set at submission reach every rank: the algorithm auto must use, and the trace.
        env = {"MPICOMM_ALLREDUCE_ALGORITHM": "ring", "MPICOMM_TRACE": "trace.json"}
        args = ["allreduce", "--algorithms", "auto", "--sizes", "8,1K", "--iters", "5", "--repeat", "1", "--validate"]
        job = cluster.submit("bench.sbatch", args, submit_dir=str(tmp_path), env=env)
        _ok(job)
        run = tmp_path / "runs" / f"bench-{job.id}"
        with open(run / "allreduce.json") as f:
            result = json.load(f)
        assert result["p"] == 4 and result["validated"] is True
        autos = [r for r in result["rows"] if r["name"] == "auto"]
        assert [r["size"] for r in autos] == [8, 1024]
        assert all(r["chose"] == "ring" and r["source"] == "environment" for r in autos), autos
        assert "| 8 " in (run / "allreduce.md").read_text()
        if _has_matplotlib():
            assert (run / "allreduce.png").stat().st_size > 0
        with open(tmp_path / "trace.json") as f:
            trace = json.load(f)
        assert trace["otherData"]["ranks"] == 4
        rings = [e for e in trace["traceEvents"] if e.get("name") == "allreduce" and e["args"]["algorithm"] == "ring"]
        assert {e["pid"] for e in rings} == {1, 2, 3, 4}  # pid = rank + 1

    def test_tune(self, cluster, tmp_path):
        cache = tmp_path / "cache"
        job = cluster.submit("tune.sbatch", ["--sizes", "8:4K", "--iters", "20"], submit_dir=str(tmp_path),
                             env={"MPICOMM_CACHE_DIR": str(cache)})
        _ok(job)
        fits = glob.glob(str(cache / "*p2*.json"))
        assert len(fits) == 1, f"expected one fit for 2 ranks in {cache}: {os.listdir(cache) if cache.exists() else []}"
        assert f"saved: {fits[0]}" in job.log
        assert job.log.count(fits[0]) >= 2, "tune.sbatch did not show the saved fit back"

    @pytest.mark.slow  # (14 s; the requeued stencil job below runs the script, checkpoints and verifies in every pass)
    def test_stencil(self, cluster, tmp_path):
        job = cluster.submit("stencil.sbatch", ["--size", "64", "--iters", "20", "--checkpoint-every", "5"],
                             submit_dir=str(tmp_path))
        _ok(job)
        assert re.search(r"verification\s+PASS", job.log), job.log
        checkpoints = tmp_path / "runs" / f"stencil-{job.id}" / "checkpoints"
        assert checkpoints.is_dir() and any(checkpoints.iterdir()), f"no checkpoints in {checkpoints}"

    def test_stencil_requeued_resumes_from_its_checkpoint(self, cluster, tmp_path):
        requeue_after_first_checkpoint = _requeue_once_checkpointed(cluster, tmp_path, "stencil", 90)

        # About 3 s of iterations after the first checkpoint: time enough to requeue it mid-run.
        args = ["--size", "256", "--iters", "1000", "--checkpoint-every", "50", "--kernel", "numpy"]
        job = cluster.submit("stencil.sbatch", args, submit_dir=str(tmp_path), timeout=240,
                             while_running=requeue_after_first_checkpoint)
        _ok(job)
        assert "restart 0" in job.log and "restart 1" in job.log, job.log  # one log, appended to on requeue
        assert "DUE TO JOB REQUEUE" in job.log, job.log
        assert re.search(r"resumed at \d+", job.log), job.log
        assert re.search(r"verification\s+PASS", job.log), job.log

    def test_mapreduce_on_a_generated_corpus(self, cluster, tmp_path):
        job = cluster.submit("mapreduce.sbatch", ["--top", "5"], submit_dir=str(tmp_path),
                             env={"MAPREDUCE_CORPUS_SIZE": "256K"})
        _ok(job)
        run = tmp_path / "runs" / f"mapreduce-{job.id}"
        assert (run / "corpus" / ".complete").exists()
        counts = _counts(run / "counts.tsv")
        found = re.search(r"(\d+) words, (\d+) distinct", job.log)
        assert found, job.log
        assert sum(counts.values()) == int(found[1]) and len(counts) == int(found[2])

    def test_mapreduce_on_given_files(self, cluster, tmp_path):
        data = tmp_path / "data"
        data.mkdir()
        expected: Counter = Counter()
        for f in range(3):  # words depend on the file and the line
            lines = [" ".join(f"w{(7 * f + i + k) % 13}" for k in range(i % 4 + 1)) for i in range(200)]
            (data / f"part{f}.txt").write_text("\n".join(lines) + "\n")
            expected.update(word for line in lines for word in line.split())
        job = cluster.submit("mapreduce.sbatch", [], submit_dir=str(tmp_path), env={"MAPREDUCE_INPUT": "data"})
        _ok(job)
        assert _counts(tmp_path / "runs" / f"mapreduce-{job.id}" / "counts.tsv") == expected

    def test_scaling_array_and_collect(self, cluster, tmp_path):
        args = ["allreduce", "--algorithms", "ring,auto", "--sizes", "8,1K", "--iters", "5", "--repeat", "1"]
        job = cluster.submit("scaling.sbatch", args, submit_dir=str(tmp_path), timeout=240)
        _ok(job)
        assert len(job.files(f"mpicomm-scaling-{job.id}_*.out")) == 4
        run = tmp_path / "runs" / f"scaling-{job.id}"
        assert sorted(os.listdir(run)) == ["p1.json", "p2.json", "p3.json", "p4.json"]
        collect = subprocess.run([sys.executable, os.path.join(JOBS, "collect.py"), str(run)], capture_output=True,
                                 text=True, timeout=120, env=_job_env())
        assert collect.returncode == 0, collect.stdout + collect.stderr
        table = (run / "scaling.md").read_text()
        assert "| Size | p=1 | p=2 | p=3 | p=4 |" in re.sub(r" +", " ", table)
        assert re.search(r"\| 1024 +\|", table) and "(ring)" in table
        if _has_matplotlib():
            assert (run / "scaling.png").stat().st_size > 0

    def test_torchddp_transformer_with_check(self, cluster, tmp_path):
        pytest.importorskip("torch", reason="PyTorch is not installed: pip install torch==2.13.0 --index-url "
                                            "https://download.pytorch.org/whl/cpu, then pip install -e '.[torch]'")
        args = ["--steps", "12", "--batch", "16", "--seq", "16", "--d-model", "32", "--layers", "1", "--ff", "64",
                "--checkpoint-every", "6"]
        job = cluster.submit("torchddp.sbatch", args, submit_dir=str(tmp_path), timeout=240)
        _ok(job)
        assert "launch: srun --mpi=pmi2" in job.log
        assert "Transformer 1 layer (d 32, 4 heads, ff 64)" in job.log and "on 4 ranks, backend mpicomm" in job.log
        assert "check: PASS" in job.log, job.log
        run = tmp_path / "runs" / f"torchddp-{job.id}"
        assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["torchddp-00000006.ckpt",
                                                                           "torchddp-00000012.ckpt"]
        with open(run / "train.json") as f:
            doc = json.load(f)
        assert doc["ranks"] == 4 and "mpiexec -n 4 python -m apps.torchddp train --model transformer" in doc["command"]
        assert doc["environment"]["OMP_NUM_THREADS"] == "1"  # the script's default: one torch thread per task
        report = doc["results"]["report"]
        assert report["check"]["passed"] is True and report["steps"] == 12 and report["checkpoint"]

    def test_pipeline_two_stages_two_replicas_with_check(self, cluster, tmp_path):
        args = ["--steps", "6", "--blocks", "4", "--width", "16", "--hidden", "32", "--batch", "32",
                "--schedule", "zb-h1", "--quiet"]
        job = cluster.submit("pipeline.sbatch", args, submit_dir=str(tmp_path), timeout=240,
                             env={"PIPELINE_CHECKPOINT_EVERY": "3"})
        _ok(job)
        assert "launch: srun --mpi=pmi2" in job.log
        assert "zb-h1 on 4 ranks = T 1 x S 2 x D 2" in job.log and " - equal" in job.log, job.log
        run = tmp_path / "runs" / f"pipeline-{job.id}"
        names = sorted(p.name for p in (run / "checkpoints").iterdir())
        assert names == ["pipeline-00000003.json", "pipeline-00000003.stage0-t0.bin", "pipeline-00000003.stage1-t0.bin",
                         "pipeline-00000006.json", "pipeline-00000006.stage0-t0.bin", "pipeline-00000006.stage1-t0.bin"]
        with open(run / "train.json") as f:
            doc = json.load(f)
        assert doc["ranks"] == 4 and len(doc["results"]["losses"]) == 6
        assert len((run / "train.csv").read_text().splitlines()) == 7

    def test_sgd_checkpoints_under_srun(self, cluster, tmp_path):
        # Ten ddp steps on the digits (seconds) on 4 tasks under srun, checkpointed every 3 steps, with the run's
        # record. (Resuming a run directory bit for bit is the script's own logic, tested outside Slurm in
        # tests/jobs/test_scripts.py, for ddp and ps-sync.)
        args = ["--steps", "10", "--keep", "4", "--quiet"]
        job = cluster.submit("sgd.sbatch", args, submit_dir=str(tmp_path), env={"SGD_CHECKPOINT_EVERY": "3"})
        _ok(job)
        assert "launch: srun --mpi=pmi2" in job.log and "resumed" not in job.log, job.log
        assert "apps.sgd: ddp on 4 ranks, data digits" in job.log and "done: 10 steps" in job.log, job.log
        run = tmp_path / "runs" / f"sgd-{job.id}"
        checkpoints = sorted(p.name for p in (run / "checkpoints").iterdir())
        assert checkpoints == [f"sgd-{step:08d}.{ext}" for step in (3, 6, 9, 10) for ext in ("bin", "json")]
        with open(run / "train.json") as f:
            doc = json.load(f)
        assert doc["ranks"] == 4 and "mpiexec -n 4 python -m apps.sgd train --checkpoint-every 3" in doc["command"]
        report = doc["results"]["report"]
        assert (report["start_step"], report["steps"]) == (0, 10) and doc["results"]["digest"] == sgd_digest(job.log)
        with open(run / "train.csv", newline="") as f:
            assert [row["step"] for row in csv.DictReader(f)][-1] == "10"  # the evaluation at the end of the run

    @pytest.mark.slow  # (30 s; a requeue mid-run and the resume run in every pass with the stencil above)
    def test_torchddp_requeued_resumes_from_its_checkpoint(self, cluster, tmp_path):
        pytest.importorskip("torch", reason="PyTorch is not installed: pip install torch==2.13.0 (the CPU wheel), "
                                            "then pip install -e '.[torch]'")

        def requeue_after_first_checkpoint(job_id: str) -> None:
            ckpt = tmp_path / "runs" / f"torchddp-{job_id}" / "checkpoints"
            deadline = time.monotonic() + 120
            while not glob.glob(str(ckpt / "torchddp-*.ckpt")):
                assert time.monotonic() < deadline, f"no checkpoint appeared in {ckpt} within 120 s"
                time.sleep(0.05)
            out = cluster.run(["scontrol", "requeue", job_id])
            assert out.returncode == 0, out.stdout + out.stderr

        # A few seconds of steps after the first checkpoint: time enough to requeue the job mid-run.
        args = ["--steps", "600", "--batch", "16", "--seq", "16", "--d-model", "32", "--layers", "1", "--ff", "64",
                "--checkpoint-every", "20", "--optimizer", "sgd"]
        job = cluster.submit("torchddp.sbatch", args, submit_dir=str(tmp_path), timeout=300,
                             while_running=requeue_after_first_checkpoint)
        _ok(job)
        assert "restart 0" in job.log and "restart 1" in job.log, job.log  # one log, appended to on requeue
        assert re.search(r"resumed from step \d+", job.log), job.log
        assert "check: PASS" in job.log, job.log


@pytest.mark.launches
class TestTwoNodes:
    """Two slurmd as two hosts (nodeA, nodeB in network namespaces): what a -N 2 job sees."""

    @pytest.fixture
    def cluster(self, two_nodes):
        return two_nodes

    def test_topology_and_the_hierarchical_inter_node_step(self, cluster, tmp_path):
        trace = tmp_path / "trace.json"
        out = cluster.run(["srun", "-N", "2", "--ntasks-per-node=2", "--mpi=pmi2", "--time=2", sys.executable, PROBE],
                          env={"MPICOMM_TRACE": str(trace)}, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr + cluster.logs()
        ranks = json.loads(out.stdout.strip().splitlines()[-1])["ranks"]
        assert [r["nodes"] for r in ranks] == [2, 2, 2, 2]
        assert [r["host"] for r in ranks] == ["nodeA", "nodeA", "nodeB", "nodeB"]
        assert [r["leaders_size"] for r in ranks] == [2, None, 2, None]
        assert all(r["hierarchical_ok"] for r in ranks)
        # The leaders (ranks 0 and 2) ran an allreduce among the 2 nodes inside the hierarchical one.
        with open(trace) as f:
            events = [e for e in json.load(f)["traceEvents"] if e.get("name") == "allreduce"]
        outer = {e["pid"] for e in events if e["args"]["algorithm"] == "hierarchical" and e["args"]["p"] == 4}
        between = {e["pid"] for e in events if e["args"]["algorithm"] != "hierarchical" and e["args"]["p"] == 2}
        assert outer == {1, 2, 3, 4} and between == {1, 3}, events  # pid = rank + 1

    def test_bench_job_on_two_nodes(self, cluster, tmp_path):
        args = ["allreduce", "--algorithms", "hierarchical,auto", "--sizes", "8,64K", "--iters", "5", "--repeat", "1",
                "--validate"]
        job = cluster.submit("bench.sbatch", args, submit_dir=str(tmp_path), options=["-N", "2", "--ntasks-per-node=2"])
        _ok(job)
        assert "2 node(s)" in job.log
        with open(tmp_path / "runs" / f"bench-{job.id}" / "allreduce.json") as f:
            result = json.load(f)
        assert (result["p"], result["nodes"], result["validated"]) == (4, 2, True)
        assert {r["name"] for r in result["rows"]} == {"native", "hierarchical", "auto"}

    def test_stencil_job_on_two_nodes(self, cluster, tmp_path):
        job = cluster.submit("stencil.sbatch", ["--size", "128", "--iters", "20"], submit_dir=str(tmp_path),
                             options=["-N", "2", "--ntasks-per-node=2"])
        _ok(job)
        assert "2 node(s)" in job.log
        assert re.search(r"verification\s+PASS", job.log), job.log


@pytest.mark.launches
@pytest.mark.slow
class TestEveryApplicationOnTwoNodes:
    """Every application as a 2-node batch job (2 tasks on each of nodeA and nodeB), each checking its own answer,
    and one job requeued mid-run that resumes from its checkpoint bit for bit (slower tier: about 3 minutes)."""

    @pytest.fixture
    def cluster(self, two_nodes):
        return two_nodes

    OPTIONS = ["-N", "2", "--ntasks-per-node=2"]

    def test_mapreduce(self, cluster, tmp_path):
        job = cluster.submit("mapreduce.sbatch", ["--top", "5"], submit_dir=str(tmp_path), options=self.OPTIONS,
                             env={"MAPREDUCE_CORPUS_SIZE": "256K"})
        _ok(job)
        counts = _counts(tmp_path / "runs" / f"mapreduce-{job.id}" / "counts.tsv")
        found = re.search(r"(\d+) words, (\d+) distinct", job.log)
        assert found, job.log
        assert sum(counts.values()) == int(found[1]) and len(counts) == int(found[2])

    @pytest.mark.parametrize("mode", ["ddp", "zero3", "ps-sync", "ps-async"])
    def test_sgd(self, cluster, tmp_path, mode):
        job = cluster.submit("sgd.sbatch", ["--mode", mode, "--steps", "10", "--quiet"], submit_dir=str(tmp_path),
                             options=self.OPTIONS, env={"SGD_CHECKPOINT_EVERY": "5"}, timeout=240)
        _ok(job)
        assert f"apps.sgd: {mode} on 4 ranks" in job.log and "done: 10 steps" in job.log, job.log
        sgd_digest(job.log)

    def test_pipeline_with_offload_across_the_nodes(self, cluster, tmp_path):
        # 4 stages, one a rank: stages 1 -> 2 cross from nodeA to nodeB, so offload goes through RMA there.
        args = ["--steps", "4", "--blocks", "4", "--width", "16", "--hidden", "32", "--batch", "32",
                "--schedule", "1f1b", "--activations", "offload", "--quiet"]
        job = cluster.submit("pipeline.sbatch", args, submit_dir=str(tmp_path), options=self.OPTIONS, timeout=240,
                             env={"PIPELINE_STAGES": "4", "PIPELINE_CHECKPOINT_EVERY": "2"})
        _ok(job)
        assert "1f1b on 4 ranks = T 1 x S 4 x D 1" in job.log and " - equal" in job.log, job.log

    def test_torchddp(self, cluster, tmp_path):
        pytest.importorskip("torch", reason="PyTorch is not installed: pip install torch==2.13.0 (the CPU wheel), "
                                            "then pip install -e '.[torch]'")
        args = ["--steps", "6", "--batch", "16", "--seq", "16", "--d-model", "32", "--layers", "1", "--ff", "64",
                "--checkpoint-every", "3"]
        job = cluster.submit("torchddp.sbatch", args, submit_dir=str(tmp_path), options=self.OPTIONS, timeout=240)
        _ok(job)
        assert "on 4 ranks, backend mpicomm" in job.log and "check: PASS" in job.log, job.log

    def test_sgd_requeued_mid_run_resumes_bit_for_bit(self, cluster, tmp_path):
        args = ["--mode", "ddp", "--steps", "400", "--quiet"]
        env = {"SGD_CHECKPOINT_EVERY": "20"}
        for name in ("whole", "requeued"):
            (tmp_path / name).mkdir()
        whole = cluster.submit("sgd.sbatch", args, submit_dir=str(tmp_path / "whole"), options=self.OPTIONS,
                               env=env, timeout=300)
        _ok(whole)

        requeue_after_first_checkpoint = _requeue_once_checkpointed(cluster, tmp_path / "requeued", "sgd", 120)

        requeued = cluster.submit("sgd.sbatch", args, submit_dir=str(tmp_path / "requeued"), options=self.OPTIONS,
                                  env=env, timeout=300, while_running=requeue_after_first_checkpoint)
        _ok(requeued)
        assert "restart 1" in requeued.log and "resumed" in requeued.log, requeued.log
        assert sgd_digest(requeued.log) == sgd_digest(whole.log)


def _counts(path) -> Counter:
    with open(path, newline="", encoding="utf-8") as f:
        return Counter({word: int(count) for word, count in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)})


def _has_matplotlib() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None
