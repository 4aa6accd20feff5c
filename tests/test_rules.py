"""mpicomm.rules: the one rules format (round trip, refusals that name the key), conditions at their edges, the
measured rules' place in the selection's precedence, decisions files of earlier versions, loading per
communicator, and ``--explain``."""

from __future__ import annotations

import json
import os
import socket
import warnings
from dataclasses import replace

import numpy as np
import pytest

from mpicomm import model, registry, rules, selection
from mpicomm.facts import Facts
from mpicomm.rules import Rules, RulesError

ALLREDUCE = [{"max_bytes": 4096, "device": False, "algorithm": "recursive_doubling"},
             {"max_bytes": 65536, "device": False, "algorithm": "ring"}]


def sample(**changes) -> Rules:
    """Measured rules for p = 2 on one node: allreduce in two ranges, barrier for every size."""
    fields = {"p": 2, "nodes": 1, "ppn": 2, "host": "h1", "measured": "2026-01-01T00:00:00+00:00",
              "collectives": {"allreduce": [dict(r) for r in ALLREDUCE], "barrier": [{"algorithm": "native"}]},
              "measurements": {"allreduce": [{"bytes": 8, "us": {"recursive_doubling": 20.0, "ring": 30.0}},
                                             {"bytes": 65536, "us": {"recursive_doubling": 90.0, "ring": 60.0}}]}}
    fields.update(changes)
    return Rules(**fields)


# ---------------------------------------------------------------- the file


@pytest.mark.serial
def test_round_trip_and_the_file_sits_next_to_the_model(tmp_path, monkeypatch):
    monkeypatch.setenv("MPICOMM_CACHE_DIR", str(tmp_path))
    original = sample()
    path = rules.save(original)
    assert path == rules.path_for("h1", "p2-1x2") == str(tmp_path / "rules-h1-p2-1x2.json")
    assert os.path.dirname(path) == os.path.dirname(model.path_for("h1", "p2-1x2"))
    back = rules.load(path, registry.algorithms)
    assert back.path == path
    assert {**back.__dict__, "path": ""} == {**original.__dict__, "path": ""}
    assert rules.load_for("h1", "p2-1x2") == back
    assert rules.load_for("h1", "p4-1x4") is None  # no file for that layout
    assert rules.saved_layouts("h1") == ["p2-1x2"]
    text = open(path).read()
    assert '{"max_bytes": 4096, "device": false, "algorithm": "recursive_doubling"}' in text  # one rule per line
    body = json.loads(text)
    assert body["format"] == "mpicomm-rules" and body["version"] == 1
    assert body["layout"] == {"p": 2, "nodes": 1, "ppn": 2, "host": "h1"}
    with pytest.raises(ValueError, match="no layout"):
        rules.save(Rules({"barrier": [{"algorithm": "native"}]}))


def test_the_default_rules_are_a_rules_file_of_any_layout():
    default = rules.default()
    assert default.path == rules.DEFAULT_PATH and not default.p and default.layout == ""
    assert default.collectives == selection.SELECTION
    assert Rules.from_json(default.to_json(), "again", registry.algorithms).collectives == default.collectives
    assert default.collectives["allreduce"][0] == {"max_bytes": 2048, "algorithm": "recursive_doubling"}


def _broken(edit) -> str:
    body = json.loads(sample().to_json())
    edit(body)
    return json.dumps(body)


@pytest.mark.serial
@pytest.mark.parametrize("text,where,problem", [
    ("{not json", "the text", "is not JSON"),
    (_broken(lambda b: b.update(format="mpicomm-model")), '"format"', "not an mpicomm rules file"),
    (_broken(lambda b: b.update(version=2)), '"version"', "reads version 1"),
    (_broken(lambda b: b.update(colectives={})), "key 'colectives'", "is unknown"),
    (_broken(lambda b: b["layout"].update(p=0)), "layout.p", "not a positive integer"),
    (_broken(lambda b: b["collectives"]["allreduce"][0].update(max_size=8)),
     "collectives.allreduce[0] key 'max_size'", "is unknown; a rule has conditions (max_bytes, min_bytes"),
    (_broken(lambda b: b["collectives"]["allreduce"][1].update(max_bytes=-1)),
     "collectives.allreduce[1].max_bytes", "= -1 is not an integer >= 0"),
    (_broken(lambda b: b["collectives"]["allreduce"][1].update(max_p=0)),
     "collectives.allreduce[1].max_p", "is not a positive integer"),
    (_broken(lambda b: b["collectives"]["allreduce"][0].update(pof2="yes")),
     "collectives.allreduce[0].pof2", "is not true or false"),
    (_broken(lambda b: b["collectives"]["allreduce"][0].pop("algorithm")),
     "collectives.allreduce[0].algorithm", "= None is not an algorithm name"),
    (_broken(lambda b: b["collectives"]["allreduce"][1].update(algorithm="spiral")),
     "collectives.allreduce[1].algorithm", "'spiral' is not a registered allreduce algorithm"),
    (_broken(lambda b: b["collectives"].update(allreduse=[{"algorithm": "ring"}])), "collective 'allreduse'",
     "is unknown"),
    (_broken(lambda b: b["collectives"].update(bcast=[])), "collectives.bcast", "non-empty list"),
])
def test_malformed_files_are_refused_naming_the_file_and_the_key(tmp_path, text, where, problem):
    path = tmp_path / "rules-h1-p2-1x2.json"
    path.write_text(text)
    with pytest.raises(RulesError) as info:
        rules.load(str(path), registry.algorithms)
    message = str(info.value)
    assert str(path) in message and where in message and problem in message, message
    assert "mpicomm.tune --collectives" in message  # the fix


@pytest.mark.serial
def test_a_file_named_for_another_layout_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("MPICOMM_CACHE_DIR", str(tmp_path))
    rules.save(sample(), rules.path_for("h1", "p4-1x4"))
    with pytest.raises(RulesError, match=r"\"layout\" is p2-1x2, but the file is named for p4-1x4"):
        rules.load_for("h1", "p4-1x4")


# ---------------------------------------------------------------- decisions files of earlier versions


OLD = {"format": "mpicomm-decisions", "version": 1, "layout": {"p": 2, "nodes": 1, "ppn": 2, "host": "h1"},
       "measured": "2025-01-01T00:00:00+00:00",
       "collectives": {"allreduce": [{"max_bytes": 4096, "algorithm": "recursive_doubling"},
                                     {"max_bytes": 65536, "algorithm": "ring"}],
                       "barrier": [{"algorithm": "native"}]},
       "measurements": {"allreduce": [{"bytes": 8, "us": {"ring": 30.0}}]}}


@pytest.mark.serial
def test_an_old_decisions_file_is_read_as_measured_rules(tmp_path, monkeypatch):
    monkeypatch.setenv("MPICOMM_CACHE_DIR", str(tmp_path))
    old = tmp_path / "decisions-h1-p2-1x2.json"
    old.write_text(json.dumps(OLD))
    found = rules.load_for("h1", "p2-1x2", registry.algorithms)
    assert found is not None and found.path == str(old) and found.layout == "p2-1x2"
    assert found.collectives == {"allreduce": ALLREDUCE, "barrier": [{"device": False, "algorithm": "native"}]}
    assert found.measurements == OLD["measurements"]
    assert rules.saved_layouts("h1") == ["p2-1x2"]
    rules.save(sample(collectives={"allreduce": [{"algorithm": "naive"}]}))  # a rules file of the layout wins
    assert rules.load_for("h1", "p2-1x2").collectives == {"allreduce": [{"algorithm": "naive"}]}
    assert rules.saved_layouts("h1") == ["p2-1x2"]


@pytest.mark.serial
@pytest.mark.parametrize("edit,where,problem", [
    (lambda b: b["collectives"]["allreduce"][1].update(max_bytes=1024), "collectives.allreduce[1].max_bytes",
     "not above the previous range's 4096"),
    (lambda b: b["collectives"]["allreduce"][0].pop("max_bytes"), "collectives.allreduce[0].max_bytes",
     "only the last range may leave it out"),
    (lambda b: b["collectives"]["allreduce"][0].update(min_bytes=8), "collectives.allreduce[0] key 'min_bytes'",
     "is unknown"),
    (lambda b: b.update(version=7), '"version"', "of an mpicomm-decisions file"),
])
def test_a_broken_old_decisions_file_is_refused_naming_the_key(tmp_path, edit, where, problem):
    body = json.loads(json.dumps(OLD))
    edit(body)
    path = tmp_path / "decisions-h1-p2-1x2.json"
    path.write_text(json.dumps(body))
    with pytest.raises(RulesError) as info:
        rules.load(str(path), registry.algorithms)
    message = str(info.value)
    assert str(path) in message and where in message and problem in message, message


# ---------------------------------------------------------------- conditions, first match, decide


@pytest.mark.serial
@pytest.mark.parametrize("nbytes,expected", [
    (0, "recursive_doubling"), (1, "recursive_doubling"), (4096, "recursive_doubling"), (4097, "ring"),
    (65536, "ring"), (65537, None), (None, None),
])
def test_ranges_at_their_edges(nbytes, expected):
    assert sample().algorithm_for("allreduce", nbytes) == expected


@pytest.mark.serial
def test_open_ranges_missing_collectives_and_devices():
    open_ended = sample(collectives={"allreduce": [{"max_bytes": 4096, "algorithm": "naive"}, {"algorithm": "ring"}]})
    assert open_ended.algorithm_for("allreduce", 1 << 30) == "ring"
    assert sample().algorithm_for("barrier", None) == "native"  # a rule without conditions covers "no size"
    assert sample().algorithm_for("bcast", 8) is None
    assert sample().algorithm_for("allreduce", 8, device=True) is None  # measured on host arrays
    assert sample().first("allreduce", Facts(p=4, bytes=8)) is None  # rules of p = 2 only


@pytest.mark.serial
@pytest.mark.parametrize("rule,facts,expected", [
    ({"min_bytes": 64}, Facts(bytes=64), True), ({"min_bytes": 64}, Facts(bytes=63), False),
    ({"min_bytes": 0}, Facts(bytes=None), False),
    ({"pof2": True}, Facts(p=4), True), ({"pof2": True}, Facts(p=6), False), ({"pof2": False}, Facts(p=6), True),
    ({"min_p": 3}, Facts(p=3), True), ({"min_p": 3}, Facts(p=2), False), ({"max_p": 2}, Facts(p=3), False),
    ({"min_count": 1}, Facts(p=4, count=4), True), ({"min_count": 1}, Facts(p=4, count=3), False),
    ({"min_count": 1}, Facts(p=4), False),
    ({"device": True}, Facts(device=True), True), ({"device": True}, Facts(device=False), False),
    ({"device": False}, Facts(), True), ({}, Facts(), True),
])
def test_each_condition(rule, facts, expected):
    assert rules.holds({**rule, "algorithm": "x"}, facts) is expected


def test_an_unknown_condition_in_a_patched_table_is_named():
    with pytest.raises(ValueError, match="unknown condition 'tiny'; known: max_bytes"):
        rules.holds({"tiny": True, "algorithm": "ring"}, Facts())


def test_describe_says_a_rule_in_words():
    assert rules.describe({"max_bytes": 4096, "device": False, "algorithm": "ring"}) == (
        "up to 4096 B, host buffers → ring")
    assert rules.describe({"algorithm": "ring"}) == "otherwise → ring"


@pytest.mark.serial
def test_decide_merges_neighbours_and_breaks_ties_by_name():
    points = [{"bytes": 8, "us": {"ring": 5.0, "naive": 5.0, "auto": 1.0}},
              {"bytes": 64, "us": {"ring": 4.0, "naive": 6.0}},
              {"bytes": 1024, "us": {"ring": 3.0, "naive": 9.0}},
              {"bytes": 65536, "us": {"ring": 9.0, "naive": 2.0}}]
    assert rules.decide(points) == [{"max_bytes": 8, "algorithm": "naive"}, {"max_bytes": 1024, "algorithm": "ring"},
                                    {"max_bytes": 65536, "algorithm": "naive"}]
    assert rules.decide([{"bytes": None, "us": {"native": 2.0, "dissemination": 3.0}}], device=False) == [
        {"device": False, "algorithm": "native"}]
    # the size below's winner goes on while it is within 5 % of the fastest (noise does not split ranges)
    near = [{"bytes": 8, "us": {"ring": 10.0, "naive": 20.0}}, {"bytes": 16, "us": {"ring": 10.4, "naive": 10.0}},
            {"bytes": 32, "us": {"ring": 12.0, "naive": 10.0}}]
    assert [r["max_bytes"] for r in rules.decide(near)] == [16, 32]
    assert [(r["max_bytes"], r["algorithm"]) for r in rules.decide(near, stick=0.0)] == [(8, "ring"), (32, "naive")]
    assert rules.decide(points, device=False)[0] == {"max_bytes": 8, "device": False, "algorithm": "naive"}


# ---------------------------------------------------------------- precedence


FACTS = Facts(p=2, bytes=1024, count=128, commutative=True, op="sum", nodes=1, ppn=2, device=False, blocking=True)


@pytest.mark.serial
def test_measured_rules_come_after_call_communicator_and_environment(monkeypatch):
    monkeypatch.delenv("MPICOMM_ALLREDUCE_ALGORITHM", raising=False)
    facts = replace(FACTS, rules=sample())
    assert selection.choose("allreduce", None, None, facts) == (registry.lookup("allreduce", "recursive_doubling"),
                                                                "rules")
    assert selection.choose("allreduce", "auto", None, facts)[1] == "rules"
    assert selection.choose("allreduce", "ring", None, facts) == (registry.lookup("allreduce", "ring"), "call")
    assert selection.choose("allreduce", None, "naive", facts)[1] == "communicator"
    monkeypatch.setenv("MPICOMM_ALLREDUCE_ALGORITHM", "tree")
    assert selection.choose("allreduce", None, None, facts)[:2] == (registry.lookup("allreduce", "tree"),
                                                                    "environment")


@pytest.mark.serial
def test_measured_rules_beat_the_default_rules_where_they_hold(monkeypatch):
    monkeypatch.delenv("MPICOMM_ALLREDUCE_ALGORITHM", raising=False)
    table = selection.choose("allreduce", None, None, FACTS)
    assert table[1] == "table"
    picked = sample(collectives={"allreduce": [{"max_bytes": 65536, "algorithm": "naive"}]})  # not the table's
    assert selection.choose("allreduce", None, None, replace(FACTS, rules=picked)) == (
        registry.lookup("allreduce", "naive"), "rules")
    # a fitted model changes nothing: it predicts, the rules choose (the facts have no place for a machine)
    with pytest.raises(TypeError, match="machine"):
        Facts(p=2, bytes=1024, rules=picked, machine=model.NOMINAL)
    # no measured rule holds (above the last range): the default rules
    big = replace(FACTS, bytes=1 << 20, count=1 << 17, rules=picked)
    assert selection.choose("allreduce", None, None, big) == selection.choose("allreduce", None, None,
                                                                              replace(big, rules=None))
    assert selection.choose("allreduce", None, None, big)[1] == "table"
    algorithm, source, rule = selection.auto_rule("allreduce", replace(FACTS, rules=picked))
    assert rule == "rule 1 of the measured rules of p2-1x2: up to 65536 B → naive"


@pytest.mark.serial
def test_a_measured_rule_that_cannot_run_here_is_skipped(monkeypatch):
    monkeypatch.delenv("MPICOMM_ALLREDUCE_ALGORITHM", raising=False)
    ring = sample(collectives={"allreduce": [{"max_bytes": 65536, "device": False, "algorithm": "ring"}]})
    assert selection.choose("allreduce", None, None, replace(FACTS, rules=ring))[0].name == "ring"
    noncommutative = replace(FACTS, commutative=False, op="mine", rules=ring)  # ring reorders operands
    assert selection.choose("allreduce", None, None, noncommutative)[1] == "table"
    assert selection.choose("allreduce", None, None, replace(FACTS, device=True, rules=ring))[1] == "table"
    assert selection.choose("allreduce", None, None, replace(FACTS, p=4, rules=ring))[1] == "table"  # other p
    unknown = sample(collectives={"allreduce": [{"algorithm": "from_elsewhere"}]})  # not registered here
    assert selection.choose("allreduce", None, None, replace(FACTS, rules=unknown))[1] == "table"


# ---------------------------------------------------------------- --explain (no MPI job)


@pytest.mark.serial
def test_explain_shows_each_algorithm_the_source_and_the_rule(tmp_path, monkeypatch, capsys):
    from mpicomm.__main__ import main

    monkeypatch.setenv("MPICOMM_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("MPICOMM_ALLREDUCE_ALGORITHM", raising=False)
    assert main(["algorithms", "--explain", "allreduce", "64K", "--ranks", "2"]) == 0
    out = capsys.readouterr().out
    assert "allreduce, size 65536 B" in out and "layout p2-1x2" in out and "measured rules: none for this layout" in out
    assert "auto (*): recursive_doubling (from the table: rule 4 of the default rules: otherwise → " \
           "recursive_doubling)" in out
    for name in registry.algorithms("allreduce"):
        assert name in out
    rules.save(sample(host=socket.gethostname()))
    assert main(["algorithms", "--explain", "allreduce", "64K"]) == 0  # the layout of the saved file
    out = capsys.readouterr().out
    assert "layout p2-1x2" in out and "measured (µs)" in out
    assert "auto (*): ring (from the rules: rule 2 of " in out and "up to 65536 B, host buffers → ring)" in out
    assert "table: recursive_doubling (rule 4 of the default rules" in out  # what the default rules would pick
    ring = [line for line in out.splitlines() if line.startswith("* ring")][0].split()
    assert ring[3] == "60.0" and ring[4] == "yes"  # measured at 65536 B, allowed
    assert main(["algorithms", "--explain", "allreduce", "8", "--ranks", "3"]) == 0
    out = capsys.readouterr().out
    assert "p = 3 on 1 node(s)" in out and "layout p3-1x3" in out
    assert "from the table" in out


@pytest.mark.serial
def test_explain_names_the_environment_and_what_auto_would_pick(tmp_path, monkeypatch, capsys):
    from mpicomm.__main__ import main

    monkeypatch.setenv("MPICOMM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("MPICOMM_ALLREDUCE_ALGORITHM", "ring")
    assert main(["algorithms", "--explain", "allreduce", "8", "--ranks", "2"]) == 0
    out = capsys.readouterr().out
    assert "auto (*): ring (from the environment: MPICOMM_ALLREDUCE_ALGORITHM is set; without it auto would pick " \
           "recursive_doubling (rule 1 of the default rules" in out


@pytest.mark.serial
@pytest.mark.parametrize("argv,message", [
    (["algorithms", "--explain", "allreduce", "1Q"], "SIZE must be a whole number with an optional unit"),
    (["algorithms", "--explain", "allreduce", "8:64"], "one size"),
    (["algorithms", "--ranks", "2"], "--ranks needs --explain"),
    (["info", "--explain", "allreduce", "8"], "go with the algorithms command"),
])
def test_explain_refuses_bad_arguments(capsys, argv, message):
    from mpicomm.__main__ import main

    with pytest.raises(SystemExit):
        main(argv)
    assert message in capsys.readouterr().err


# ---------------------------------------------------------------- loaded per communicator (any rank count)


@pytest.mark.mpi
def test_a_communicator_loads_the_rules_of_its_layout(tmp_path, monkeypatch, comm):
    from mpi4py import MPI

    import mpicomm
    from mpicomm.front import dispatch

    folder = comm.bcast(str(tmp_path), root=0)
    monkeypatch.setenv("MPICOMM_CACHE_DIR", folder)
    monkeypatch.delenv("MPICOMM_ALLREDUCE_ALGORITHM", raising=False)
    p, host = comm.size, comm.bcast(comm.host, root=0)
    layout = model.layout_key(p, comm.nodes, comm.ppn)
    if comm.rank == 0:
        rules.save(Rules({"allreduce": [{"max_bytes": 64, "device": False, "algorithm": "naive"}]}, p, comm.nodes,
                         comm.ppn, host))
    comm.Barrier()
    fresh = mpicomm.Comm(MPI.COMM_WORLD.Dup())
    try:
        loaded = fresh._state.rules
        assert loaded is not None and loaded.layout == layout and loaded.algorithm_for("allreduce", 64) == "naive"
        assert loaded.path == rules.path_for(host, layout)  # every rank knows where rank 0 read it
        small = dispatch.Args("allreduce", dtype=np.dtype(np.float64), count=8)
        big = dispatch.Args("allreduce", dtype=np.dtype(np.float64), count=1024)
        state = fresh._state
        assert (selection.choose_for(state, small, None)[0].name, selection.choose_for(state, small, None)[1]) == \
            ("naive", "rules")
        assert selection.choose_for(state, big, None)[1] == "table"
        assert selection.choose_for(state, small, "ring")[1] == "call"
        # a new rule list makes new choices (the selection keeps a communicator's choices by the lists' identity)
        fresh._state.rules.collectives["allreduce"] = [{"max_bytes": 64, "algorithm": "tree"}]
        assert selection.choose_for(state, small, None) == (registry.lookup("allreduce", "tree"), "rules")
        x = np.arange(8, dtype=np.float64)
        y = np.empty_like(x)
        fresh.Allreduce(x, y)
        assert np.array_equal(y, x * p)
    finally:
        fresh.Free()
    if comm.rank == 0:  # a broken file: ignored with a warning naming it, the same (None) on every rank
        with open(rules.path_for(host, layout), "w") as f:
            f.write('{"format": "mpicomm-rules", "version": 1, "layout": {"p": 0}}')
    comm.Barrier()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        broken = mpicomm.Comm(MPI.COMM_WORLD.Dup())
    try:
        assert broken._state.rules is None
        if comm.rank == 0:
            assert any("layout.p" in str(w.message) and rules.path_for(host, layout) in str(w.message)
                       for w in caught), [str(w.message) for w in caught]
    finally:
        broken.Free()
