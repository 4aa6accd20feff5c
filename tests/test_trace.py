"""mpicomm.trace: off by default, one event per call, a Chrome trace file with a lane per rank (pid = rank + 1),
an arrow (a pair of flow events) from every send to its receive, and user spans.

The in-process tests run at every rank count (``flush`` is collective); the
tests marked ``launches`` start their own 3-rank (or 2-rank) jobs with
``MPICOMM_TRACE`` set, running programs from tests/programs.py, and parse the
file they leave.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
from mpi4py import MPI

from mpicomm import trace
from tests import mpirun
from tests.conftest import rank_data

# ---------------------------------------------------------------- helpers


def x_events(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if e["ph"] == "X"]


def lane(doc: dict, rank: int, cat: str, by_seq: bool = True) -> list[dict]:
    """Rank *rank*'s events of category *cat*, in call order (their sequence number), or by start time."""
    events = [e for e in x_events(doc) if e["pid"] == rank + 1 and e["cat"] == cat]
    return sorted(events, key=(lambda e: e["args"]["seq"]) if by_seq else (lambda e: e["ts"]))


def assert_nested(events: list[dict]) -> None:
    """Complete events of one row must nest: each starts after the previous ends or ends inside it."""
    open_ends: list[float] = []
    for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
        while open_ends and open_ends[-1] <= e["ts"]:
            open_ends.pop()
        end = e["ts"] + e["dur"]
        assert not open_ends or end <= open_ends[-1] + 1e-6, f"{e} overlaps an enclosing event without nesting in it"
        open_ends.append(end)


def check_chrome_trace(doc: dict, ranks: int) -> None:
    """The structure Perfetto and chrome://tracing read, with one named, sorted process per rank."""
    assert set(doc) == {"traceEvents", "displayTimeUnit", "otherData"}
    assert doc["displayTimeUnit"] == "ms"
    assert doc["otherData"]["ranks"] == ranks
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    order = {e["pid"]: e["args"]["sort_index"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_sort_index"}
    hosts = doc["otherData"]["hosts"]
    assert names == {r + 1: f"rank {r} ({hosts[r]})" for r in range(ranks)}  # pid = rank + 1: Perfetto's pid 0 is idle
    assert order == {r + 1: r for r in range(ranks)}
    rows: dict[tuple[int, int], list[dict]] = {}
    for e in x_events(doc):
        assert set(e) == {"name", "cat", "ph", "ts", "dur", "pid", "tid", "args"}, e
        assert type(e["ts"]) in (int, float) and type(e["dur"]) in (int, float) and e["dur"] >= 0, e
        assert e["pid"] in range(1, ranks + 1) and type(e["tid"]) is int, e
        rows.setdefault((e["pid"], e["tid"]), []).append(e)
    threads = {(e["pid"], e["tid"]) for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert set(rows) <= threads
    for events in rows.values():
        assert_nested(events)
    assert {e["ph"] for e in doc["traceEvents"]} <= {"M", "X", "s", "f"}
    check_flows(doc)


SENDS = {"send_array": "message", "answer": "rendezvous answer"}
RECEIVES = {"recv_array": "message", "pull": "rendezvous answer"}


def flow_pairs(doc: dict) -> list[tuple[dict, dict]]:
    """(sending slice, receiving slice) of every arrow in *doc*, each flow event checked to bind to its slice."""
    slices: dict[tuple, list[dict]] = {}
    for e in x_events(doc):
        slices.setdefault((e["pid"], e["tid"], e["cat"], e["ts"]), []).append(e)
    starts, ends = {}, {}
    for e in doc["traceEvents"]:
        if e["ph"] in ("s", "f"):
            assert set(e) == {"name", "cat", "ph", "id", "pid", "tid", "ts"} | ({"bp"} if e["ph"] == "f" else set()), e
            assert e.get("bp", "e") == "e", e
            table = starts if e["ph"] == "s" else ends
            assert e["id"] not in table, f"flow id {e['id']} used twice: {e}"
            table[e["id"]] = e
    assert set(starts) == set(ends), "every flow start has its end and no end lacks its start"
    pairs = []
    for key, out in starts.items():
        into = ends[key]
        assert (out["name"], out["cat"]) == (into["name"], into["cat"]), (out, into)

        def bound(flow: dict, names: dict) -> dict:
            (found,) = [e for e in slices.get((flow["pid"], flow["tid"], flow["cat"], flow["ts"]), [])
                        if names.get(e["name"]) == flow["name"]]
            return found

        pairs.append((bound(out, SENDS), bound(into, RECEIVES)))
    return pairs


def check_flows(doc: dict) -> None:
    """Every arrow joins a send to the receive of that very message: peers, tag, msg, bytes and dtype agree."""
    for send, receive in flow_pairs(doc):
        a, b = send["args"], receive["args"]
        assert a["peer"] == receive["pid"] - 1 and b["peer"] == send["pid"] - 1, (send, receive)
        assert (a["tag"], a["msg"], a["bytes"], a["dtype"]) == (b["tag"], b["msg"], b["bytes"], b["dtype"]), (a, b)


@pytest.fixture
def fresh(monkeypatch):
    """An empty event list and fresh sequence numbers for this test (restored afterwards)."""
    monkeypatch.setattr(trace, "_events", [])
    monkeypatch.setattr(trace, "_seq", {})
    monkeypatch.setattr(trace, "_dropped", 0)
    return trace


def shared_path(comm, tmp_path, name: str) -> str:
    """A path in rank 0's temporary directory, the same string on every rank."""
    return comm.bcast(str(tmp_path / name) if comm.rank == 0 else None, root=0)


# ---------------------------------------------------------------- off by default


def test_off_without_the_variable():
    if os.environ.get("MPICOMM_TRACE", "").strip():
        pytest.skip("MPICOMM_TRACE is set for this run")
    assert trace.ON is False
    assert trace.PATH is None


def test_calls_record_nothing_when_off(comm):
    if trace.ON:
        pytest.skip("MPICOMM_TRACE is set for this run")
    before = list(trace._events)
    x = rank_data(comm.rank, 20_000)  # two-part
    send = comm.isend_array(x, comm.rank, tag=5)
    assert np.array_equal(comm.recv_array(source=comm.rank, tag=5), x)
    send.Wait()
    with comm.rendezvous() as rv:
        rv.publish("x", x)
        assert np.array_equal(rv.pull("x", comm.rank), x)
    win = comm.expose(x.copy())
    win.put(x[:3], comm.rank)
    assert np.array_equal(win.get(comm.rank, count=3), x[:3])
    win.Free()
    assert trace._events == before


def test_flush_without_a_path_when_off_names_the_fix():
    if trace.ON:
        pytest.skip("MPICOMM_TRACE is set for this run")
    with pytest.raises(ValueError, match="MPICOMM_TRACE"):
        trace.flush()


# ---------------------------------------------------------------- recording


def test_steps_record_one_event_when_the_operation_returns_raises_or_is_cancelled(fresh):
    def operation(fail: bool):
        statuses = yield ["request"]
        if fail:
            raise ValueError("broken on purpose")
        return statuses

    done = trace.steps(operation(False), "op", "test", {"peer": 3})
    assert next(done) == ["request"]
    with pytest.raises(StopIteration) as stop:
        done.send("statuses")
    assert stop.value.value == "statuses"
    failed = trace.steps(operation(True), "op", "test", {"peer": 4})
    next(failed)
    with pytest.raises(ValueError, match="broken on purpose"):
        failed.send(None)
    cancelled = trace.steps(operation(False), "op", "test", {"peer": 5})
    next(cancelled)
    cancelled.close()
    unstarted = trace.steps(operation(False), "op", "test", {"peer": 6})
    del unstarted  # never started: no event, no sequence number

    events = trace._events
    assert [(e[0], e[1], e[5]) for e in events] == [
        ("op", "test", {"peer": 3, "seq": 0}),
        ("op", "test", {"peer": 4, "seq": 1, "error": "ValueError: broken on purpose"}),
        ("op", "test", {"peer": 5, "seq": 2, "cancelled": True}),
    ]
    assert all(e[2] <= e[3] for e in events)


def test_span_records_the_block_and_what_it_adds(fresh, monkeypatch):
    monkeypatch.setattr(trace, "ON", True)
    with trace.span("get", "rma", peer=1) as note:
        note["bytes"] = 24
    with pytest.raises(KeyError), trace.span("get", "rma", peer=2):
        raise KeyError("missing")
    assert [e[5] for e in trace._events] == [
        {"peer": 1, "seq": 0, "bytes": 24},
        {"peer": 2, "seq": 1, "error": "KeyError: 'missing'"},
    ]


def test_span_is_a_user_annotation_that_costs_nothing_when_off(fresh, monkeypatch):
    monkeypatch.setattr(trace, "ON", False)
    with trace.span("phase", step=3) as note:
        note["cells"] = 10
    with pytest.raises(ValueError), trace.span("failing"):
        raise ValueError("passes through")
    assert trace._events == [] and trace._seq == {}
    monkeypatch.setattr(trace, "ON", True)
    with trace.span("phase", step=4) as note:  # the documented example: category "user" by default
        with trace.span("inner", "compute"):
            pass
        note["cells"] = 10
    names = [(e[0], e[1], e[5]) for e in trace._events]
    assert names == [("inner", "compute", {"seq": 0}), ("phase", "user", {"step": 4, "seq": 0, "cells": 10})]
    (inner, outer) = trace._events
    assert outer[2] <= inner[2] <= inner[3] <= outer[3]  # nested on the lane
    assert "trace.span(" in trace.__doc__ and "span" in trace.__all__


def test_endpoints_name_messages_and_flows_pair_them():
    # (name, cat, start ns, end ns, thread, args) as _prepare makes them
    events0 = [("send_array", "p2p", 100, 150, 1, {"peer": 1, "tag": 5, "msg": 0}),
               ("send_array", "p2p", 200, 250, 1, {"peer": 1, "tag": 5, "msg": 1}),
               ("recv_array", "p2p", 300, 400, 1, {"peer": 1, "tag": 6, "msg": 0}),
               ("send_array", "p2p", 500, 510, 1, {"peer": -2, "tag": 5}),  # PROC_NULL: no message
               ("recv_array", "p2p", 600, 700, 1, {"peer": 1, "tag": 9, "cancelled": True}),  # no header came
               ("answer", "p2p", 800, 900, 1, {"peer": 1, "tag": 3, "msg": 0}),
               ("allreduce", "collective", 50, 1000, 1, {"peers": [1]})]
    events1 = [("recv_array", "p2p", 120, 160, 1, {"peer": 0, "tag": 5, "msg": 0}),
               ("recv_array", "p2p", 210, 260, 1, {"peer": 0, "tag": 5, "msg": 1}),
               ("send_array", "p2p", 290, 310, 1, {"peer": 0, "tag": 6, "msg": 0}),
               ("pull", "p2p", 700, 950, 1, {"peer": 0, "tag": 3, "msg": 0}),
               ("send_array", "p2p", 990, 995, 1, {"peer": 0, "tag": 6, "msg": 1})]  # its receive is not traced
    ends0 = trace._endpoints(0, events0, [0, 0, 0, 0, 0, 1, 0])
    ends1 = trace._endpoints(1, events1, [0, 2, 0, 0, 0])
    assert len(ends0) == 4 and len(ends1) == 5
    flows, unpaired = trace._flows(ends0 + ends1)
    assert unpaired == 1
    assert len(flows) == 8 and sorted(f["id"] for f in flows) == [1, 1, 2, 2, 3, 3, 4, 4]
    by_id: dict[int, dict] = {}
    for f in flows:
        by_id.setdefault(f["id"], {})[f["ph"]] = f
    got = sorted(((p["s"]["name"], p["s"]["pid"], p["s"]["tid"], p["s"]["ts"]),
                  (p["f"]["name"], p["f"]["pid"], p["f"]["tid"], p["f"]["ts"], p["f"]["bp"])) for p in by_id.values())
    assert got == sorted([
        (("message", 1, 0, 0.1), ("message", 2, 0, 0.12, "e")),  # rank 0's msg 0 to rank 1
        (("message", 1, 0, 0.2), ("message", 2, 2, 0.21, "e")),  # its msg 1, received on rank 1's row 2
        (("message", 2, 0, 0.29), ("message", 1, 0, 0.3, "e")),  # rank 1 to rank 0, received before it was sent
        (("rendezvous answer", 1, 1, 0.8), ("rendezvous answer", 2, 0, 0.7, "e")),
    ])
    assert all(f["cat"] == "p2p" for f in flows)


def test_flows_of_messages_with_the_same_name_pair_in_start_order():
    key = ("message", 0, 1, 5, 0)  # two communicators over the same ranks: the same name twice
    ends = [(*key, True, 0, 0, 200), (*key, True, 0, 0, 100), (*key, False, 1, 0, 250), (*key, False, 1, 1, 150)]
    flows, unpaired = trace._flows(ends)
    assert unpaired == 0
    pairs = {}
    for f in flows:
        pairs.setdefault(f["id"], {})[f["ph"]] = f["ts"]
    assert sorted((p["s"], p["f"]) for p in pairs.values()) == [(0.1, 0.15), (0.2, 0.25)]


def test_rows_keep_every_row_properly_nested():
    events = [("a", "c", 0.0, 10.0, 1, {}), ("b", "c", 1.0, 2.0, 1, {}), ("c", "c", 3.0, 12.0, 1, {}),
              ("d", "c", 11.0, 13.0, 1, {}), ("e", "c", 3.5, 4.0, 1, {})]
    tids, names = trace._rows(events)
    assert tids == [0, 0, 1, 0, 0]  # "c" straddles the end of "a": a row of its own; "e" nests in "a"
    assert len(names) == 2
    rng = np.random.default_rng(7)
    starts = rng.uniform(0, 100, 300)
    many = [("x", "c", s, s + d, 1, {}) for s, d in zip(starts, rng.exponential(5, 300))]
    tids, names = trace._rows(many)
    assert len(names) == max(tids) + 1
    for row in set(tids):
        assert_nested([{"ts": e[2], "dur": e[3] - e[2]} for e, t in zip(many, tids) if t == row])


# ---------------------------------------------------------------- flush, in process (collective)


def test_flush_gathers_every_rank_caps_and_aligns(comm, tmp_path, fresh, monkeypatch):
    monkeypatch.setattr(trace, "MAX_EVENTS", 3)
    path = shared_path(comm, tmp_path, "in-process.json")
    common = comm.bcast(trace.now() if comm.rank == 0 else None, root=0)  # one clock for the ranks of a host
    for i in range(comm.rank + 2):  # rank r records r+2 events; at most 3 are kept
        trace.record(f"e{i}", "test", common + i, common + i + 0.5, rank=comm.rank, i=i, values=[i, "x"])
    assert trace.dropped() == max(0, comm.rank + 2 - 3)
    trace.flush(path)
    hosts = comm.allgather(MPI.Get_processor_name())
    if comm.rank == 0:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        check_chrome_trace(doc, comm.size)
        other = doc["otherData"]
        assert other["events_per_rank"] == [min(r + 2, 3) for r in range(comm.size)]
        assert other["dropped_per_rank"] == [max(0, r + 2 - 3) for r in range(comm.size)]
        assert other["dropped_events"] == sum(other["dropped_per_rank"])
        assert other["hosts"] == hosts
        for r in range(comm.size):
            events = lane(doc, r, "test", by_seq=False)
            assert [e["name"] for e in events] == [f"e{i}" for i in range(min(r + 2, 3))]
            assert [e["args"] for e in events] == [{"rank": r, "i": i, "values": [i, "x"]} for i in range(len(events))]
            for i, e in enumerate(events):
                assert e["dur"] == pytest.approx(500_000, abs=0.01)
                assert e["ts"] - events[0]["ts"] == pytest.approx(i * 1e6, abs=0.01)
                if hosts[r] == hosts[0]:  # one clock per host: no correction, exactly aligned
                    assert e["ts"] == pytest.approx(i * 1e6, abs=0.01)


def test_flows_pair_every_send_with_its_receive(comm, tmp_path, fresh, monkeypatch):
    """At the run's rank count (2 under ``mpiexec -n 2``): every rank sends to every rank (itself too) an inline
    and a two-part message, receives them (the two-part ones from any source), and every send gets its arrow."""
    import mpicomm

    monkeypatch.setattr(trace, "ON", True)
    path = shared_path(comm, tmp_path, "flows.json")
    p, r = comm.size, comm.rank
    sends = [comm.isend_array(rank_data(r, 10 + d), d, tag=7) for d in range(p)]
    sends += [comm.isend_array(rank_data(r, 5000 + d), d, tag=8) for d in range(p)]  # 40 KB: two-part
    for source in range(p):
        assert np.array_equal(comm.recv_array(source=source, tag=7), rank_data(source, 10 + r))
    for _ in range(p):
        got = comm.recv_array(source=MPI.ANY_SOURCE, tag=8)
        assert got.size >= 5000
    mpicomm.Request.waitall(sends)
    with trace.span("after", step=1):
        pass
    trace.flush(path)
    if comm.rank == 0:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        check_chrome_trace(doc, p)
        pairs = flow_pairs(doc)
        assert len(pairs) == 2 * p * p  # every send of every rank
        assert doc["otherData"]["messages_paired"] == 2 * p * p
        assert doc["otherData"]["message_ends_unpaired"] == 0
        assert doc["otherData"]["pid"] == "rank + 1"
        assert sorted((s["pid"] - 1, s["args"]["peer"], s["args"]["tag"]) for s, _ in pairs) == sorted(
            (a, b, tag) for a in range(p) for b in range(p) for tag in (7, 8))
        for send, receive in pairs:
            assert send["name"] == "send_array" and receive["name"] == "recv_array"
            assert receive["args"]["bytes"] == (10 + receive["pid"] - 1 if send["args"]["tag"] == 7
                                                else 5000 + receive["pid"] - 1) * 8
        spans = [e for e in x_events(doc) if e["cat"] == "user"]
        assert sorted(e["pid"] for e in spans) == list(range(1, p + 1))
        assert all(e["name"] == "after" and e["args"] == {"step": 1, "seq": 0} for e in spans)


def test_flush_error_is_raised_on_every_rank(comm, tmp_path, fresh):
    path = shared_path(comm, tmp_path, "no-such-directory/trace.json")
    trace.record("e", "test", 0.0, 1.0)
    with pytest.raises(OSError, match="cannot write the trace to .*no-such-directory"):
        trace.flush(path)


# ---------------------------------------------------------------- launched jobs with MPICOMM_TRACE set

RANKS = 3


@pytest.fixture(scope="module")
def traced_job(tmp_path_factory):
    """Run tests/programs.py's ``traced`` on 3 ranks with the trace on; the parsed file."""
    path = tmp_path_factory.mktemp("trace") / "job.json"
    argv = [sys.executable, "-m", "mpi4py", "-m", "tests.programs", "traced"]
    result = mpirun.run(RANKS, argv, timeout=120, env={"MPICOMM_TRACE": str(path)})
    assert not result.timed_out and result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"ok": True, "ranks": RANKS}
    assert sorted(os.listdir(path.parent)) == ["job.json"]  # written atomically: no temporary left
    with open(path, encoding="utf-8") as f:
        return json.load(f)


@pytest.mark.launches
def test_trace_file_is_a_chrome_trace_with_a_lane_per_rank(traced_job):
    check_chrome_trace(traced_job, RANKS)
    assert traced_job["otherData"]["dropped_events"] == 0
    assert {e["pid"] for e in x_events(traced_job)} == set(range(1, RANKS + 1))
    assert not [e for e in x_events(traced_job) if "error" in e["args"] or "cancelled" in e["args"]]


@pytest.mark.launches
def test_one_event_per_point_to_point_call(traced_job):
    for r in range(RANKS):
        left, right = (r - 1) % RANKS, (r + 1) % RANKS
        expected = [
            ("send_array", {"peer": right, "tag": 11, "bytes": (10 + r) * 8, "dtype": "float64", "shape": [10 + r],
                            "msg": 0}),
            ("recv_array", {"peer": left, "tag": 11, "bytes": (10 + left) * 8, "dtype": "float64",
                            "shape": [10 + left], "msg": 0, "call": "recv_array"}),
            ("send_array", {"peer": right, "tag": 12, "bytes": (6000 + r) * 4, "dtype": "float32",
                            "shape": [6000 + r], "msg": 1}),
            ("recv_array", {"peer": left, "tag": 12, "bytes": (6000 + left) * 4, "dtype": "float32",
                            "shape": [6000 + left], "msg": 1, "call": "irecv_array"}),
            ("pull", {"peer": right, "key": f"part{right}", "offset": 2, "count": None, "bytes": (18 + right) * 8,
                      "dtype": "float64", "shape": [18 + right]}),
            ("answer", {"peer": left, "key": f"part{r}", "offset": 2, "count": 18 + r, "bytes": (18 + r) * 8,
                        "dtype": "float64", "shape": [18 + r]}),
        ]
        events = lane(traced_job, r, "p2p")
        assert [e["name"] for e in events] == [name for name, _ in expected], f"rank {r}"
        assert [e["args"]["seq"] for e in events] == list(range(len(expected)))
        for e, (_name, args) in zip(events, expected):
            assert {k: e["args"].get(k) for k in args} == args, f"rank {r}: {e}"
        starts = [e["ts"] for e in events[:5]]  # the calls, in call order (the answer runs when served)
        assert starts == sorted(starts)

    def find(rank: int, name: str, **args) -> dict:
        (e,) = [e for e in lane(traced_job, rank, "p2p") if e["name"] == name
                and all(e["args"][k] == v for k, v in args.items())]
        return e

    for r in range(RANKS):  # cause before effect, on clocks that ranks of one host share
        left, right = (r - 1) % RANKS, (r + 1) % RANKS
        received = find(r, "recv_array", tag=11)
        assert find(left, "send_array", tag=11)["ts"] < received["ts"] + received["dur"]
        pulled = find(r, "pull")
        answer = find(right, "answer")
        assert pulled["ts"] < answer["ts"] < pulled["ts"] + pulled["dur"]


@pytest.mark.launches
def test_every_message_is_an_arrow_from_its_send_to_its_receive(traced_job):
    """``traced``: each rank sends two typed messages to its right (tags 11, 12) and answers its left's pull."""
    pairs = flow_pairs(traced_job)
    assert traced_job["otherData"]["message_ends_unpaired"] == 0
    assert traced_job["otherData"]["messages_paired"] == len(pairs) == 3 * RANKS
    found = sorted((s["pid"] - 1, d["pid"] - 1, s["name"], d["name"], s["args"].get("tag"), d["args"].get("key"))
                   for s, d in pairs)
    expected = []
    for r in range(RANKS):
        right, left = (r + 1) % RANKS, (r - 1) % RANKS
        expected += [(r, right, "send_array", "recv_array", 11, None), (r, right, "send_array", "recv_array", 12, None),
                     (r, left, "answer", "pull", traced_job_answer_tag(pairs, r), f"part{r}")]
    assert found == sorted(expected)


def traced_job_answer_tag(pairs: list[tuple[dict, dict]], rank: int):
    """The tag of rank *rank*'s answer (chosen by the rendezvous, not by the program)."""
    (tag,) = [s["args"]["tag"] for s, d in pairs if s["name"] == "answer" and s["pid"] == rank + 1]
    return tag


@pytest.mark.launches
def test_one_event_per_one_sided_call(traced_job):
    for r in range(RANKS):
        left, right = (r - 1) % RANKS, (r + 1) % RANKS
        events = lane(traced_job, r, "rma")
        assert [(e["name"], e["args"]) for e in events] == [
            ("get", {"peer": right, "offset": 2, "count": 3, "bytes": 24, "dtype": "float64", "seq": 0}),
            ("put", {"peer": left, "offset": 5, "count": 2, "bytes": 16, "dtype": "float64", "seq": 1}),
        ], f"rank {r}"


@pytest.mark.launches
def test_one_event_per_collective_with_its_algorithm(traced_job):
    """Recorded by the dispatcher (mpicomm/coll/dispatch.py): the collectives the program calls, in order."""
    program = [("barrier", "dissemination", None, None), ("allreduce", "ring", None, 1000 * 8),
               ("bcast", "binomial", 1, 300 * 8), ("barrier", "dissemination", None, None)]
    seqs = []
    for r in range(RANKS):
        events = lane(traced_job, r, "collective")
        assert [(e["name"], e["args"]["algorithm"]) for e in events] == [(c, a) for c, a, _, _ in program], f"rank {r}"
        for e, (_, _, root, nbytes) in zip(events, program):
            args = e["args"]
            assert args["p"] == RANKS and "source" in args, e
            if root is not None:
                assert args["root"] == root, e
            if nbytes is not None:
                assert args["bytes"] == nbytes, e
            assert args["peers"] and set(args["peers"]) <= set(range(RANKS)) - {r}, e
        seqs.append([e["args"]["seq"] for e in events])
        assert seqs[-1] == sorted(set(seqs[-1])), f"rank {r}: sequence numbers {seqs[-1]}"
    assert all(s == seqs[0] for s in seqs), f"sequence numbers differ across ranks: {seqs}"


@pytest.mark.launches
def test_after_finalize_each_rank_writes_its_own_file_at_the_relative_path(tmp_path):
    """``traced_finalized``: relative MPICOMM_TRACE, resolved at import; MPI_Finalize before exit."""
    work = tmp_path / "work"
    work.mkdir()
    argv = [sys.executable, "-m", "mpi4py", "-m", "tests.programs", "traced_finalized", str(work)]
    result = mpirun.run(2, argv, timeout=60, env={"MPICOMM_TRACE": "relative.json"})
    assert not result.timed_out and result.returncode == 0, result.stderr[-3000:]
    assert sorted(os.listdir(work)) == ["relative.rank0.json", "relative.rank1.json"]
    for r in range(2):
        assert f"rank {r}: MPI is already finalized" in result.stderr
        with open(work / f"relative.rank{r}.json", encoding="utf-8") as f:
            doc = json.load(f)
        assert doc["otherData"]["rank"] == r
        events = x_events(doc)
        assert [(e["pid"], e["name"]) for e in sorted(events, key=lambda e: e["args"]["seq"])] == [
            (r + 1, "send_array"), (r + 1, "recv_array")]
        ((send, receive),) = flow_pairs(doc)  # the message to itself
        assert (send["name"], receive["name"]) == ("send_array", "recv_array")
        assert doc["otherData"]["messages_paired"] == 1
        for e in events:
            assert {k: e["args"][k] for k in ("peer", "tag", "bytes", "dtype", "msg")} == {
                "peer": r, "tag": 3, "bytes": (5 + r) * 8, "dtype": "int64", "msg": 0}
