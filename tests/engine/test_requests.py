"""mpicomm.engine.requests: step generators, the progress of every request, and the mpi4py Request interface."""

from __future__ import annotations

import time

import numpy as np
import pytest
from mpi4py import MPI

from mpicomm.engine.requests import Envelope, Request, outstanding, progress, run
from mpicomm.transport.buffers import mpi_datatype

from ..conftest import rank_data

BIG = 1 << 20  # float64 elements: 8 MB, far past any eager limit (rendezvous protocol)


def neighbours(comm) -> tuple[int, int]:
    """(right, left) in the ring of ranks (both are this rank at size 1)."""
    return (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size


def until(predicate, seconds: float = 30.0, what: str = "condition") -> None:
    """Call *predicate* until it is true; fail (instead of hanging) after *seconds*."""
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not reached within {seconds} s")
        time.sleep(1e-4)


# ---------------------------------------------------------------- step generators


def empty_step(log: list, value="done"):
    log.append("start")
    statuses = yield []
    log.append(statuses)
    return value


def no_steps(value):
    return value
    yield  # a generator that returns at once


def fails_after_first_step(message="boom after the first step"):
    yield []
    raise RuntimeError(message)


def fails_before_first_step():
    raise ValueError("bad argument: checked before anything is posted")
    yield []


def returns_envelope(value, source, tag, count=0, datatype=None):
    yield []
    return Envelope(value, source, tag, count, datatype)


def test_empty_step():
    log = []
    r = Request(empty_step(log, 42), "empty")
    assert log == ["start"]  # the first step is posted at construction
    assert not r.done
    assert r in outstanding()
    assert r.wait() == 42
    assert log == ["start", []]  # resumed with the (empty) list of statuses
    assert r.done
    assert r not in outstanding()


def test_generator_without_steps_is_done_at_construction():
    before = outstanding()
    r = Request(no_steps("now"))
    assert r.done
    assert outstanding() == before
    assert r.Wait() is True
    assert r.wait() == "now"
    assert r.test() == (True, "now")
    assert r.Test() is True


def test_returns_a_value():
    r = Request(empty_step([], {"answer": 42}))
    assert r.Wait() is True  # Wait returns True, as mpi4py's does
    assert r.wait() == {"answer": 42}  # wait returns the result (and keeps returning it)
    assert r.wait() == {"answer": 42}
    assert r.test() == (True, {"answer": 42})


def test_test_before_and_after_completion():
    def two_empty_steps():
        yield []
        yield []
        return "finished"

    r = Request(two_empty_steps())
    assert not r.done
    # Test() advances as far as possible without blocking: empty steps complete at once
    assert r.test() == (True, "finished")
    assert r.done


@pytest.mark.mpi
def test_multiple_steps_get_their_statuses(comm, private):
    right, left = neighbours(comm)
    seen = []

    def steps():
        # step 1: a message to myself
        mine = np.empty(5)
        st = yield [private.Irecv(mine, comm.rank, 1), private.Isend(np.arange(5.0) + comm.rank, comm.rank, 1)]
        seen.append((st[0].Get_source(), st[0].Get_tag(), st[0].Get_count(MPI.DOUBLE)))
        # step 2: a ring message, sized by what step 1 received
        n = int(mine[1] - mine[0]) * 7  # 7 elements
        ring = np.empty(n, np.int32)
        st = yield [private.Isend(rank_data(comm.rank, n, np.int32), right, 2), private.Irecv(ring, left, 2)]
        seen.append((st[1].Get_source(), st[1].Get_tag(), st[1].Get_count(MPI.INT32_T)))
        # step 3: nothing to wait for
        st = yield []
        seen.append(st)
        return mine, ring

    r = Request(steps(), "three steps")
    mine, ring = r.wait()
    assert np.array_equal(mine, np.arange(5.0) + comm.rank)
    assert np.array_equal(ring, rank_data(left, 7, np.int32))
    assert seen == [(comm.rank, 1, 5), (left, 2, 7), []]


def test_raises_after_first_step_is_delivered_by_test():
    r = Request(fails_after_first_step())  # the error is not raised at construction
    assert r in outstanding()
    with pytest.raises(RuntimeError, match="boom after the first step"):
        r.Test()
    assert r.done
    assert r not in outstanding()
    # the error stays with the request: every later Wait/wait/Test/test raises it again
    with pytest.raises(RuntimeError, match="boom"):
        r.Wait()
    with pytest.raises(RuntimeError, match="boom"):
        r.wait()
    with pytest.raises(RuntimeError, match="boom"):
        r.test()


@pytest.mark.parametrize("how", ["Wait", "wait", "test", "Waitall", "waitall", "Testall", "Waitany"])
def test_raises_after_first_step_is_delivered(how):
    r = Request(fails_after_first_step(f"failed, seen by {how}"))
    with pytest.raises(RuntimeError, match=f"failed, seen by {how}"):
        if how == "Wait":
            r.Wait()
        elif how == "wait":
            r.wait()
        elif how == "test":
            r.test()
        elif how == "Waitall":
            Request.Waitall([r])
        elif how == "waitall":
            Request.waitall([r])
        elif how == "Testall":
            Request.Testall([r])
        else:
            Request.Waitany([r])
    assert r.done


def test_error_is_not_lost_when_another_request_drives_it():
    bad = Request(fails_after_first_step("failed while someone else waited"))
    good = Request(empty_step([], "fine"))
    assert good.wait() == "fine"  # this wait advances every outstanding request ...
    assert bad.done  # ... so the failing one has failed by now,
    assert bad not in outstanding()
    with pytest.raises(RuntimeError, match="failed while someone else waited"):  # and keeps its error
        bad.Wait()
    assert progress() == 0


def test_waitall_raises_the_error_after_everything_completed():
    log = []
    bad = Request(fails_after_first_step())
    good = Request(empty_step(log, "fine"))
    with pytest.raises(RuntimeError, match="boom"):
        Request.Waitall([bad, good])
    assert good.done and bad.done
    assert good.wait() == "fine"


def test_raises_before_first_step_at_construction():
    before = outstanding()
    with pytest.raises(ValueError, match="checked before anything is posted"):
        Request(fails_before_first_step())
    assert outstanding() == before


@pytest.mark.mpi
def test_argument_errors_raise_at_the_call(comm):
    before = outstanding()
    with pytest.raises(ValueError, match="source"):
        comm.irecv_array(source=comm.size + 3)
    with pytest.raises(TypeError, match="buf must be an array or a buffer"):
        comm.irecv_array([0.0, 0.0])
    with pytest.raises(ValueError, match="x is not C-contiguous"):
        comm.isend_array(np.zeros(10)[::2], 0)
    with pytest.raises(ValueError, match="tag"):
        comm.isend_array(np.zeros(3), 0, tag=-5)
    assert outstanding() == before


# ---------------------------------------------------------------- Envelope and statuses


def test_envelope_fills_a_status():
    value = np.arange(3, dtype=np.int64)
    r = Request(returns_envelope(value, 2, 9, 3, MPI.INT64_T))
    status = MPI.Status()
    assert r.wait(status) is value  # the request returns the envelope's value
    assert status.Get_source() == 2
    assert status.Get_tag() == 9
    assert status.Get_error() == MPI.SUCCESS
    assert status.Get_count(MPI.INT64_T) == 3
    assert status.Get_count(MPI.BYTE) == 24
    assert status.Get_elements(MPI.INT64_T) == 3


@pytest.mark.parametrize("how", ["Wait", "Test", "wait", "test", "Waitall", "waitall", "Waitany"])
def test_every_way_of_waiting_fills_the_status(how):
    r = Request(returns_envelope("payload", 1, 5, 4, MPI.DOUBLE))
    status = MPI.Status()
    if how == "Wait":
        assert r.Wait(status) is True
    elif how == "Test":
        until(lambda: r.Test(status), what="Test")
    elif how == "wait":
        assert r.wait(status) == "payload"
    elif how == "test":
        assert r.test(status) == (True, "payload")
    elif how == "Waitall":
        others = [MPI.Status()]
        assert Request.Waitall([r], others) is True
        status = others[0]
    elif how == "waitall":
        others = [MPI.Status()]
        assert Request.waitall([r], others) == ["payload"]
        status = others[0]
    else:
        assert Request.Waitany([r], status) == 0
    assert (status.Get_source(), status.Get_tag(), status.Get_count(MPI.DOUBLE)) == (1, 5, 4)


@pytest.mark.parametrize("how", ["Waitall", "waitall", "Testall"])
@pytest.mark.parametrize("given", [0, 1])
def test_a_short_statuses_list_grows_as_in_mpi4py(how, given):
    """mpi4py extends a statuses list shorter than the requests; so does mpicomm, for its own and plain requests."""
    comm = MPI.COMM_SELF
    sent, got = np.arange(3.0), np.empty(3)
    requests = [Request(returns_envelope("a", 0, 7, 1, MPI.DOUBLE)), comm.Isend(sent, 0, 9), comm.Irecv(got, 0, 9),
                Request(returns_envelope("b", 0, 8, 2, MPI.DOUBLE))]
    statuses = [MPI.Status() for _ in range(given)]
    if how == "Testall":
        until(lambda: Request.Testall(requests, statuses), what="Testall")
    else:
        getattr(Request, how)(requests, statuses)
    assert len(statuses) == 4
    assert [(s.Get_source(), s.Get_tag()) for s in statuses[2:]] == [(0, 9), (0, 8)]
    assert statuses[0].Get_tag() == 7 and statuses[3].Get_count(MPI.DOUBLE) == 2
    assert np.array_equal(got, sent)


def test_envelope_without_datatype_leaves_the_count():
    r = Request(returns_envelope(None, 0, 3))
    status = MPI.Status()
    status.Set_elements(MPI.BYTE, 17)
    assert r.wait(status) is None
    assert (status.Get_source(), status.Get_tag()) == (0, 3)
    assert status.Get_count(MPI.BYTE) == 17


def test_run_drives_steps_and_fills_the_status():
    status = MPI.Status()
    assert run(returns_envelope("ran", 4, 8, 2, MPI.FLOAT), status) == "ran"
    assert (status.Get_source(), status.Get_tag(), status.Get_count(MPI.FLOAT)) == (4, 8, 2)
    assert run(no_steps(7)) == 7


def test_run_joins_the_engine_when_requests_are_outstanding():
    pending = Request(empty_step([], "pending"))
    assert run(empty_step([], "blocking")) == "blocking"
    assert pending.done  # the blocking call advanced the pending request too
    assert pending.wait() == "pending"


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", [np.float64, np.int16, np.complex64, np.bool_, np.longdouble])
def test_received_array_status(comm, dtype):
    right, left = neighbours(comm)
    x = rank_data(comm.rank, 123, dtype).reshape(3, 41)
    send = comm.isend_array(x, right, tag=17)
    status = MPI.Status()
    got = comm.irecv_array(source=MPI.ANY_SOURCE if comm.size == 1 else left, tag=MPI.ANY_TAG).wait(status)
    send.Wait()
    assert got.shape == (3, 41) and got.dtype == np.dtype(dtype)
    assert np.array_equal(got, rank_data(left, 123, dtype).reshape(3, 41))
    assert status.Get_source() == left
    assert status.Get_tag() == 17
    assert status.Get_count(mpi_datatype(dtype)) == 123
    assert status.Get_count(MPI.BYTE) == 123 * np.dtype(dtype).itemsize


# ---------------------------------------------------------------- Waitall / waitall / Testall / Waitany


@pytest.mark.mpi
def test_waitall_mixes_mpicomm_and_plain_mpi_requests(comm, private):
    right, left = neighbours(comm)
    plain_in = np.zeros(7, np.int32)
    requests = [
        comm.irecv_array(source=left, tag=31),
        private.Irecv(plain_in, left, 32),
        comm.isend_array(rank_data(comm.rank, 10), right, tag=31),
        private.Isend(rank_data(comm.rank, 7, np.int32), right, 32),
    ]
    statuses = [MPI.Status() for _ in requests]
    results = Request.waitall(requests, statuses)
    assert len(results) == 4
    assert np.array_equal(results[0], rank_data(left, 10))
    assert results[1] is None and results[2] is None and results[3] is None
    assert np.array_equal(plain_in, rank_data(left, 7, np.int32))
    assert (statuses[0].Get_source(), statuses[0].Get_tag(), statuses[0].Get_count(MPI.DOUBLE)) == (left, 31, 10)
    assert (statuses[1].Get_source(), statuses[1].Get_tag()) == (left, 32)
    # plain requests complete as they would in mpi4py: their handles become REQUEST_NULL
    assert requests[1] == MPI.REQUEST_NULL and requests[3] == MPI.REQUEST_NULL
    assert all(r.done for r in requests[::2])

    # again with Waitall, without statuses
    plain_in[:] = 0
    again = [
        private.Irecv(plain_in, left, 33),
        comm.isend_array(rank_data(comm.rank, 3, np.uint8), right, tag=34),
        private.Isend(rank_data(comm.rank, 7, np.int32), right, 33),
        comm.irecv_array(source=left, tag=34),
    ]
    assert Request.Waitall(again) is True
    assert np.array_equal(plain_in, rank_data(left, 7, np.int32))
    assert np.array_equal(again[3].wait(), rank_data(left, 3, np.uint8))


@pytest.mark.mpi
def test_waitall_fills_plain_mpi_statuses_completely(comm, private):
    """A plain MPI.Request in Request.Waitall must give the status mpi4py's Waitall gives (count included)."""
    right, left = neighbours(comm)
    buf = np.zeros(7, np.int32)
    requests = [private.Irecv(buf, left, 35), private.Isend(rank_data(comm.rank, 7, np.int32), right, 35)]
    statuses = [MPI.Status() for _ in requests]
    Request.Waitall(requests, statuses)
    assert np.array_equal(buf, rank_data(left, 7, np.int32))
    assert (statuses[0].Get_source(), statuses[0].Get_tag()) == (left, 35)
    assert statuses[0].Get_count(MPI.BYTE) == buf.nbytes
    assert statuses[0].Get_count(MPI.INT32_T) == 7


def test_waitall_rejects_other_objects():
    with pytest.raises(TypeError, match="expected mpicomm.Request or MPI.Request, got str"):
        Request.Waitall(["not a request"])
    assert Request.Waitall([]) is True
    assert Request.waitall([]) == []
    assert Request.Testall([]) is True


@pytest.mark.mpi
def test_testall(comm):
    right, left = neighbours(comm)
    never = comm.irecv_array(source=comm.rank, tag=777)  # nobody sends this
    assert Request.Testall([never]) is False
    recv = comm.irecv_array(source=left, tag=778)
    send = comm.isend_array(rank_data(comm.rank, 50_000), right, tag=778)
    until(lambda: Request.Testall([recv, send]), what="Testall")
    assert recv.done and send.done
    assert np.array_equal(recv.wait(), rank_data(left, 50_000))
    assert Request.Testall([recv, never]) is False  # all, not any
    assert not never.done
    never.Cancel()


@pytest.mark.mpi
def test_waitany(comm):
    right, left = neighbours(comm)
    assert Request.Waitany([]) == MPI.UNDEFINED
    never = comm.irecv_array(source=comm.rank, tag=779)  # nobody sends this
    recv = comm.irecv_array(source=left, tag=780)
    send = comm.isend_array(rank_data(comm.rank, 9, np.int64), right, tag=780)
    status = MPI.Status()
    assert Request.Waitany([never, recv], status) == 1
    assert (status.Get_source(), status.Get_tag(), status.Get_count(MPI.INT64_T)) == (left, 780, 9)
    assert np.array_equal(recv.wait(), rank_data(left, 9, np.int64))
    send.Wait()
    assert not never.done
    never.Cancel()
    assert Request.Waitany([never]) == 0  # a cancelled request is complete


def test_waitany_returns_a_completed_request():
    first = Request(empty_step([], "first"))
    second = Request(empty_step([], "second"))
    assert Request.Waitany([first, second]) == 0
    assert first.done and second.done  # one wait advanced both
    assert Request.Waitany([Request(no_steps(None)), first]) == 0


# ---------------------------------------------------------------- Cancel


@pytest.mark.mpi
def test_cancel_an_unmatched_receive(comm):
    right, left = neighbours(comm)
    r = comm.irecv_array(source=left, tag=4321)
    assert r in outstanding()
    assert repr(r) == "<mpicomm.Request irecv_array: waiting on 1 MPI request(s)>"
    r.Cancel()
    assert r.done
    assert r not in outstanding()
    assert r.wait() is None
    assert r.test() == (True, None)
    assert repr(r) == "<mpicomm.Request irecv_array: done>"
    r.Cancel()  # again: nothing to do
    comm.Barrier()  # every rank has cancelled before anyone sends on that tag
    # the cancelled receive does not steal the next message on its tag
    send = comm.isend_array(rank_data(comm.rank, 4), right, tag=4321)
    got = comm.recv_array(source=left, tag=4321)
    send.Wait()
    assert np.array_equal(got, rank_data(left, 4))


@pytest.mark.mpi
def test_cancel_of_an_already_matched_receive_loses_no_message(fresh):
    """MPI_Cancel of a receive that has matched fails and the receive completes normally;
    mpicomm's Cancel must either deliver the message or leave it for the next receive."""
    comm = fresh
    x = rank_data(comm.rank, 16)
    send = comm.isend_array(x, comm.rank, tag=4322)  # to myself
    comm._state.channel.header.Probe(comm.rank, 4322)  # the header has arrived: the receive matches it when posted
    r = comm.irecv_array(source=comm.rank, tag=4322)
    try:
        r.Cancel()
        value = r.wait()
        if value is None:  # reported as cancelled: the message must still be there for the next receive
            again = comm.irecv_array(source=comm.rank, tag=4322)
            deadline = time.monotonic() + 2  # a message to myself is there at once
            while not again.Test() and time.monotonic() < deadline:
                time.sleep(1e-3)
            value = again.wait() if again.done else again.Cancel()
        assert value is not None, "the message was neither delivered by the cancelled receive nor left for the next one"
        assert np.array_equal(value, x)
        send.Wait()  # and the sender is not left waiting
    finally:
        if not send.done:  # the message was lost: its payload is never received, so the send never completes
            send.Cancel()


def test_cancel_a_request_without_mpi_requests():
    log = []
    r = Request(empty_step(log))
    r.Cancel()
    assert r.done and r not in outstanding()
    assert log == ["start"]  # never resumed
    assert r.wait() is None


# ---------------------------------------------------------------- repr, progress, outstanding


def test_repr():
    r = Request(empty_step([]), "my op")
    assert repr(r) == "<mpicomm.Request my op: waiting on 0 MPI request(s)>"
    r.wait()
    assert repr(r) == "<mpicomm.Request my op: done>"
    assert Request(no_steps(1)).label == "request"
    assert repr(Request(no_steps(1))) == "<mpicomm.Request request: done>"


def test_a_label_is_built_only_when_shown():
    class Lazy:
        shown = 0

        def __str__(self) -> str:
            Lazy.shown += 1
            return "allreduce #3 (ring)"

    r = Request(empty_step([]), Lazy())
    r.wait()
    assert Lazy.shown == 0
    assert r.label == "allreduce #3 (ring)" and Lazy.shown == 1
    assert repr(r) == "<mpicomm.Request allreduce #3 (ring): done>" and Lazy.shown == 2
    assert run(no_steps(5), label=Lazy()) == 5 and Lazy.shown == 2  # run shows it only when stuck


def test_progress_and_outstanding_are_inspectable():
    assert isinstance(outstanding(), list)
    log1, log2 = [], []
    r1 = Request(empty_step(log1, 1), "one")
    r2 = Request(empty_step(log2, 2), "two")
    pending = outstanding()
    assert r1 in pending and r2 in pending
    pending.clear()  # a copy: clearing it changes nothing
    assert r1 in outstanding()
    assert progress() == 2  # both stepped (and completed)
    assert r1.done and r2.done
    assert r1 not in outstanding() and r2 not in outstanding()
    assert progress() == 0  # nothing left to advance
    assert (r1.wait(), r2.wait()) == (1, 2)


@pytest.mark.mpi
def test_progress_advances_a_receive(comm):
    right, left = neighbours(comm)
    r = comm.irecv_array(source=left, tag=901)
    assert r in outstanding() and not r.done
    progress()
    assert not r.done  # nobody sends before every rank has entered the barrier below
    MPI.Intracomm.Barrier(comm)  # mpi4py's barrier: it does not run mpicomm's progress engine
    send = comm.isend_array(rank_data(comm.rank, 1000), right, tag=901)
    stepped = []
    until(lambda: stepped.append(progress()) or r.done, what="progress() completing the receive")
    assert sum(stepped) >= 1
    assert r not in outstanding()
    send.Wait()
    assert np.array_equal(r.wait(), rank_data(left, 1000))


# ---------------------------------------------------------------- progress fairness and ordering


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["wait", "Wait", "waitall", "Waitany", "Test", "blocking recv_array"])
def test_waiting_on_a_later_receive_progresses_an_earlier_one(fresh, how):
    """Rank 1's 8 MB send (rendezvous) blocks until rank 0 posts its payload receive; rank 0 is
    meanwhile waiting for the *second* message. MPI progresses every posted receive, so this must
    complete; an engine that only advanced the request being waited on would deadlock here."""
    comm = fresh
    big = rank_data(1, BIG)
    small = rank_data(1, 10, np.int32)
    if comm.rank == 1:
        comm.send_array(big, 0, tag=1)  # returns only once rank 0 has posted the payload receive
        comm.send_array(small, 0, tag=2)
    elif comm.rank == 0:
        b = comm.irecv_array(source=1, tag=1)
        if how == "blocking recv_array":
            got_small = comm.recv_array(source=1, tag=2)
        else:
            a = comm.irecv_array(source=1, tag=2)
            if how == "wait":
                got_small = a.wait()
            elif how == "Wait":
                assert a.Wait() is True
                got_small = a.wait()
            elif how == "waitall":
                (got_small,) = Request.waitall([a])
            elif how == "Waitany":
                assert Request.Waitany([a]) == 0
                got_small = a.wait()
            else:
                until(a.Test, seconds=60, what="a.Test()")
                got_small = a.wait()
        got_big = b.wait()
        assert got_small.dtype == np.int32 and np.array_equal(got_small, small)
        assert got_big.shape == (BIG,) and np.array_equal(got_big, big)


SIZES = [0, 1, 100_000, 5, BIG, 3, 0, 70_000, 2]
DTYPE_CYCLE = [np.float64, np.int32, np.complex128, np.uint8, np.float32, np.int64]


def message(rank: int, k: int, n: int) -> np.ndarray:
    """The k-th message of *rank*: its own dtype, size and contents."""
    return rank_data(rank * len(SIZES) + k, n, DTYPE_CYCLE[k % len(DTYPE_CYCLE)])


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_same_source_and_tag_arrive_in_order_sent(fresh):
    """Non-overtaking: receives posted for one source and tag match that source's messages in the
    order they were sent, whatever their sizes and whichever receive is waited on first."""
    comm = fresh
    right, left = neighbours(comm)
    sends = [comm.isend_array(message(comm.rank, k, n), right, tag=55) for k, n in enumerate(SIZES)]
    recvs = [comm.irecv_array(source=left, tag=55) for _ in SIZES]
    got = [r.wait() for r in reversed(recvs)][::-1]
    Request.Waitall(sends)
    for k, n in enumerate(SIZES):
        expected = message(left, k, n)
        assert got[k].shape == (n,), f"message {k}"
        assert got[k].dtype == expected.dtype, f"message {k}"
        assert np.array_equal(got[k], expected), f"message {k}"


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
def test_in_order_with_blocking_sends(fresh):
    """Rank 1 sends with blocking send_array (the large ones need rank 0's payload receives);
    rank 0 posted every receive first and waits for the last one first."""
    comm = fresh
    if comm.rank == 1:
        for k, n in enumerate(SIZES):
            comm.send_array(message(1, k, n), 0, tag=56)
    elif comm.rank == 0:
        recvs = [comm.irecv_array(source=1, tag=56) for _ in SIZES]
        statuses = [MPI.Status() for _ in SIZES]
        got = [r.wait(s) for r, s in zip(recvs[::-1], statuses[::-1])][::-1]
        for k, n in enumerate(SIZES):
            expected = message(1, k, n)
            assert got[k].shape == (n,) and got[k].dtype == expected.dtype, f"message {k}"
            assert np.array_equal(got[k], expected), f"message {k}"
            assert statuses[k].Get_count(mpi_datatype(expected.dtype)) == n


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_in_order_into_given_buffers(comm):
    right, left = neighbours(comm)
    sizes = [10, BIG // 4, 10, 1000]
    sends = [comm.isend_array(rank_data(comm.rank * 10 + k, n), right, tag=57) for k, n in enumerate(sizes)]
    bufs = [np.zeros(n) for n in sizes]
    recvs = [comm.irecv_array(buf, source=left, tag=57) for buf in bufs]
    results = Request.waitall(recvs[::-1])[::-1]
    for k, (buf, r) in enumerate(zip(bufs, recvs)):
        assert results[k] is buf and r.wait() is buf
        assert np.array_equal(buf, rank_data(left * 10 + k, sizes[k])), f"message {k}"
    Request.Waitall(sends)


@pytest.mark.mpi
def test_waitany_over_plain_requests_ends_like_mpi(private):
    right, left = (private.rank + 1) % private.size, (private.rank - 1) % private.size
    bufs = [np.empty(1) for _ in range(3)]
    receives = [private.Irecv(b, source=left, tag=t) for t, b in enumerate(bufs)]
    sends = [private.Isend(np.full(1, float(t)), dest=right, tag=t) for t in range(3)]
    order = []
    while True:
        index = Request.Waitany(receives)
        if index == MPI.UNDEFINED:
            break
        order.append(index)
    MPI.Request.Waitall(sends)
    assert sorted(order) == [0, 1, 2]
    assert [float(b[0]) for b in bufs] == [0.0, 1.0, 2.0]


@pytest.mark.mpi(min_size=2)
def test_cancel_after_the_first_step_completes_the_receive(comm):
    """Once a two-part receive has its header, Cancel cannot drop the payload: it finishes the receive."""
    n = 500_000  # two-part
    if comm.rank == 1:
        comm.send_array(rank_data(1, n), 0, tag=77)
    elif comm.rank == 0:
        r = comm.irecv_array(source=1, tag=77)
        until(lambda: progress() >= 0 and (r._step > 0 or r.done), what="the header")
        r.Cancel()
        assert not r.cancelled
        assert np.array_equal(r.wait(), rank_data(1, n))
