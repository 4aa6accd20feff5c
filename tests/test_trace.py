"""mpicomm.trace: off by default, one event per call, a Chrome trace file with a lane per rank.

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
    events = [e for e in x_events(doc) if e["pid"] == rank and e["cat"] == cat]
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
    assert names == {r: f"rank {r} ({hosts[r]})" for r in range(ranks)}
    assert order == {r: r for r in range(ranks)}
    rows: dict[tuple[int, int], list[dict]] = {}
    for e in x_events(doc):
        assert set(e) == {"name", "cat", "ph", "ts", "dur", "pid", "tid", "args"}, e
        assert type(e["ts"]) in (int, float) and type(e["dur"]) in (int, float) and e["dur"] >= 0, e
        assert e["pid"] in range(ranks) and type(e["tid"]) is int, e
        rows.setdefault((e["pid"], e["tid"]), []).append(e)
    threads = {(e["pid"], e["tid"]) for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert set(rows) <= threads
    for events in rows.values():
        assert_nested(events)


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


def test_span_records_the_block_and_what_it_adds(fresh):
    with trace.span("get", "rma", peer=1) as note:
        note["bytes"] = 24
    with pytest.raises(KeyError):
        with trace.span("get", "rma", peer=2):
            raise KeyError("missing")
    assert [e[5] for e in trace._events] == [
        {"peer": 1, "seq": 0, "bytes": 24},
        {"peer": 2, "seq": 1, "error": "KeyError: 'missing'"},
    ]


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
    assert {e["pid"] for e in x_events(traced_job)} == set(range(RANKS))
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
        for e, (name, args) in zip(events, expected):
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
            (r, "send_array"), (r, "recv_array")]
        for e in events:
            assert {k: e["args"][k] for k in ("peer", "tag", "bytes", "dtype", "msg")} == {
                "peer": r, "tag": 3, "bytes": (5 + r) * 8, "dtype": "int64", "msg": 0}
