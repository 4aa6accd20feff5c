"""Request.Waitany / Testany / Waitsome / Testsome (and their lowercase forms) with MPI's semantics, over mpicomm
requests (point to point, nonblocking and persistent collectives) mixed with plain mpi4py requests."""

from __future__ import annotations

import time

import numpy as np
import pytest
from mpi4py import MPI

from mpicomm.engine.requests import Request, progress

from ..conftest import rank_data
from .test_requests import neighbours

UNDEFINED = MPI.UNDEFINED
ANY = ["Waitany", "waitany", "Testany", "testany"]
SOME = ["Waitsome", "waitsome", "Testsome", "testsome"]


def allreduced(size: int, n: int) -> np.ndarray:
    return sum(rank_data(r, n) for r in range(size))


def no_steps(value):
    return value
    yield


def fails_after_first_step(message):
    yield []
    raise RuntimeError(message)


def call(how: str, cls, requests, statuses=None):
    """One call of *how* (of class *cls*: mpicomm's Request or MPI.Request), normalised to
    ``(indices or None, results or None)``: indices None when all are inactive, [] when a test found nothing.
    For the any forms *statuses* is a one-element list holding the status passed."""
    status = statuses[0] if statuses else None
    if how == "Waitany":
        i = cls.Waitany(requests, status)
        return (None, None) if i == UNDEFINED else ([i], None)
    if how == "waitany":
        i, obj = cls.waitany(requests, status)
        return (None, None) if i == UNDEFINED else ([i], [obj])
    if how == "Testany":
        i, flag = cls.Testany(requests, status)
        assert flag or i == UNDEFINED
        return (None, None) if flag and i == UNDEFINED else ([i] if flag else [], None)
    if how == "testany":
        i, flag, obj = cls.testany(requests, status)
        assert flag or (i == UNDEFINED and obj is None)
        return (None, None) if flag and i == UNDEFINED else (([i], [obj]) if flag else ([], []))
    if how == "Waitsome":
        return cls.Waitsome(requests, statuses), None
    if how == "waitsome":
        return cls.waitsome(requests, statuses)
    if how == "Testsome":
        return cls.Testsome(requests, statuses), None
    if how == "testsome":
        return cls.testsome(requests, statuses)
    raise AssertionError(how)


def garbage() -> MPI.Status:
    """A status that a call must overwrite (it describes no completion of the test)."""
    st = MPI.Status()
    st.source, st.tag = 12345, 6789
    st.Set_elements(MPI.BYTE, 77)
    return st


def drain(how: str, cls, requests, seconds: float = 60.0):
    """Call *how* until every request is inactive; ``[(index, (source, tag), result)]`` in the order reported,
    and how many calls reported nothing (tests only)."""
    reported = []
    deadline = time.monotonic() + seconds
    while True:
        statuses = [garbage() for _ in range(1 if how in ANY else 2)]  # (some: filled in place, then grown)
        indices, results = call(how, cls, requests, statuses)
        if indices is None:
            if how in ANY:  # an empty status for MPI_UNDEFINED
                assert (statuses[0].Get_source(), statuses[0].Get_tag()) == (MPI.ANY_SOURCE, MPI.ANY_TAG)
                assert statuses[0].Get_count(MPI.BYTE) == 0
            return reported
        if how.startswith("W"):
            assert indices, f"{how} returned no index while requests were active"
        elif not indices:
            assert time.monotonic() < deadline, f"{how}: nothing completed within {seconds} s"
            time.sleep(1e-4)
            continue
        assert len(statuses) == max(2, len(indices)) if how in SOME else len(statuses) == 1
        assert indices == sorted(indices)
        for k, i in enumerate(indices):
            st = statuses[k]
            reported.append((i, (st.Get_source(), st.Get_tag()), results[k] if results is not None else None))


# ---------------------------------------------------------------- nothing active


@pytest.mark.mpi
@pytest.mark.parametrize("how", ANY + SOME)
def test_all_inactive_like_mpi4py(comm, private, how):
    """REQUEST_NULL, an inactive persistent request (native or mpicomm), a freed one, a request whose completion
    was reported: all inactive, and the answer is mpi4py's own for native requests."""
    x, y = rank_data(comm.rank, 5), np.zeros(5)
    never_started = comm.Allreduce_init(x, y)
    freed = comm.Allreduce_init(x, y)
    freed.Free()
    reported = Request(no_steps("already reported"))
    assert reported.wait() == "already reported"
    native_persistent = private.Recv_init(np.zeros(1), MPI.ANY_SOURCE, 5)
    try:
        for native, ours in [
            ([], []),
            ([MPI.REQUEST_NULL], [MPI.REQUEST_NULL]),
            ([native_persistent], [never_started]),
            ([MPI.REQUEST_NULL, native_persistent], [never_started, MPI.REQUEST_NULL, freed, reported,
                                                     native_persistent]),
        ]:
            st_native, st_ours = MPI.Status(), MPI.Status()
            for st in (st_native, st_ours):
                st.source, st.tag = 3, 4
                st.Set_elements(MPI.BYTE, 9)
            expected = call(how, MPI.Request, native, [st_native] if how in ANY else None)
            assert expected == (None, None)
            assert call(how, Request, ours, [st_ours] if how in ANY else None) == expected
            if how in ANY:  # the empty status, as MPI gives
                for st in (st_native, st_ours):
                    assert (st.Get_source(), st.Get_tag(), st.Get_count(MPI.BYTE)) == (MPI.ANY_SOURCE, MPI.ANY_TAG, 0)
            statuses: list = []
            if how in SOME:  # statuses untouched when nothing is reported
                assert call(how, Request, ours, statuses) == (None, None) and statuses == []
        # the raw return values, as mpi4py gives them
        assert getattr(Request, how)([never_started, MPI.REQUEST_NULL]) == getattr(MPI.Request, how)([MPI.REQUEST_NULL])
    finally:
        native_persistent.Free()
        never_started.Free()


@pytest.mark.mpi
@pytest.mark.parametrize("how", ["Testany", "testany", "Testsome", "testsome"])
def test_test_forms_report_nothing_while_pending(comm, private, how):
    """Active but not complete: (UNDEFINED, False) / [] - not the answer for all-inactive - as mpi4py's; and once
    cancelled, each is reported once, then all are inactive."""
    mine = comm.irecv_array(source=comm.rank, tag=4001)  # nobody sends these
    native = private.Irecv(np.zeros(2), comm.rank, 4002)
    pure = private.Irecv(np.zeros(2), comm.rank, 4003)
    expected = call(how, MPI.Request, [MPI.REQUEST_NULL, pure])
    assert expected == ([], [] if how.islower() else None)
    for _ in range(3):
        assert call(how, Request, [MPI.REQUEST_NULL, mine, native]) == expected
    assert not mine.done and native != MPI.REQUEST_NULL
    mine.Cancel()
    native.Cancel()
    pure.Cancel()
    got = drain(how, Request, [MPI.REQUEST_NULL, mine, native])
    assert sorted(i for i, _, _ in got) == [1, 2]
    assert native == MPI.REQUEST_NULL
    assert call(how, Request, [mine, native]) == (None, None)
    pure.Wait()


# ---------------------------------------------------------------- a mix of everything, each completion once


def mixed(comm, private, n: int, tag: int):
    """Every kind of request at once: ``(requests, expectations)`` where expectations maps each active index to
    ``(kind, check)``; check(status, result) validates what that completion reported."""
    right, left = neighbours(comm)
    size = comm.size
    x = rank_data(comm.rank, n)
    y_nb, y_p, y_q = np.zeros(n), np.zeros(n), np.zeros(n)
    started = comm.Allreduce_init(x, y_p)
    idle = comm.Allreduce_init(x, y_q)  # never started: inactive
    native_in = np.zeros(n + 3, np.int32)
    done_before = Request(no_steps(None))
    done_before.Wait()  # reported: inactive
    nb = comm.Iallreduce(x, y_nb)
    started.Start()
    requests = [
        MPI.REQUEST_NULL,                                                      # 0  inactive
        comm.irecv_array(source=left, tag=tag),                                # 1
        nb,                                                                    # 2
        idle,                                                                  # 3  inactive
        private.Irecv(native_in, left, tag + 1),                               # 4
        comm.isend_array(rank_data(comm.rank, n + 1, np.int64), right, tag),   # 5
        started,                                                               # 6
        done_before,                                                           # 7  inactive
        private.Isend(rank_data(comm.rank, n + 3, np.int32), right, tag + 1),  # 8
        MPI.REQUEST_NULL,                                                      # 9  inactive
    ]

    def check_recv(status, result):
        assert (status.Get_source(), status.Get_tag()) == (left, tag)
        if result is not None:
            assert np.array_equal(result, rank_data(left, n + 1, np.int64))

    def check_native_recv(status, result):
        assert (status.Get_source(), status.Get_tag()) == (left, tag + 1)
        assert status.Get_count(MPI.INT32_T) == n + 3
        assert result is None

    def check_empty(status, result):  # a send's or a collective's: MPI's empty status
        assert (status.Get_source(), status.Get_tag()) == (MPI.ANY_SOURCE, MPI.ANY_TAG)
        assert result is None

    def check_native_send(status, result):  # (MPI leaves a send's status undefined: MPICH does not touch it)
        assert result is None

    expect = {1: ("irecv_array", check_recv), 2: ("Iallreduce", check_empty), 4: ("Irecv", check_native_recv),
              5: ("isend_array", check_empty), 6: ("persistent", check_empty), 8: ("Isend", check_native_send)}

    def after():
        total = allreduced(size, n)
        assert np.array_equal(y_nb, total) and np.array_equal(y_p, total)
        assert not y_q.any()
        assert np.array_equal(native_in, rank_data(left, n + 3, np.int32))
        started.Free()
        idle.Free()

    return requests, expect, after, started


@pytest.mark.mpi
@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [3, 70_000], ids=["small", "large"])
@pytest.mark.parametrize("how", ANY + SOME)
def test_mixed_requests_each_reported_once(comm, private, how, n):
    requests, expect, after, persistent = mixed(comm, private, n, 4100)
    natives = {i: requests[i] for i in (4, 8)}
    got = drain(how, Request, requests)
    indices = [i for i, _, _ in got]
    assert sorted(indices) == sorted(expect), f"reported {indices}, expected each of {sorted(expect)} once"
    for i, source_tag, result in got:
        st = MPI.Status()
        st.source, st.tag = source_tag
        if expect[i][0] == "Irecv":
            st.Set_elements(MPI.INT32_T, n + 3)
        expect[i][1](st, result)
        if expect[i][0] in ("isend_array", "Iallreduce", "persistent") and how.islower():
            assert result is None
    for i, r in natives.items():  # completed by MPI in the caller's list: the same objects, now REQUEST_NULL
        assert requests[i] is r and r == MPI.REQUEST_NULL
    # nothing active any more: the answer stays UNDEFINED / None
    assert call(how, Request, requests) == (None, None)
    # a persistent request is active again once restarted, and reported once more
    persistent.Start()
    again = drain(how, Request, requests)
    assert [i for i, _, _ in again] == [6]
    after()


@pytest.mark.mpi
@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ANY + SOME)
def test_receive_statuses_and_results(comm, private, how):
    """Receives from every rank (data and tags depend on the sender): statuses[k] belongs to indices[k]."""
    size, rank = comm.size, comm.rank
    recvs, sends, bufs = [], [], {}
    for src in range(size):
        if src % 2:
            bufs[src] = np.zeros(src + 2, np.int64)
            recvs.append(private.Irecv(bufs[src], src, 4200 + src))
        else:
            recvs.append(comm.irecv_array(source=src, tag=4200 + src))
    for dest in range(size):
        data = rank_data(rank, rank + 2, np.int64)
        sends.append(private.Isend(data, dest, 4200 + rank) if rank % 2 else comm.isend_array(data, dest, 4200 + rank))
    got = drain(how, Request, recvs + [MPI.REQUEST_NULL])
    assert sorted(i for i, _, _ in got) == list(range(size))
    for i, source_tag, result in got:
        assert source_tag == (i, 4200 + i)
        if how.islower():
            if i % 2:
                assert result is None
            else:
                assert np.array_equal(result, rank_data(i, i + 2, np.int64))
    for src, buf in bufs.items():
        assert np.array_equal(buf, rank_data(src, src + 2, np.int64))
    Request.Waitall(sends)


@pytest.mark.mpi
@pytest.mark.parametrize("how", ["Waitsome", "waitsome", "Testsome", "testsome"])
def test_some_forms_match_mpi4py_on_native_requests(comm, private, how):
    """Self-messages, all complete before the call: mpicomm's answer on native requests is mpi4py's (indices,
    statuses by position, the list of statuses grown, the requests nulled), and mpicomm requests slot in."""
    rank = comm.rank

    def native_set(tag):
        bufs = [np.zeros(k + 1) for k in range(3)]
        reqs = []
        for k in range(3):
            reqs.append(private.Isend(rank_data(rank, k + 1), rank, tag + k))
        for k in range(3):
            reqs.append(private.Irecv(bufs[k], rank, tag + k))
        while not MPI.Request.Get_status_all(reqs):
            time.sleep(1e-4)
        return [MPI.REQUEST_NULL] + reqs, bufs

    def outcome(cls, reqs):
        statuses = [MPI.Status()]  # shorter than the outcome: mpi4py appends
        indices, results = call(how, cls, reqs, statuses)
        return indices, results, [(s.Get_source(), s.Get_tag(), s.Get_count(MPI.BYTE)) for s in statuses]

    native, nbufs = native_set(4300)
    ours, obufs = native_set(4310)
    expected = outcome(MPI.Request, native)
    assert expected[0] == [1, 2, 3, 4, 5, 6]

    def shifted(statuses, by):
        return [(s, t - by if t >= 0 else t, c) for s, t, c in statuses]

    got = outcome(Request, ours)
    assert got[0] == expected[0] and got[1] == expected[1]
    assert shifted(got[2], 10) == expected[2]
    assert all(r == MPI.REQUEST_NULL for r in native + ours)
    for k in range(3):
        assert np.array_equal(nbufs[k], rank_data(rank, k + 1)) and np.array_equal(obufs[k], nbufs[k])
    # the same with mpicomm requests between them: each gets its place, in index order, with its status
    mine, _ = native_set(4320)
    recv = comm.irecv_array(source=rank, tag=4330)
    send = comm.isend_array(rank_data(rank, 4, np.float32), rank, tag=4330)
    deadline = time.monotonic() + 30
    while not (recv.done and send.done):  # complete, not yet reported
        progress()
        assert time.monotonic() < deadline
    ready = Request(no_steps(None))
    mixed_list = [mine[0], ready] + mine[1:4] + [recv] + mine[4:]
    indices, results, statuses = outcome(Request, mixed_list)
    assert indices == [1, 2, 3, 4, 5, 6, 7, 8]
    assert statuses[0] == (MPI.ANY_SOURCE, MPI.ANY_TAG, 0)  # the empty status of a request without an envelope
    assert shifted(statuses[1:4], 20) == expected[2][:3]
    assert statuses[4] == (rank, 4330, 16)
    assert shifted(statuses[5:], 20) == expected[2][3:]
    if how.islower():
        assert results[:4] == [None] * 4 and results[5:] == [None] * 3
        assert np.array_equal(results[4], rank_data(rank, 4, np.float32))
    send.Wait()


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("how", ANY + SOME)
@pytest.mark.parametrize("bad_first", [True, False])
def test_an_error_raises_once_and_loses_no_completion(how, bad_first):
    bad = Request(fails_after_first_step(f"failed under {how}"))
    good = Request(no_steps("fine"))
    other = Request(no_steps("also fine"))
    requests = [bad, good, other] if bad_first else [good, bad, other]
    seen, raised = [], 0
    for _ in range(6):
        try:
            indices, results = call(how, Request, requests, [MPI.Status()] if how in ANY else [])
        except RuntimeError as exc:
            assert str(exc) == f"failed under {how}"
            raised += 1
            continue
        if indices is None:
            break
        if how.startswith("T") and not indices:
            continue
        seen += indices
    assert raised == 1
    assert sorted(seen) == ([1, 2] if bad_first else [0, 2])
    if how in SOME and not bad_first:
        assert seen[0] == 0  # the completion before the failure came first, not lost with it
    assert bad.delivered and good.delivered and other.delivered
    with pytest.raises(RuntimeError, match=f"failed under {how}"):  # the error stays with the request
        bad.Wait()


@pytest.mark.mpi
@pytest.mark.parametrize("how", ANY + SOME)
def test_a_failed_native_request_raises_alone(comm, private, how):
    """A truncated native receive raises MPI's error in a call of its own (pure mpi4py's Waitsome would consume
    every completed request with it); the completions before and after it are each reported once."""
    rank = comm.rank
    reqs = [private.Isend(rank_data(rank, 3), rank, 4400), private.Isend(rank_data(rank, 4), rank, 4401)]
    ok, short = np.zeros(3), np.zeros(1)
    reqs += [private.Irecv(ok, rank, 4400), private.Irecv(short, rank, 4401)]
    MPI.Request.Waitall(reqs[:2])
    deadline = time.monotonic() + 30
    while not reqs[2].Get_status():
        assert time.monotonic() < deadline
        time.sleep(1e-4)
    while True:  # the truncated one has completed too (its Get_status reports the error, freeing nothing)
        try:
            reqs[3].Get_status()
        except MPI.Exception:
            break
        assert time.monotonic() < deadline
        time.sleep(1e-4)
    MPI.Request.Waitall(reqs[:2])
    later = Request(no_steps("later"))
    requests = [MPI.REQUEST_NULL, reqs[2], reqs[3], later]
    seen, raised = [], []
    for _ in range(6):
        try:
            indices, _ = call(how, Request, requests, [MPI.Status()] if how in ANY else [])
        except MPI.Exception as exc:
            raised.append(exc.Get_error_class())
            assert requests[2] == MPI.REQUEST_NULL and seen == [1]  # freed by the failure; nothing else taken
            continue
        if indices is None:
            break
        seen += indices
    assert raised == [MPI.ERR_TRUNCATE]
    assert seen == [1, 3]
    assert np.array_equal(ok, rank_data(rank, 3))


# ---------------------------------------------------------------- progress while waiting


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["Waitany", "waitany", "Waitsome", "waitsome", "Testany", "Testsome"])
def test_waiting_progresses_every_outstanding_operation(fresh, private, how):
    """Rank 1's 8 MB send blocks until rank 0 posts its payload receive; rank 0 waits only on a later, native
    receive and a collective that rank 1 joins after its send: the wait must advance the first receive."""
    comm = fresh
    big = rank_data(1, 1 << 20)
    x, y = rank_data(comm.rank, 4), np.zeros(4)
    if comm.rank == 1:
        comm.send_array(big, 0, tag=1)
        private.Send(rank_data(1, 6, np.int32), 0, 2)
    if comm.rank == 0:
        b = comm.irecv_array(source=1, tag=1)
        small = np.zeros(6, np.int32)
        native_recv = private.Irecv(small, 1, 2)
        coll = comm.Iallreduce(x, y)
        got = drain(how, Request, [native_recv, coll], seconds=60)
        assert sorted(i for i, _, _ in got) == [0, 1]
        assert np.array_equal(small, rank_data(1, 6, np.int32))
        assert np.array_equal(b.wait(), big)
    else:
        comm.Iallreduce(x, y).Wait()
    assert np.array_equal(y, allreduced(comm.size, 4))


@pytest.mark.mpi
@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["Waitany", "Waitsome"])
def test_collectives_on_several_communicators(comm, fresh, how):
    """Collectives of two communicators, started in opposite order of completion on every rank: every one is
    reported once, with its data."""
    n = 1000
    outs = [np.zeros(n) for _ in range(4)]
    reqs = [
        comm.Iallreduce(rank_data(comm.rank, n), outs[0]),
        fresh.Iallreduce(rank_data(comm.rank + 1, n), outs[1]),
        comm.Iallreduce(rank_data(comm.rank + 2, n), outs[2]),
        fresh.Iallreduce(rank_data(comm.rank + 3, n), outs[3]),
    ]
    got = drain(how, Request, reqs[::-1])
    assert sorted(i for i, _, _ in got) == [0, 1, 2, 3]
    for k in range(4):
        assert np.array_equal(outs[k], sum(rank_data(r + k, n) for r in range(comm.size)))


@pytest.mark.mpi
@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["Waitany", "waitsome"])
def test_a_late_collective_alone(comm, how):
    """Only a collective is pending (rank 0 joins late): the wait sleeps in the collective's own MPI requests
    and returns once it completes, with every rank's data."""
    n = 50_000
    x, y = rank_data(comm.rank, n), np.zeros(n)
    if comm.rank == 0:
        time.sleep(0.2)
    r = comm.Iallreduce(x, y)
    status = garbage()
    if how == "Waitany":
        assert Request.Waitany([MPI.REQUEST_NULL, r], status) == 1
        assert (status.Get_source(), status.Get_tag()) == (MPI.ANY_SOURCE, MPI.ANY_TAG)
        assert Request.Waitany([MPI.REQUEST_NULL, r], status) == UNDEFINED
    else:
        assert Request.waitsome([r, MPI.REQUEST_NULL], [status]) == ([0], [None])
        assert Request.waitsome([r, MPI.REQUEST_NULL]) == (None, None)
    assert np.array_equal(y, allreduced(comm.size, n))


@pytest.mark.mpi
@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["Waitany", "waitany", "Waitsome", "waitsome"])
def test_a_collective_completes_the_wait_while_a_native_request_never_does(comm, private, how):
    """The collective is completed by its communicator's queue, not by an MPI request in the list: a wait that
    slept in MPI on the native receive alone would never return."""
    n = 1000
    x, y = rank_data(comm.rank, n), np.zeros(n)
    never = private.Irecv(np.zeros(1), comm.rank, 4500)  # nobody sends it
    inactive = private.Recv_init(np.zeros(1), comm.rank, 4501)
    try:
        requests = [never, inactive, comm.Iallreduce(x, y)]
        indices, _ = call(how, Request, requests, [MPI.Status()])
        assert indices == [2]
        assert np.array_equal(y, allreduced(comm.size, n))
        assert never != MPI.REQUEST_NULL
        never.Cancel()
        indices, _ = call(how, Request, requests, [MPI.Status()])
        assert indices == [0] and never == MPI.REQUEST_NULL
        assert call(how, Request, requests) == (None, None)
    finally:
        inactive.Free()
