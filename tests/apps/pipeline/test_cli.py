"""python -m apps.pipeline as users run it: schedule charts, train --check, bad options on every rank, bench, trace."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests import mpirun

pytestmark = pytest.mark.launches

PIPELINE = [sys.executable, "-m", "apps.pipeline"]
SMALL = ["--blocks", "4", "--width", "16", "--hidden", "32", "--features", "8", "--batch", "32", "--steps", "3",
         "--quiet"]


def _run(n: int, args: list[str], timeout: float = 120, env: dict | None = None) -> mpirun.Result:
    return mpirun.run(n, PIPELINE + args, timeout=timeout, env={"OMP_NUM_THREADS": "1", **(env or {})})


def _serial(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(PIPELINE + args, cwd=mpirun.REPO, capture_output=True, text=True, timeout=120)


def test_schedule_prints_validates_draws_and_writes_json(tmp_path):
    png, doc = tmp_path / "s.png", tmp_path / "s.json"
    out = _serial(["schedule", "--stages", "4", "--micro", "8", "--schedule", "1f1b", "--plot", str(png),
                   "--json", str(doc)])
    assert out.returncode == 0, out.stderr
    assert "rank 3: 3F0 3B0 3F1 3B1" in out.stdout
    assert "planned bubble 27.3% of 4 x 33 units" in out.stdout and "formula (p-1)/(m+p-1) = 27.3%" in out.stdout
    assert png.stat().st_size > 10_000
    results = json.loads(doc.read_text())["results"]
    assert results["bubble"] == pytest.approx(3 / 11) and results["rows"][0][:2] == ["0F0", "SEND_F 0F0 →1"]


def test_schedule_draws_a_v_as_text_with_two_chunks_by_default():
    out = _serial(["schedule", "--stages", "2", "--micro", "4", "--schedule", "zb-v", "--chart"])
    assert out.returncode == 0, out.stderr
    assert "v=2 chunks" in out.stdout  # zb-v's own chunk count, without --chunks
    assert "rank 0  F0F1F2f0i0w0f1i1w1F3I0W0f2i2w2I1W1f3i3w3I2W2I3W3·" in out.stdout  # f: stage 3, the V's top
    assert "rank 1  · F0f0F1f1i0w0F2I0W0f2i1w1F3I1W1f3i2w2I2i3I3W2w3W3" in out.stdout
    assert "formula (p-1)/(6m+p-1) = 4.0%" in out.stdout and "published 2p = 4" in out.stdout


def test_schedule_bad_shape_exits_2_naming_the_fix():
    out = _serial(["schedule", "--stages", "3", "--micro", "4", "--schedule", "interleaved", "--chunks", "2"])
    assert out.returncode == 2
    assert "micro-batches (4) to be a multiple of the stages (3); use --micro 3 or 6" in out.stderr


def test_help_lists_the_schedules_and_strategies():
    out = _serial(["train", "--help"])
    assert out.returncode == 0
    for word in ("naive", "gpipe", "1f1b", "interleaved", "looped-bfs", "zb-h1", "zb-h2", "zb-v", "dualpipev",
                 "recompute", "offload", "--tensor", "--balance"):
        assert word in out.stdout


def test_train_check_equals_one_process_and_measures(tmp_path):
    png, doc, log, trace = tmp_path / "run.png", tmp_path / "run.json", tmp_path / "log.csv", tmp_path / "trace.json"
    out = _run(2, ["train", *SMALL, "--schedule", "zb-h1", "--check", "--plot", str(png), "--json", str(doc),
                   "--log", str(log)], env={"MPICOMM_TRACE": str(trace)})
    assert out.returncode == 0, out.stderr
    assert "parameters 0.00e+00 - equal" in out.stdout or " - equal" in out.stdout
    assert "bubble measured" in out.stdout and "formula (p-1)/(3m+p-1) = 4.0%" in out.stdout
    assert png.stat().st_size > 10_000
    assert log.read_text().splitlines()[0] == "step,loss,accuracy,seconds" and len(log.read_text().splitlines()) == 4
    summary = json.loads(doc.read_text())["results"]["summary"]
    assert [r["rank"] for r in summary["per_rank"]] == [0, 1] and summary["per_rank"][0]["peak_micro"] <= 2
    names = {e["name"] for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"}
    assert {"0F0", "0I0", "0W0", "1F7", "1W7"} <= names


def test_two_dimensional_run_with_tensor_parallelism(tmp_path):
    out = _run(4, ["train", *SMALL, "--stages", "2", "--tensor", "2", "--micro", "4", "--activations", "offload",
                   "--check"], timeout=180)
    assert out.returncode == 0, out.stderr
    assert "T 2 x S 2 x D 1" in out.stdout and " - equal" in out.stdout


@pytest.mark.parametrize("args,message,usage", [
    (["--stages", "2", "--micro", "0"], "--micro must be an integer >= 1, got 0", True),
    (["--stages", "2", "--schedule", "dualpipev", "--micro", "3"],
     r"dualpipev needs at least twice as many micro-batches as stages (m >= 2p = 4), got 3; use --micro 4", True),
    (["--stages", "2", "--blocks", "1"], "2 stages but the model has 1 blocks", True),
    (["--stages", "2", "--keep", "0"], "--keep must be >= 1, got 0", True),
    (["--stages", "2", "--hidden", "32,64"], "--hidden must be one width", True),
    (["--stages", "3"], "2 ranks cannot be split into --tensor 1 x --stages 3 x D replicas", False),
])
def test_bad_options_exit_2_on_every_rank(args, message, usage):
    """Options wrong at any rank count are usage errors before the work starts; the rest once the ranks are known.
    Either way the error is said once per job, and every rank exits with status 2."""
    out = _run(2, ["train", *SMALL, *args], timeout=60)
    assert out.returncode == 2, out.stderr
    assert out.stdout == "", out.stdout  # nothing printed as if accepted
    assert out.stderr.count(f"python -m apps.pipeline train: error: {message}") == 1, out.stderr
    assert out.stderr.count("usage:") == (1 if usage else 0) and " of 2: " not in out.stderr, out.stderr


@pytest.mark.parametrize("args,message", [
    (["--stages", "0"], "--stages must be >= 1, got 0"),
    (["--micro", "0"], "--micro must be >= 1, got 0"),
    (["--stages", "3", "--micro", "4", "--schedule", "interleaved", "--chunks", "2"],
     "interleaved 1F1B needs the micro-batches (4) to be a multiple of the stages (3); use --micro 3 or 6"),
])
def test_schedule_refuses_before_printing_anything(args, message):
    out = _serial(["schedule", *args])
    assert out.returncode == 2 and out.stdout == "", out.stdout  # no "validated" line before the refusal
    assert f"python -m apps.pipeline schedule: error: {message}" in out.stderr


def test_restart_without_checkpoints_exits_2(tmp_path):
    out = _run(2, ["train", *SMALL, "--restart", "--checkpoint-dir", str(tmp_path / "none")], timeout=60)
    assert out.returncode == 2 and "no valid checkpoint" in out.stderr


def test_bench_writes_the_table_and_json(tmp_path):
    md, doc = tmp_path / "bench.md", tmp_path / "bench.json"
    out = _run(2, ["bench", *SMALL, "--repeat", "1", "--micro", "4", "--out", str(md), "--json", str(doc)], timeout=240)
    assert out.returncode == 0, out.stderr
    text = md.read_text()
    for row in ("| naive |", "| gpipe |", "| 1f1b | 1 | store |", "| interleaved | 2 |", "| looped-bfs | 2 |",
                "| zb-h1 |", "| zb-h2 |", "| zb-v | 2 |", "| dualpipev | 2 |", "| 1f1b | 1 | recompute |",
                "| 1f1b | 1 | offload |", "| one rank |"):
        assert row in text
    assert "against one rank on the same model and global batch" in text
    rows = json.loads(doc.read_text())["results"]
    assert len(rows) == 12 and all(r["step_s"] > 0 for r in rows)
    # every schedule holds what it planned, and the papers' count: zb-v 2p = 4 chunk micro-batches, dualpipev 5
    assert all(r["peak_micro"] == r["planned_peak"] for r in rows)
    assert {r["schedule"]: r["memory"] for r in rows if r["activations"] == "store"}["dualpipev"] == 5
    again = _run(2, ["bench", *SMALL, "--repeat", "1", "--out", str(md)], timeout=60)
    assert again.returncode == 2 and "python -m apps.pipeline bench: error: --out " in again.stderr
    assert "exists; add --append" in again.stderr
