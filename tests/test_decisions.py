"""mpicomm.decisions: the measured-decisions file (round trip, refusals that name the key), lookup at the edges of
its ranges, its place in the selection's precedence, its loading per communicator, and ``--explain``."""

from __future__ import annotations

import json
import socket
import warnings

import numpy as np
import pytest

from mpicomm import decisions, model, registry
from mpicomm.decisions import Decisions, DecisionsError, Range

ALLREDUCE = (Range(4096, "recursive_doubling"), Range(65536, "ring"))


def sample(**changes) -> Decisions:
    """Decisions for p = 2 on one node: allreduce in two ranges, barrier for every size."""
    fields = {"p": 2, "nodes": 1, "ppn": 2, "host": "h1", "measured": "2026-01-01T00:00:00+00:00",
              "collectives": {"allreduce": ALLREDUCE, "barrier": (Range(None, "native"),)},
              "measurements": {"allreduce": [{"bytes": 8, "us": {"recursive_doubling": 20.0, "ring": 30.0}},
                                             {"bytes": 65536, "us": {"recursive_doubling": 90.0, "ring": 60.0}}]}}
    fields.update(changes)
    return Decisions(**fields)


# ---------------------------------------------------------------- the file


@pytest.mark.serial
def test_round_trip_and_the_file_sits_next_to_the_model(tmp_path, monkeypatch):
    monkeypatch.setenv("MPICOMM_CACHE_DIR", str(tmp_path))
    original = sample()
    path = decisions.save(original)
    assert path == decisions.path_for("h1", "p2-1x2") == str(tmp_path / "decisions-h1-p2-1x2.json")
    assert (tmp_path / "decisions-h1-p2-1x2.json").exists()
    import os

    assert os.path.dirname(path) == os.path.dirname(model.path_for("h1", "p2-1x2"))
    back = decisions.load(path, registry.algorithms)
    assert back.path == path
    assert {**back.__dict__, "path": ""} == {**original.__dict__, "path": ""}
    assert decisions.load_for("h1", "p2-1x2") == back
    assert decisions.load_for("h1", "p4-1x4") is None  # no file for that layout
    assert decisions.saved_layouts("h1") == ["p2-1x2"]
    text = path and open(path).read()
    assert '{"max_bytes": 4096, "algorithm": "recursive_doubling"}' in text  # one range per line, by hand
    assert json.loads(text)["layout"] == {"p": 2, "nodes": 1, "ppn": 2, "host": "h1"}


def _broken(edit) -> str:
    body = json.loads(sample().to_json())
    edit(body)
    return json.dumps(body)


@pytest.mark.serial
@pytest.mark.parametrize("text,where,problem", [
    ("{not json", "the text", "is not JSON"),
    (_broken(lambda b: b.update(format="mpicomm-model")), '"format"', "not an mpicomm decisions file"),
    (_broken(lambda b: b.update(version=2)), '"version"', "reads version 1"),
    (_broken(lambda b: b.update(colectives={})), "key 'colectives'", "is unknown"),
    (_broken(lambda b: b["layout"].update(p=0)), "layout.p", "not a positive integer"),
    (_broken(lambda b: b["collectives"]["allreduce"][0].update(min_bytes=8)),
     "collectives.allreduce[0] key 'min_bytes'", "is unknown"),
    (_broken(lambda b: b["collectives"]["allreduce"][1].update(max_bytes=1024)),
     "collectives.allreduce[1].max_bytes", "not above the previous entry's 4096"),
    (_broken(lambda b: b["collectives"]["allreduce"][0].pop("max_bytes")),
     "collectives.allreduce[0].max_bytes", "only the last entry may leave it out"),
    (_broken(lambda b: b["collectives"]["allreduce"][1].update(algorithm="spiral")),
     "collectives.allreduce[1].algorithm", "'spiral' is not a registered allreduce algorithm"),
    (_broken(lambda b: b["collectives"].update(allreduse=[{"algorithm": "ring"}])), "collective 'allreduse'",
     "is unknown"),
    (_broken(lambda b: b["collectives"].update(bcast=[])), "collectives.bcast", "non-empty list"),
])
def test_malformed_files_are_refused_naming_the_file_and_the_key(tmp_path, text, where, problem):
    path = tmp_path / "decisions-h1-p2-1x2.json"
    path.write_text(text)
    with pytest.raises(DecisionsError) as info:
        decisions.load(str(path), registry.algorithms)
    message = str(info.value)
    assert str(path) in message and where in message and problem in message, message
    assert "mpicomm.tune --collectives" in message  # the fix


@pytest.mark.serial
def test_a_file_named_for_another_layout_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("MPICOMM_CACHE_DIR", str(tmp_path))
    decisions.save(sample(), decisions.path_for("h1", "p4-1x4"))
    with pytest.raises(DecisionsError, match=r"\"layout\" is p2-1x2, but the file is named for p4-1x4"):
        decisions.load_for("h1", "p4-1x4")


# ---------------------------------------------------------------- lookup and decide


@pytest.mark.serial
@pytest.mark.parametrize("nbytes,expected", [
    (0, "recursive_doubling"), (1, "recursive_doubling"), (4096, "recursive_doubling"), (4097, "ring"),
    (65536, "ring"), (65537, None), (None, None),
])
def test_lookup_at_the_edges_of_the_ranges(nbytes, expected):
    assert decisions.lookup(sample(), "allreduce", nbytes) == expected


@pytest.mark.serial
def test_lookup_open_ranges_missing_collectives_and_no_decisions():
    open_ended = sample(collectives={"allreduce": (Range(4096, "naive"), Range(None, "ring"))})
    assert decisions.lookup(open_ended, "allreduce", 1 << 30) == "ring"
    assert decisions.lookup(sample(), "barrier", None) == "native"  # a range for every size covers "no size"
    assert decisions.lookup(sample(), "bcast", 8) is None
    assert decisions.lookup(None, "allreduce", 8) is None


@pytest.mark.serial
def test_decide_merges_neighbours_and_breaks_ties_by_name():
    points = [{"bytes": 8, "us": {"ring": 5.0, "naive": 5.0, "auto": 1.0}},
              {"bytes": 64, "us": {"ring": 4.0, "naive": 6.0}},
              {"bytes": 1024, "us": {"ring": 3.0, "naive": 9.0}},
              {"bytes": 65536, "us": {"ring": 9.0, "naive": 2.0}}]
    assert decisions.decide(points) == (Range(8, "naive"), Range(1024, "ring"), Range(65536, "naive"))
    assert decisions.decide([{"bytes": None, "us": {"native": 2.0, "dissemination": 3.0}}]) == (Range(None, "native"),)
    # the size below's winner goes on while it is within 5 % of the fastest (noise does not split ranges)
    near = [{"bytes": 8, "us": {"ring": 10.0, "naive": 20.0}}, {"bytes": 16, "us": {"ring": 10.4, "naive": 10.0}},
            {"bytes": 32, "us": {"ring": 12.0, "naive": 10.0}}]
    assert decisions.decide(near) == (Range(16, "ring"), Range(32, "naive"))
    assert decisions.decide(near, stick=0.0) == (Range(8, "ring"), Range(32, "naive"))


# ---------------------------------------------------------------- precedence


FACTS = {"p": 2, "bytes": 1024, "count": 128, "commutative": True, "op": "sum", "nodes": 1, "ppn": 2,
         "device": False, "blocking": True}


@pytest.mark.serial
def test_decisions_come_after_call_communicator_and_environment(monkeypatch):
    monkeypatch.delenv("MPICOMM_ALLREDUCE_ALGORITHM", raising=False)
    facts = {**FACTS, "decisions": sample()}
    assert registry.choose("allreduce", None, None, facts) == (registry.lookup("allreduce", "recursive_doubling"),
                                                                "decisions")
    assert registry.choose("allreduce", "auto", None, facts)[1] == "decisions"
    assert registry.choose("allreduce", "ring", None, facts) == (registry.lookup("allreduce", "ring"), "call")
    assert registry.choose("allreduce", None, "naive", facts)[1] == "communicator"
    monkeypatch.setenv("MPICOMM_ALLREDUCE_ALGORITHM", "tree")
    assert registry.choose("allreduce", None, None, facts)[:2] == (registry.lookup("allreduce", "tree"),
                                                                    "environment")


@pytest.mark.serial
def test_decisions_beat_the_model_and_the_table_where_they_cover_the_size(monkeypatch):
    monkeypatch.delenv("MPICOMM_ALLREDUCE_ALGORITHM", raising=False)
    table = registry.choose("allreduce", None, None, FACTS)
    assert table[1] == "table"
    machine = model.NOMINAL
    picked = sample(collectives={"allreduce": (Range(65536, "naive"),)})  # naive: neither the table's nor the model's
    assert registry.choose("allreduce", None, None, {**FACTS, "decisions": picked})[0].name == "naive"
    assert registry.choose("allreduce", None, None, {**FACTS, "decisions": picked, "machine": machine})[1] == "decisions"
    # not covered (above the last range): the model, else the table
    big = {**FACTS, "bytes": 1 << 20, "count": 1 << 17, "decisions": picked}
    assert registry.choose("allreduce", None, None, {**big, "machine": machine})[1] == "model"
    assert registry.choose("allreduce", None, None, big)[1] == "table"


@pytest.mark.serial
def test_a_decision_that_cannot_run_here_is_skipped(monkeypatch):
    monkeypatch.delenv("MPICOMM_ALLREDUCE_ALGORITHM", raising=False)
    ring = sample(collectives={"allreduce": (Range(65536, "ring"),)})
    assert registry.choose("allreduce", None, None, {**FACTS, "decisions": ring})[0].name == "ring"
    noncommutative = {**FACTS, "commutative": False, "op": "mine", "decisions": ring}  # ring reorders operands
    assert registry.choose("allreduce", None, None, noncommutative)[1] == "table"
    assert registry.choose("allreduce", None, None, {**FACTS, "device": True, "decisions": ring})[1] == "table"
    assert registry.choose("allreduce", None, None, {**FACTS, "p": 4, "decisions": ring})[1] == "table"  # other p


# ---------------------------------------------------------------- --explain (no MPI job)


@pytest.mark.serial
def test_explain_shows_each_algorithm_and_the_source(tmp_path, monkeypatch, capsys):
    from mpicomm.__main__ import main

    monkeypatch.setenv("MPICOMM_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("MPICOMM_ALLREDUCE_ALGORITHM", raising=False)
    assert main(["algorithms", "--explain", "allreduce", "64K", "--ranks", "2"]) == 0
    out = capsys.readouterr().out
    assert "allreduce, size 65536 B" in out and "layout p2-1x2" in out and "decisions: none for this layout" in out
    assert "from the table" in out
    for name in registry.algorithms("allreduce"):
        assert name in out
    decisions.save(sample(host=socket.gethostname()))
    assert main(["algorithms", "--explain", "allreduce", "64K"]) == 0  # the layout of the saved file
    out = capsys.readouterr().out
    assert "layout p2-1x2" in out and "measured (µs)" in out
    assert "auto (*): ring (from the decisions" in out
    ring = [line for line in out.splitlines() if line.startswith("* ring")][0].split()
    assert ring[3] == "60.0" and ring[4] == "yes"  # measured at 65536 B, allowed
    assert main(["algorithms", "--explain", "allreduce", "8", "--ranks", "3"]) == 0
    out = capsys.readouterr().out
    assert "p = 3 on 1 node(s)" in out and "layout p3-1x3" in out
    assert "from the table" in out


@pytest.mark.serial
@pytest.mark.parametrize("argv,message", [
    (["algorithms", "--explain", "allreduce", "1Q"], "'1Q' is not a size"),
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
def test_a_communicator_loads_the_decisions_of_its_layout(tmp_path, monkeypatch, comm):
    from mpi4py import MPI

    import mpicomm
    from mpicomm.coll import dispatch

    folder = comm.bcast(str(tmp_path), root=0)
    monkeypatch.setenv("MPICOMM_CACHE_DIR", folder)
    monkeypatch.delenv("MPICOMM_ALLREDUCE_ALGORITHM", raising=False)
    p, host = comm.size, comm.bcast(comm.host, root=0)
    layout = model.layout_key(p, comm.nodes, comm.ppn)
    if comm.rank == 0:
        decisions.save(Decisions(p, comm.nodes, comm.ppn, {"allreduce": (Range(64, "naive"),)}, host))
    comm.Barrier()
    fresh = mpicomm.Comm(MPI.COMM_WORLD.Dup())
    try:
        loaded = fresh._state.decisions
        assert loaded is not None and loaded.layout == layout and loaded.algorithm_for("allreduce", 64) == "naive"
        small = dispatch.Args("allreduce", dtype=np.dtype(np.float64), count=8)
        big = dispatch.Args("allreduce", dtype=np.dtype(np.float64), count=1024)
        assert (dispatch._choose(fresh, small, None)[0].name, dispatch._choose(fresh, small, None)[1]) == \
            ("naive", "decisions")
        assert dispatch._choose(fresh, big, None)[1] in ("model", "table")
        assert dispatch._choose(fresh, small, "ring")[1] == "call"
        x = np.arange(8, dtype=np.float64)
        y = np.empty_like(x)
        fresh.Allreduce(x, y)
        assert np.array_equal(y, x * p)
    finally:
        fresh.Free()
    if comm.rank == 0:  # a broken file: ignored with a warning naming it, the same (None) on every rank
        with open(decisions.path_for(host, layout), "w") as f:
            f.write('{"format": "mpicomm-decisions", "version": 1, "layout": {"p": 0}}')
    comm.Barrier()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        broken = mpicomm.Comm(MPI.COMM_WORLD.Dup())
    try:
        assert broken._state.decisions is None
        if comm.rank == 0:
            assert any("layout.p" in str(w.message) and decisions.path_for(host, layout) in str(w.message)
                       for w in caught), [str(w.message) for w in caught]
    finally:
        broken.Free()
