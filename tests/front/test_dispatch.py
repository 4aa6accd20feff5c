"""mpicomm.front.dispatch: selection and its source, kept plans and the fast path, nested plans, trace events."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from mpicomm import registry, selection
from mpicomm.engine.executor import complete
from mpicomm.facts import Facts
from mpicomm.front import dispatch

from ..coll import reference as R

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


def _nested(comm: Any, collective: str, **kwargs: Any) -> dispatch.Plan:
    """Make the plan of a nested call on *comm* and run it to its end."""
    plan = dispatch.planner(comm._state, collective, **kwargs)
    run = plan.run(comm._state.next_seq())
    run.start()
    complete(run)
    run.raise_error()
    return plan


# ---------------------------------------------------------------- nested plans (compositions)


def test_nested_collectives_match_the_library(halves):
    sub, plain = halves
    p, rank = plain.Get_size(), plain.Get_rank()
    n = 5
    x = R.data(rank, n, np.int64)
    root = p - 1

    buf = x.copy() if rank == root else np.zeros(n, np.int64)
    _nested(sub, "bcast", recv=buf, root=root)
    R.assert_matches(buf, R.data(root, n, np.int64), "nested bcast")

    got = np.zeros(n, np.int64) if rank == root else None
    _nested(sub, "reduce", send=x, recv=got, op="max", root=root)
    expected = np.empty_like(x)
    plain.Reduce(x, expected if rank == root else None, op=MPI.MAX, root=root)
    if rank == root:
        R.assert_matches(got, expected, "nested reduce")

    gathered = np.zeros(n * p, np.int64)
    _nested(sub, "allgather", send=x, recv=gathered)
    expected = np.empty_like(gathered)
    plain.Allgather(x, expected)
    R.assert_matches(gathered, expected, "nested allgather")

    big = R.data(rank, n * p, np.int64)
    mixed = np.zeros_like(big)
    _nested(sub, "alltoall", send=big, recv=mixed)
    expected = np.empty_like(big)
    plain.Alltoall(big, expected)
    R.assert_matches(mixed, expected, "nested alltoall")

    block = np.zeros(n, np.int64)
    _nested(sub, "reduce_scatter_block", send=big, recv=block, op="sum")
    expected = np.empty_like(block)
    plain.Reduce_scatter_block(big, expected)
    R.assert_matches(block, expected, "nested reduce_scatter_block")

    counts = [r + 1 for r in range(p)]
    mine = R.data(rank, counts[rank], np.int64)
    every = np.zeros(sum(counts), np.int64)
    _nested(sub, "allgatherv", send=mine, recv=every, recvcounts=counts)
    expected = np.empty_like(every)
    plain.Allgatherv(mine, [expected, counts])
    R.assert_matches(every, expected, "nested allgatherv")

    scan = np.zeros(n, np.int64)
    _nested(sub, "scan", send=x, recv=scan, op="sum")
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
        _nested(sub, "gather", send=whole[:n], recv=whole, root=0, count=n)
        expected = np.empty_like(whole)
        plain.Gather(x, expected, root=0)
        R.assert_matches(whole, expected, "nested in-place gather")
    else:
        _nested(sub, "gather", send=x, root=0)
        plain.Gather(x, None, root=0)


def test_nested_named_algorithm_and_source(halves):
    sub, plain = halves
    x = R.data(plain.Get_rank(), 4, np.int64)
    runnable = [a for a in mpicomm.algorithms("allreduce")  # shared memory needs one node (not so under --ranks 2x2)
                if registry.allowed(registry.lookup("allreduce", a), Facts(nodes=sub.nodes, nested=True)) is None]
    for algorithm in runnable:
        out = np.zeros_like(x)
        plan = _nested(sub, "allreduce", send=x, recv=out, algorithm=algorithm)
        assert (plan.algorithm.name, plan.source) == (algorithm, "call")
        expected = np.empty_like(x)
        plain.Allreduce(x, expected)
        R.assert_matches(out, expected, f"nested allreduce {algorithm}")
    plan = _nested(sub, "allreduce", send=x, recv=np.zeros_like(x))
    assert plan.source in ("table", "environment", "rules"), plan.source


def test_nested_rejects_what_it_cannot_run(halves):
    sub, _ = halves
    x = np.zeros(2)
    with pytest.raises(ValueError, match="unknown collective 'allreduse'"):
        dispatch.planner(sub._state, "allreduse", send=x, recv=x)
    with pytest.raises(ValueError, match=f"root {sub.Get_size()} is not a rank"):
        dispatch.planner(sub._state, "bcast", recv=x, root=sub.Get_size())
    with pytest.raises(ValueError, match="unknown allreduce algorithm 'nope'"):
        dispatch.planner(sub._state, "allreduce", send=x, recv=x.copy(), algorithm="nope")
    sub.Barrier()  # nothing was left half-done: the next collective works


# ---------------------------------------------------------------- the choice, its source, kept plans


def _kept(comm: Any, collective: str) -> list[dispatch.Plan]:
    return [plan for plan in comm._state.plans.values() if plan.collective == collective]


def test_the_plan_knows_where_its_algorithm_came_from(comm, monkeypatch):
    monkeypatch.delenv("MPICOMM_BCAST_ALGORITHM", raising=False)
    buf = R.data(RANK, 3, np.float64) if RANK == 0 else np.zeros(3)
    sources = []

    def last() -> tuple[str, str]:
        plan = _kept(comm, "bcast")[-1]
        return plan.algorithm.name, plan.source

    comm._state.plans.clear()
    comm.Bcast(buf, 0, algorithm="linear")
    sources.append(last())
    comm.set_algorithm("bcast", "binomial")
    try:
        comm.Bcast(buf, 0)
        sources.append(last())
    finally:
        comm.set_algorithm("bcast", None)
    monkeypatch.setenv("MPICOMM_BCAST_ALGORITHM", "pipeline")
    comm.Bcast(buf, 0)
    sources.append(last())
    assert sources == [("linear", "call"), ("binomial", "communicator"), ("pipeline", "environment")]
    R.assert_matches(buf, R.data(0, 3, np.float64), "bcast")


def test_a_repeated_call_reuses_its_plan_and_follows_changes(comm, monkeypatch):
    x = R.data(RANK, 5, np.int64)
    out = np.zeros_like(x)
    expected = np.empty_like(x)
    WORLD.Allreduce(x, expected)
    comm._state.plans.clear()
    comm._state.fast.clear()
    comm._state.seen.clear()
    comm.Allreduce(x, out, algorithm="naive")  # (the first call on these arrays: the staged plan of their shape)
    comm.Allreduce(x, out, algorithm="naive")
    assert len(comm._state.fast) == 1, "a blocking call on plain arrays is remembered for the fast path"
    plans = dict(comm._state.plans)
    for _ in range(3):
        out[:] = 0
        comm.Allreduce(x, out, algorithm="naive")
        R.assert_matches(out, expected, "repeated allreduce")
    assert comm._state.plans == plans, "the same signature again: the kept plan, nothing new"
    other = np.zeros_like(x)
    comm.Allreduce(x, other, algorithm="naive")  # another output array: the staged plan again, then its own
    assert len(comm._state.plans) == len(plans)
    comm.Allreduce(x, other, algorithm="naive")
    assert len(comm._state.plans) == len(plans) + 1
    monkeypatch.setenv("MPICOMM_ALLREDUCE_ALGORITHM", "tree")  # a setting the plan depends on changes
    comm.Allreduce(x, out)
    assert _kept(comm, "allreduce")[-1].algorithm.name == "tree"
    R.assert_matches(out, expected, "allreduce after a setting changed")


def test_a_kept_plan_never_keeps_the_callers_arrays_alive(comm):
    import gc
    import weakref

    x = R.data(RANK, 7, np.float64)
    out = np.zeros_like(x)
    comm.Allreduce(x, out)
    comm.Allreduce(x, out)
    refs = weakref.ref(x), weakref.ref(out)
    del x, out
    gc.collect()
    assert refs[0]() is None and refs[1]() is None
    y = R.data(RANK, 7, np.float64)  # (the memory may be reused: the plan finds the arrays by address)
    got = np.zeros_like(y)
    comm.Allreduce(y, got)
    expected = np.empty_like(y)
    WORLD.Allreduce(y, expected)
    R.assert_matches(got, expected, "allreduce after the first arrays were freed")


def test_a_composition_never_chooses_itself_for_its_inner_calls(comm, monkeypatch):
    """Hierarchical bcast/allreduce on one node: the node level is the whole communicator. Even when the
    environment names hierarchical for every call, its inner calls choose another algorithm (no recursion)."""
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
    facts = Facts(p=comm.size, nodes=1, nested=True, bytes=8)
    assert registry.allowed(registry.lookup("bcast", "hierarchical"), facts) is not None
    assert selection.choose("bcast", None, None, facts)[0].name != "hierarchical"


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
    request.Wait()
    assert [e[0] for e in events] == ["allreduce", "bcast"]
    name, cat, start, end, args = events[0]
    assert cat == "collective" and start <= end
    assert args["algorithm"] == "recursive_doubling" and args["source"] == "call"
    assert (args["bytes"], args["count"], args["dtype"], args["seq"], args["root"], args["p"]) == (48, 6, "float64", seq, 0, P)
    if P & (P - 1) == 0:
        assert args["peers"] == sorted({RANK ^ (1 << k) for k in range((P - 1).bit_length())} - {RANK})
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


def _call(comm: Any, collective: str, x: np.ndarray, y: np.ndarray | None) -> None:
    """*collective* on *comm* (mpicomm's or the library's) with send *x* and receive *y* (root 1 % P)."""
    root = 1 % P
    if collective == "allreduce":
        comm.Allreduce(x, y)
    elif collective == "allreduce in place":
        comm.Allreduce(MPI.IN_PLACE, y)
    elif collective == "bcast":
        comm.Bcast(y, root=root)
    elif collective == "reduce":
        comm.Reduce(x, y if root == RANK else None, root=root)
    elif collective == "exscan":
        comm.Exscan(x, y)
    elif collective == "gather":
        comm.Gather(x, y if root == RANK else None, root=root)
    elif collective == "allgather":
        comm.Allgather(x, y)
    elif collective == "alltoall":
        comm.Alltoall(x, y)
    elif collective == "reduce_scatter_block":
        comm.Reduce_scatter_block(x, y)
    else:
        raise AssertionError(collective)


@pytest.mark.parametrize("collective", ["allreduce", "allreduce in place", "bcast", "reduce", "exscan", "gather",
                                        "allgather", "alltoall", "reduce_scatter_block"])
def test_new_arrays_on_every_call_run_one_staged_plan_of_their_shape(comm, collective, monkeypatch):
    """A loop that makes new (small) arrays on every call compiles one plan for their shape, run on its own arrays
    with the call's copied in and the result copied out, and matches the library on rank-, index- and
    call-dependent data (rank 0's Exscan output left as it was); the second call on the same arrays compiles
    their own plan, which the third runs through the fast path with no copies."""
    builds = []
    monkeypatch.setattr(dispatch, "build", lambda *a, _f=dispatch.build, **k: builds.append(1) or _f(*a, **k))
    comm._state.plans.clear()
    comm._state.fast.clear()
    comm._state.seen.clear()
    count = 3
    send_count = count * P if collective in ("alltoall", "reduce_scatter_block") else count
    recv_count = count * P if collective in ("gather", "allgather", "alltoall") else count
    kept = []  # (alive: every call's arrays at new addresses)
    for call in range(6):
        x = R.data(RANK, send_count, np.int64) * (call + 2)
        y = R.data(RANK, recv_count, np.int64) - 100 * call  # (read by bcast, in place; kept by rank 0's Exscan)
        expected = y.copy()
        _call(WORLD, collective, x.copy(), expected)
        _call(comm, collective, x, y)
        R.assert_matches(y, expected, f"{collective}, call {call} on new arrays")
        kept.append((x, y))
    assert len(builds) == 1, f"{len(builds)} plans compiled for 6 calls of one shape on new arrays"
    x, y = kept[0]
    for again in range(2):
        y[:] = R.data(RANK, recv_count, np.int64) + again
        expected = y.copy()
        _call(WORLD, collective, x.copy(), expected)
        _call(comm, collective, x, y)
        R.assert_matches(y, expected, f"{collective}, the first call's arrays again ({again + 1})")
    assert len(builds) == 2, "the second call on the same arrays compiles their plan, the third reuses it"


def _icall(comm: Any, collective: str, x: np.ndarray, y: np.ndarray) -> Any:
    """The nonblocking *collective* on *comm* (mpicomm's or the library's): its request."""
    root = 1 % P
    if collective == "allreduce":
        return comm.Iallreduce(x, y)
    if collective == "allreduce in place":
        return comm.Iallreduce(MPI.IN_PLACE, y)
    if collective == "bcast":
        return comm.Ibcast(y, root=root)
    if collective == "gather":
        return comm.Igather(x, y if root == RANK else None, root=root)
    if collective == "allgather":
        return comm.Iallgather(x, y)
    if collective == "alltoall":
        return comm.Ialltoall(x, y)
    raise AssertionError(collective)


@pytest.mark.parametrize("collective", ["allreduce", "allreduce in place", "bcast", "gather", "allgather",
                                        "alltoall"])
def test_nonblocking_calls_on_new_arrays_run_staged_plans_of_their_shape(comm, collective, monkeypatch):
    """Nonblocking calls on new (small) arrays: up to STAGED_IN_FLIGHT in flight at once run the staged plans of
    their shape, each result copied out when its run ends (before the request says done), and match the library
    on rank-, index- and call-dependent data; one more in flight compiles a plan for its arrays (the arrays kept
    alive, so no two calls share an address)."""
    builds = []
    monkeypatch.setattr(dispatch, "build", lambda *a, _f=dispatch.build, **k: builds.append(1) or _f(*a, **k))
    comm._state.plans.clear()
    comm._state.fast.clear()
    comm._state.seen.clear()
    most = dispatch.STAGED_IN_FLIGHT
    count = 3
    send_count = count * P if collective == "alltoall" else count
    recv_count = count * P if collective in ("gather", "allgather", "alltoall") else count
    kept = []  # (alive: every call's arrays at new addresses)
    for round_ in range(3):
        calls = []
        for k in range(most + (round_ == 2)):  # (the last round: one more than there are staged plans)
            tag = 10 * round_ + k
            x = R.data(RANK, send_count, np.int64) * (tag + 2)
            y = R.data(RANK, recv_count, np.int64) - 100 * tag
            expected = y.copy()
            _call(WORLD, collective, x.copy(), expected)
            calls.append((_icall(comm, collective, x, y), x, y, expected, tag))
        for request, _x, y, expected, tag in reversed(calls):  # (waited for in the other order)
            request.Wait()
            R.assert_matches(y, expected, f"nonblocking {collective}, call {tag} on new arrays")
        kept.append(calls)
    # (a run may end inside its call, which frees its staged plan at once: so at most, not exactly)
    assert 1 <= len(builds) <= most + 1, f"{len(builds)} plans compiled for {3 * most + 1} calls of one shape"


@pytest.mark.parametrize("collective", ["allreduce", "allreduce in place", "allgather", "alltoall"])
def test_ranks_on_staged_and_on_own_plans_agree_across_failed_calls(comm, collective):
    """The same small call runs the staged plan of its shape on the even ranks (new arrays every call) and the
    arrays' own plan on the odd ones (the same arrays, then the fast path), with a call that fails on a
    disagreement every third time (the communicator moves to fresh tags): every result matches the library on
    rank-, index- and call-dependent data, so the two kinds of plan send the same messages in every epoch."""
    count = 3
    send_count = count * P if collective == "alltoall" else count
    recv_count = count * P if collective in ("allgather", "alltoall") else count
    mine: dict[str, np.ndarray] = {}

    def array(name: str, n: int) -> np.ndarray:
        if RANK % 2 == 0:
            return np.empty(n, np.int64)
        return mine.setdefault(name, np.empty(n, np.int64))

    for call in range(12):
        x, y = array("x", send_count), array("y", recv_count)
        x[:] = R.data(RANK, send_count, np.int64) * (call + 2)
        y[:] = R.data(RANK, recv_count, np.int64) - call
        expected = y.copy()
        _call(WORLD, collective, x.copy(), expected)
        _call(comm, collective, x, y)
        R.assert_matches(y, expected, f"{collective}, call {call}")
        if call % 3 == 0 and P > 1:
            bad = array("bad", 4 if RANK == P - 1 else 3)
            bad[:] = 1
            with pytest.raises(mpicomm.ArgumentError, match="count"):
                comm.Allreduce(MPI.IN_PLACE, bad)


def test_kept_plans_hold_at_most_kept_bytes_of_their_own_arrays(comm, monkeypatch):
    """Plans of large calls are dropped, oldest first, once the kept plans' scratch passes KEPT_BYTES (the newest
    stays, so a repeated large call keeps its plan), with the fast path's entries that ran them."""
    monkeypatch.setattr(dispatch, "KEPT_BYTES", 300_000)
    comm._state.plans.clear()
    comm._state.fast.clear()
    arrays = [(R.data(RANK, 20_000, np.float64) * (i + 1), np.zeros(20_000)) for i in range(4)]  # 160 KB each
    for x, y in arrays:
        for _ in range(2):
            comm.Allreduce(x, y, algorithm="recursive_doubling")  # (scratch: one vector)
            expected = np.empty_like(x)
            WORLD.Allreduce(x, expected)
            R.assert_matches(y, expected, "allreduce of 160 KB")
    held = [sum(a.nbytes for a in plan.keep) for plan in comm._state.plans.values()]
    assert len(held) == 1 or sum(held) <= 300_000, held  # (a rank that recursive doubling folds away has none)
    if P == 2:
        assert len(held) == 1 and held[0] >= 160_000, held
    assert all(entry.plan in comm._state.plans.values() for entry in comm._state.fast.values())
    x, y = arrays[-1]
    comm.Allreduce(x, y, algorithm="recursive_doubling")  # the newest plan: still kept, still fast
    assert len(comm._state.fast) >= (P > 1)
