"""python -m apps.sgd as users run it: accuracy on digits, every mode, bad input on every rank, restart, plots."""

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

SGD = [sys.executable, "-m", "apps.sgd"]


def _run(n: int, args: list[str], timeout: float = 120) -> mpirun.Result:
    return mpirun.run(n, SGD + args, timeout=timeout, env={"OMP_NUM_THREADS": "1"})


def _digest(stdout: str) -> str:
    return re.search(r"parameter digest (\w+)", stdout).group(1)


def _accuracy(stdout: str) -> float:
    return float(re.search(r"test accuracy ([0-9.]+)", stdout).group(1))


def _document(path) -> dict:
    """A --json document, checked for the fields every mpicomm command writes."""
    doc = json.loads(path.read_text())
    assert {"schema", "schema_version", "command", "machine", "versions", "date", "results"} <= doc.keys()
    assert doc["schema"] == cli.SCHEMA and doc["schema_version"] == cli.SCHEMA_VERSION
    return doc


def test_default_ddp_reaches_95_percent_on_digits_in_under_a_minute(tmp_path):
    out = _run(2, ["train", "--log", str(tmp_path / "m.csv"), "--json", str(tmp_path / "r.json"),
                   "--plot", str(tmp_path / "c.png"), "--plot-timeline", str(tmp_path / "t.png")])
    assert out.returncode == 0, out.stderr
    assert out.seconds < 60
    assert _accuracy(out.stdout) >= 0.95, out.stdout
    # progress lines (rank 0, stderr): train [i/N] epoch ... elapsed m:ss  ETA m:ss
    assert re.search(r"train \[\d+/\d+\] epoch .* test acc .* samples/s  elapsed \d+:\d\d  ETA", out.stderr)
    rows = (tmp_path / "m.csv").read_text().splitlines()
    assert rows[0].startswith("step,epoch,seconds,train_loss") and len(rows) == 13  # header + 12 epochs
    doc = _document(tmp_path / "r.json")
    assert doc["command"].startswith("mpiexec -n 2 python -m apps.sgd train --log ")
    body = doc["results"]
    assert {"config", "report", "hidden_fraction", "digest"} <= body.keys()
    assert body["config"]["mode"] == "ddp" and body["report"]["test_accuracy"] >= 0.95
    assert body["digest"] == _digest(out.stdout)
    for png in ("c.png", "t.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("mode,n,extra", [
    ("zero1", 3, []), ("zero2", 4, ["--optimizer", "adamw"]), ("ps-sync", 3, []),
    # (one server and staleness 2: the slower tier, 4 s; ps-async with two servers and staleness 3 runs in every pass)
    pytest.param("ps-async", 3, ["--staleness", "2"], marks=pytest.mark.slow),
    ("ps-async", 4, ["--servers", "2", "--staleness", "3"]),
    ("ddp", 3, ["--compress", "fp16", "--accumulate", "2", "--uneven"]),
])
def test_every_mode_learns_digits(mode, n, extra):
    out = _run(n, ["train", "--mode", mode, "--epochs", "8", *extra])
    assert out.returncode == 0, out.stderr
    assert _accuracy(out.stdout) >= 0.9, out.stdout


def test_ps_sync_equals_ps_async_with_staleness_zero():
    a = _run(3, ["train", "--mode", "ps-sync", "--epochs", "2", "--dtype", "float64"])
    b = _run(3, ["train", "--mode", "ps-async", "--staleness", "0", "--epochs", "2", "--dtype", "float64"])
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert _digest(a.stdout) == _digest(b.stdout)


def test_reproducible_runs_at_one_and_three_ranks_print_the_same_parameter_digest():
    """``--reproducible``: the command line's own check that the rank count does not change the model (ddp at one
    rank, zero2 at three: the same digest of the final parameters)."""
    common = ["train", "--reproducible", "--micro-batches", "6", "--steps", "12", "--dtype", "float64"]
    a = _run(1, common)
    b = _run(3, [*common, "--mode", "zero2"])
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert _digest(a.stdout) == _digest(b.stdout)


@pytest.mark.parametrize("n,args,text,usage", [
    (4, ["--batch", "3"], "--batch 3: the global batch is smaller than the 4 workers", False),
    (2, ["--mode", "nope"], "argument --mode: invalid choice: 'nope'", True),
    (2, ["--bucket-mb", "0"], "--bucket-mb must be > 0, got 0 (DDP's default is 25)", True),
    (2, ["--batch", "0"], "--batch must be >= 1, got 0", True),
    (3, ["--mode", "ps-async", "--staleness", "-1"], "--staleness must be >= 0, got -1 (0 is synchronous)", True),
    (2, ["--keep", "0"], "--keep must be >= 1, got 0", True),
    (2, ["--mode", "ps-sync", "--plot-timeline", "t.png"], "--plot-timeline draws bucket collectives", True),
    (2, ["--mode", "ps-sync", "--servers", "2"], "--servers 2: need 1 <= K < N ranks (N = 2)", False),
    (2, ["--data", "file", "--data-file", "/nonexistent/x.npz"], "/nonexistent/x.npz", False),
    (2, ["--micro-batches", "4"], "--micro-batches 4 applies to --reproducible only", True),
    (2, ["--mode", "ps-sync", "--reproducible"], "--reproducible applies to --mode ddp, zero1, zero2 or zero3 only",
     True),
    (2, ["--reproducible", "--accumulate", "2"], "drop --accumulate, --compress and --uneven", True),
    (4, ["--reproducible", "--micro-batches", "3"], "--micro-batches 3: fewer than the 4 workers", False),
])
def test_bad_input_is_refused_on_every_rank_with_status_2(n, args, text, usage):
    """Settings wrong at any rank count are usage errors before the work starts; the rest once the ranks are known.
    Either way the error is said once per job, every rank exits with status 2, and nothing is printed as if
    accepted first (the run's first line, "apps.sgd: ddp on ...")."""
    out = _run(n, ["train", *args], timeout=60)
    assert not out.timed_out and out.seconds < 45
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stdout == "", out.stdout
    assert out.stderr.count("python -m apps.sgd train: error: ") == 1, out.stderr
    assert text in out.stderr, out.stderr
    assert out.stderr.count("usage:") == (1 if usage else 0) and f" of {n}: " not in out.stderr, out.stderr


def test_a_checkpoint_of_another_model_is_refused(tmp_path):
    ckpt = str(tmp_path / "ck")
    first = _run(2, ["train", "--steps", "4", "--checkpoint-every", "2", "--checkpoint-dir", ckpt])
    assert first.returncode == 0, first.stderr
    again = _run(2, ["train", "--steps", "4", "--checkpoint-every", "2", "--checkpoint-dir", ckpt])
    assert again.returncode == 2 and "already holds checkpoints" in again.stderr
    other = _run(2, ["train", "--hidden", "32", "--steps", "4", "--checkpoint-every", "2", "--checkpoint-dir", ckpt,
                     "--restart"])
    assert other.returncode == 2, other.stderr
    assert other.stderr.count("a checkpoint of another model") == 1, other.stderr


SLOW = ["train", "--data", "teacher", "--features", "64", "--hidden", "256,256", "--samples", "8192", "--batch", "64",
        "--steps", "600", "--dropout", "0.1", "--optimizer", "sgd", "--lr", "0.05", "--eval-every", "100"]


def test_killed_run_restarts_bit_identical(tmp_path):
    """SIGKILL the job mid-run; --restart (at another rank count too) ends bit-identical to an uninterrupted run."""
    ckpt = tmp_path / "ckpt"
    args = SLOW + ["--checkpoint-every", "20", "--checkpoint-dir", str(ckpt)]
    cmd = mpirun.command(2, SGD + args, timeout=300)
    proc = subprocess.Popen(cmd, cwd=mpirun.REPO, env=mpirun.job_env({"OMP_NUM_THREADS": "1"}, timeout=300),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if (ckpt / "sgd-00000060.json").exists():
                break
            time.sleep(0.01)
        assert proc.poll() is None, "the run ended before it could be killed: " + proc.stderr.read().decode()
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    resumed = _run(2, args + ["--restart"], timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    step = int(re.search(r"resumed from step (\d+)", resumed.stdout).group(1))
    assert 60 <= step < 600
    straight = _run(2, SLOW, timeout=300)
    assert straight.returncode == 0, straight.stderr
    assert _digest(resumed.stdout) == _digest(straight.stdout)


def test_restart_at_another_rank_count_and_mode(tmp_path):
    """A zero2 checkpoint written on 3 ranks resumes as ddp on 2: the state is stored whole."""
    ckpt = str(tmp_path / "ck")
    common = ["train", "--dtype", "float64", "--checkpoint-dir", ckpt, "--checkpoint-every", "10"]
    first = _run(3, common + ["--mode", "zero2", "--steps", "10"])
    assert first.returncode == 0, first.stderr
    resumed = _run(2, common + ["--steps", "30", "--restart"])
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from step 10" in resumed.stdout
    straight = _run(1, ["train", "--dtype", "float64", "--steps", "30"])
    assert resumed.returncode == 0 and straight.returncode == 0
    # float64, other reduction orders: equal to ~1e-12, not bit for bit; the accuracies agree.
    assert abs(_accuracy(resumed.stdout) - _accuracy(straight.stdout)) <= 0.01


def test_help_lists_the_modes_and_options():
    out = subprocess.run(SGD + ["train", "--help"], capture_output=True, text=True, cwd=mpirun.REPO, timeout=60)
    assert out.returncode == 0
    for option in ("--mode", "--bucket", "--bucket-mb", "25M", "--no-overlap", "--per-parameter", "--compress",
                   "--accumulate", "--uneven", "--servers", "--staleness", "--checkpoint-every", "--restart", "--log",
                   "--json", "--plot", "--plot-timeline", "zero2", "ps-async"):
        assert option in out.stdout
    for command in ("bench", "plot"):
        more = subprocess.run(SGD + [command, "--help"], capture_output=True, text=True, cwd=mpirun.REPO, timeout=60)
        assert more.returncode == 0 and "--plot" in more.stdout
    bench = subprocess.run(SGD + ["bench", "--help"], capture_output=True, text=True, cwd=mpirun.REPO, timeout=60)
    for option in ("--parts", "--out", "--append", "--force", "--json", "--quiet"):
        assert option in bench.stdout


def test_bucket_sizes_in_any_form_and_the_plot_command(tmp_path):
    csv, js = tmp_path / "m.csv", tmp_path / "r.json"
    out = _run(2, ["train", "--steps", "4", "--eval-every", "2", "--bucket", "64KiB", "--log", str(csv),
                   "--json", str(js), "--quiet"], timeout=60)
    assert out.returncode == 0, out.stderr
    assert _document(js)["results"]["config"]["bucket_mb"] == 64 / 1024
    exponent = _run(1, ["train", "--steps", "2", "--bucket", "1e5", "--quiet"], timeout=60)
    assert exponent.returncode == 0, exponent.stderr
    both = _run(1, ["train", "--bucket", "1M", "--bucket-mb", "1"], timeout=60)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
    png = tmp_path / "c.png"
    drawn = subprocess.run(SGD + ["plot", str(csv), "--plot", str(png)], capture_output=True, text=True,
                           cwd=mpirun.REPO, timeout=60)
    assert drawn.returncode == 0, drawn.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    renamed = subprocess.run(SGD + ["plot", str(csv), "--out", str(tmp_path / "o.png")], capture_output=True,
                             text=True, cwd=mpirun.REPO, timeout=60)  # --out was a hidden alias of --plot
    assert renamed.returncode == 2 and not (tmp_path / "o.png").exists()
    assert "python -m apps.sgd plot: error: --out: renamed --plot" in renamed.stderr


def test_bench_runs_every_part_small(tmp_path):
    out_file, js = tmp_path / "b.md", tmp_path / "b.json"
    args = ["bench", "--repeat", "1", "--steps", "2", "--features", "32", "--hidden", "64,48", "--batch", "32",
            "--async-epochs", "1", "--out", str(out_file), "--plot", str(tmp_path / "a.png"), "--json", str(js)]
    out = _run(3, args, timeout=180)
    assert out.returncode == 0, out.stderr
    text = out_file.read_text()
    for heading in ("### Scaling", "### Modes", "### Parameter-server bottleneck", "### Synchronous vs asynchronous"):
        assert heading in text
    assert "Model: MLP 32→64→48→10" in text  # --hidden: the width of each hidden layer, as in train
    for mode in ("per-parameter", "bucketed", "overlapped", "zero1", "zero2", "zero3", "ps-sync", "ps-async"):
        assert f"| {mode} |" in text
    for part, total in (("scaling", 1), ("modes", 1), ("ps", 2), ("async", 3)):
        assert f"bench {part} [{total}/{total}]" in out.stderr, out.stderr  # progress from rank 0
    doc = _document(js)
    assert f"Command: `{doc['command']}`" in text
    results = doc["results"]
    assert results["parts"] == ["scaling", "modes", "ps", "async"]
    assert results["scaling"]["speedup"] > 0 and len(results["scaling"]["samples_per_s_all_ranks"]) == 1
    assert [m["mode"] for m in results["modes"]["modes"]][:2] == ["per-parameter", "bucketed"]
    assert all(m["step_ms"] > 0 for m in results["modes"]["modes"])
    assert [r["workers"] for r in results["ps"]["rows"]] == [1, 2]
    assert [r["run"] for r in results["async"]["runs"]][0] == "ps-sync"
    again = _run(2, args, timeout=60)
    assert again.returncode == 2 and f"--out {out_file} exists; add --append" in again.stderr
    assert out_file.read_text() == text


def test_the_trace_shows_layers_backward_next_to_the_bucket_allreduces(tmp_path):
    path = tmp_path / "trace.json"
    out = mpirun.run(2, SGD + ["train", "--steps", "3", "--quiet", "--per-parameter"], timeout=60,
                     env={"MPICOMM_TRACE": str(path), "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    events = json.loads(path.read_text())["traceEvents"]
    names = [e["name"] for e in events if e.get("ph") == "X"]
    for rank_pid in {e["pid"] for e in events if e.get("ph") == "X"}:
        mine = [e["name"] for e in events if e.get("ph") == "X" and e["pid"] == rank_pid]
        assert sum(n.startswith("backward layer") for n in mine) == 3 * 3  # 3 layers (Linear, ReLU, Linear) × 3 steps
        assert sum(n.startswith("allreduce") for n in mine) == 3 * 4  # a bucket per W and b, 3 steps
    assert len(names) > 0
