"""mpicomm.tune.command: ``python -m mpicomm.tune`` - options, advice that always runs, and the fit end to end at small
sizes."""

from __future__ import annotations

import json
import os
import re
import shlex
import sys

import pytest

from mpicomm import model
from mpicomm.tune import command
from tests import mpirun
from tests.tune.test_reports import marks


@pytest.mark.serial  # under mpiexec only the lowest rank prints a usage error: one process checks it
@pytest.mark.parametrize("argv,message", [
    (["--sizes", "8"], "--sizes must hold at least two sizes"),
    (["--iters", "0"], "--iters must be >= 1, got 0"),
    (["--sizes", "8:4"], "must go from the smaller size to the larger (LOW:HIGH), got '8:4'"),
    (["--sizes", "8,1.5"], "must be a whole number, got '1.5'"),  # mpicomm.cli's size parser
    (["--sizes", "8,64Q"], "must be a whole number with an optional unit"),
])
def test_bad_options_are_named(capsys, argv, message):
    with pytest.raises(SystemExit) as info:
        command.main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and message in err and "python -m mpicomm.tune: error: " in err


@pytest.mark.serial  # under mpiexec only the lowest rank prints a usage error: one process checks it
def test_help_explains_the_command(capsys):
    with pytest.raises(SystemExit):
        command.main(["--help"])
    out = capsys.readouterr().out
    assert "mpiexec" in out and "--sizes" in out and "--show" in out and "MPICOMM_CACHE_DIR" in out


@pytest.mark.launches
def test_tune_writes_a_loadable_fit(tmp_path, monkeypatch):
    env = {"MPICOMM_CACHE_DIR": str(tmp_path)}
    document = tmp_path / "fit.json"
    result = mpirun.run(2, [sys.executable, "-m", "mpi4py", "-m", "mpicomm.tune", "--sizes", "8:64K", "--iters", "20",
                            "--json", str(document)], timeout=180, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "fit:" in out and re.search(r"intra-node\s+alpha\s+\d+\.\d+ µs", out)
    assert "65536" in out and "local work" in out
    # progress: mpicomm.cli.Progress lines, one per size, on stderr
    ping = r"^mpicomm\.tune intra-node ping-pong "
    assert re.search(ping + r"\[1/14\] 8 B: \S+ \S+ one way  elapsed \d+:\d\d  ETA \d+:\d\d$", result.stderr,
                     re.M), result.stderr
    assert re.search(ping + r"\[14/14\] 65536 B: .* elapsed \d+:\d\d$", result.stderr, re.M)
    assert "mpicomm.tune: local reduction and copy" in result.stderr
    # on one node the inter-node link was not measured, and the printed fit says so
    inter = [line for line in out.splitlines() if line.strip().startswith("inter-node")]
    assert inter and all("[not measured: one node" in line for line in inter), out
    saved = re.search(r"^saved: (.+)$", out, re.M)
    assert saved, out
    path = saved.group(1).strip()
    assert os.path.dirname(path) == str(tmp_path) and path.endswith("-p2-1x2.json")
    with open(path) as f:
        machine = model.Machine.from_json(f.read())
    assert machine.intra.alpha > 0 and machine.nodes == 1 and machine.ppn == 2
    assert machine.inter == machine.intra  # one node
    monkeypatch.setenv("MPICOMM_CACHE_DIR", str(tmp_path))
    assert model.load(machine.host, "p2-1x2") == machine

    with open(document, encoding="utf-8") as f:
        doc = json.load(f)
    assert doc["schema"] == "mpicomm-results" and doc["schema_version"] == 1 and doc["saved"] == path
    assert doc["command"].startswith("mpiexec -n 2 python -m mpicomm.tune --sizes 8:64K")
    assert {"python", "numpy", "mpi4py", "mpicomm"} <= set(doc["versions"])
    results = doc["results"]
    assert results["layout"] == "p2-1x2" and results["p"] == 2
    assert model.Machine.from_json(json.dumps(results["machine"])) == machine
    assert set(results["not_measured"]) >= {"inter-node", "inter mem"}
    assert results["pingpong"]["bytes"] == [8 << i for i in range(14)] and results["pingpong"]["inter_s"] is None
    assert len(results["pingpong"]["intra_s"]) == 14 and all(t > 0 for t in results["pingpong"]["intra_s"])
    assert results["lines"]["intra"]["alpha_s"] == pytest.approx(machine.intra.alpha)

    shown_doc = tmp_path / "shown.json"
    shown = mpirun.run(2, [sys.executable, "-m", "mpi4py", "-m", "mpicomm.tune", "--show", "--json", str(shown_doc)],
                       timeout=120, env=env)
    assert shown.returncode == 0, shown.stderr
    assert path in shown.stdout and re.search(r"intra-node\s+alpha", shown.stdout)
    # the saved file does not say what was measured; --show reads it from the layout: one node
    shown_marks = marks(shown.stdout.splitlines())
    assert {"inter-node", "inter mem"} <= set(shown_marks) and "intra-node" not in shown_marks, shown.stdout
    with open(shown_doc, encoding="utf-8") as f:
        shown_results = json.load(f)["results"]
    assert shown_results["machine"] == results["machine"] and shown_results["not_measured"] == results["not_measured"]


@pytest.mark.launches
def test_tune_needs_two_ranks_and_show_needs_a_fit(tmp_path):
    env = {"MPICOMM_CACHE_DIR": str(tmp_path)}
    result = mpirun.run(1, [sys.executable, "-m", "mpicomm.tune", "--sizes", "8,64"], timeout=60, env=env)
    assert result.returncode == 2 and "python -m mpicomm.tune: error: needs at least 2 ranks" in result.stderr
    assert "rank 0 of 1" not in result.stderr
    assert advised(result.stderr) == [(2, ["--sizes", "8,64"])]  # the same options, on 2 ranks
    result = mpirun.run(1, [sys.executable, "-m", "mpicomm.tune", "--show"], timeout=60, env=env)
    assert result.returncode == 1 and "no fit saved" in result.stderr and "p1-1x1" in result.stderr
    assert "-n 1" not in result.stderr  # the advice it used to give: tune refuses 1 rank
    assert advised(result.stderr) == [(2, []), (2, ["--show"])]


@pytest.mark.serial  # under mpiexec only the lowest rank prints a usage error: one process checks it
@pytest.mark.parametrize("argv,message", [
    (["--collectives", "--collective", "allreduce,spiral"], "unknown collective(s) 'spiral'"),
    (["--collective", "allreduce"], "--collective needs --collectives"),
    (["--repeat", "3"], "--repeat needs --collectives (the fit does not use it)"),
    (["--out", "d.json"], "--out: renamed --output (the rules file; --out is for Markdown reports)"),
    (["--collectives", "--rounds", "3"], "--rounds: renamed --repeat"),
    (["--collectives", "--repeat", "0"], "--repeat must be >= 1, got 0"),
    (["--show", "--output", "fit.json"], "--output does not apply to --show, which measures nothing"),
    (["--collectives", "--show", "--sizes", "8"], "--sizes does not apply to --show"),
    (["--show", "--force"], "--force does not apply to --show"),
    (["--force"], "--force needs --output FILE (the file to replace)"),
])
def test_bad_collectives_options_are_named(capsys, argv, message):
    with pytest.raises(SystemExit) as info:
        command.main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and "python -m mpicomm.tune: error: " in err and message in err


@pytest.mark.serial  # under mpiexec only the lowest rank prints a usage error: one process checks it
@pytest.mark.parametrize("mode", [[], ["--collectives"]])
def test_output_is_used_in_both_modes_and_never_replaced_without_force(tmp_path, capsys, mode):
    """``--output`` names the fit's file and, with --collectives, the rules' (it was silently ignored there)."""
    path = tmp_path / "saved.json"
    assert command._parse([*mode, "--output", str(path)]).output == str(path)
    path.write_text("{}")
    with pytest.raises(SystemExit):
        command._parse([*mode, "--output", str(path)])
    assert f"--output {path} exists; add --force to replace it" in capsys.readouterr().err
    assert command._parse([*mode, "--output", str(path), "--force"]).force
    assert path.read_text() == "{}"


@pytest.mark.serial  # under mpiexec only the lowest rank prints a usage error: one process checks it
def test_help_names_repeat_with_its_median_and_no_rounds(capsys):
    with pytest.raises(SystemExit):
        command.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--repeat N with --collectives: run each size's measurement" in out and "report the median" in out
    assert "--rounds" not in out and "--out " not in out and "--output PATH" in out


def test_collective_names_accept_benchmark_and_registry_names():
    assert command._collective_names("allreduce,reduce_scatter_block,allreduce") == ["allreduce", "reduce_scatter"]
    assert "barrier" in command._collective_names("all")


@pytest.mark.launches
def test_tune_collectives_needs_two_ranks(tmp_path):
    env = {"MPICOMM_CACHE_DIR": str(tmp_path)}
    result = mpirun.run(1, [sys.executable, "-m", "mpicomm.tune", "--collectives", "--sizes", "8"], timeout=60, env=env)
    assert result.returncode == 2 and "python -m mpicomm.tune: error: needs at least 2 ranks" in result.stderr
    assert advised(result.stderr) == [(2, ["--collectives", "--sizes", "8"])]
    result = mpirun.run(1, [sys.executable, "-m", "mpicomm.tune", "--collectives", "--show"], timeout=60, env=env)
    assert result.returncode == 1 and "python -m mpicomm.tune: error: no rules saved" in result.stderr
    assert "p1-1x1" in result.stderr
    assert advised(result.stderr) == [(2, ["--collectives"]), (2, ["--collectives", "--show"])]


#: A command tune advises, up to the punctuation its messages put after one.
_ADVICE = re.compile(r"mpiexec -n (\d+) python -m mpicomm\.tune(.*?)(?=$|; |\)| \(|, then )", re.M)


def advised(text: str) -> list[tuple[int, list[str]]]:
    """Every ``mpiexec -n N python -m mpicomm.tune ...`` in *text*: (N, its options), each checked to be a command
    tune runs: N >= 2 and tune's own parser accepts the options."""
    found = []
    for ranks, rest in _ADVICE.findall(text):
        options = shlex.split(rest)
        assert int(ranks) >= command.MIN_RANKS, f"advice on {ranks} rank(s), which tune refuses: {text}"
        command._parse(options)  # SystemExit (a usage error) fails the test
        found.append((int(ranks), options))
    return found


def test_tune_command_never_asks_for_fewer_than_two_ranks():
    assert command.tune_command(1) == "mpiexec -n 2 python -m mpicomm.tune"
    assert command.tune_command(4, "--collectives", "--output", "my file.json") == (
        "mpiexec -n 4 python -m mpicomm.tune --collectives --output 'my file.json'")
    assert advised(command.tune_command(0, "--show")) == [(2, ["--show"])]


@pytest.mark.parametrize("p,nodes", [(1, 1), (2, 1), (4, 2)])
@pytest.mark.parametrize("options", [(), ("--collectives",)])
def test_show_without_a_saved_file_advises_commands_that_run(p, nodes, options):
    text = command._no_saved("fit", "h1", f"p{p}-{nodes}x{p // nodes}", "/cache/x.json", p, nodes, *options)
    commands = advised(text)
    assert commands and all(opts[: len(options)] == list(options) for _, opts in commands), text
    if p >= 2:
        assert commands == [(p, list(options))]  # the layout that was asked about
    else:
        assert "at least 2 ranks" in text and commands[-1] == (2, [*options, "--show"])


@pytest.mark.serial  # under mpiexec only the lowest rank prints a usage error: one process checks it
@pytest.mark.parametrize("argv", [["--collective", "allreduce"], ["--repeat", "2", "--sizes", "8,64"]])
def test_option_errors_advise_commands_that_run(capsys, argv):
    with pytest.raises(SystemExit):
        command.main(argv)
    err = capsys.readouterr().err
    assert advised(err) == [(2, ["--collectives", *argv])], err


def test_json_option_is_parsed():
    assert command._parse(["--json", "fit.json"]).json == "fit.json"
    assert command._parse(["--collectives", "--json", "d.json"]).json == "d.json"
    assert command._parse(["--sizes", "1K:4KiB"]).sizes == [1024, 2048, 4096]
