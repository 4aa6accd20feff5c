"""python -m apps.stencil end to end: output, bad arguments on every rank, restart after SIGKILL."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests import mpirun

pytestmark = pytest.mark.launches

STENCIL = [sys.executable, "-m", "apps.stencil", "--quiet", "--no-stream"]


def _digest(text: str) -> str:
    found = re.search(r"field digest\s+([0-9a-f]{16})", text)
    assert found, text
    return found.group(1)


def test_runs_verifies_and_reports(tmp_path):
    out_json, png = tmp_path / "r.json", tmp_path / "field.png"
    result = mpirun.run(3, STENCIL[:-1] + ["--size", "60", "--iters", "50", "--json", str(out_json), "--plot", str(png)],
                        timeout=180)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "heat 2-D, 60 x 60 cells, 3 ranks as 3 x 1 (blocks 20 x 60)" in text
    assert "verification    PASS" in text and "MLUP/s" in text and "of STREAM" in text and "parallel eff." in text
    data = json.loads(out_json.read_text())
    assert data["result"]["verdict"]["passed"] and data["result"]["iterations"] == 50
    assert png.stat().st_size > 1000


def test_every_rank_says_what_is_wrong():
    for args, message in [
        (["--size", "-5"], "--size -5: must be >= 1"),
        (["--kernel", "fortran"], "invalid choice: 'fortran'"),
        (["--size", "2", "--rank-dims", "4x1"], "2 cells per side split over 4 ranks in dimension 0"),
        (["--dims", "3", "--problem", "star"], "--problem star is 2-D"),
    ]:
        result = mpirun.run(4, STENCIL + args, timeout=120)
        assert result.returncode != 0 and not result.timed_out, (args, result.stderr)
        if message.startswith("--size 2") or "split over" in message or "star" in message:
            for rank in range(4):
                assert f"error (rank {rank}): " in result.stderr, (args, result.stderr)
        assert result.stderr.count(message) >= 2, (args, result.stderr)  # not only one rank


def test_help():
    out = subprocess.run(STENCIL[:3] + ["--help"], capture_output=True, text=True, timeout=60, cwd=mpirun.REPO)
    assert out.returncode == 0
    for option in ("--dims", "--size", "--iters", "--tol", "--kernel", "--halo", "--checkpoint-every",
                   "--checkpoint-dir", "--restart", "--plot"):
        assert option in out.stdout


def test_killed_run_restarts_bit_identical(tmp_path):
    """SIGKILL the whole job mid-run; --restart ends with the same field as a run never interrupted."""
    args = ["--size", "300", "--iters", "4000", "--kernel", "numpy", "--check-every", "50"]
    ckpt = tmp_path / "ckpt"
    cmd = mpirun.command(2, STENCIL + args + ["--checkpoint-every", "100", "--checkpoint-dir", str(ckpt)], timeout=300)
    proc = subprocess.Popen(cmd, cwd=mpirun.REPO, env=mpirun.job_env(timeout=300), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if (ckpt / "stencil-00000300.json").exists():
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the run ended before it could be killed: " + proc.stderr.read().decode()
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    resumed = mpirun.run(2, STENCIL + args + ["--checkpoint-every", "100", "--checkpoint-dir", str(ckpt), "--restart"],
                         timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    step = int(re.search(r"restarted from .* \(iteration (\d+)\)", resumed.stdout).group(1))
    assert 300 <= step < 4000
    straight = mpirun.run(3, STENCIL + args, timeout=300)
    assert straight.returncode == 0, straight.stderr
    assert _digest(resumed.stdout) == _digest(straight.stdout)
    assert "verification    PASS" in resumed.stdout
