"""``python -m mpicomm.torch.bench``: the table, the JSON document, the --out rule (tiny sizes, 2 ranks)."""

from __future__ import annotations

import json
import sys

import pytest

from tests import mpirun

from .conftest import torch  # noqa: F401 - skips the module without PyTorch


def _bench(tmp_path, *argv: str) -> mpirun.Result:
    return mpirun.run(2, [sys.executable, "-m", "mpicomm.torch.bench", *argv], timeout=180)


@pytest.mark.launches
def test_bench_reports_every_variant_and_agrees_with_gloo(tmp_path):
    out, js = tmp_path / "t.md", tmp_path / "t.json"
    result = _bench(tmp_path, "--sizes", "8,4KiB", "--repeat", "2", "--iters", "4", "--warmup", "1", "--out", str(out),
                    "--json", str(js), "--quiet")
    assert result.returncode == 0, result.stderr
    assert "gloo / mpicomm" in result.stdout and "Comm.Allreduce" in result.stdout
    assert "passthrough (µs)" in result.stdout and "mpicomm / passthrough" in result.stdout  # the default baseline
    doc = json.loads(js.read_text())
    assert doc["schema"] == "mpicomm-results" and doc["ranks"] == 2 and doc["command"].startswith("mpiexec -n 2")
    assert [r["bytes"] for r in doc["results"]] == [8, 4096]
    assert all(r["iterations"] == 4 and r["repeat"] == 2 for r in doc["results"])  # 2 measurements of 4 calls
    assert doc["repeat"] == 2 and doc["warmup"] == 1 and "a time is the median of the measurements" in doc["method"]
    assert all(r["wrong"] == 0 and r["mpicomm"] > 0 and r["gloo"] > 0 and r["passthrough"] > 0
               for r in doc["results"])
    text = out.read_text()
    assert "Command: `mpiexec -n 2 python -m mpicomm.torch.bench" in text and "measured 2 times" in text
    again = _bench(tmp_path, "--sizes", "8", "--out", str(out))  # an existing report is kept
    assert again.returncode == 2 and "--append" in again.stderr and "--force" in again.stderr


@pytest.mark.launches
def test_bench_without_the_baseline(tmp_path):
    result = _bench(tmp_path, "--sizes", "8", "--repeat", "1", "--iters", "2", "--baseline", "none", "--quiet")
    assert result.returncode == 0, result.stderr
    assert "passthrough" not in result.stdout and "gloo / mpicomm" in result.stdout


@pytest.mark.launches
def test_bench_usage_errors_name_the_value(tmp_path):
    result = _bench(tmp_path, "--sizes", "1.3K")
    assert result.returncode == 2 and "1.3K" in result.stderr and "whole number" in result.stderr
    result = _bench(tmp_path, "--repeat", "0")
    assert result.returncode == 2 and "python -m mpicomm.torch.bench: error: --repeat must be >= 1, got 0" in result.stderr
    result = _bench(tmp_path, "--rounds", "3")
    assert result.returncode == 2 and "--rounds: renamed --repeat N" in result.stderr
    result = _bench(tmp_path, "--iters", "0")
    assert result.returncode == 2 and "--iters must be >= 1, got 0" in result.stderr
    result = _bench(tmp_path, "--baseline", "gloo")
    assert result.returncode == 2 and "--baseline" in result.stderr and "passthrough" in result.stderr
