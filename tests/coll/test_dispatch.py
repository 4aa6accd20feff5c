"""mpicomm.coll.dispatch: nested calls for compositions, the choice's source, the trace hook, the validation digest."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from mpicomm.coll import agreement, dispatch
from mpicomm.requests import Request, run

from . import reference as R

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(120)]

WORLD = MPI.COMM_WORLD
P, RANK = WORLD.Get_size(), WORLD.Get_rank()


@pytest.fixture(scope="module")
def halves():
    """(mpicomm.Comm over this rank's half of the world - even or odd ranks -, the same as a plain MPI comm)."""
    plain = WORLD.Split(RANK % 2, RANK)
    sub = mpicomm.Comm(plain)
    yield sub, plain
    plain.Free()


# ---------------------------------------------------------------- nested


def _composite(sub: Any, world: Any, x: np.ndarray, out: np.ndarray, total: np.ndarray) -> Any:
    """A composition: allreduce within the half, then allreduce of that across the world; returns 7."""
    yield from dispatch.nested(sub, "allreduce", send=x, recv=out, op="sum")
    yield from dispatch.nested(world, "allreduce", send=out, recv=total, op=mpicomm.ops.BUILTIN["max"])
    return 7


@pytest.mark.parametrize("blocking", [True, False], ids=["run", "request"])
def test_nested_allreduce_on_a_sub_communicator(halves, blocking):
    sub, plain = halves
    world = mpicomm.Comm(WORLD)
    x = R.data(RANK, 11, np.int64)
    out, total = np.zeros_like(x), np.zeros_like(x)
    before = sub._state.collectives
    if blocking:
        assert run(_composite(sub, world, x, out, total)) == 7
    else:
        assert Request(_composite(sub, world, x, out, total)).wait() == 7
    expected = np.empty_like(x)
    plain.Allreduce(x, expected)
    R.assert_matches(out, expected, "nested allreduce on the half")
    best = np.empty_like(x)
    WORLD.Allreduce(expected, best, op=MPI.MAX)
    R.assert_matches(total, best, "nested allreduce across the world")
    assert sub._state.collectives == before + 1, "a nested call takes one sequence number of its own communicator"


def _one(comm: Any, collective: str, **kwargs: Any) -> Any:
    return run(dispatch.nested(comm, collective, **kwargs))


def test_nested_collectives_match_the_library(halves):
    sub, plain = halves
    p, rank = plain.Get_size(), plain.Get_rank()
    n = 5
    x = R.data(rank, n, np.int64)
    root = p - 1

    buf = x.copy() if rank == root else np.zeros(n, np.int64)
    _one(sub, "bcast", recv=buf, root=root)
    R.assert_matches(buf, R.data(root, n, np.int64), "nested bcast")

    got = np.zeros(n, np.int64) if rank == root else None
    _one(sub, "reduce", send=x, recv=got, op="max", root=root)
    if rank == root:
        expected = np.empty_like(x)
        plain.Reduce(x, expected, op=MPI.MAX, root=root)
        R.assert_matches(got, expected, "nested reduce")
    else:
        plain.Reduce(x, None, op=MPI.MAX, root=root)

    gathered = np.zeros(n * p, np.int64)
    _one(sub, "allgather", send=x, recv=gathered)
    expected = np.empty_like(gathered)
    plain.Allgather(x, expected)
    R.assert_matches(gathered, expected, "nested allgather")

    big = R.data(rank, n * p, np.int64)
    mixed = np.zeros_like(big)
    _one(sub, "alltoall", send=big, recv=mixed)
    expected = np.empty_like(big)
    plain.Alltoall(big, expected)
    R.assert_matches(mixed, expected, "nested alltoall")

    block = np.zeros(n, np.int64)
    _one(sub, "reduce_scatter_block", send=big, recv=block, op="sum")
    expected = np.empty_like(block)
    plain.Reduce_scatter_block(big, expected)
    R.assert_matches(block, expected, "nested reduce_scatter_block")

    counts = [r + 1 for r in range(p)]
    mine = R.data(rank, counts[rank], np.int64)
    every = np.zeros(sum(counts), np.int64)
    _one(sub, "allgatherv", send=mine, recv=every, recvcounts=counts)
    expected = np.empty_like(every)
    plain.Allgatherv(mine, [expected, counts])
    R.assert_matches(every, expected, "nested allgatherv")

    scan = np.zeros(n, np.int64)
    _one(sub, "scan", send=x, recv=scan, op="sum")
    expected = np.empty_like(x)
    plain.Scan(x, expected)
    R.assert_matches(scan, expected, "nested scan")


def test_nested_in_place_gather(halves):
    sub, plain = halves
    p, rank = plain.Get_size(), plain.Get_rank()
    n = 3
    x = R.data(rank, n, np.float64)
    if rank == 0:
        whole = np.zeros(n * p)
        whole[:n] = x
        _one(sub, "gather", send=whole[:n], recv=whole, root=0, count=n)
        expected = np.empty_like(whole)
        plain.Gather(x, expected, root=0)
        R.assert_matches(whole, expected, "nested in-place gather")
    else:
        _one(sub, "gather", send=x, root=0)
        plain.Gather(x, None, root=0)


def test_nested_named_algorithm_and_source(halves, monkeypatch):
    sub, plain = halves
    x = R.data(plain.Get_rank(), 4, np.int64)
    made = _spy_calls(monkeypatch, sub)
    from mpicomm import registry

    runnable = [a for a in mpicomm.algorithms("allreduce")  # shared memory needs one node (not so under --ranks 2x2)
                if sub.nodes == 1 or not registry.lookup("allreduce", a).single_node]
    for algorithm in runnable:
        out = np.zeros_like(x)
        _one(sub, "allreduce", send=x, recv=out, algorithm=algorithm)
        expected = np.empty_like(x)
        plain.Allreduce(x, expected)
        R.assert_matches(out, expected, f"nested allreduce {algorithm}")
    _one(sub, "allreduce", send=x, recv=np.zeros_like(x))
    assert made[:-1] == [(a, "call") for a in runnable]
    assert made[-1][1] in ("table", "model", "environment"), made[-1]


def test_nested_calls_know_whether_the_outer_call_blocks(halves):
    from mpicomm import registry

    sub, _ = halves
    blocking_only = [n for n in mpicomm.algorithms("allreduce")
                     if getattr(registry.lookup("allreduce", n), "blocking_only", False)]
    if not blocking_only:
        pytest.skip("no allreduce algorithm runs blocking calls only")
    x = np.zeros(2)
    with pytest.raises(ValueError, match="blocking"):
        _one(sub, "allreduce", send=x, recv=x.copy(), algorithm=blocking_only[0], blocking=False)


def test_nested_rejects_what_it_cannot_run(halves):
    sub, _ = halves
    x = np.zeros(2)
    with pytest.raises(ValueError, match="unknown collective 'allreduse'"):
        _one(sub, "allreduse", send=x, recv=x)
    with pytest.raises(ValueError, match=f"root {sub.Get_size()} is not a rank"):
        _one(sub, "bcast", recv=x, root=sub.Get_size())
    with pytest.raises(ValueError, match="unknown allreduce algorithm 'nope'"):
        _one(sub, "allreduce", send=x, recv=x.copy(), algorithm="nope")
    sub.Barrier()  # nothing was left half-done: the next collective works


# ---------------------------------------------------------------- the choice and its source


def _spy_calls(monkeypatch, on: Any) -> list:
    """The (algorithm, source) of every Call the dispatcher makes on communicator *on* from now on."""
    made: list = []
    original = dispatch._call

    def spy(state: Any, *a: Any) -> Any:
        call = original(state, *a)
        if state is on._state:
            made.append((call.algorithm, call.source))
        return call

    monkeypatch.setattr(dispatch, "_call", spy)
    return made


def test_the_call_knows_where_its_algorithm_came_from(comm, monkeypatch):
    made = _spy_calls(monkeypatch, comm)
    monkeypatch.delenv("MPICOMM_BCAST_ALGORITHM", raising=False)
    buf = R.data(RANK, 3, np.float64) if RANK == 0 else np.zeros(3)
    comm.Bcast(buf, 0, algorithm="linear")
    comm.set_algorithm("bcast", "binomial")
    try:
        comm.Bcast(buf, 0)
        comm.Bcast(buf, 0, algorithm="auto")  # auto on the call defers to the communicator
    finally:
        comm.set_algorithm("bcast", None)
    monkeypatch.setenv("MPICOMM_BCAST_ALGORITHM", "linear")
    comm.Bcast(buf, 0)
    monkeypatch.delenv("MPICOMM_BCAST_ALGORITHM")
    comm.Bcast(buf, 0)
    assert made[:4] == [("linear", "call"), ("binomial", "communicator"), ("binomial", "communicator"),
                        ("linear", "environment")]
    assert made[4][1] in ("model", "table"), made
    R.assert_matches(buf, R.data(0, 3, np.float64), "bcast")


def test_choices_are_kept_per_communicator_and_follow_changes(comm, monkeypatch):
    from mpicomm import registry

    x = R.data(RANK, 5, np.int64)
    out = np.zeros_like(x)
    comm.Allreduce(x, out, algorithm="naive")
    kept = dict(comm._state.choices)
    comm.Allreduce(x, out, algorithm="naive")
    assert comm._state.choices == kept, "the same facts again: the kept choice, nothing new"
    made = _spy_calls(monkeypatch, comm)
    rules = [{"algorithm": "tree"}]
    monkeypatch.setitem(registry.SELECTION, "allreduce", rules)  # a new rule list: choices are made again
    comm.Allreduce(x, out)
    if comm.machine is None:
        assert made[-1] == ("tree", "table")
    expected = np.empty_like(x)
    WORLD.Allreduce(x, expected)
    R.assert_matches(out, expected, "allreduce after a table change")


# ---------------------------------------------------------------- the agreement


def _steps_of(comm, args: dispatch.Args, algorithm: str) -> tuple[int, Any]:
    """Run the agreement for *args* on every rank; (steps it took, its outcome: True/False or the error text)."""
    chosen, source = dispatch._choose(comm, args, algorithm)
    call = dispatch._call(comm._state, args, chosen, source)
    steps = agreement.agreement(call, args)
    count = 0
    try:
        step = next(steps)
        while True:
            count += 1
            statuses = [MPI.Status() for _ in step]
            MPI.Request.Waitall(list(step), statuses)
            for finish in getattr(step, "after", []):
                finish()
            step = steps.send(statuses)
    except StopIteration as stop:
        return count, stop.value
    except dispatch.ArgumentError as exc:
        return count, str(exc)


def _allreduce_args(n: int, op: Any = "sum") -> dispatch.Args:
    x = R.data(RANK, n, np.float64)
    return dispatch.Args("allreduce", xp=np, dtype=x.dtype, send=x, recv=np.zeros_like(x), count=n,
                         op=mpicomm.ops.resolve(op))


def test_agreeing_ranks_need_one_round(comm):
    assert _steps_of(comm, _allreduce_args(4), "recursive_doubling") == (1, False)


@pytest.mark.skipif(P < 2, reason="needs two ranks to disagree")
def test_disagreeing_ranks_need_a_second_round_and_name_the_problem(comm):
    count, outcome = _steps_of(comm, _allreduce_args(5 if RANK == 1 else 4), "recursive_doubling")
    assert count > 1
    assert "ranks disagree on the count" in outcome and "5 elements on rank(s) 1" in outcome


def test_a_problem_on_one_rank_is_raised_everywhere(comm):
    args = _allreduce_args(4)
    if RANK == P - 1:
        args.fail(ValueError("something is wrong here"))
    count, outcome = _steps_of(comm, args, "recursive_doubling")
    assert count > 1 or P == 1, "a second round (one rank has nobody to exchange with)"
    assert f"rank {P - 1}: something is wrong here" in outcome


def test_cross_checked_counts_always_compare_the_rows(comm):
    counts = tuple(r + 1 for r in range(P))
    x = R.data(RANK, counts[RANK], np.float64)
    args = dispatch.Args("gatherv", xp=np, dtype=x.dtype, send=x, root=0)
    if RANK == 0:
        args.recv, args.recvcounts, args.recvdispls = np.zeros(sum(counts)), counts, dispatch._packed(counts)
    count, outcome = _steps_of(comm, args, "linear")
    assert (count > 1 or P == 1) and outcome is False


def _digest_of(args: dispatch.Args, algorithm: str = "ring", p: int = 4, rank: int = 0) -> bytes:
    call = SimpleNamespace(collective=args.collective, algorithm=algorithm)
    vector = agreement._vector(args, p, rank) if args.collective in agreement._VECTORED else []
    return agreement._digest(call, args, vector, False).tobytes()


def test_the_digest_changes_with_everything_the_ranks_must_agree_on():
    def base(**changes: Any) -> dispatch.Args:
        fields = dict(xp=np, dtype=np.dtype(np.float64), count=8, root=0, op=mpicomm.ops.resolve("sum"))
        fields.update(changes)
        return dispatch.Args(fields.pop("collective", "allreduce"), **fields)

    reference = _digest_of(base())
    assert _digest_of(base()) == reference, "the same call, the same digest"
    variants = {
        "collective": base(collective="reduce"),
        "algorithm": None,
        "dtype": base(dtype=np.dtype(np.float32)),
        "dtype-byte-order": base(dtype=np.dtype(">f8")),
        "count": base(count=9),
        "root": base(root=1),
        "op": base(op=mpicomm.ops.resolve("max")),
        "commutativity": base(op=mpicomm.ops.create(np.add, commutative=False, name="sum")),
        "native": base(unsupported="a derived datatype"),
        "can-native": base(native=lambda: None),
    }
    for name, args in variants.items():
        digest = _digest_of(base(), algorithm="tree") if args is None else _digest_of(args)
        assert digest != reference, f"the digest ignores the {name}"
    counts = base(collective="reduce_scatter", recvcounts=(1, 2, 3, 4), count=-1)
    other = base(collective="reduce_scatter", recvcounts=(1, 2, 4, 3), count=-1)
    assert _digest_of(counts) != _digest_of(other), "the digest ignores the v-counts"
    mine = base(collective="allgatherv", recvcounts=(1, 2, 3, 4), recvdispls=(0, 1, 3, 6), count=-1,
                send=np.zeros(1))
    theirs = base(collective="allgatherv", recvcounts=(1, 2, 3, 4), recvdispls=(0, 1, 3, 6), count=-1,
                  send=np.zeros(2))
    assert _digest_of(mine, rank=0) == _digest_of(theirs, rank=1), "each rank's own allgatherv size is checked locally"


# ---------------------------------------------------------------- the trace event


@pytest.fixture
def events(monkeypatch):
    """Trace events recorded from now on (tracing switched on for the test)."""
    from mpicomm import trace

    got: list = []
    monkeypatch.setattr(trace, "ON", True)
    monkeypatch.setattr(trace, "record", lambda name, cat, start, end, **args: got.append((name, cat, start, end, args)))
    return got


def test_one_trace_event_per_collective(comm, events):
    x = R.data(RANK, 6, np.float64)
    out = np.zeros_like(x)
    seq = comm._state.collectives
    comm.Allreduce(x, out, algorithm="recursive_doubling")
    request = comm.Ibcast(out, root=P - 1, algorithm="linear")
    assert len(events) == 1, "a nonblocking call is recorded when it completes"
    request.Wait()
    assert [e[0] for e in events] == ["allreduce", "bcast"]
    name, cat, start, end, args = events[0]
    assert cat == "collective" and start <= end
    partners = sorted({RANK ^ (1 << k) for k in range((P - 1).bit_length()) if RANK ^ (1 << k) < P}) if P & (P - 1) == 0 else None
    assert args["algorithm"] == "recursive_doubling" and args["source"] == "call"
    assert (args["bytes"], args["count"], args["dtype"], args["seq"], args["root"], args["p"]) == (48, 6, "float64", seq, 0, P)
    if partners is not None:
        assert args["peers"] == partners
    _, _, _, _, bcast = events[1]
    assert bcast["seq"] == seq + 1 and bcast["root"] == P - 1 and bcast["algorithm"] == "linear"
    expected = [] if P == 1 else ([r for r in range(P) if r != RANK] if RANK == P - 1 else [P - 1])
    assert bcast["peers"] == expected


def test_a_failed_collective_is_recorded_with_its_error(comm, events):
    x = R.data(RANK, 2, np.float64)
    with pytest.raises(mpicomm.ArgumentError):
        comm.Allreduce(x, np.zeros(2), "band")
    (name, _, _, _, args), = events
    assert name == "allreduce" and "op band is not defined on dtype float64" in args["error"]


def test_nested_calls_are_events_of_their_own(halves, events):
    sub, plain = halves
    world = mpicomm.Comm(WORLD)
    x = R.data(RANK, 3, np.int64)
    out, total = np.zeros_like(x), np.zeros_like(x)
    seq = sub._state.collectives
    run(_composite(sub, world, x, out, total))
    assert [e[0] for e in events] == ["allreduce", "allreduce"]
    inner = events[0][4]
    assert inner["p"] == plain.Get_size() and inner["seq"] == seq and inner["source"] in ("table", "model")
    assert all(0 <= r < plain.Get_size() and r != plain.Get_rank() for r in inner["peers"])


def test_a_composition_never_chooses_itself_for_its_inner_calls(comm, monkeypatch):
    """Hierarchical bcast/allreduce on one node: the node level is the whole communicator. Even when the
    environment names hierarchical for every call, its inner calls choose another algorithm (no recursion)."""
    from mpicomm import registry

    monkeypatch.setenv("MPICOMM_BCAST_ALGORITHM", "hierarchical")
    monkeypatch.setenv("MPICOMM_ALLREDUCE_ALGORITHM", "hierarchical")
    x = R.data(comm.rank, 9, np.int64)
    out, expected = np.zeros_like(x), np.zeros_like(x)
    comm.Allreduce(x, out)
    WORLD.Allreduce(x, expected)
    R.assert_matches(out, expected, "hierarchical allreduce with hierarchical named for every bcast")
    buf = R.data(comm.rank, 5, np.int64)
    comm.Bcast(buf, root=0)
    R.assert_matches(buf, R.data(0, 5, np.int64), "hierarchical bcast named by the environment")
    facts = {"p": comm.size, "nodes": 1, "nested": True, "bytes": 8}
    assert registry.allowed(registry.lookup("bcast", "hierarchical"), facts) is not None
    assert registry.choose("bcast", None, None, facts)[0].name != "hierarchical"
