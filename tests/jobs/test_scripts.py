"""jobs/*.sbatch without Slurm: their shared conventions, and runs through mpiexec (``bash jobs/x.sbatch``).

Every script must also run outside Slurm (a laptop, a CI machine without root),
where it launches with mpiexec; these tests need neither root nor Slurm. The
conventions checked here are the ones jobs/README.md promises: strict bash,
small #SBATCH defaults that the command line overrides, srun with PMI-2, the
same launch block in every script (so a fix to one is a fix to all), requeue.
"""

from __future__ import annotations

import glob
import json
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


#: The sub-command a script runs when its first argument does not name one.
_DEFAULT_SUBCOMMAND = {"mpicomm.bench": "allreduce"}
_INVOCATION = re.compile(r"-m (apps\.\w+|mpicomm\.\w+|kernels\.\w+)((?: +\S+)*)")


def _invocations() -> list[tuple[str, str, list[str]]]:
    """(script, command as --help names it, the options the script passes) for every application and tool the
    scripts start with options of their own (continuation lines joined, comments skipped)."""
    from tests.test_commands import BY_NAME

    found = []
    for path in SCRIPTS:
        for line in _text(path).replace("\\\n", " ").splitlines():
            m = _INVOCATION.search(line)
            if line.lstrip().startswith("#") or not m:
                continue
            words = m.group(2).split()
            sub = words[0] if words and not words[0].startswith(("-", '"')) else None
            if words and words[0].startswith('"$') and m.group(1) in _DEFAULT_SUBCOMMAND:
                sub = _DEFAULT_SUBCOMMAND[m.group(1)]  # a sub-command from a variable: check the script's default
            name = f"python -m {m.group(1)}" + (f" {sub}" if sub else "")
            options = sorted({w.split("=")[0] for w in words if w.startswith("--")})
            if options:
                assert name in BY_NAME, f"{os.path.basename(path)} runs {name}, which tests/test_commands.py lacks"
                found.append((os.path.basename(path), name, options))
    return found


def test_scripts_pass_only_options_their_commands_have():
    """After a rename (--checkpoint to --checkpoint-dir, --resume to --restart...) a script still using the old
    name would fail at submission time on a cluster: every option a script passes is in its command's --help."""
    from tests.test_commands import BY_NAME, Child, options_of, run_all

    invocations = _invocations()
    assert {name for _, name, _ in invocations} >= {"python -m apps.stencil", "python -m apps.torchddp train",
                                                    "python -m apps.pipeline train", "python -m apps.pipeline bench",
                                                    "python -m apps.mapreduce wordcount",
                                                    "python -m apps.mapreduce corpus", "python -m apps.sgd train",
                                                    "python -m apps.sgd bench"}
    names = sorted({name for _, name, _ in invocations if not BY_NAME[name].needs or _importable(BY_NAME[name].needs)})
    children = {"torch": Child(), "rest": Child()}
    try:
        outcomes = run_all(children, [(BY_NAME[n], [*BY_NAME[n].argv, "--help"]) for n in names])
    finally:
        for child in children.values():
            child.close()
    helps = {n: options_of(o.stdout) for n, o in zip(names, outcomes)}
    for script, name, options in invocations:
        if name in helps:
            missing = [o for o in options if o not in helps[name]]
            assert not missing, f"{script} passes {missing} to {name}, which has no such option"


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


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


def sgd_digest(log: str) -> str:
    """The parameter digest an apps.sgd run prints last (equal digests: bit-identical models); test_slurm.py's too."""
    found = re.findall(r"^parameter digest ([0-9a-f]{32})$", log, re.M)
    assert found, f"no parameter digest in:\n{log}"
    return found[-1]


@pytest.mark.launches
@pytest.mark.parametrize("mode,every,steps,saved,resumed", [
    (["--keep", "4"], 3, 10, (3, 6, 9, 10), 6),
    # The parameter servers checkpoint like every mode (the script's resume is the same for both; the slower tier, 8 s).
    pytest.param(["--mode", "ps-sync", "--servers", "1"], 4, 6, (4, 6), 4, marks=pytest.mark.slow),
], ids=["ddp", "ps-sync"])
def test_sgd_outside_slurm_resumes_its_run_directory_bit_for_bit(tmp_path, mode, every, steps, saved, resumed):
    # The script always passes --restart: a run on a run directory whose newest checkpoints are gone (as if killed
    # after step *resumed*) continues from there and ends with the parameters of the uninterrupted run.
    env = {"MPICOMM_NTASKS": "2", "MPICOMM_RUN_DIR": "run", "SGD_CHECKPOINT_EVERY": str(every)}
    args = [*mode, "--steps", str(steps), "--quiet"]
    whole = _bash("sgd.sbatch", args, str(tmp_path), env)
    assert whole.returncode == 0, whole.stdout + whole.stderr
    assert "launch: mpiexec -n 2" in whole.stdout and "resumed" not in whole.stdout, whole.stdout
    checkpoints = tmp_path / "run" / "checkpoints"
    names = sorted(p.name for p in checkpoints.iterdir())
    assert names == [f"sgd-{step:08d}.{ext}" for step in saved for ext in ("bin", "json")]
    for name in names[2 * (saved.index(resumed) + 1):]:
        (checkpoints / name).unlink()
    again = _bash("sgd.sbatch", args, str(tmp_path), env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"resumed from step {resumed} in run/checkpoints" in again.stdout, again.stdout
    assert sgd_digest(again.stdout) == sgd_digest(whole.stdout)
    with open(tmp_path / "run" / "train.json") as f:
        doc = json.load(f)
    assert (doc["results"]["report"]["start_step"], doc["results"]["report"]["steps"]) == (resumed, steps)
    assert doc["results"]["digest"] == sgd_digest(again.stdout)


@pytest.mark.launches
def test_scaling_outside_slurm_runs_each_rank_count_then_collects(tmp_path):
    args = ["--algorithms", "ring,auto", "--sizes", "8,1K", "--iters", "5", "--repeat", "1"]
    out = _bash("scaling.sbatch", args, str(tmp_path), {"SCALING_RANKS": "1 2", "MPICOMM_RUN_DIR": "scaling"},
                timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    run = tmp_path / "scaling"
    assert {"p1.json", "p2.json", "scaling.md"} <= set(os.listdir(run))
    assert re.search(r"\| Size +\| +p=1 +\| +p=2 +\|", (run / "scaling.md").read_text())
