"""``python -m mpicomm``: the version, the algorithm table with every registered algorithm, ``--explain``,
``--schedule`` (text, JSON, plot, usage errors), user algorithms (``--module``, ``MPICOMM_ALGORITHM_MODULES``), and
the ``--json`` documents of info, algorithms and --explain. ``verify``: tests/test_verify.py."""

from __future__ import annotations

import json
import os
import re
import sys

import pytest

import mpicomm
from mpicomm import __main__ as cli
from mpicomm import doctor, registry, selection
from mpicomm.cli import US
from tests import mpirun


@pytest.mark.serial  # under mpiexec only the lowest rank prints a usage error: one process checks it
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


@pytest.mark.serial  # under mpiexec only the lowest rank prints a usage error: one process checks it
def test_markdown_table_is_the_rows_the_documentation_shows(capsys):
    """``--markdown`` prints the table the documentation builds from :func:`algorithm_rows` (the registry's rows);
    the README no longer holds a copy, so there is no ``--readme`` updater."""
    assert cli.main(["algorithms", "--markdown"]) == 0
    out = capsys.readouterr().out
    rows = cli.algorithm_rows()
    assert out.startswith(cli.algorithm_markdown() + "\n")
    assert [line.split(" | ")[:2] for line in out.splitlines()[2 : 2 + len(rows)]] == [
        [f"| {c}", n] for c, n, _, _ in rows]
    assert ("allreduce", "shm") in {(c, n) for c, n, _, _ in rows}
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["algorithms", "--readme", "README.md"])
    assert exit_info.value.code == 2 and "--readme" in capsys.readouterr().err


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
    assert doc["selection"] == {c: selection.SELECTION.get(c, []) for c in doc["selection"]}
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
    assert call["rules"] is None and call["model"] == "nominal" and call["default_rules"].endswith("default_rules.json")
    assert doc["choice"]["rule"].startswith("rule ") and "of the default rules" in doc["choice"]["rule"]


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
@pytest.mark.parametrize("size,message", [("1.5", "must be a whole number"), ("0", "must be >= 1"),
                                          ("64Q", "SIZE must be a whole number with an optional unit"), ("8,16", "one size")])
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
    # the doctor's part: every optional package with its version or None, the settings, the stale segments
    assert list(installation["optional"]) == [package.name for package in doctor.OPTIONAL]
    for name, version in installation["optional"].items():
        assert re.search(rf"^  {re.escape(name)} +{re.escape(version or '-')} ", result.stdout, re.M), name
    assert all(name.startswith("MPICOMM_") and f"{name}={value}" in result.stdout
               for name, value in installation["settings"].items())
    assert installation["stale_segments"] is None or installation["stale_segments"]["count"] >= 0
    assert re.search(r"^MPI standard .*, thread level \w+$", result.stdout, re.M) and "CUDA-aware " in result.stdout
    assert re.search(r"^shared memory  ", result.stdout, re.M) and re.search(r"^settings  ", result.stdout, re.M)
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


# ---------------------------------------------------------------- algorithms --schedule (mpicomm.plan.preview)


@pytest.mark.serial
def test_schedule_prints_every_rank_and_the_pair_check(capsys):
    assert cli.main(["algorithms", "--schedule", "allreduce", "ring", "-p", "4", "--count", "8"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "allreduce (ring): p = 4 on 1 node(s), count 8 x float64"
    for rank in range(4):
        assert f"rank {rank} of 4: allreduce (ring), send 8, recv 8 x float64; scratch t0: 2 x float64, " \
               f"t1: 2 x float64" in lines
    # rank 0 as tests/test_schedule.py's literal tables describe it: blocks of 2, the left neighbour is rank 3
    at = lines.index("rank 0 of 4: allreduce (ring), send 8, recv 8 x float64; scratch t0: 2 x float64, "
                     "t1: 2 x float64")
    assert lines[at + 1 : at + 6] == ["    0  local", "         then copy send[0:8] -> recv[0:8]",
                                      "    1  recv t0[0:2] <- 3; send recv[6:8] -> 1",
                                      "         then recv[4:6] = t0[0:2] (+) recv[4:6]",
                                      "    2  recv t1[0:2] <- 3; send recv[4:6] -> 1"]
    assert sum(1 for line in lines if re.match(r"\s+\d+  recv .* <- \d; send .* -> \d$", line)) == 4 * 6
    assert lines[-1] == ("pair check: ok - each of the 24 message(s) meets a receive of the same size on its peer, "
                         "in order")


@pytest.mark.serial
def test_schedule_of_one_rank_and_its_json(tmp_path, capsys):
    path = tmp_path / "schedule.json"
    argv = ["algorithms", "--schedule", "gatherv", "linear", "-p", "3", "--counts", "2,0,3", "--root", "1",
            "--rank", "1", "--json", str(path)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "rank 1 of 3: gatherv (linear)" in out and "rank 0 of 3" not in out and "rank 2 of 3" not in out
    assert out.splitlines()[0] == "gatherv (linear): p = 3 on 1 node(s), counts 2,0,3 x float64, root 1"
    doc = read(path)
    assert doc["command"] == "python -m mpicomm " + " ".join(argv)
    assert [row["rank"] for row in doc["results"]] == [1]
    row = doc["results"][0]
    assert row["lines"] == [line for line in out.splitlines() if line][1:-1]
    received = [m for r in row["rounds"] for m in r["recvs"]]
    assert sorted((m["peer"], m["bytes"]) for m in received) == [(0, 16), (2, 24)]  # the root gathers 2 and 3
    assert doc["call"]["counts"] == [2, 0, 3] and doc["call"]["root"] == 1
    assert doc["pairs"] == {"ok": True, "problems": [], "messages": 2}


@pytest.mark.serial
def test_schedule_pair_problems_exit_1(capsys, monkeypatch):
    """A schedule whose messages do not meet: the pair check names them and the command fails."""
    from mpicomm.registry import Algorithm

    def lopsided(s, send, recv):
        """Demo: rank 0 sends the whole vector, rank 1 receives half of it.
        Cost: α"""
        if s.rank == 0:
            s.send(1, send)
        elif s.rank == 1:
            s.recv(0, recv[: recv.size // 2])

    monkeypatch.setitem(registry._TABLE["allreduce"], "lopsided", Algorithm("allreduce", "lopsided", lopsided))
    assert cli.main(["algorithms", "--schedule", "allreduce", "lopsided", "-p", "2", "--count", "8"]) == 1
    out = capsys.readouterr().out
    assert "pair check: FAILED - 1 problem(s):\n  rank 0 sends messages of [64] bytes to rank 1, which receives " \
           "[32]" in out


@pytest.mark.serial
@pytest.mark.parametrize("p, count", [(2, 2), (3, 6), (7, 100)])
def test_schedule_plot_cuts_no_text(p, count):
    """Every label, the x-axis's included, lies inside the figure (a 2-rank plot cut its x label at both ends)."""
    pytest.importorskip("matplotlib")
    from mpicomm.plan.preview import schedules_for
    from mpicomm.schedule import check_pairs

    scheds = schedules_for("allreduce", "ring", p, count)
    fig = cli.schedule_figure(scheds, f"allreduce ring p={p}", check_pairs(scheds))
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        width, height = fig.bbox.width, fig.bbox.height
        texts = [fig.axes[0].xaxis.label, fig.axes[0].title, *fig.axes[0].get_yticklabels()]
        for text in texts:
            box = text.get_window_extent(renderer)
            assert box.x0 >= 0 and box.x1 <= width and box.y0 >= 0 and box.y1 <= height, (text.get_text(), box)
    finally:
        cli.cli.pyplot().close(fig)


@pytest.mark.serial
def test_schedule_plot_writes_a_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "ring.png"
    assert cli.main(["algorithms", "--schedule", "allreduce", "ring", "-p", "3", "--count", "6",
                     "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    for collective, algorithm in (("allreduce", "shm"), ("bcast", "hierarchical")):  # counter waits, nested calls
        other = tmp_path / f"{algorithm}.png"
        assert cli.main(["algorithms", "--schedule", collective, algorithm, "-p", "4", "--nodes", "2"
                         if algorithm == "hierarchical" else "1", "--plot", str(other)]) == 0
        assert other.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.serial
def test_schedule_out_follows_the_out_rule(tmp_path, capsys):
    report = tmp_path / "schedule.md"
    argv = ["algorithms", "--schedule", "bcast", "binomial", "-p", "3", "--out", str(report)]
    assert cli.main(argv) == 0
    text = report.read_text()
    assert text.startswith("## schedule of bcast/binomial, p = 3") and "rank 2 of 3: bcast (binomial)" in text
    with pytest.raises(SystemExit):
        cli.main(argv)  # exists: kept
    assert "add --append" in capsys.readouterr().err
    assert cli.main(argv + ["--append"]) == 0
    assert report.read_text().count("## schedule of bcast/binomial") == 2


@pytest.mark.serial
@pytest.mark.parametrize("argv, message", [
    (["--schedule", "allreduse", "ring", "-p", "4"], "unknown collective 'allreduse'; known: "),
    (["--schedule", "allreduce", "rong", "-p", "4"],
     "unknown allreduce algorithm 'rong' (did you mean 'ring'?); registered: hierarchical, naive, rabenseifner, recursive_doubling, ring"),
    (["--schedule", "allreduce", "ring"], "--schedule needs -p P"),
    (["--schedule", "allreduce", "ring", "-p", "0"], "-p 0: must be >= 1"),
    (["--schedule", "allreduce", "ring", "-p", "2..4"], "takes one number of ranks"),
    (["--schedule", "allreduce", "ring", "-p", "4", "--count", "-3"], "--count must be"),
    (["--schedule", "allreduce", "ring", "-p", "4", "--count", "2.5"], "must be a whole number"),
    (["--schedule", "allreduce", "ring", "-p", "4", "--counts", "1,2,3,4"], "only the v-forms take"),
    (["--schedule", "allgatherv", "ring", "-p", "4", "--counts", "1,2"], "2 count(s) for p = 4 ranks"),
    (["--schedule", "allgatherv", "ring", "-p", "2", "--counts", "1,x"], "not a list of element counts"),
    (["--schedule", "allgatherv", "ring", "-p", "2", "--counts", "1,-1"], "counts must be >= 0"),
    (["--schedule", "allreduce", "ring", "-p", "4", "--rank", "4"], "--rank 4: must be a rank 0..3"),
    (["--schedule", "bcast", "binomial", "-p", "4", "--root", "-1"], "--root -1: must be a rank 0..3"),
    (["--schedule", "allreduce", "ring", "-p", "4", "--root", "1"], "allreduce has no root"),
    (["--schedule", "allreduce", "ring", "-p", "4", "--nodes", "5"], "--nodes 5: must be 1..p"),
    (["--schedule", "allreduce", "ring", "-p", "4", "--dtype", "float65"], "not a NumPy element type"),
    (["--count", "8"], "--count goes with algorithms --schedule"),
    (["--schedule", "allreduce", "ring", "-p", "4", "--explain", "allreduce", "1M"], "does not go with --explain"),
])
def test_schedule_usage_errors(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["algorithms", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


# ---------------------------------------------------------------- user algorithms (MPICOMM_ALGORITHM_MODULES, --module)


@pytest.mark.serial
def test_register_algorithm_and_cost_are_the_registrys():
    assert mpicomm.register_algorithm is registry.register and mpicomm.register_cost is registry.cost
    assert {"register_algorithm", "register_cost"} <= set(mpicomm.__all__)


@pytest.mark.serial
def test_a_bad_module_name_is_a_clear_error(capsys, monkeypatch):
    monkeypatch.delenv(registry.MODULES_VARIABLE, raising=False)
    with pytest.raises(ImportError, match=r"MPICOMM_ALGORITHM_MODULES: cannot import algorithm module "
                                          r"'no_such_pkg\.algos': no module named 'no_such_pkg'"):
        registry.import_modules("no_such_pkg.algos")
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["algorithms", "--module", "no_such_pkg.algos"])
    assert exit_info.value.code == 2
    assert "--module: cannot import algorithm module 'no_such_pkg.algos'" in capsys.readouterr().err
    assert registry.MODULES_VARIABLE not in os.environ
    with pytest.raises(SystemExit):
        cli.main(["info", "--module", "x"])
    assert "--module goes with the algorithms and verify commands" in capsys.readouterr().err


@pytest.mark.serial
def test_the_variable_loads_user_algorithms_in_every_process(tmp_path):
    """A fresh process (as every rank of a job is): the variable's modules register with mpicomm's own table;
    a name that cannot be imported stops the first use of the table with the variable and the module named."""
    import subprocess

    code = ("import mpicomm; from mpicomm import registry; print(mpicomm.algorithms('allreduce')); "
            "print(registry.lookup('allreduce', 'torus2d').cost)")
    env = mpirun.clean_env({registry.MODULES_VARIABLE: "docs.examples.torus_allreduce"})
    done = subprocess.run([sys.executable, "-c", code], cwd=mpirun.REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "'torus2d'" in done.stdout and "2(R+C−2)·α" in done.stdout
    env[registry.MODULES_VARIABLE] = "docs.examples.torus_allreduce, docs.examples.no_such_example"
    done = subprocess.run([sys.executable, "-c", code], cwd=mpirun.REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0
    assert ("ImportError: MPICOMM_ALGORITHM_MODULES: cannot import algorithm module "
            "'docs.examples.no_such_example'") in done.stderr


@pytest.mark.serial
def test_module_option_shows_a_user_algorithms_schedule():
    import subprocess

    done = subprocess.run([sys.executable, "-m", "mpicomm", "algorithms", "--schedule", "allreduce", "torus2d", "-p",
                           "4", "--count", "8", "--module", "docs.examples.torus_allreduce"], cwd=mpirun.REPO,
                          env=mpirun.clean_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "allreduce (torus2d): p = 4 on 1 node(s), count 8 x float64"
    # 2 × 2: rank 0 swaps halves with rank 1 (its row), then quarters with rank 2 (its column), then back
    at = lines.index("rank 0 of 4: allreduce (torus2d), send 8, recv 8 x float64; scratch t0: 4 x float64, "
                     "t1: 4 x float64")
    assert lines[at + 3 : at + 9] == ["    1  recv t1[0:4] <- 1; send recv[4:8] -> 1",
                                      "         then recv[0:4] = t1[0:4] (+) recv[0:4]",
                                      "    2  recv t0[0:2] <- 2; send recv[2:4] -> 2",
                                      "         then recv[0:2] = t0[0:2] (+) recv[0:2]",
                                      "    3  recv recv[2:4] <- 2; send recv[0:2] -> 2",
                                      "    4  recv recv[4:8] <- 1; send recv[0:4] -> 1"]
    assert lines[-1].startswith("pair check: ok - each of the 16 message(s)")


@pytest.mark.serial
def test_a_call_the_algorithm_refuses_is_named():
    """torus2d refuses a prime p > 3 (its schedule function raises): --schedule says so and exits 2."""
    import subprocess

    done = subprocess.run([sys.executable, "-m", "mpicomm", "algorithms", "--schedule", "allreduce", "torus2d", "-p",
                           "5", "--module", "docs.examples.torus_allreduce"], cwd=mpirun.REPO,
                          env=mpirun.clean_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert ("python -m mpicomm algorithms --schedule: allreduce/torus2d cannot describe this call: torus2d needs "
            "p = rows x cols with rows >= 2, but p = 5 is prime") in done.stderr
