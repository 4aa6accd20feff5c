"""python -m apps.stencil and apps.stencil.bench end to end: output, --json, --out, bad arguments on every rank,
restart after SIGKILL."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from mpicomm import cli
from tests import mpirun

pytestmark = pytest.mark.launches

STENCIL = [sys.executable, "-m", "apps.stencil", "--quiet", "--no-stream"]
BENCH = [sys.executable, "-m", "apps.stencil.bench"]
DOCUMENT = {"schema", "schema_version", "command", "machine", "versions", "date", "results"}


def _document(path) -> dict:
    """A --json document, checked for the fields every mpicomm command writes."""
    doc = json.loads(path.read_text())
    assert doc.keys() >= DOCUMENT, doc.keys()
    assert doc["schema"] == cli.SCHEMA and doc["schema_version"] == cli.SCHEMA_VERSION
    assert {"python", "numpy", "mpicomm"} <= doc["versions"].keys()
    return doc


def _digest(text: str) -> str:
    found = re.search(r"field digest\s+([0-9a-f]{16})", text)
    assert found, text
    return found.group(1)


def test_runs_verifies_and_reports(tmp_path):
    out_json, png = tmp_path / "r.json", tmp_path / "field.png"
    result = mpirun.run(3, STENCIL[:-1] + ["--size", "6e1", "--iters", "50", "--json", str(out_json),
                                           "--plot", str(png)], timeout=180)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "heat 2-D, 60 x 60 cells, 3 ranks as 3 x 1 (blocks 20 x 60)" in text  # --size 6e1 is 60
    assert "verification    PASS" in text and "MLUP/s" in text and "of STREAM" in text and "parallel eff." in text
    assert re.search(rf"time +\S+ (s|ms|{cli.US}) \(\S+ (ms|{cli.US}|ns) per iteration", text), text
    data = _document(out_json)
    assert data["command"].startswith("mpiexec -n 3 python -m apps.stencil ") and "--size 6e1" in data["command"]
    assert data["ranks"] == 3 and set(data["results"]) == {"config", "result"}
    result_ = data["results"]["result"]
    assert result_["verdict"]["passed"] and result_["iterations"] == 50 and result_["mlups"] > 0
    assert data["results"]["config"]["size"] == 60 and data["results"]["config"]["rank_dims"] == [3, 1]
    assert png.stat().st_size > 1000


def test_progress_lines_count_iterations_with_elapsed_time():
    result = mpirun.run(2, [sys.executable, "-m", "apps.stencil", "--no-stream", "--size", "40", "--iters", "20",
                            "--kernel", "numpy"], timeout=120)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("stencil [")]
    assert len(lines) == 10 and lines[-1].startswith("stencil [20/20] residual "), result.stderr  # a line per tenth
    assert all("elapsed" in line for line in lines) and "ETA" in lines[0] and "\r" not in result.stderr


def test_the_job_says_what_is_wrong_once():
    for args, message in [
        (["--size", "-5"], "--size must be >= 1, got -5"),
        (["--size", "0"], "--size must be >= 1, got 0"),
        (["--kernel", "fortran"], "invalid choice: 'fortran'"),
        (["--size", "2", "--rank-dims", "4x1"], "2 cells per side split over 4 ranks in dimension 0"),
        (["--dims", "3", "--problem", "star"], "--problem star is 2-D"),
    ]:
        result = mpirun.run(4, STENCIL + args, timeout=120)
        assert result.returncode == 2 and not result.timed_out, (args, result.stderr)
        assert result.stderr.count("python -m apps.stencil: error: ") == 1, (args, result.stderr)
        assert message in result.stderr and " of 4: " not in result.stderr, (args, result.stderr)


def test_help():
    out = subprocess.run(STENCIL[:3] + ["--help"], capture_output=True, text=True, timeout=60, cwd=mpirun.REPO)
    assert out.returncode == 0
    for option in ("--dims", "--size", "--iters", "--tol", "--kernel", "--halo", "--checkpoint-every",
                   "--checkpoint-dir", "--restart", "--plot", "--json", "--quiet", "4K or 1e4"):
        assert option in out.stdout
    bench = subprocess.run(BENCH + ["--help"], capture_output=True, text=True, timeout=60, cwd=mpirun.REPO)
    assert bench.returncode == 0
    for option in ("--ranks", "--size", "--halo", "--scaling", "--repeat", "--out", "--append", "--force", "--json",
                   "--quiet"):
        assert option in bench.stdout


def test_bench_writes_its_table_and_json(tmp_path):
    """The scaling benchmark at a tiny size: one rank count, one mode; then an existing --out needs --force."""
    out, js = tmp_path / "s.md", tmp_path / "s.json"
    args = ["--ranks", "1", "--size", "3.2e1", "--iters", "5", "--halo", "blocking", "--scaling", "strong",
            "--repeat", "1", "--kernel", "numpy", "--out", str(out), "--json", str(js)]
    result = subprocess.run(BENCH + args, capture_output=True, text=True, timeout=300, cwd=mpirun.REPO,
                            env=mpirun.clean_env())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "| strong | blocking | 1 | 32 × 32 |" in result.stdout
    assert "stencil.bench [1/1] strong n=1 blocking:" in result.stderr
    assert "python -m apps.stencil.bench --ranks 1 --size 3.2e1" in out.read_text()
    doc = _document(js)
    (row,) = doc["results"]["rows"]
    assert (row["scaling"], row["halo"], row["ranks"], row["size"]) == ("strong", "blocking", 1, 32)
    assert row["mlups"] > 0 and row["run"]["verdict"]["passed"]
    before = out.read_text()
    again = subprocess.run(BENCH + args, capture_output=True, text=True, timeout=60, cwd=mpirun.REPO,
                           env=mpirun.clean_env())
    assert again.returncode == 2 and f"--out {out} exists" in again.stderr and "--force" in again.stderr
    assert out.read_text() == before


def test_bench_scaling_both_gives_weak_and_strong_rows(tmp_path):
    """``--scaling both`` is what the help says it is: weak and strong (it used to be refused)."""
    js = tmp_path / "both.json"
    args = ["--ranks", "1,2", "--size", "32", "--iters", "3", "--halo", "blocking", "--scaling", "both",
            "--repeat", "1", "--kernel", "numpy", "--json", str(js), "--quiet"]
    result = subprocess.run(BENCH + args, capture_output=True, text=True, timeout=300, cwd=mpirun.REPO,
                            env=mpirun.clean_env())
    assert result.returncode == 0, result.stdout + result.stderr
    rows = _document(js)["results"]["rows"]
    assert [(r["scaling"], r["ranks"], r["size"]) for r in rows] == [("weak", 1, 32), ("weak", 2, 45),
                                                                     ("strong", 1, 32), ("strong", 2, 32)]
    assert "median of 1" in result.stdout


@pytest.mark.serial
def test_bench_options_are_checked_before_any_run_starts(monkeypatch, capsys):
    from apps.stencil import bench
    from kernels import available

    def no_runs(*args, **kwargs):
        raise AssertionError("a run was started before the options were checked")

    monkeypatch.setattr(bench.subprocess, "run", no_runs)
    cases = [(["--kernel", "fortran"], "argument --kernel: invalid choice: 'fortran'"),
             (["--scaling", "sideways"], "--scaling must be weak, strong or both; got 'sideways'"),
             (["--halo", "blocking,round"], "--halo must be blocking, overlap or neighbor"),
             (["--ranks", "0,2"], "--ranks must be rank counts >= 1"),
             (["--repeat", "0"], "--repeat must be >= 1, got 0"),
             (["--timeout", "0"], "--timeout must be > 0, got 0")]
    if not available("cupy")[0]:
        cases.append((["--kernel", "cupy"], "--kernel cupy cannot run here: "))
    for argv, message in cases:
        with pytest.raises(SystemExit) as info:
            bench.main(argv)
        assert info.value.code == 2
        assert f"python -m apps.stencil.bench: error: {message}" in capsys.readouterr().err


@pytest.mark.serial
def test_bench_reports_each_configuration_s_median_run():
    from apps.stencil.bench import _median

    runs = [{"mlups": m, "id": i} for i, m in enumerate([30.0, 10.0, 50.0, 20.0, 40.0])]
    assert _median(runs)["id"] == 0  # 30 is the median of 10..50
    assert _median(runs[:2])["id"] == 0  # of two, the upper: 30 over 10
    assert _median(runs[1:2])["id"] == 1


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
