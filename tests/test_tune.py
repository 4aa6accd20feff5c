"""mpicomm.tune: the report of a fit (deterministic), options, and the command end to end at small sizes."""

from __future__ import annotations

import json
import os
import re
import shlex
import sys

import pytest

from mpicomm import model, tune
from tests import mpirun


def synthetic_fit() -> tune.Fit:
    """A Fit whose measurements lie exactly on known lines, but for the 8-byte intra-node sample (+10 %)."""
    fit = tune.Fit()
    fit.p, fit.layout = 4, "p4-2x2"
    fit.sizes = [8, 1024, 65536]
    fit.intra = [5e-6 + 1e-10 * n for n in fit.sizes]
    fit.intra[0] *= 1.1
    fit.inter = [20e-6 + 1e-9 * n for n in fit.sizes]
    fit.add_bytes = [8, 1024, 65536]
    fit.add = [1e-6 + 0.5e-10 * n for n in fit.add_bytes]
    fit.copy = [0.5e-6 + 0.25e-10 * n for n in fit.add_bytes]
    fit.lines = {"intra": (5e-6, 1e-10), "inter": (20e-6, 1e-9), "gamma": (1e-6, 0.5e-10), "copy": (0.5e-6, 0.25e-10)}
    fit.call_seconds, fit.small_copy, fit.validated, fit.unvalidated = 31e-6, 1e-6, 80e-6, 50e-6
    fit.machine = model.Machine(intra=model.Link(5e-6, 1e-10), inter=model.Link(20e-6, 1e-9), gamma=0.5e-10,
                                copy=0.25e-10, overhead=30e-6, validation=30e-6, ppn=2, nodes=2, host="h1",
                                created="2026-01-01T00:00:00+00:00")
    return fit


def test_report_shows_the_fit_and_the_residuals():
    text = tune.report(synthetic_fit())
    assert "4 ranks on 2 node(s), up to 2 per node (layout p4-2x2), host h1" in text
    assert re.search(r"intra-node\s+alpha\s+5\.00 µs\s+beta\s+0\.1000 ns/B\s+\(\s+10\.00 GB/s\)$", text, re.M)
    assert re.search(r"inter-node\s+alpha\s+20\.00 µs\s+beta\s+1\.0000 ns/B\s+\(\s+1\.00 GB/s\)$", text, re.M)
    assert re.search(r"gamma\s+0\.0500 ns/B reduced \(20\.00 GB/s\)", text)
    assert re.search(r"overhead\s+30\.00 µs", text) and re.search(r"validation\s+30\.00 µs", text)
    assert "meas (µs)" in text and "(us)" not in text and " us " not in text
    ping, local = [line.split() for line in text.splitlines() if re.match(r"\s+8\s", line)]  # the 8-byte rows
    assert ping[1:4] == ["5.50", "5.00", "-9.1%"]  # measured 10 % above the line
    assert ping[4:7] == ["20.01", "20.01", "+0.0%"]  # 20 µs + 8 ns
    assert local[1:7] == ["1.00", "1.00", "+0.0%", "0.50", "0.50", "+0.0%"]  # add and copy on their lines
    assert "one node" not in text


def test_report_says_when_inter_is_taken_from_intra():
    fit = synthetic_fit()
    fit.inter = None
    del fit.lines["inter"]
    text = tune.report(fit)
    assert "one node: the inter-node link is taken to be the intra-node link" in text
    assert "inter meas" not in text


@pytest.mark.parametrize("argv,message", [
    (["--sizes", "8"], "fewer than two sizes"),
    (["--iters", "0"], "--iters 0: must be >= 1"),
    (["--sizes", "8:4"], "larger than the last"),
    (["--sizes", "8,1.5"], "not a whole number"),  # mpicomm.cli's size parser
    (["--sizes", "8,64Q"], "not a size"),
])
def test_bad_options_are_named(capsys, argv, message):
    with pytest.raises(SystemExit):
        tune.main(argv)
    assert message in capsys.readouterr().err


def test_help_explains_the_command(capsys):
    with pytest.raises(SystemExit):
        tune.main(["--help"])
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
    assert result.returncode == 2 and "needs at least 2 ranks" in result.stderr
    assert advised(result.stderr) == [(2, ["--sizes", "8,64"])]  # the same options, on 2 ranks
    result = mpirun.run(1, [sys.executable, "-m", "mpicomm.tune", "--show"], timeout=60, env=env)
    assert result.returncode == 1 and "no fit saved" in result.stderr and "p1-1x1" in result.stderr
    assert "-n 1" not in result.stderr  # the advice it used to give: tune refuses 1 rank
    assert advised(result.stderr) == [(2, []), (2, ["--show"])]


# ---------------------------------------------------------------- the two regimes

#: Exact two-regime samples: 5 µs + 0.1 ns/B up to 1 MiB, 5 µs + 0.4 ns/B from 2 MiB on.
TWO_SIZES = [8 << (2 * i) for i in range(9)] + [2 << 20, 8 << 20, 32 << 20]  # 8 B .. 512 KiB, then 2 .. 32 MiB
TWO_TIMES = [5e-6 + (1e-10 if n <= 1 << 20 else 4e-10) * n for n in TWO_SIZES]


def test_fit_regimes_recovers_both_slopes():
    alpha, beta, beta_mem = tune.fit_regimes(TWO_SIZES, TWO_TIMES, 1 << 20)
    assert alpha == pytest.approx(5e-6, rel=1e-9)
    assert beta == pytest.approx(1e-10, rel=1e-9) and beta_mem == pytest.approx(4e-10, rel=1e-9)
    # nothing at ≥ 2·cache_bytes: one regime
    assert tune.fit_regimes(TWO_SIZES[:9], TWO_TIMES[:9], 1 << 20)[2] == pytest.approx(1e-10, rel=1e-9)


def test_fit_knee_finds_the_switch():
    assert tune.fit_knee(TWO_SIZES, TWO_TIMES) == 512 << 10  # the largest size on the cache line
    assert tune.fit_knee([8, 16], [1e-6, 2e-6]) == 16  # too few sizes to split


def test_cache_threshold_and_last_level_cache(tmp_path):
    assert tune.cache_threshold(32 << 20, 2) == (32 << 20) // 6
    with pytest.raises(ValueError):
        tune.cache_threshold(0, 2)
    for i, size in enumerate(["32K", "1024K", "32768K"]):
        (tmp_path / f"index{i}").mkdir()
        (tmp_path / f"index{i}" / "size").write_text(size + "\n")
    assert tune.last_level_cache(str(tmp_path)) == 32 << 20
    assert tune.last_level_cache(str(tmp_path / "missing")) is None


def test_machine_from_fits_both_regimes_and_the_report_shows_them():
    fit = tune.Fit()
    fit.p, fit.layout, fit.cache_bytes, fit.cache_source = 2, "p2-1x2", 1 << 20, "test"
    fit.sizes, fit.intra = TWO_SIZES, TWO_TIMES
    fit.add_bytes, fit.add = TWO_SIZES, [2 * t for t in TWO_TIMES]
    fit.copy = TWO_TIMES
    m = tune.machine_from(fit, 2, 1, "h1")
    assert m.cache_bytes == 1 << 20 and m.inter == m.intra
    assert m.intra.beta == pytest.approx(1e-10, rel=1e-9) and m.intra_mem.beta == pytest.approx(4e-10, rel=1e-9)
    assert m.gamma == pytest.approx(2e-10, rel=1e-9) and m.gamma_mem == pytest.approx(8e-10, rel=1e-9)
    assert m.copy_mem == pytest.approx(4e-10, rel=1e-9)
    fit.machine = m
    text = tune.report(fit)
    assert re.search(r"intra mem\s+alpha\s+5\.00 µs\s+beta\s+0\.4000 ns/B", text)
    assert re.search(r"gamma mem\s+0\.8000 ns/B", text) and "cache       1048576 B" in text
    row = [line.split() for line in text.splitlines() if re.match(r"\s+33554432\s", line)][0]
    assert row[3] in ("+0.0%", "-0.0%")  # the 32 MiB sample lies on the memory line


# ---------------------------------------------------------------- measured decisions (--collectives)


@pytest.mark.parametrize("argv,message", [
    (["--collectives", "--collective", "allreduce,spiral"], "unknown collective(s) 'spiral'"),
    (["--collective", "allreduce"], "--collective needs --collectives"),
    (["--out", "d.json"], "--out needs --collectives"),
    (["--collectives", "--rounds", "0"], "--rounds 0: must be >= 1"),
])
def test_bad_collectives_options_are_named(capsys, argv, message):
    with pytest.raises(SystemExit):
        tune.main(argv)
    assert message in capsys.readouterr().err


def test_collective_names_accept_benchmark_and_registry_names():
    assert tune._collective_names("allreduce,reduce_scatter_block,allreduce") == ["allreduce", "reduce_scatter"]
    assert "barrier" in tune._collective_names("all")


def test_auto_closeness_counts_points_within_ten_percent():
    points = [{"us": {"ring": 10.0, "naive": 20.0, "auto": 10.9}},  # within 10 %
              {"us": {"ring": 10.0, "naive": 20.0, "auto": 11.5}},  # not
              {"us": {"ring": 10.0}}]  # auto not measured: not counted
    assert tune.auto_closeness(points) == (1, 2)


@pytest.mark.launches
def test_tune_collectives_writes_decisions_that_a_communicator_uses(tmp_path):
    from mpicomm import decisions, registry

    env = {"MPICOMM_CACHE_DIR": str(tmp_path)}
    document = tmp_path / "decisions-doc.json"
    result = mpirun.run(2, [sys.executable, "-m", "mpi4py", "-m", "mpicomm.tune", "--collectives", "--collective",
                            "allreduce,barrier", "--sizes", "8,4K", "--iters", "4", "--rounds", "2", "--quiet",
                            "--json", str(document)], timeout=180, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "elapsed" not in result.stderr  # --quiet: no progress lines
    saved = re.search(r"^saved: (.+)$", result.stdout, re.M)
    assert saved, result.stdout
    path = saved.group(1).strip()
    assert os.path.dirname(path) == str(tmp_path) and os.path.basename(path).startswith("decisions-")
    assert path.endswith("-p2-1x2.json") and "decided: " in result.stdout and "within 10 % of the fastest" in result.stdout
    found = decisions.load(path, registry.algorithms)
    assert (found.p, found.nodes, found.ppn) == (2, 1, 2) and set(found.collectives) == {"allreduce", "barrier"}
    assert found.collectives["allreduce"][-1].max_bytes == 4096  # up to the largest size measured
    assert found.collectives["barrier"][0].max_bytes is None
    assert [pt["bytes"] for pt in found.measurements["allreduce"]] == [8, 4096]
    small = found.algorithm_for("allreduce", 8)
    with open(document, encoding="utf-8") as f:
        doc = json.load(f)
    assert doc["schema"] == "mpicomm-results" and doc["saved"] == path and doc["layout"] == "p2-1x2"
    assert doc["command"].startswith("mpiexec -n 2 python -m mpicomm.tune --collectives")
    assert doc["results"]["decisions"]["format"] == "mpicomm-decisions"
    assert set(doc["results"]["decisions"]["collectives"]) == {"allreduce", "barrier"}
    assert [pt["bytes"] for pt in doc["results"]["decisions"]["measurements"]["allreduce"]] == [8, 4096]

    program = ("import numpy as np, mpicomm; from mpicomm.coll import dispatch; c = mpicomm.Comm(); "
               "a = dispatch.Args('allreduce', dtype=np.dtype(np.float64), count=1); "
               "b = dispatch.Args('allreduce', dtype=np.dtype(np.float64), count=1 << 20); "
               "x = np.ones(1); y = np.empty(1); c.Allreduce(x, y); assert y[0] == 2; "
               "(small, source), big = dispatch._choose(c, a, None), dispatch._choose(c, b, None)[1]; "
               "every = c.gather((c.rank, small.name, source, big), root=0); "
               "c.rank == 0 and print(*('CHOICE %d %s %s %s' % row for row in every), sep='\\n')")
    used = mpirun.run(2, [sys.executable, "-c", program], timeout=120, env=env)
    assert used.returncode == 0, used.stdout + used.stderr
    lines = sorted(line.split() for line in used.stdout.splitlines() if line.startswith("CHOICE"))
    assert lines == [["CHOICE", "0", small, "decisions", "table"], ["CHOICE", "1", small, "decisions", "table"]]

    shown = mpirun.run(2, [sys.executable, "-m", "mpicomm.tune", "--collectives", "--show"], timeout=60, env=env)
    assert shown.returncode == 0, shown.stderr
    assert path in shown.stdout and '"format": "mpicomm-decisions"' in shown.stdout

    # a second run, elsewhere: the saved decisions stay, and are judged on the new times
    other = tmp_path / "again.json"
    again = mpirun.run(2, [sys.executable, "-m", "mpi4py", "-m", "mpicomm.tune", "--collectives", "--collective",
                           "allreduce", "--sizes", "8", "--iters", "4", "--rounds", "2", "--quiet", "--out",
                           str(other)], timeout=120, env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert re.search(r"the decisions this run loaded .*: their algorithm within 10 % of this run's fastest at "
                     r"\d of 1 points", again.stdout), again.stdout
    assert f"communicators load {path}" in again.stdout and other.exists()
    assert decisions.load(path) == found  # untouched


@pytest.mark.launches
def test_tune_collectives_needs_two_ranks(tmp_path):
    env = {"MPICOMM_CACHE_DIR": str(tmp_path)}
    result = mpirun.run(1, [sys.executable, "-m", "mpicomm.tune", "--collectives", "--sizes", "8"], timeout=60, env=env)
    assert result.returncode == 2 and "needs at least 2 ranks" in result.stderr
    assert advised(result.stderr) == [(2, ["--collectives", "--sizes", "8"])]
    result = mpirun.run(1, [sys.executable, "-m", "mpicomm.tune", "--collectives", "--show"], timeout=60, env=env)
    assert result.returncode == 1 and "no decisions saved" in result.stderr and "p1-1x1" in result.stderr
    assert advised(result.stderr) == [(2, ["--collectives"]), (2, ["--collectives", "--show"])]


def test_model_corrections_are_the_median_measured_over_predicted_above_64_kib():
    from dataclasses import replace as _replace

    from mpicomm import model as _model
    from mpicomm import registry as _registry
    from mpicomm.tune import model_corrections

    machine = _replace(_model.NOMINAL, overhead=10e-6, validation=5e-6, ppn=4)
    p = 2
    points = []
    for nbytes, factor in ((8, 100.0), (65536, 2.0), (1 << 20, 3.0), (4 << 20, 50.0)):
        predicted = _registry.communication("allreduce", "ring", nbytes, p, machine)
        points.append({"bytes": nbytes, "us": {"ring": (factor * predicted + 15e-6) * 1e6}})
    factors = model_corrections({"allreduce": points}, machine, p, validation=True)
    assert factors == (("allreduce", "ring", 3.0),)  # median of 2, 3, 50 (20 at most); 8 B is left out
    assert model_corrections({"allreduce": points[:1]}, machine, p, validation=True) == ()


# ---------------------------------------------------------------- advice: every command tune suggests runs

#: A command tune advises, up to the punctuation its messages put after one.
_ADVICE = re.compile(r"mpiexec -n (\d+) python -m mpicomm\.tune(.*?)(?=$|; |\)| \(|, then )", re.M)


def advised(text: str) -> list[tuple[int, list[str]]]:
    """Every ``mpiexec -n N python -m mpicomm.tune ...`` in *text*: (N, its options), each checked to be a command
    tune runs: N >= 2 and tune's own parser accepts the options."""
    found = []
    for ranks, rest in _ADVICE.findall(text):
        options = shlex.split(rest)
        assert int(ranks) >= tune.MIN_RANKS, f"advice on {ranks} rank(s), which tune refuses: {text}"
        tune._parse(options)  # SystemExit (a usage error) fails the test
        found.append((int(ranks), options))
    return found


def test_tune_command_never_asks_for_fewer_than_two_ranks():
    assert tune.tune_command(1) == "mpiexec -n 2 python -m mpicomm.tune"
    assert tune.tune_command(4, "--collectives", "--out", "my file.json") == (
        "mpiexec -n 4 python -m mpicomm.tune --collectives --out 'my file.json'")
    assert advised(tune.tune_command(0, "--show")) == [(2, ["--show"])]


@pytest.mark.parametrize("p,nodes", [(1, 1), (2, 1), (4, 2)])
@pytest.mark.parametrize("options", [(), ("--collectives",)])
def test_show_without_a_saved_file_advises_commands_that_run(p, nodes, options):
    text = tune._no_saved("fit", "h1", f"p{p}-{nodes}x{p // nodes}", "/cache/x.json", p, nodes, *options)
    commands = advised(text)
    assert commands and all(opts[: len(options)] == list(options) for _, opts in commands), text
    if p >= 2:
        assert commands == [(p, list(options))]  # the layout that was asked about
    else:
        assert "at least 2 ranks" in text and commands[-1] == (2, [*options, "--show"])


@pytest.mark.parametrize("argv", [["--collective", "allreduce"], ["--out", "d.json", "--sizes", "8,64"]])
def test_option_errors_advise_commands_that_run(capsys, argv):
    with pytest.raises(SystemExit):
        tune.main(argv)
    err = capsys.readouterr().err
    assert advised(err) == [(2, ["--collectives", *argv])], err


# ---------------------------------------------------------------- values not measured are marked


def one_node_machine(**changes) -> model.Machine:
    base = dict(intra=model.Link(5e-6, 1e-10), inter=model.Link(5e-6, 1e-10), gamma=0.5e-10, copy=0.25e-10,
                overhead=30e-6, validation=30e-6, ppn=2, nodes=1, host="h1", created="2026-01-01T00:00:00+00:00",
                cache_bytes=1 << 20, intra_mem=model.Link(5e-6, 4e-10), inter_mem=model.Link(5e-6, 4e-10),
                gamma_mem=1e-10, copy_mem=0.5e-10)
    base.update(changes)
    return model.Machine(**base)


def marks(lines: list[str]) -> dict[str, str]:
    """Row name → the reason of its ``[not measured: ...]`` mark, from describe's lines."""
    found = {}
    for line in lines:
        m = re.match(r"\s+(\S+(?: mem)?)\s.*\[not measured: ([^\]]+)\]$", line)
        if m:
            found[m.group(1)] = m.group(2)
    return found


def test_one_node_marks_the_inter_node_link_as_not_measured(tmp_path):
    machine = one_node_machine()
    assert set(tune.unmeasured(machine)) == {"inter-node", "inter mem"}
    shown = marks(tune.describe(machine))
    assert set(shown) == {"inter-node", "inter mem"} and "one node" in shown["inter-node"]
    # the saved file says nothing about it: read back, the marks are the same
    path = model.save(machine, str(tmp_path / "model.json"))
    with open(path) as f:
        loaded = model.Machine.from_json(f.read())
    assert marks(tune.describe(loaded)) == shown


def test_one_rank_per_node_marks_the_intra_node_link():
    machine = one_node_machine(nodes=2, ppn=1, inter=model.Link(20e-6, 1e-9), inter_mem=model.Link(20e-6, 2e-9))
    assert set(marks(tune.describe(machine))) == {"intra-node", "intra mem"}
    assert "one rank per node" in tune.unmeasured(machine)["intra-node"]


def test_a_memory_regime_not_fitted_is_marked():
    machine = one_node_machine(nodes=2, inter=model.Link(20e-6, 1e-9), intra_mem=None, inter_mem=None,
                               gamma_mem=None, copy_mem=None)
    shown = marks(tune.describe(machine))
    assert set(shown) == {"intra mem", "inter mem", "gamma mem", "copy mem"}
    assert all("cache-regime value" in reason for reason in shown.values())
    measured = one_node_machine(nodes=2, inter=model.Link(20e-6, 1e-9), inter_mem=model.Link(20e-6, 3e-9))
    assert tune.unmeasured(measured) == {} and marks(tune.describe(measured)) == {}


def test_report_marks_what_one_node_did_not_measure():
    fit = tune.Fit()
    fit.p, fit.layout, fit.cache_bytes, fit.cache_source = 2, "p2-1x2", 1 << 20, "test"
    fit.sizes, fit.intra = TWO_SIZES, TWO_TIMES
    fit.add_bytes, fit.add, fit.copy = TWO_SIZES, [2 * t for t in TWO_TIMES], TWO_TIMES
    fit.machine = tune.machine_from(fit, 2, 1, "h1")
    shown = marks(tune.report(fit).splitlines())
    assert set(shown) == {"inter-node", "inter mem"}


# ---------------------------------------------------------------- --json


def test_fit_json_holds_the_machine_the_samples_and_what_was_not_measured():
    fit = synthetic_fit()
    body = tune.fit_json(fit)
    json.dumps(body)  # plain JSON
    assert body["layout"] == "p4-2x2" and body["p"] == 4
    assert model.Machine.from_json(json.dumps(body["machine"])) == fit.machine
    assert body["not_measured"] == tune.unmeasured(fit.machine)
    assert body["pingpong"] == {"bytes": fit.sizes, "intra_s": fit.intra, "inter_s": fit.inter}
    assert body["local"] == {"bytes": fit.add_bytes, "add_s": fit.add, "copy_s": fit.copy}
    assert body["lines"]["inter"] == {"alpha_s": 20e-6, "beta_s_per_byte": 1e-9}
    assert body["call"]["validated_s"] == 80e-6
    with pytest.raises(ValueError, match="no machine"):
        tune.fit_json(tune.Fit())


def test_json_option_is_parsed():
    assert tune._parse(["--json", "fit.json"]).json == "fit.json"
    assert tune._parse(["--collectives", "--json", "d.json"]).json == "d.json"
    assert tune._parse(["--sizes", "1K:4KiB"]).sizes == [1024, 2048, 4096]
