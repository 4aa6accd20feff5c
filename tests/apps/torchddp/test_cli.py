"""python -m apps.torchddp as users run it, under mpiexec at 2 ranks: --check, bench, checkpoints, bad flags."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys

import pytest

from tests.apps.torchddp import NO_TORCH

pytest.importorskip("torch", reason=NO_TORCH)

from mpicomm import cli  # noqa: E402
from tests import mpirun  # noqa: E402

pytestmark = pytest.mark.launches

TORCHDDP = [sys.executable, "-m", "apps.torchddp"]
#: A transformer small enough for a few seconds per run, big enough to have every kind of layer.
TINY_TRANSFORMER = ["--model", "transformer", "--vocab", "64", "--seq", "12", "--d-model", "32", "--heads", "4",
                    "--layers", "2", "--ff", "64"]


def _run(args: list[str], n: int = 2, timeout: float = 180) -> mpirun.Result:
    out = mpirun.run(n, TORCHDDP + args, timeout=timeout, env={"OMP_NUM_THREADS": "1"})
    assert not out.timed_out, f"timed out after {timeout} s:\n{out.stdout}\n{out.stderr}"
    return out


def _digest(stdout: str) -> str:
    return re.search(r"parameter digest (\w+)", stdout).group(1)


def _document(path) -> dict:
    """A --json document, checked for the fields every mpicomm command writes."""
    doc = json.loads(path.read_text())
    assert {"schema", "schema_version", "command", "machine", "versions", "date", "results"} <= doc.keys()
    assert doc["schema"] == cli.SCHEMA and doc["schema_version"] == cli.SCHEMA_VERSION
    return doc


@pytest.mark.parametrize("model", ["mlp", "transformer"])
def test_train_check_passes_and_reports(model, tmp_path):
    js = tmp_path / "run.json"
    args = ["train", "--steps", "12", "--batch", "15", "--check", "--progress-every", "4", "--json", str(js)]
    if model == "mlp" and importlib.util.find_spec("matplotlib") is not None:
        args += ["--plot", str(tmp_path / "curves.png")]
    args += TINY_TRANSFORMER if model == "transformer" else ["--model", "mlp", "--hidden", "64,64"]
    out = _run(args)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "on 2 ranks, backend mpicomm, global batch 15 (7-8 per rank)" in out.stdout
    assert "float64" in out.stdout  # --check trains in float64
    assert re.search(r"check: PASS .*max \|Δ\| \S+", out.stdout), out.stdout
    assert re.search(r"done: 12 steps in .*: [\d.,]+ steps/s, [\d,]+ samples/s", out.stdout), out.stdout
    assert re.search(r"train loss [\d.]+, accuracy [\d.]+ .* eval loss [\d.]+, accuracy [\d.]+", out.stdout)
    assert len(re.findall(r"^torchddp train \[\d+/12\] loss", out.stderr, re.M)) == 3, out.stderr  # progress, rank 0
    doc = _document(js)
    assert "mpiexec -n 2 python -m apps.torchddp train --steps 12" in doc["command"]
    assert doc["ranks"] == 2
    body = doc["results"]
    assert body["config"]["model"] == model and body["config"]["dtype"] == "float64"
    assert body["report"]["check"]["passed"] is True and body["report"]["digest"] == _digest(out.stdout)
    assert body["report"]["steps_per_s"] > 0 and 0 <= body["report"]["eval_accuracy"] <= 1
    assert [row["step"] for row in body["report"]["history"]] == [4, 8, 12]  # one row per progress line
    if "--plot" in args:
        assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "wrote " in out.stdout


def test_gloo_and_mpicomm_train_the_same_model():
    args = ["train", "--steps", "6", "--batch", "16", "--quiet", "--hidden", "32"]
    mpi = _run(args)
    gloo = _run(args + ["--dist-backend", "gloo"])
    assert mpi.returncode == 0 and gloo.returncode == 0, mpi.stderr + gloo.stderr
    assert "backend gloo" in gloo.stdout
    assert _digest(mpi.stdout) == _digest(gloo.stdout)  # two ranks: every sum is a + b, bit for bit


#: The control's columns of every bench row: positive numbers, and per round (one value per round).
CONTROL = ("compute_steps_per_s", "allreduce_s", "control_s", "vs_control")


def _control_columns(row: dict, rounds: int) -> None:
    """The control's columns of a bench row are there, positive, one per round; the all-reduced buffers are DDP's
    buckets, as many elements as the model's gradients."""
    for key in CONTROL:
        assert row[key] > 0 and len(row[f"{key}_rounds"]) == rounds and min(row[f"{key}_rounds"]) > 0, (key, row)
    assert row["allreduce_of"] == "DDP's buckets" and sum(row["allreduce_counts"]) == row["parameters"], row


def test_bench_writes_both_backends_rows(tmp_path):
    js, md = tmp_path / "bench.json", tmp_path / "bench.md"
    out = _run(["bench", "--repeat", "2", "--steps", "1", "--warmup", "2", "--json", str(js), "--out", str(md)],
               timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    doc = _document(js)
    assert doc["command"].endswith(f"mpiexec -n 2 python -m apps.torchddp bench --repeat 2 --steps 1 --warmup 2 "
                                   f"--json {js} --out {md}")
    assert "OMP_NUM_THREADS=1 " in doc["command"] and doc["environment"]["OMP_NUM_THREADS"] == "1"
    assert doc["ranks"] == 2 and doc["steps"] == 1 and doc["repeat"] == 2 and doc["torch"]
    assert doc["progress"] == ("sync" if doc["environment"].get("MPICOMM_TORCH_PROGRESS") == "sync" else "async")
    rows = doc["results"]
    assert {(r["config"], r["backend"]) for r in rows} == {(c, b) for c in ("mlp", "wide-mlp", "transformer")
                                                           for b in ("mpicomm", "gloo")}
    for r in rows:
        assert {"model", "parameters", "global_batch", "steps_per_s", "steps_per_s_rounds", "samples_per_s", "vs_gloo",
                "same_parameters", "identical_parameters", "max_abs_diff"} <= r.keys()
        assert r["steps_per_s"] > 0 and len(r["steps_per_s_rounds"]) == 2
        assert r["identical_parameters"] is True  # two ranks: the same sums in the same order on both backends
        _control_columns(r, 2)
    by = {(r["config"], r["backend"]): r for r in rows}
    for name in ("mlp", "wide-mlp", "transformer"):  # one control per configuration, on both backends' rows
        m, g = by[name, "mpicomm"], by[name, "gloo"]
        assert all(m[k] == g[k] for k in ("control_s_rounds", "allreduce_s_rounds", "allreduce_counts")), name
    # 35.8 MB of float32 gradients cannot fit one 25 MiB bucket
    assert len(by["wide-mlp", "mpicomm"]["allreduce_counts"]) >= 2
    text = md.read_text()
    assert text.startswith("## apps.torchddp bench, 2 ranks (") and f"Command: `{doc['command']}`" in text
    for name in ("mlp", "wide-mlp", "transformer"):
        assert re.search(rf"^\| {re.escape(name)} +\|", text, re.M), text
    for column in ("compute steps/s", "MPI_Allreduce per step", "mpicomm step / control", "gloo step / control"):
        assert f" {column} |" in text, column
    assert "Target: mpicomm ≥ 1.5× gloo's steps/s on wide-mlp" in text
    assert "Target: mpicomm's step ≤ 1.0 × the control" in text
    again = _run(["bench", "--configs", "mlp", "--repeat", "1", "--steps", "1", "--warmup", "2", "--out", str(md)])
    assert again.returncode == 2 and "exists; add --append" in again.stderr  # a report is never replaced silently
    assert md.read_text() == text


@pytest.mark.slow  # another launch of torch and the bench (~10 s on 2 busy cores); the default mode runs above
def test_bench_control_in_sync_progress_mode(tmp_path):
    """MPICOMM_TORCH_PROGRESS=sync (every all-reduce completes in its call), the mode the default is compared with:
    the same columns, the mode in the document and in the target's line."""
    js, md = tmp_path / "sync.json", tmp_path / "sync.md"
    out = mpirun.run(2, TORCHDDP + ["bench", "--configs", "mlp", "--repeat", "1", "--steps", "1", "--warmup", "2",
                                    "--quiet", "--json", str(js), "--out", str(md)],
                     timeout=180, env={"OMP_NUM_THREADS": "1", "MPICOMM_TORCH_PROGRESS": "sync"})
    assert not out.timed_out and out.returncode == 0, out.stdout + out.stderr
    doc = _document(js)
    assert doc["progress"] == "sync" and "MPICOMM_TORCH_PROGRESS=sync " in doc["command"]
    for r in doc["results"]:
        _control_columns(r, 1)
    assert "this run is `MPICOMM_TORCH_PROGRESS=sync`, the target is the default mode's." in md.read_text()


def _checkpointed(tmp_path, steps: int, *more: str) -> mpirun.Result:
    return _run(["train", *TINY_TRANSFORMER, "--steps", str(steps), "--batch", "8", "--quiet",
                 "--checkpoint-dir", str(tmp_path / "ck"), *more])


def test_restart_continues_bit_identically_keeping_the_newest(tmp_path):
    straight = _run(["train", *TINY_TRANSFORMER, "--steps", "10", "--batch", "8", "--quiet"])
    first = _checkpointed(tmp_path, 4, "--checkpoint-every", "1")
    resumed = _checkpointed(tmp_path, 10, "--checkpoint-every", "3", "--restart", "--keep", "3")
    for out in (straight, first, resumed):
        assert out.returncode == 0, out.stdout + out.stderr
    assert "checkpoint: " in first.stdout and "(step 4)" in first.stdout
    assert "resumed from step 4" in resumed.stdout
    assert _digest(resumed.stdout) == _digest(straight.stdout)
    assert _digest(first.stdout) != _digest(straight.stdout)
    # --keep 3: of the first run's 3 and 4 (--keep 2) and this run's 6, 9 (every 3) and 10 (the end), the newest 3
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == [
        "torchddp-00000006.ckpt", "torchddp-00000009.ckpt", "torchddp-00000010.ckpt"]  # and no temporary file


def test_a_damaged_newest_checkpoint_is_passed_over_for_the_one_before(tmp_path):
    straight = _run(["train", *TINY_TRANSFORMER, "--steps", "6", "--batch", "8", "--quiet"])
    assert _checkpointed(tmp_path, 4, "--checkpoint-every", "2").returncode == 0  # steps 2 and 4 (--keep 2)
    _flip_payload_byte(tmp_path / "ck" / "torchddp-00000004.ckpt")
    resumed = _checkpointed(tmp_path, 6, "--restart")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resumed from step 2" in resumed.stdout
    assert re.search(r"refused checkpoint: checkpoint \S+torchddp-00000004\.ckpt: checksum mismatch", resumed.stdout)
    assert _digest(resumed.stdout) == _digest(straight.stdout)


def _flip_payload_byte(path) -> None:
    data = bytearray(path.read_bytes())
    data[-20] ^= 0x40
    path.write_bytes(bytes(data))


# A flipped byte in every pass; a cut-short file and another model's checkpoint are the slower tier (5 s a case; the
# reader refuses each of them in-process in tests/apps/torchddp/test_checkpoint.py, in every pass).
@pytest.mark.parametrize("damage,text", [
    ("flip", "checksum mismatch"),
    pytest.param("truncate", "cut short or overwritten", marks=pytest.mark.slow),
    pytest.param("other-model", "belongs to another run (d_model: 16 here, 32 in the checkpoint)",
                 marks=pytest.mark.slow),
])
def test_a_bad_checkpoint_is_refused_on_every_rank(tmp_path, damage, text):
    first = _checkpointed(tmp_path, 3, "--checkpoint-every", "3")
    assert first.returncode == 0, first.stderr
    path = tmp_path / "ck" / "torchddp-00000003.ckpt"
    more = ["--restart"]
    if damage == "flip":
        _flip_payload_byte(path)
    elif damage == "truncate":
        path.write_bytes(path.read_bytes()[:-100])
    else:
        more += ["--d-model", "16"]
    out = _checkpointed(tmp_path, 6, *more)
    assert out.returncode == 2, out.stdout + out.stderr
    line = "python -m apps.torchddp train: error: "
    assert out.stderr.count(line) == 1, out.stderr  # once per job
    assert re.search(re.escape(line) + r".*checkpoint \S+torchddp-00000003\.ckpt.*" + re.escape(text), out.stderr), \
        out.stderr
    assert "parameter digest" not in out.stdout


def test_an_existing_checkpoint_is_not_overwritten_without_restart(tmp_path):
    assert _checkpointed(tmp_path, 2, "--checkpoint-every", "2").returncode == 0
    before = (tmp_path / "ck" / "torchddp-00000002.ckpt").read_bytes()
    out = _checkpointed(tmp_path, 2, "--checkpoint-every", "2")
    assert out.returncode == 2 and out.stderr.count("already holds checkpoints (newest: step 2)") == 1, out.stderr
    assert (tmp_path / "ck" / "torchddp-00000002.ckpt").read_bytes() == before


def _slower(args: list[str], text: str, every_rank: bool):
    """A usage error of a kind that runs in every pass (2 s a job): the slower tier."""
    return pytest.param(args, text, every_rank, marks=pytest.mark.slow)


# One case of each kind of check runs in every pass (a choice, a rule, a renamed option, two options that conflict,
# one found only once the ranks are known, the bench's own, an unknown command); the other cases are the slower tier.
@pytest.mark.parametrize("args,text,every_rank", [
    (["train", "--model", "cnn"], "invalid choice: 'cnn'", False),
    (["train", "--steps", "0"], "--steps must be >= 1, got 0", False),
    _slower(["train", "--bucket-mb", "0"], "--bucket-mb must be > 0, got 0", False),
    (["train", "--resume"], "--resume: renamed --restart", False),
    _slower(["train", "--checkpoint", "ck"], "--checkpoint: renamed --checkpoint-dir", False),
    _slower(["train", "--backend", "gloo"], "--backend: renamed --dist-backend", False),
    _slower(["train", "--keep", "0"], "--keep must be >= 1, got 0", False),
    _slower(["train", "--checkpoint-every", "-1"], "--checkpoint-every must be >= 0, got -1", False),
    (["train", "--check", "--dtype", "float32"], "--check compares in float64", False),
    _slower(["train", "--model", "transformer", "--d-model", "30"], "--d-model 30 is not a multiple of --heads 4",
            False),
    _slower(["train", "--hidden", "64,x"], "--hidden must be the width of each hidden layer", False),
    _slower(["train", "--model", "transformer", "--hidden", "64"], "--hidden 64 applies to --model mlp only", False),
    _slower(["train", "--optimizer", "adamw", "--momentum", "0.5"], "--momentum 0.5 applies to --optimizer sgd only",
            False),
    _slower(["train", "--eval", "5"], "--eval: renamed --eval-samples", False),
    (["train", "--batch", "1"], "--batch 1: the global batch is smaller than the 2 ranks", True),
    _slower(["bench", "--configs", "mlp,resnet"], "choose from mlp, wide-mlp, transformer", False),
    _slower(["bench", "--warmup", "1"], "--warmup must be >= 2, got 1 (DDP rebuilds its buckets in the second step",
            False),
    _slower(["bench", "--rounds", "3"], "--rounds: renamed --repeat", False),
    (["bench", "--repeat", "0"], "--repeat must be >= 1, got 0", False),
    _slower(["bench", "--force"], "--force needs --out FILE.md", False),
    (["nope"], "invalid choice: 'nope'", False),
])
def test_bad_flags_are_usage_errors(args, text, every_rank):
    """Said once per job (both ranks exit with status 2); a usage error with its usage block, the error found once
    the ranks are known without."""
    out = _run(args, timeout=90)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.count(text) == 1 and " of 2: " not in out.stderr, out.stderr
    assert out.stderr.count("usage: python -m apps.torchddp") == (0 if every_rank else 1), out.stderr
    assert out.stderr.count(": error: ") == 1, out.stderr


def test_help_describes_every_option():
    def help_of(*command: str) -> str:
        out = subprocess.run(TORCHDDP + [*command, "--help"], capture_output=True, text=True, cwd=mpirun.REPO,
                             timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout

    top = help_of()  # (each --help is a Python start-up importing PyTorch: one per command)
    assert "train" in top and "bench" in top and "examples:" in top
    train = help_of("train")
    for option in ("--model", "{mlp,transformer}", "--dist-backend", "{mpicomm,gloo}", "--steps", "--batch",
                   "GLOBAL batch", "--lr", "--bucket-mb", "--check", "--checkpoint-dir", "--checkpoint-every",
                   "--keep", "--restart", "--json",
                   "--progress-every", "--eval-samples", "--threads", "teacher"):
        assert option in train, option
    bench = help_of("bench")
    for option in ("--configs", "wide-mlp", "--repeat", "--steps", "--warmup", "--out", "--append", "--force",
                   "--json", "gloo"):
        assert option in bench, option
