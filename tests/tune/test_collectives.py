"""mpicomm.tune.collectives: measuring every algorithm into rules (end to end at small sizes), how close auto came,
and the model's corrections."""

from __future__ import annotations

import json
import os
import re
import sys

import pytest

from mpicomm.tune import collectives as measuring
from tests import mpirun


def test_auto_closeness_counts_points_within_ten_percent():
    points = [{"us": {"ring": 10.0, "naive": 20.0, "auto": 10.9}},  # within 10 %
              {"us": {"ring": 10.0, "naive": 20.0, "auto": 11.5}},  # not
              {"us": {"ring": 10.0}}]  # auto not measured: not counted
    assert measuring.auto_closeness(points) == (1, 2)


def test_model_corrections_are_the_median_measured_over_predicted_above_64_kib():
    from dataclasses import replace as _replace

    from mpicomm import model as _model
    from mpicomm import registry as _registry

    machine = _replace(_model.NOMINAL, overhead=10e-6, validation=5e-6, ppn=4)
    p = 2
    points = []
    for nbytes, factor in ((8, 100.0), (65536, 2.0), (1 << 20, 3.0), (4 << 20, 50.0)):
        predicted = _registry.communication("allreduce", "ring", nbytes, p, machine)
        points.append({"bytes": nbytes, "us": {"ring": (factor * predicted + 15e-6) * 1e6}})
    factors = measuring.model_corrections({"allreduce": points}, machine, p, validation=True)
    assert factors == (("allreduce", "ring", 3.0),)  # median of 2, 3, 50 (20 at most); 8 B is left out
    assert measuring.model_corrections({"allreduce": points[:1]}, machine, p, validation=True) == ()


@pytest.mark.launches
def test_tune_collectives_writes_rules_that_a_communicator_uses(tmp_path):
    from mpicomm import registry, rules

    env = {"MPICOMM_CACHE_DIR": str(tmp_path)}
    document = tmp_path / "rules-doc.json"
    result = mpirun.run(2, [sys.executable, "-m", "mpi4py", "-m", "mpicomm.tune", "--collectives", "--collective",
                            "allreduce,barrier", "--sizes", "8,4K", "--iters", "4", "--repeat", "2", "--quiet",
                            "--json", str(document)], timeout=180, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "elapsed" not in result.stderr  # --quiet: no progress lines
    saved = re.search(r"^saved: (.+)$", result.stdout, re.M)
    assert saved, result.stdout
    path = saved.group(1).strip()
    assert os.path.dirname(path) == str(tmp_path) and os.path.basename(path).startswith("rules-")
    assert path.endswith("-p2-1x2.json") and "decided: " in result.stdout and "within 10 % of the fastest" in result.stdout
    found = rules.load(path, registry.algorithms)
    assert (found.p, found.nodes, found.ppn) == (2, 1, 2) and set(found.collectives) == {"allreduce", "barrier"}
    assert found.collectives["allreduce"][-1]["max_bytes"] == 4096  # up to the largest size measured
    assert all(rule["device"] is False for rule in found.collectives["allreduce"])  # measured on host arrays
    assert "max_bytes" not in found.collectives["barrier"][0]
    assert [pt["bytes"] for pt in found.measurements["allreduce"]] == [8, 4096]
    small = found.algorithm_for("allreduce", 8)
    with open(document, encoding="utf-8") as f:
        doc = json.load(f)
    assert doc["schema"] == "mpicomm-results" and doc["saved"] == path and doc["layout"] == "p2-1x2"
    assert doc["command"].startswith("mpiexec -n 2 python -m mpicomm.tune --collectives")
    assert doc["results"]["rules"]["format"] == "mpicomm-rules"
    assert set(doc["results"]["rules"]["collectives"]) == {"allreduce", "barrier"}
    assert [pt["bytes"] for pt in doc["results"]["rules"]["measurements"]["allreduce"]] == [8, 4096]

    program = ("import numpy as np, mpicomm; from mpicomm.plan.args import Args; "
               "from mpicomm.selection import choose_for; c = mpicomm.Comm(); "
               "a = Args('allreduce', dtype=np.dtype(np.float64), count=1); "
               "b = Args('allreduce', dtype=np.dtype(np.float64), count=1 << 20); "
               "x = np.ones(1); y = np.empty(1); c.Allreduce(x, y); assert y[0] == 2; "
               "(small, source), big = choose_for(c._state, a, None), choose_for(c._state, b, None)[1]; "
               "every = c.gather((c.rank, small.name, source, big), root=0); "
               "c.rank == 0 and print(*('CHOICE %d %s %s %s' % row for row in every), sep='\\n')")
    used = mpirun.run(2, [sys.executable, "-c", program], timeout=120, env=env)
    assert used.returncode == 0, used.stdout + used.stderr
    lines = sorted(line.split() for line in used.stdout.splitlines() if line.startswith("CHOICE"))
    assert lines == [["CHOICE", "0", small, "rules", "table"], ["CHOICE", "1", small, "rules", "table"]]

    shown = mpirun.run(2, [sys.executable, "-m", "mpicomm.tune", "--collectives", "--show"], timeout=60, env=env)
    assert shown.returncode == 0, shown.stderr
    assert path in shown.stdout and '"format": "mpicomm-rules"' in shown.stdout

    # a second run, elsewhere: the saved rules stay, and are judged on the new times
    other = tmp_path / "again.json"
    again = mpirun.run(2, [sys.executable, "-m", "mpi4py", "-m", "mpicomm.tune", "--collectives", "--collective",
                           "allreduce", "--sizes", "8", "--iters", "4", "--repeat", "2", "--quiet", "--output",
                           str(other)], timeout=120, env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert re.search(r"the rules this run loaded .*: their algorithm within 10 % of this run's fastest at "
                     r"\d of 1 points", again.stdout), again.stdout
    assert f"communicators load {path}" in again.stdout and other.exists()
    assert rules.load(path) == found  # untouched
