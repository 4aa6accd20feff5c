"""python -m apps.sgd train refuses impossible settings at start, on every rank, and counts real samples.

Each job runs under a wall-clock limit: a rank left waiting would show as a
timeout, not as a hung suite.
"""

from __future__ import annotations

import json
import sys

import pytest

from tests import mpirun

pytestmark = pytest.mark.launches

SGD = [sys.executable, "-m", "apps.sgd", "train"]


def _run(n: int, args: list[str], timeout: float = 60) -> mpirun.Result:
    out = mpirun.run(n, SGD + args, timeout=timeout, env={"OMP_NUM_THREADS": "1"})
    assert not out.timed_out, f"timed out after {timeout} s (a rank hung):\n{out.stdout}\n{out.stderr}"
    return out


def _refused_on_every_rank(out: mpirun.Result, n: int, message: str) -> None:
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    lines = [line for line in out.stderr.splitlines() if "error:" in line]
    assert lines == [f"python -m apps.sgd train: error: {message}"], out.stderr  # once per job, every rank exits 2


def test_a_batch_larger_than_the_data_set_exits_2_on_every_rank():
    out = _run(3, ["--batch", str(10 ** 12)])
    _refused_on_every_rank(out, 3, "--batch 1000000000000: larger than the 1,437 training samples of digits; "
                                   "use --batch <= 1437")


def test_an_unwritable_checkpoint_directory_is_refused_before_training(tmp_path):
    blocker = tmp_path / "a-file"  # a directory under a regular file: not writable, for root too
    blocker.write_text("")
    target = blocker / "ckpt"
    out = _run(2, ["--epochs", "50", "--checkpoint-every", "1000", "--checkpoint-dir", str(target)])
    _refused_on_every_rank(out, 2, f"--checkpoint-dir {target}: checkpoints cannot be written there: ranks 0, 1 "
                                   f"cannot create it (Not a directory); choose a directory that can be "
                                   f"created and written on every rank (pass --checkpoint-dir DIR), or fix its "
                                   f"permissions")
    assert "epoch" not in out.stderr and out.stdout == "", out.stdout + out.stderr  # no step ran


def test_reported_throughput_times_step_time_is_the_samples_processed(tmp_path):
    """--batch 1000 on 1,437 samples: one epoch is 1,437 samples in 2 steps (the old count said 2,000)."""
    out = _run(2, ["--batch", "1000", "--epochs", "1", "--quiet", "--json", str(tmp_path / "r.json")])
    assert out.returncode == 0, out.stderr
    report = json.loads((tmp_path / "r.json").read_text())["results"]["report"]
    assert report["steps"] == 2 and report["samples"] == 1437
    assert report["samples_per_s"] * report["step_s"] == pytest.approx(1437, rel=1e-9)
