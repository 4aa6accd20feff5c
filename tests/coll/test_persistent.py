"""Persistent collectives (``comm.Allreduce_init`` & co.) against the MPI library, started many times.

Each request is made once and started several times with data that changes
between starts (and depends on rank and index); every run must equal the
library's own collective on the same data. Also: several requests in flight
at once, every algorithm a nonblocking call may use, Free, misuse, bad
arguments at creation (the same ArgumentError on every rank), buffer specs
that only the MPI library runs, and misuse that must get the same answer on
every rank however far the run got in the background (20 runs each).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from mpicomm import registry
from mpicomm.engine import lane, progress
from mpicomm.facts import Facts

from . import reference
from .reference import assert_matches, counts, data

pytestmark = pytest.mark.mpi

STARTS = 3


def _fill(x: np.ndarray, rank: int, start: int) -> None:
    """Rank-, index- and start-dependent values, written into *x* in place (the request keeps its buffers)."""
    x[...] = data(rank, x.size, x.dtype) + start


def _ranks(comm: Any) -> tuple[int, int]:
    return comm.Get_rank(), comm.Get_size()


@pytest.mark.parametrize("count", counts(4) + [reference.LARGE // 10])
@pytest.mark.parametrize("collective", ["allreduce", "bcast", "reduce", "allgather", "reduce_scatter_block",
                                        "alltoall", "gather", "scatter", "scan", "exscan"])
def test_started_many_times_with_changing_data_matches_the_library(comm, collective, count):
    rank, p = _ranks(comm)
    lib = reference.native()
    root = p - 1
    big = count * p
    send = np.zeros(big if collective in ("reduce_scatter_block", "alltoall", "scatter") else count, np.int64)
    recv = np.zeros(big if collective in ("allgather", "alltoall", "gather") else count, np.int64)
    expected = np.zeros_like(recv)
    make, reference_call = {
        "allreduce": (lambda: comm.Allreduce_init(send, recv), lambda: lib.Allreduce(send, expected)),
        "bcast": (lambda: comm.Bcast_init(recv, root), None),
        "reduce": (lambda: comm.Reduce_init(send, recv, MPI.SUM, root), lambda: lib.Reduce(send, expected, MPI.SUM, root)),
        "allgather": (lambda: comm.Allgather_init(send, recv), lambda: lib.Allgather(send, expected)),
        "reduce_scatter_block": (lambda: comm.Reduce_scatter_block_init(send, recv),
                                 lambda: lib.Reduce_scatter_block(send, expected)),
        "alltoall": (lambda: comm.Alltoall_init(send, recv), lambda: lib.Alltoall(send, expected)),
        "gather": (lambda: comm.Gather_init(send, recv, root), lambda: lib.Gather(send, expected, root)),
        "scatter": (lambda: comm.Scatter_init(send, recv, root), lambda: lib.Scatter(send, expected, root)),
        "scan": (lambda: comm.Scan_init(send, recv), lambda: lib.Scan(send, expected)),
        "exscan": (lambda: comm.Exscan_init(send, recv, MPI.SUM), lambda: lib.Exscan(send, expected)),
    }[collective]
    request = make()
    assert isinstance(request, mpicomm.Prequest) and request
    for start in range(STARTS):
        _fill(send, rank, start)
        if collective == "bcast":
            _fill(recv, rank, start)
            expected[...] = data(root, count, np.int64) + start
        else:
            recv[...] = -1
            expected[...] = -1
            reference_call()
        request.Start()
        request.Wait()
        if collective in ("reduce", "gather") and rank != root:
            continue  # only the root's receive buffer is defined
        if collective == "exscan" and rank == 0:
            continue  # rank 0's is undefined in MPI
        assert_matches(recv, expected, f"persistent {collective}, start {start}")
    assert request.plan.runs == STARTS
    request.Free()
    assert not request


@pytest.mark.parametrize("collective", ["allgatherv", "alltoallv", "reduce_scatter", "gatherv", "scatterv"])
def test_the_v_forms_with_uneven_counts(comm, collective):
    rank, p = _ranks(comm)
    lib = reference.native()
    sizes = [r + 1 for r in range(p)]  # rank r's block has r + 1 elements
    displs = [sum(sizes[:r]) for r in range(p)]
    total = sum(sizes)
    if collective == "allgatherv":
        send, recv = np.zeros(sizes[rank], np.int64), np.zeros(total, np.int64)
        spec = [recv, (sizes, displs), MPI.INT64_T]
        request = comm.Allgatherv_init(send, spec)
        expected_call = lambda out: lib.Allgatherv(send, [out, (sizes, displs), MPI.INT64_T])  # noqa: E731
    elif collective == "alltoallv":
        send, recv = np.zeros(total, np.int64), np.zeros(sizes[rank] * p, np.int64)
        rcounts = [sizes[rank]] * p
        rdispls = [r * sizes[rank] for r in range(p)]
        request = comm.Alltoallv_init([send, (sizes, displs), MPI.INT64_T], [recv, (rcounts, rdispls), MPI.INT64_T])
        expected_call = lambda out: lib.Alltoallv([send, (sizes, displs), MPI.INT64_T],  # noqa: E731
                                                  [out, (rcounts, rdispls), MPI.INT64_T])
    elif collective == "reduce_scatter":
        send, recv = np.zeros(total, np.int64), np.zeros(sizes[rank], np.int64)
        request = comm.Reduce_scatter_init(send, recv, sizes)
        expected_call = lambda out: lib.Reduce_scatter(send, out, sizes)  # noqa: E731
    elif collective == "gatherv":
        send, recv = np.zeros(sizes[rank], np.int64), np.zeros(total, np.int64)
        request = comm.Gatherv_init(send, [recv, (sizes, displs), MPI.INT64_T], 0)
        expected_call = lambda out: lib.Gatherv(send, [out, (sizes, displs), MPI.INT64_T], 0)  # noqa: E731
    else:
        send, recv = np.zeros(total, np.int64), np.zeros(sizes[rank], np.int64)
        request = comm.Scatterv_init([send, (sizes, displs), MPI.INT64_T], recv, 0)
        expected_call = lambda out: lib.Scatterv([send, (sizes, displs), MPI.INT64_T], out, 0)  # noqa: E731
    for start in range(STARTS):
        _fill(send, rank, start)
        recv[...] = -1
        expected = np.full_like(recv, -1)
        expected_call(expected)
        request.Start()
        request.Wait()
        if collective == "gatherv" and rank != 0:
            continue
        assert_matches(recv, expected, f"persistent {collective}, start {start}")
    request.Free()


@pytest.mark.parametrize("algorithm", registry.algorithms("allreduce"))
def test_every_allreduce_algorithm_a_persistent_request_may_use(comm, algorithm):
    rank, p = _ranks(comm)
    why = registry.allowed(registry.lookup("allreduce", algorithm), Facts(p=p, nodes=comm.nodes, blocking=False))
    if why is not None:  # the same on every rank: the facts are
        with pytest.raises(mpicomm.ArgumentError, match=algorithm):
            comm.Allreduce_init(np.zeros(3), np.zeros(3), algorithm=algorithm)
        return
    for count in (1, p + 1, 1000):
        send, recv = np.zeros(count), np.zeros(count)
        request = comm.Allreduce_init(send, recv, algorithm=algorithm)
        assert request.plan.algorithm.name == algorithm
        for start in range(STARTS):
            _fill(send, rank, start)
            expected = np.empty_like(recv)
            reference.native().Allreduce(send, expected)
            request.Start()
            request.Wait()
            assert_matches(recv, expected, f"persistent allreduce {algorithm}, count {count}, start {start}")
        request.Free()


def test_several_requests_in_flight_complete_in_any_order(comm):
    rank, p = _ranks(comm)
    a_send, a_recv = np.zeros(5, np.int64), np.zeros(5, np.int64)
    b_buf = np.zeros(7, np.int64)
    c_send, c_recv = np.zeros(3, np.int64), np.zeros(3 * p, np.int64)
    a = comm.Allreduce_init(a_send, a_recv)
    b = comm.Bcast_init(b_buf, root=0)
    c = comm.Allgather_init(c_send, c_recv)
    for start in range(STARTS):
        _fill(a_send, rank, start)
        _fill(b_buf, rank, start)
        _fill(c_send, rank, 10 * start)
        mpicomm.Prequest.Startall([a, b, c])
        assert mpicomm.Request.Testall([c, b, a]) in (True, False)  # progress, whatever it says
        if start % 2:
            mpicomm.Request.Waitall([c, b, a])
        else:
            c.Wait()
            a.Wait()
            b.Wait()
        expected_a = np.empty_like(a_recv)
        reference.native().Allreduce(a_send, expected_a)
        expected_c = np.empty_like(c_recv)
        reference.native().Allgather(c_send, expected_c)
        assert_matches(a_recv, expected_a, f"allreduce in flight, start {start}")
        assert_matches(b_buf, data(0, 7, np.int64) + start, f"bcast in flight, start {start}")
        assert_matches(c_recv, expected_c, f"allgather in flight, start {start}")
    for r in (a, b, c):
        r.Free()


def test_a_blocking_call_between_starts_and_an_inactive_wait(comm):
    rank, _ = _ranks(comm)
    send, recv = np.zeros(4, np.int64), np.zeros(4, np.int64)
    request = comm.Allreduce_init(send, recv)
    assert request.Wait() is True and request.Test() is True  # inactive: returns at once
    _fill(send, rank, 1)
    request.Start()
    other = np.zeros(4, np.int64)
    comm.Allreduce(send, other)  # a blocking collective while the persistent one is active
    request.Wait()
    assert_matches(recv, other, "persistent and blocking allreduce of the same data")
    request.Free()


def test_misuse_is_named(comm):
    request = comm.Barrier_init()
    request.Start()  # (on one rank a barrier completes as it starts: still active until a Wait reports it)
    with pytest.raises(ValueError, match="started again while active"):
        request.Start()
    with pytest.raises(ValueError, match="freed while active"):
        request.Free()
    request.Wait()
    request.Free()
    request.Free()  # freeing twice is harmless
    with pytest.raises(ValueError, match="was freed"):
        request.Start()
    with pytest.raises(TypeError, match="Startall takes mpicomm persistent requests"):
        mpicomm.Prequest.Startall([MPI.REQUEST_NULL])


@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() < 2, reason="needs two ranks to disagree")
def test_mismatched_counts_at_creation_raise_on_every_rank(comm):
    rank, _ = _ranks(comm)
    n = 5 if rank == 1 else 4
    try:
        comm.Allreduce_init(np.zeros(n), np.zeros(n))
    except mpicomm.ArgumentError as exc:
        message = str(exc)
    else:
        message = ""
    everyone = MPI.COMM_WORLD.allgather(message)
    assert all("ranks disagree on the count" in m for m in everyone), everyone
    x = np.ones(3)  # the communicator still works
    out = np.empty_like(x)
    comm.Allreduce(x, out)
    assert out.tolist() == [comm.Get_size()] * 3


def test_a_bad_root_or_op_at_creation_raises_on_every_rank(comm):
    _, p = _ranks(comm)
    for make in (lambda: comm.Bcast_init(np.zeros(3), root=p),
                 lambda: comm.Allreduce_init(np.zeros(3, np.float64), np.zeros(3), op=MPI.BXOR)):
        try:
            make()
        except mpicomm.ArgumentError as exc:
            message = str(exc)
        else:
            message = ""
        everyone = MPI.COMM_WORLD.allgather(message)
        assert all(everyone) and len({m.partition(": ")[2] for m in everyone}) == 1, everyone


def test_a_derived_datatype_runs_in_the_librarys_own_persistent_collective(comm):
    rank, p = _ranks(comm)
    vector = MPI.DOUBLE.Create_vector(2, 1, 2).Commit()
    try:
        send = np.zeros(4)
        out = np.zeros(2 * p)
        request = comm.Allgather_init([send, 1, vector], [out, 2, MPI.DOUBLE])
        assert request.plan.library
        for start in range(STARTS):
            send[...] = data(rank, 4, np.float64) + start
            request.Start()
            request.Wait()
            expected = np.concatenate([data(r, 4, np.float64)[[0, 2]] + start for r in range(p)])
            assert_matches(out, expected, f"persistent allgather of a vector type, start {start}")
        request.Free()
    finally:
        vector.Free()


def test_the_persistent_plan_reuses_its_scratch(comm):
    rank, p = _ranks(comm)
    if p < 2:
        pytest.skip("one rank allocates nothing")
    send, recv = np.zeros(4096), np.zeros(4096)
    request = comm.Allreduce_init(send, recv, algorithm="ring")
    request.Start()
    request.Wait()
    first = [id(x) for x in request.plan.scratch]
    assert first, "the ring allocates scratch on the first run"
    for start in range(2):
        _fill(send, rank, start)
        request.Start()
        request.Wait()
        assert [id(x) for x in request.plan.scratch] == first
        expected = np.empty_like(recv)
        reference.native().Allreduce(send, expected)
        assert_matches(recv, expected, "ring allreduce with reused scratch")
    request.Free()


def test_a_freed_requests_plan_serves_the_next_request_on_the_same_arrays(comm, monkeypatch):
    """A request made again on the same arrays after Free (a solver's setup in a loop, mpi4py's test modules)
    takes the freed request's plan, renumbered: no compile, the results still the library's, and a creation
    whose arguments differ on one rank (another op there: a plan of another signature) still raises the same
    error on every rank."""
    from mpicomm.front import dispatch

    rank, p = _ranks(comm)
    dup = comm.Dup()
    send, recv = np.zeros(7, np.int64), np.zeros(7, np.int64)
    builds = []
    monkeypatch.setattr(dispatch, "build", lambda *a, _f=dispatch.build, **k: builds.append(a[1].collective) or _f(*a, **k))
    plans, labels = [], []
    for made in range(4):
        request = dup.Allreduce_init(send, recv)
        plans.append(request.plan)
        labels.append(request.label)
        for start in range(2):
            _fill(send, rank, 10 * made + start)
            request.Start()
            request.Wait()
            expected = np.empty_like(recv)
            reference.native().Allreduce(send, expected)
            assert_matches(recv, expected, f"request {made}, start {start}")
        request.Free()
    assert builds == ["allreduce"], builds
    assert all(plan is plans[0] for plan in plans)
    assert len(set(labels)) == 4 and all(", 0 starts)" in label for label in labels), labels
    if p > 1:
        op = MPI.MAX if rank == p - 1 else MPI.SUM
        try:
            dup.Allreduce_init(send, recv, op)
        except mpicomm.ArgumentError as exc:
            message = str(exc).partition(": ")[2]
        else:
            message = ""
        everyone = MPI.COMM_WORLD.allgather(message)
        assert all("ranks disagree on the op" in m for m in everyone) and len(set(everyone)) == 1, everyone
    dup.Free()


def test_the_creation_agreement_names_the_call_it_checks(comm):
    """The creation agreement's plan is kept and recast for each creation: after good creations of other
    collectives, a mismatched one is named with its own collective and counts."""
    rank, p = _ranks(comm)
    if p < 2:
        pytest.skip("needs two ranks to disagree")
    dup = comm.Dup()
    for request in (dup.Allgather_init(np.zeros(2), np.zeros(2 * p)), dup.Bcast_init(np.zeros(3), root=0),
                    dup.Alltoall_init(np.zeros(p), np.zeros(p))):
        request.Free()
    n = 5 if rank == 1 else 4
    try:
        dup.Reduce_init(np.zeros(n), np.zeros(n), MPI.SUM, 0)
    except mpicomm.ArgumentError as exc:
        message = str(exc)
    else:
        message = ""
    everyone = MPI.COMM_WORLD.allgather(message)
    assert all("reduce" in m and "ranks disagree on the count" in m and "5" in m and "4" in m
               for m in everyone), everyone
    dup.Free()


# ---------------------------------------------------------------- the same answer on every rank, 20 runs each
#
# A reliability probe (the same program on every rank) found answers that depended on timing: whether the
# progress thread had finished a run in the background decided if a second Start or a Free was refused.
# Each test runs its case RUNS times; in half of them the run has surely finished on this rank (a blocking
# collective on the same communicator runs after it), in the others it may still be in flight.

RUNS = 20


def _refusal(call: Any) -> str:
    """The message of the ValueError *call* raised, "" if none."""
    try:
        call()
    except ValueError as exc:
        return str(exc)
    return ""


def test_a_second_start_is_refused_on_every_rank_whether_or_not_the_run_finished(comm):
    rank, _ = _ranks(comm)
    send, recv = np.zeros(8), np.zeros(8)
    request = comm.Allreduce_init(send, recv)
    for run in range(RUNS):
        _fill(send, rank, run)
        request.Start()
        if run % 2:
            comm.Barrier()  # runs after the persistent run: it has finished here, but no Wait reported it
        refused = MPI.COMM_WORLD.allgather(_refusal(request.Start))
        assert all("started again while active" in m for m in refused), (run, refused)
        request.Wait()  # the refusal left it usable: the first start completes, with its data
        expected = np.empty_like(recv)
        reference.native().Allreduce(send, expected)
        assert_matches(recv, expected, f"persistent allreduce after a refused second start, run {run}")
    request.Start()  # inactive again: starts
    request.Wait()
    request.Free()


def test_free_while_active_is_refused_on_every_rank_and_the_request_stays_usable(comm):
    rank, _ = _ranks(comm)
    send, recv = np.zeros(8), np.zeros(8)
    for run in range(RUNS):
        request = comm.Allreduce_init(send, recv)
        _fill(send, rank, run)
        request.Start()
        if run % 2:
            comm.Barrier()
        refused = MPI.COMM_WORLD.allgather(_refusal(request.Free))
        assert all("freed while active" in m for m in refused), (run, refused)
        assert request  # not freed
        request.Wait()
        expected = np.empty_like(recv)
        reference.native().Allreduce(send, expected)
        assert_matches(recv, expected, f"persistent allreduce after a refused Free, run {run}")
        request.Free()  # inactive: freed on every rank
        assert not request


@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() < 2, reason="needs two ranks to start in different orders")
def test_requests_of_different_shapes_started_in_different_orders_raise_on_every_rank(comm):
    """One small request and one of 5000 float64 (40 KB: a rendezvous-size message), started in opposite
    orders on rank 0 and the others: the same ArgumentError on every rank (it used to crash MPICH when the
    failed run cancelled a rendezvous send), and the communicator and both requests work afterwards."""
    rank, p = _ranks(comm)
    for run in range(RUNS):
        dup = comm.Dup()  # (a failed start moves the communicator's tags on: each run on a fresh one)
        small_send, small_recv = np.zeros(3), np.zeros(3)
        big_send, big_recv = np.zeros(5000), np.zeros(5000)
        small = dup.Allreduce_init(small_send, small_recv)
        big = dup.Allreduce_init(big_send, big_recv)
        _fill(small_send, rank, run)
        _fill(big_send, rank, run)
        for request in ([small, big] if rank == 0 else [big, small]):
            request.Start()
        errors = []
        for request in (small, big):
            try:
                request.Wait()
            except mpicomm.ArgumentError as exc:
                errors.append(str(exc).partition(": ")[2])  # (the label before it names this rank's request)
        everyone = MPI.COMM_WORLD.allgather(sorted(errors))
        assert len(everyone[0]) == 2 and all(errs == everyone[0] for errs in everyone), (run, everyone)
        assert all("ranks disagree on the count: " in e and "3 elements" in e and "5000 elements" in e
                   for e in everyone[0]), (run, everyone)
        out = np.empty(4)
        dup.Allreduce(np.full(4, rank + run, np.float64), out)  # the communicator works
        assert out.tolist() == [sum(range(p)) + p * run] * 4, (run, out)
        for request, send, recv in ((small, small_send, small_recv), (big, big_send, big_recv)):
            request.Start()  # and so do the requests, started in the same order
            request.Wait()
            expected = np.empty_like(recv)
            reference.native().Allreduce(send, expected)
            assert_matches(recv, expected, f"persistent allreduce of {send.size} after the disagreement, run {run}")
        small.Free()
        big.Free()
        dup.Free()


@pytest.mark.skipif(not lane.available(), reason=f"no compiled lane here: {lane.why_not}")
def test_start_and_wait_are_one_call_each_into_the_compiled_lane(comm, monkeypatch):
    """A repeated Start/Wait of a host-array allreduce: Start makes one call into the lane (start, first poll, often
    the whole run), Wait at most one (the rest of the run, without the GIL); neither goes through the queue's
    general submit or wait. With a nonblocking call queued ahead, Start queues behind it (the order every rank
    keeps) and the results still match the library's."""
    rank, p = _ranks(comm)
    send, recv = np.zeros(1), np.zeros(1)
    request = comm.Allreduce_init(send, recv)
    general = []
    monkeypatch.setattr(progress, "submit", lambda *a, _f=progress.submit: general.append("submit") or _f(*a))
    monkeypatch.setattr(progress, "wait", lambda *a, _f=progress.wait: general.append("wait") or _f(*a))
    into_lane = []

    def count(frame, event, arg):
        if event == "c_call" and getattr(arg, "__qualname__", "").startswith("Lane."):
            into_lane.append(arg.__qualname__)

    for start in range(20):
        _fill(send, rank, start)
        into_lane.clear()
        sys.setprofile(count)
        try:
            request.Start()
            started = list(into_lane)
            request.Wait()
        finally:
            sys.setprofile(None)
        assert started == ["Lane.start"], f"start {start}: Start's calls into the lane: {started}"
        assert into_lane[1:] in ([], ["Lane.advance"]), f"start {start}: Wait's calls into the lane: {into_lane[1:]}"
        assert recv[0] == sum(data(r, 1, np.float64)[0] + start for r in range(p))
    assert general == [], f"Start/Wait went through the queue's general path: {general}"
    ahead_send, ahead_recv = np.full(3, rank + 1.0), np.zeros(3)
    ahead = comm.Iallreduce(ahead_send, ahead_recv)
    _fill(send, rank, 99)
    request.Start()
    request.Wait()
    ahead.Wait()
    assert "submit" in general
    assert recv[0] == sum(data(r, 1, np.float64)[0] + 99 for r in range(p))
    assert np.array_equal(ahead_recv, np.full(3, p * (p + 1) / 2))
    request.Free()
