"""``python -m mpicomm``: the version, the algorithm table with every registered algorithm, ``--explain``, and
the ``--json`` documents of info, algorithms and --explain."""

from __future__ import annotations

import json
import re
import sys

import pytest

import mpicomm
from mpicomm import __main__ as cli
from mpicomm import registry
from mpicomm.cli import US
from tests import mpirun


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"mpicomm {mpicomm.__version__}"


def test_algorithms_lists_every_registered_algorithm_with_its_cost(capsys):
    assert cli.main(["algorithms"]) == 0
    out = capsys.readouterr().out
    for collective, algorithms in registry.table().items():
        for name, algorithm in algorithms.items():
            assert any(line.split()[:2] == [collective, name] and algorithm.cost in line for line in out.splitlines()), (
                f"{collective}/{name} is missing from python -m mpicomm algorithms")


# ---------------------------------------------------------------- --json documents (mpicomm.cli.document)


def read(path) -> dict:
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    assert doc["schema"] == "mpicomm-results" and doc["schema_version"] == 1
    assert {"command", "machine", "host", "versions", "date", "results"} <= set(doc)
    assert {"python", "numpy", "mpi4py", "mpicomm"} <= set(doc["versions"])
    return doc


@pytest.mark.serial
def test_algorithms_json_holds_the_rows_printed(tmp_path, capsys):
    path = tmp_path / "algorithms.json"
    assert cli.main(["algorithms", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    doc = read(path)
    assert doc["command"] == f"python -m mpicomm algorithms --json {path}"
    rows = doc["results"]
    printed = [line for line in out.splitlines() if line and not line.startswith(" ") and "→" not in line
               and not line.startswith("auto selection")]
    assert len(rows) == len(printed) == sum(len(a) for a in registry.table().values())
    for row, line in zip(rows, printed):
        assert line.split()[:2] == [row["collective"], row["algorithm"]] and line.endswith(row["cost"])
        restrictions = ", ".join(row["restrictions"]) or "-"
        assert f"  {restrictions}  " in line
    assert doc["selection"] == {c: registry.SELECTION.get(c, []) for c in doc["selection"]}
    assert "allreduce" in doc["selection"]


@pytest.mark.serial
def test_explain_json_holds_one_row_per_algorithm_and_the_choice(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MPICOMM_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("MPICOMM_ALLREDUCE_ALGORITHM", raising=False)
    path = tmp_path / "explain.json"
    assert cli.main(["algorithms", "--explain", "allreduce", "64KiB", "--ranks", "2", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"model ({US})" in out and f"measured ({US})" in out  # µs as mpicomm.cli writes it
    doc = read(path)
    rows = doc["results"]
    assert [r["algorithm"] for r in rows] == sorted(registry.algorithms("allreduce"))
    assert sum(r["chosen"] for r in rows) == 1
    chosen = next(r for r in rows if r["chosen"])
    assert doc["choice"]["algorithm"] == chosen["algorithm"] and doc["choice"]["source"] == "table"
    assert re.search(rf"^\* {chosen['algorithm']}\s", out, re.M)
    for r in rows:
        assert r["allowed"] == (r["why_not"] is None)
        assert r["measured_us"] is None and (r["model_us"] is None or r["model_us"] > 0)
    call = doc["call"]
    assert (call["collective"], call["size"], call["p"], call["layout"]) == ("allreduce", 65536, 2, "p2-1x2")
    assert call["decisions"] is None and call["model"] == "nominal"


@pytest.mark.serial
def test_explain_advice_never_asks_for_one_rank(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MPICOMM_CACHE_DIR", str(tmp_path))
    assert cli.main(["algorithms", "--explain", "bcast", "8", "--ranks", "1"]) == 0
    out = capsys.readouterr().out
    assert "mpiexec -n 1" not in out and "at least 2 ranks" in out
    assert cli.main(["algorithms", "--explain", "bcast", "1e3", "--ranks", "3"]) == 0
    out = capsys.readouterr().out
    assert "size 1000 B" in out and "mpiexec -n 3 python -m mpicomm.tune --collectives" in out


@pytest.mark.serial
@pytest.mark.parametrize("size,message", [("1.5", "not a whole number"), ("0", "must be >= 1"),
                                          ("64Q", "'64Q' is not a size"), ("8,16", "one size")])
def test_explain_size_uses_the_shared_size_parser(capsys, size, message):
    with pytest.raises(SystemExit):
        cli.main(["algorithms", "--explain", "allreduce", size])
    assert message in capsys.readouterr().err


@pytest.mark.launches
def test_info_json_holds_a_row_per_rank(tmp_path):
    path = tmp_path / "info.json"
    result = mpirun.run(2, [sys.executable, "-m", "mpicomm", "info", "--json", str(path)], timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    doc = read(path)
    assert doc["command"] == f"mpiexec -n 2 python -m mpicomm info --json {path}"
    assert [row["rank"] for row in doc["results"]] == [0, 1]
    assert all(set(row) == {"rank", "local_rank", "local_size", "node", "host", "gpu"} for row in doc["results"])
    installation = doc["installation"]
    assert installation["ranks"] == 2 and installation["mpicomm"] == mpicomm.__version__
    assert installation["mpi_library"] and installation["mpi_library"] in result.stdout
    for row in doc["results"]:  # the same rows as printed
        assert re.search(rf"^\s+{row['rank']}\s+{row['local_rank']}/{row['local_size']}\s+{row['node']}\s+"
                         rf"{re.escape(row['host'])}\s", result.stdout, re.M), result.stdout


# ---------------------------------------------------------------- cleanup (mpicomm.cleanup; more in tests/test_cleanup.py)


@pytest.mark.serial
def test_cleanup_removes_stale_segments_and_keeps_other_files(tmp_path, capsys):
    stale = tmp_path / "mpich_shm_deadbeef_0"
    stale.write_bytes(b"\0" * (3 << 20))
    (tmp_path / "not_mpich").write_bytes(b"x")
    assert cli.main(["cleanup", "--dir", str(tmp_path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"^would remove\s+{re.escape(str(stale))}\s+3\.0 MiB\s+\d+ s old$", out, re.M), out
    assert out.splitlines()[-1] == f"would remove 1 stale MPICH segment(s), 3.0 MiB, in {tmp_path}; kept 0 in use " \
                                   f"by live processes"
    assert stale.exists()
    path = tmp_path / "cleanup.json"
    assert cli.main(["cleanup", "--dir", str(tmp_path), "--json", str(path)]) == 0
    assert not stale.exists() and (tmp_path / "not_mpich").exists()
    doc = read(path)
    assert doc["command"] == f"python -m mpicomm cleanup --dir {tmp_path} --json {path}"
    assert [(r["path"], r["bytes"], r["removed"]) for r in doc["results"]] == [(str(stale), 3 << 20, True)]
    assert doc["summary"]["removed"] == 1 and doc["summary"]["dry_run"] is False


@pytest.mark.serial
@pytest.mark.parametrize("argv, message", [(["info", "--dry-run"], "go with the cleanup command"),
                                           (["algorithms", "--dir", "x"], "go with the cleanup command"),
                                           (["cleanup", "--markdown"], "cleanup takes --dry-run, --dir and --json")])
def test_cleanup_options_go_with_cleanup_only(capsys, argv, message):
    with pytest.raises(SystemExit):
        cli.main(argv)
    assert message in capsys.readouterr().err
