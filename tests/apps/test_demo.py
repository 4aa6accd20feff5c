"""python -m apps.demo: --json, element counts in the size forms, --warmup (untimed calls before every timed loop)."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from apps import demo
from mpicomm import cli
from tests import mpirun

DEMO = [sys.executable, "-m", "apps.demo"]


@pytest.mark.launches
def test_json_document_and_size_forms(tmp_path):
    js = tmp_path / "demo.json"
    result = mpirun.run(2, DEMO + ["--count", "1e3", "--iters", "10", "--warmup", "2", "--json", str(js)], timeout=120)
    assert result.returncode == 0, result.stderr
    assert "1000 float64 per array" in result.stdout and "all checks passed" in result.stdout
    assert f"{cli.US}/call" in result.stdout and f"MPI {cli.US}" in result.stdout and "after 2 untimed" in result.stdout
    doc = json.loads(js.read_text())
    assert {"schema", "schema_version", "command", "machine", "versions", "date", "results"} <= doc.keys()
    assert doc["schema"] == cli.SCHEMA and doc["schema_version"] == cli.SCHEMA_VERSION
    assert doc["command"] == f"mpiexec -n 2 python -m apps.demo --count 1e3 --iters 10 --warmup 2 --json {js}"
    results = doc["results"]
    assert {"ranks", "count", "iters", "warmup", "topology", "ring", "barrier", "collectives", "checks", "passed",
            "seconds"} <= results.keys()
    assert results["ranks"] == 2 and results["count"] == 1000 and results["warmup"] == 2 and results["passed"]
    assert [row["rank"] for row in results["topology"]] == [0, 1] and results["ring"]["us"] > 0
    assert all(row["us"] > 0 for row in results["barrier"])
    timed = [row for row in results["collectives"] if "us" in row]
    assert {row["collective"] for row in timed} == {"allreduce", "allgather", "alltoall"}
    assert all(row["us"] > 0 and row["mpi_us"] > 0 for row in timed)
    assert len(results["checks"]) == 4 and all(check["passed"] for check in results["checks"])


@pytest.mark.launches
def test_help_and_bad_options():
    out = subprocess.run(DEMO + ["--help"], capture_output=True, text=True, cwd=mpirun.REPO, timeout=60)
    assert out.returncode == 0
    for option in ("--count", "64K or 1e6", "--iters", "--warmup", "--json", "--backend"):
        assert option in out.stdout
    for args, message in ((["--warmup", "-1"], "python -m apps.demo: error: --warmup must be >= 0, got -1"),
                          (["--count", "lots"], "--count must be a whole number with an optional unit"),
                          (["--count", "-4"], "python -m apps.demo: error: --count must be >= 0, got -4")):
        bad = mpirun.run(1, DEMO + args, timeout=60)
        assert bad.returncode == 2 and message in bad.stderr, (args, bad.stderr)


@pytest.mark.serial
def test_counts_take_the_size_forms():
    args = demo.parse(["--count", "64K"])
    assert args.count == 64 << 10 and args.warmup == 5
    assert demo.parse(["--count", "1e6"]).count == 10**6
    assert demo.parse(["--count", "0"]).count == 0


@pytest.mark.serial
def test_timed_loops_start_after_the_untimed_warm_up(monkeypatch):
    """Structural: *warmup* calls happen before the clock is first read; only *iters* calls are timed."""
    events: list[str] = []
    clock = iter(range(100))

    def perf_counter() -> float:
        events.append("clock")
        return float(next(clock))

    monkeypatch.setattr(demo, "time", SimpleNamespace(perf_counter=perf_counter))  # this module's clock only
    per = demo.timed(4, lambda: events.append("call"), warmup=3)
    assert events == ["call"] * 3 + ["clock"] + ["call"] * 4 + ["clock"]
    assert per == 1 / 4
