"""jobs/*.sbatch without Slurm: their shared conventions, and runs through mpiexec (``bash jobs/x.sbatch``).

Every script must also run outside Slurm (a laptop, a CI machine without root),
where it launches with mpiexec; these tests need neither root nor Slurm. The
conventions checked here are the ones jobs/README.md promises: strict bash,
small #SBATCH defaults that the command line overrides, srun with PMI-2, the
same launch block in every script (so a fix to one is a fix to all), requeue.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess

import pytest

from tests import mpirun

pytestmark = pytest.mark.serial  # no MPI in this process: one run is enough, not one per rank

REPO = mpirun.REPO
JOBS = os.path.join(REPO, "jobs")
SCRIPTS = sorted(glob.glob(os.path.join(JOBS, "*.sbatch")))
NAMES = [os.path.basename(p) for p in SCRIPTS]


def _text(path: str) -> str:
    with open(path) as f:
        return f.read()


def _env(extra: dict[str, str] | None = None, timeout: float = 120) -> dict[str, str]:
    """A shell that is not inside a Slurm job, with this Python and its mpiexec, and a launcher time limit."""
    import sys

    env = {k: v for k, v in mpirun.job_env(timeout=timeout).items() if not k.startswith(("SLURM_", "SBATCH_"))}
    env["PATH"] = os.path.dirname(mpirun.mpiexec_path()) + os.pathsep + env.get("PATH", "")
    env["PYTHON"] = sys.executable
    env.update(extra or {})
    return env


def _bash(script: str, args: list[str], cwd: str, env: dict[str, str] | None = None,
          timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", os.path.join(JOBS, script), *args], cwd=cwd, env=_env(env, timeout),
                          capture_output=True, text=True, timeout=timeout + 30)


def _launch_block(text: str) -> str:
    start = text.index("# ---- launch")
    end = text.index("# ----------", start)
    return text[text.index("\n", start):end]


@pytest.mark.parametrize("path", SCRIPTS, ids=NAMES)
def test_conventions(path):
    text = _text(path)
    name = os.path.basename(path)[: -len(".sbatch")]
    assert text.startswith("#!/bin/bash\n")
    assert subprocess.run(["bash", "-n", path], capture_output=True, timeout=30).returncode == 0
    directives = re.findall(r"^#SBATCH (\S+)", text, re.M)
    assert f"--job-name=mpicomm-{name}" in directives
    assert any(d.startswith(f"--output=mpicomm-{name}-%") for d in directives), directives
    assert "--requeue" in directives and "--open-mode=append" in directives
    ntasks = [int(d.split("=")[1]) for d in directives if d.startswith("--ntasks=")]
    assert ntasks and ntasks[0] <= 4, "default task count: small, overridable with sbatch --ntasks"
    minutes = [d.split("=")[1] for d in directives if d.startswith("--time=")]
    assert minutes and minutes[0] <= "00:15:00", minutes
    # Every #SBATCH line comes before the first command, or sbatch ignores it.
    first_command = min(i for i, line in enumerate(text.splitlines()) if line and not line.startswith("#"))
    assert all(i < first_command for i, line in enumerate(text.splitlines()) if line.startswith("#SBATCH"))
    assert "set -euo pipefail" in text
    assert "srun --mpi=pmi2" in text and "mpiexec -n" in text
    assert "SLURM_SUBMIT_DIR" in text and "SLURM_RESTART_COUNT" in text


def test_the_launch_block_is_the_same_everywhere():
    blocks = {}
    for path in SCRIPTS:
        if os.path.basename(path) == "scaling.sbatch":
            continue  # its block takes a rank count per run (see that script)
        blocks[os.path.basename(path)] = re.sub(r"MPICOMM_NTASKS:-\d+", "MPICOMM_NTASKS:-N", _launch_block(_text(path)))
    reference = blocks["demo.sbatch"]
    different = [name for name, block in blocks.items() if block != reference]
    assert not different, f"the launch block of {different} differs from demo.sbatch's; keep them the same"
    # scaling.sbatch shares the requeue clean-up verbatim.
    cleanup = reference[reference.index("if [[ -n \"${SLURM_JOB_ID:-}\" && ${SLURM_RESTART_COUNT"):]
    assert cleanup in _text(os.path.join(JOBS, "scaling.sbatch"))


def test_scaling_rejects_a_bad_rank_list(tmp_path):
    out = _bash("scaling.sbatch", [], str(tmp_path), {"SCALING_RANKS": "1 two 4"})
    assert out.returncode == 2 and "SCALING_RANKS: 'two' is not a rank count" in out.stderr, out.stderr


def test_mapreduce_names_a_missing_input(tmp_path):
    out = _bash("mapreduce.sbatch", [], str(tmp_path), {"MAPREDUCE_INPUT": "nowhere/*.txt"})
    assert out.returncode == 2 and "MAPREDUCE_INPUT: nowhere/*.txt does not exist" in out.stderr, out.stderr


@pytest.mark.launches
def test_demo_outside_slurm(tmp_path):
    out = _bash("demo.sbatch", ["--count", "1000", "--iters", "5"], str(tmp_path), {"MPICOMM_NTASKS": "2"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "launch: mpiexec -n 2" in out.stdout
    assert "mpicomm demo: 2 ranks on 1 node(s)" in out.stdout and "all checks passed" in out.stdout


@pytest.mark.launches
def test_bench_pingpong_outside_slurm(tmp_path):
    out = _bash("bench.sbatch", ["pingpong", "--sizes", "8,1K", "--iters", "10"], str(tmp_path),
                {"MPICOMM_NTASKS": "2", "MPICOMM_RUN_DIR": "bench"})
    assert out.returncode == 0, out.stdout + out.stderr
    table = (tmp_path / "bench" / "pingpong.md").read_text()
    assert re.search(r"^\| 1024 ", table, re.M), table


@pytest.mark.launches
def test_stencil_outside_slurm_resumes_its_run_directory(tmp_path):
    env = {"MPICOMM_NTASKS": "2", "MPICOMM_RUN_DIR": "run"}
    first = _bash("stencil.sbatch", ["--size", "64", "--iters", "20", "--checkpoint-every", "10"], str(tmp_path), env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert any((tmp_path / "run" / "checkpoints").iterdir())
    again = _bash("stencil.sbatch", ["--size", "64", "--iters", "30", "--checkpoint-every", "10"], str(tmp_path), env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert re.search(r"resumed at 20", again.stdout), again.stdout
    assert re.search(r"verification\s+PASS", again.stdout), again.stdout


@pytest.mark.launches
def test_scaling_outside_slurm_runs_each_rank_count_then_collects(tmp_path):
    args = ["--algorithms", "ring,auto", "--sizes", "8,1K", "--iters", "5", "--rounds", "1"]
    out = _bash("scaling.sbatch", args, str(tmp_path), {"SCALING_RANKS": "1 2", "MPICOMM_RUN_DIR": "scaling"},
                timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    run = tmp_path / "scaling"
    assert {"p1.json", "p2.json", "scaling.md"} <= set(os.listdir(run))
    assert re.search(r"\| Size +\| +p=1 +\| +p=2 +\|", (run / "scaling.md").read_text())
