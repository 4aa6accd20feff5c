"""jobs/collect.py: a scaling study's benchmark JSON files into one table per row kind, and a plot.

No MPI here: the inputs are files in the format ``python -m mpicomm.bench
--json`` writes (the fields collect.py reads), with latencies that depend on
the rank count, the size and the algorithm, so a value in the wrong column or
row is caught. The end-to-end run (real benchmark files from a job array) is
in tests/jobs/test_slurm.py and test_scripts.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys

import pytest

from tests import mpirun

pytestmark = pytest.mark.serial  # no MPI: one run is enough, not one per rank

_spec = importlib.util.spec_from_file_location("jobs_collect", os.path.join(mpirun.REPO, "jobs", "collect.py"))
collect = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = collect  # dataclasses look their module up there
_spec.loader.exec_module(collect)

ALGORITHMS = ("ring", "recursive_doubling")
SIZES = (8, 1024, 65536)


def latency(p: int, size: int, name: str) -> float:
    """A made-up but distinct latency per (p, size, name): ring is fastest at p >= 3 and size > 8."""
    base = {"native": 1.0, "ring": 3.0, "recursive_doubling": 2.0}[name]
    if name == "ring" and p >= 3 and size > 8:
        base = 1.5
    return round(base * p + size / 1000 + 0.01 * SIZES.index(size), 3)


def document(p: int, benchmark: str = "allreduce", nodes: int = 1) -> dict:
    rows = []
    for size in SIZES:
        rows.append({"size": size, "name": "native", "algorithm": None, "chose": None,
                     "avg_us": latency(p, size, "native")})
        for a in ALGORITHMS:
            rows.append({"size": size, "name": a, "algorithm": a, "chose": None, "avg_us": latency(p, size, a)})
        chose = "ring" if size > 8 else "recursive_doubling"
        rows.append({"size": size, "name": "auto", "algorithm": "auto", "chose": chose,
                     "avg_us": latency(p, size, chose) + 0.5})
    return {"benchmark": benchmark, "p": p, "nodes": nodes, "command": f"mpiexec -n {p} python -m mpicomm.bench",
            "machine": "test machine", "rows": rows}


def write(folder, name: str, doc) -> str:
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        json.dump(doc, f)
    return path


@pytest.fixture
def study(tmp_path):
    for p in (4, 1, 2, 3):
        write(tmp_path, f"p{p}.json", document(p, nodes=2 if p == 4 else 1))
    return tmp_path


def test_load_sorts_by_rank_count_and_skips_other_json(study):
    write(study, "trace.json", {"traceEvents": []})
    runs = collect.load([str(study)])
    assert [r.p for r in runs] == [1, 2, 3, 4]
    assert runs[3].nodes == 2 and runs[0].rows[1024]["ring"]["avg_us"] == latency(1, 1024, "ring")


@pytest.mark.parametrize("kind, expected", [
    ("native", (latency(3, 1024, "native"), "")),
    ("ring", (latency(3, 1024, "ring"), "")),
    ("auto", (latency(3, 1024, "ring") + 0.5, "ring")),
    ("best", (latency(3, 1024, "ring"), "ring")),
    ("missing", None),
])
def test_cell(study, kind, expected):
    runs = collect.load([str(study)])
    assert collect.cell(runs[2].rows[1024], kind) == expected


def test_best_is_the_fastest_algorithm_not_native_nor_auto(study):
    runs = collect.load([str(study)])
    assert collect.cell(runs[0].rows[8], "best") == (latency(1, 8, "recursive_doubling"), "recursive_doubling")
    assert collect.cell(runs[3].rows[65536], "best") == (latency(4, 65536, "ring"), "ring")


def test_tables_put_sizes_down_and_rank_counts_across(study):
    text = collect.tables(collect.load([str(study)]), ["native", "auto"])
    assert "# Scaling: allreduce, 1 to 4 rank(s)" in text
    header = re.search(r"^\| Size .*$", text, re.M)[0]
    assert re.sub(r" +", " ", header) == "| Size | p=1 | p=2 | p=3 | p=4 (2 nodes) |"
    row = re.search(r"^\| 1024 .*$", text, re.M)[0]  # the first table: native
    assert [c.strip() for c in row.strip("|").split("|")] == ["1024"] + [f"{latency(p, 1024, 'native'):.2f}"
                                                                       for p in (1, 2, 3, 4)]
    assert f"{latency(2, 65536, 'ring') + 0.5:.2f} (ring)" in text


def test_main_writes_the_table_and_the_plot(study, capsys):
    assert collect.main([str(study)]) == 0
    table = (study / "scaling.md").read_text()
    assert table.count("\n## ") == 3  # native, auto, best
    assert capsys.readouterr().out.strip() == table.strip()
    if importlib.util.find_spec("matplotlib") is not None:
        assert (study / "scaling.png").stat().st_size > 0 and "![latency against ranks](scaling.png)" in table


def test_an_existing_report_is_kept_unless_append_or_force(study, capsys):
    """collect.py's report follows every command's --out rule: scaling.md (the default) is never replaced silently."""
    (study / "scaling.md").write_text("# kept\n")
    with pytest.raises(SystemExit) as exc:
        collect.main([str(study), "--no-plot"])
    assert exc.value.code == 2
    assert f"python jobs/collect.py: error: --out {study / 'scaling.md'} exists; add --append" in capsys.readouterr().err
    assert (study / "scaling.md").read_text() == "# kept\n"
    assert collect.main([str(study), "--no-plot", "--append"]) == 0
    text = (study / "scaling.md").read_text()
    assert text.startswith("# kept\n\n# Scaling: allreduce") and text.count("\n## ") == 3
    assert collect.main([str(study), "--no-plot", "--force", "--rows", "native"]) == 0
    assert (study / "scaling.md").read_text().startswith("# Scaling: allreduce")
    assert (study / "scaling.md").read_text().count("\n## ") == 1


def test_main_with_rows_and_no_plot(study, tmp_path):
    out = tmp_path / "elsewhere.md"
    assert collect.main([str(study), "--rows", "recursive_doubling", "--out", str(out), "--no-plot"]) == 0
    text = out.read_text()
    assert text.count("\n## ") == 1 and "mpicomm recursive_doubling" in text
    assert not (study / "scaling.png").exists()


@pytest.mark.parametrize("setup, message", [
    (lambda d: None, "no benchmark results"),
    (lambda d: (write(d, "a.json", document(2)), write(d, "b.json", document(2))), r"two results for 2 rank\(s\)"),
    (lambda d: (write(d, "a.json", document(1)), write(d, "b.json", document(2, "bcast"))), "different benchmarks"),
])
def test_load_refuses_what_cannot_make_one_table(tmp_path, setup, message):
    setup(tmp_path)
    with pytest.raises(ValueError, match=message):
        collect.load([str(tmp_path)])


def test_main_reports_errors_and_exits_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        collect.main([str(tmp_path / "absent")])
    assert exc.value.code == 2
    assert "python jobs/collect.py: error: " in capsys.readouterr().err
    write(tmp_path, "p1.json", document(1))
    with pytest.raises(SystemExit) as exc:
        collect.main([str(tmp_path), "--rows", "tree"])
    assert exc.value.code == 2
    assert "tree not in these results" in capsys.readouterr().err
