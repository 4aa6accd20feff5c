"""Reliability: a wrong call raises the same error on every rank - never a hang, never a silent wrong result.

One test per failure that was found (each failed before its fix):

* a buffer whose element type only the MPI library could take (object,
  structured) on one rank: that rank raised ``KeyError`` inside the library
  call while the others waited (for Bcast the root returned);
* send and receive buffers that partly overlap: accepted, wrong results;
* overlapping receive displacements in allgatherv: accepted, ranks disagreed;
* two different user functions that look alike (two lambdas): taken for one op;
* protocol settings (``MPICOMM_VALIDATE``, ``MPICOMM_<C>_ALGORITHM``) that
  differ between ranks: a silent hang; now an error when the ``Comm`` is made;
* the watchdog: now names the stuck call (count, dtype, op), the ranks that
  never arrived, and each rank's last calls (the flight recorder);
* one ``Comm`` used from two threads at once: now refused with an error that
  says to use one communicator per thread;
* an ``MPICOMM_*`` setting misspelt, with a bad value, naming an unknown
  algorithm or an unwritable trace file: ignored, or refused at first use on
  one rank; now refused when the ``Comm`` is made, on every rank;
* a ``Comm`` used after ``Free``: raw "Invalid communicator" errors and stale
  topology; now :class:`mpicomm.FreedError` naming it;
* ``Cancel`` on a collective request: refused before MPI is touched, and the
  operation completes;
* a program's own message on the private channel (``comm.library_comm``) with
  a collective's tag: blamed on "a bug in the algorithm"; now the error names
  the channel, its tags and what to send on instead.

Jobs that must hang (or may) run as their own MPI job with a time limit
(marked ``launches``: the serial pass runs them).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from mpicomm import config

from . import mpirun
from .coll.reference import expect_everywhere as everywhere
from .coll.reference import outcome

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(120)]

P = MPI.COMM_WORLD.Get_size()


# ---------------------------------------------------------------- element types only the library could take


@pytest.mark.parametrize("kind", ["object", "structured"])
@pytest.mark.parametrize("collective", ["bcast", "allreduce", "allgather"])
def test_a_dtype_the_library_cannot_map_on_one_rank_raises_everywhere(comm, kind, collective):
    rank, p = comm.Get_rank(), comm.Get_size()
    odd = rank == p - 1
    if kind == "object":
        x = np.array([1.0, 2.0, 3.0], dtype=object) if odd else np.arange(3.0)
    else:
        x = np.zeros(3, [("a", "f8"), ("b", "i4")]) if odd else np.arange(3.0)
    if collective == "bcast":
        call = lambda: comm.Bcast(x, root=0)  # noqa: E731
    elif collective == "allreduce":
        call = lambda: comm.Allreduce(x, np.empty_like(x))  # noqa: E731
    else:
        call = lambda: comm.Allgather(x, np.empty(3 * p, x.dtype))  # noqa: E731
    everywhere(comm, call, f"rank {p - 1}: ", "neither mpicomm nor the MPI library moves without a datatype",
               ".astype()")


def test_a_dtype_the_library_cannot_map_on_every_rank_raises_everywhere(comm):
    x = np.array([1, 2], dtype=object)
    everywhere(comm, lambda: comm.Bcast(x, root=0), "rank 0: buf has element type object")


def test_a_structured_dtype_with_its_mpi_datatype_still_goes_to_the_library(comm):
    dt = np.dtype([("a", "f8"), ("b", "f8")])  # no MPI pair type, but contiguous doubles
    x = np.zeros(2, dt)
    if comm.Get_rank() == 0:
        x["a"], x["b"] = [1, 2], [3, 4]
    comm.Bcast([x, 4, MPI.DOUBLE], root=0)
    assert x["a"].tolist() == [1, 2] and x["b"].tolist() == [3, 4]


# ---------------------------------------------------------------- send and receive buffers that overlap


def _overlapping(comm, collective: str, algorithm: str | None) -> Callable[[], Any]:
    p = comm.Get_size()
    big = np.arange(4 * p + 2, dtype=np.float64) + comm.Get_rank()
    if collective == "allreduce":
        return lambda: comm.Allreduce(big[:4], big[2:6], algorithm=algorithm)
    if collective == "scan":
        return lambda: comm.Scan(big[:4], big[1:5], algorithm=algorithm)
    if collective == "reduce_scatter_block":
        return lambda: comm.Reduce_scatter_block(big[: 2 * p], big[1:3], algorithm=algorithm)
    if collective == "alltoall":
        return lambda: comm.Alltoall(big[: 2 * p], big[1 : 1 + 2 * p], algorithm=algorithm)
    if collective == "allgather":
        return lambda: comm.Allgather(big[:2], big[1 : 1 + 2 * p], algorithm=algorithm)
    raise AssertionError(collective)


@pytest.mark.parametrize("collective,algorithm", [
    ("reduce_scatter_block", "pairwise"), ("scan", "linear"), ("alltoall", "linear"), ("alltoall", "pairwise"),
    ("allreduce", None), ("allgather", None)])
def test_partly_overlapping_send_and_receive_buffers_are_refused(comm, collective, algorithm):
    everywhere(comm, _overlapping(comm, collective, algorithm), "the send buffer", "partly overlap",
               "MPI.IN_PLACE")


def test_overlap_in_the_array_api_is_refused(comm):
    x = np.arange(6, dtype=np.float64)
    everywhere(comm, lambda: mpicomm.allreduce(x[:4], out=x[2:], comm=comm), "partly overlap")


def test_the_same_buffer_for_send_and_receive_stays_accepted(comm):
    rank, p = comm.Get_rank(), comm.Get_size()
    x = np.arange(4, dtype=np.float64) + rank
    expected = np.empty_like(x)
    MPI.COMM_WORLD.Allreduce(x, expected)
    comm.Allreduce(x, x)  # the same bytes: in place, as before
    assert np.allclose(x, expected)
    y = np.arange(2 * p, dtype=np.float64) + 100 * rank
    want = np.empty_like(y)
    MPI.COMM_WORLD.Alltoall(y, want)
    comm.Alltoall(y, y.view())
    assert np.array_equal(y, want)


def test_disjoint_views_of_one_array_are_accepted(comm):
    p = comm.Get_size()
    big = np.zeros(4 * p + 4)
    big[:4] = np.arange(4) + comm.Get_rank()
    comm.Allreduce(big[:4], big[4:8])
    assert np.allclose(big[4:8], np.arange(4) * p + p * (p - 1) / 2)


# ---------------------------------------------------------------- overlapping receive displacements


@pytest.mark.parametrize("algorithm", ["bruck", "ring", "linear", "recursive_doubling"])
def test_allgatherv_overlapping_receive_blocks_are_refused(comm, algorithm):
    p = comm.Get_size()
    if p < 2:
        pytest.skip("needs two ranks' blocks")
    counts = [2] * p
    displs = [0] + [2 * r - 1 for r in range(1, p)]  # rank 1's block starts inside rank 0's
    x = np.full(2, float(comm.Get_rank()))
    everywhere(comm, lambda: comm.Allgatherv(x, [np.zeros(2 * p), counts, displs], algorithm=algorithm),
               "recvbuf: the blocks of rank 0 (elements [0, 2)) and rank 1 (elements [1, 3)) overlap")


def test_gatherv_and_alltoallv_overlapping_receive_blocks_are_refused(comm):
    p = comm.Get_size()
    if p < 2:
        pytest.skip("needs two ranks' blocks")
    x = np.ones(1)
    recv = [np.zeros(p), [1] * p, [0] * p] if comm.Get_rank() == 0 else None
    everywhere(comm, lambda: comm.Gatherv(x, recv, root=0), "rank 0: ", "overlap")
    send = np.ones(p)
    everywhere(comm, lambda: comm.Alltoallv([send, [1] * p], [np.zeros(p), [1] * p, [0] * p]), "overlap")


def test_empty_blocks_may_share_a_displacement(comm):
    p = comm.Get_size()
    counts = [1] + [0] * (p - 1)
    x = np.full(1 if comm.Get_rank() == 0 else 0, 7.0)
    out = np.zeros(1)
    comm.Allgatherv(x, [out, counts, [0] * p])
    assert out[0] == 7.0


# ---------------------------------------------------------------- user ops that look alike


@pytest.mark.skipif(P < 2, reason="needs p >= 2: ranks must differ")
def test_two_different_lambdas_are_two_ops(comm):
    x = np.arange(1.0, 5.0)
    fn = (lambda a, b: a + b) if comm.Get_rank() == 0 else (lambda a, b: a * b)
    op = mpicomm.ops.create(fn, commutative=True)
    everywhere(comm, lambda: comm.Allreduce(x, np.empty_like(x), op), "ranks disagree on the op",
               "<lambda> (user function #")


@pytest.mark.skipif(P < 2, reason="needs p >= 2: ranks must differ")
def test_closures_over_different_values_are_different_ops(comm):
    scale = 2.0 if comm.Get_rank() == 0 else 3.0
    op = mpicomm.ops.create(lambda a, b: a + scale * b, name="scaled")
    x = np.arange(4.0)
    everywhere(comm, lambda: comm.Allreduce(x, np.empty_like(x), op), "ranks disagree on the op")


def test_the_same_function_is_one_op_on_every_rank(comm):
    op = mpicomm.ops.create(lambda a, b: np.maximum(a, b), commutative=True)
    x = np.arange(4.0) * (comm.Get_rank() + 1)
    out = np.empty_like(x)
    comm.Allreduce(x, out, op)
    assert np.array_equal(out, np.arange(4.0) * comm.Get_size())


def test_op_codes_tell_functions_apart_locally():
    create = mpicomm.ops.create
    k = 3
    codes = {create(lambda a, b: a + b).code, create(lambda a, b: a * b).code, create(lambda a, b: a + k * b).code,
             create(np.add).code, create(np.multiply).code}
    assert len(codes) == 5
    assert create(lambda a, b: a + b).code == create(lambda a, b: a + b).code  # the same source: the same op


# ---------------------------------------------------------------- protocol settings checked at Comm creation


@pytest.mark.skipif(P < 2, reason="needs p >= 2: ranks must differ")
@pytest.mark.parametrize("variable,values", [("MPICOMM_VALIDATE", ("0", "1")),
                                             ("MPICOMM_ALLREDUCE_ALGORITHM", ("ring", None))])
def test_protocol_settings_that_differ_raise_at_comm_creation(comm, monkeypatch, variable, values):
    mine = values[0] if comm.Get_rank() == 0 else values[1]
    if mine is None:
        monkeypatch.delenv(variable, raising=False)
    else:
        monkeypatch.setenv(variable, mine)
    dup = MPI.COMM_WORLD.Dup()
    try:
        got = MPI.COMM_WORLD.allgather(outcome(lambda: mpicomm.Comm(dup)))
    finally:
        monkeypatch.undo()
        dup.Free()
    assert all(kind == "ValueError" for kind, _, _ in got), got
    assert len({m for _, _, m in got}) == 1, got
    message = got[0][2]
    shown = "'0'" if variable == "MPICOMM_VALIDATE" else "'ring'"
    assert f"{variable}: {shown} on rank(s) 0" in message and "rank(s) 1" in message, message
    assert "Set them alike on every rank" in message


def test_equal_protocol_settings_pass(comm, monkeypatch):
    monkeypatch.setenv("MPICOMM_VALIDATE", "on")  # parsed: "on" and "1" are one setting
    monkeypatch.setenv("MPICOMM_BCAST_ALGORITHM", "binomial")
    dup = mpicomm.Comm(MPI.COMM_WORLD.Dup())
    try:
        buf = np.arange(3.0) if dup.Get_rank() == 0 else np.zeros(3)
        dup.Bcast(buf, root=0)
        assert np.array_equal(buf, np.arange(3.0))
    finally:
        dup.Free()


def test_protocol_mismatch_message_names_every_rank():
    every = [(("MPICOMM_VALIDATE", "1"),), (("MPICOMM_VALIDATE", "0"), ("MPICOMM_BCAST_ALGORITHM", "linear")),
             (("MPICOMM_VALIDATE", "1"),)]
    message = config.protocol_mismatch(every)
    assert "MPICOMM_VALIDATE: '1' on rank(s) 0, 2, '0' on rank(s) 1" in message
    assert "MPICOMM_BCAST_ALGORITHM: 'unset' on rank(s) 0, 2, 'linear' on rank(s) 1" in message
    assert config.protocol_mismatch([(("MPICOMM_VALIDATE", "1"),)] * 3) is None


# ---------------------------------------------------------------- every MPICOMM_* setting checked at Comm creation


def _made_everywhere(monkeypatch, mine: dict[str, str]) -> list[tuple[str, bool, str]]:
    """Every rank's outcome of making a Comm with *mine* set in its environment (this rank's settings)."""
    for name, value in mine.items():
        monkeypatch.setenv(name, value)
    dup = MPI.COMM_WORLD.Dup()
    made: list[mpicomm.Comm] = []
    try:
        return MPI.COMM_WORLD.allgather(outcome(lambda: made.append(mpicomm.Comm(dup))))
    finally:
        monkeypatch.undo()
        (made[0] if made else dup).Free()


@pytest.mark.parametrize("setting,fragments", [
    ({"MPICOMM_VALIDAT": "0"}, ["MPICOMM_VALIDAT is not an mpicomm setting", "did you mean MPICOMM_VALIDATE?"]),
    ({"MPICOMM_ALLREDUCE_ALGORITHM": "rign"}, ["MPICOMM_ALLREDUCE_ALGORITHM='rign' is not an algorithm of allreduce",
                                               "did you mean 'ring'?", "recursive_doubling"]),
    ({"MPICOMM_ALLREDUC_ALGORITHM": "ring"}, ["'allreduc' is not a collective", "MPICOMM_ALLREDUCE_ALGORITHM"]),
    ({"MPICOMM_TIMEOUT": "soon"}, ["MPICOMM_TIMEOUT='soon' is not a positive number"]),
    ({"MPICOMM_CMA": "maybe"}, ["MPICOMM_CMA='maybe' is not one of auto, 0, 1"]),
    ({"MPICOMM_TORCH_PROGRESS": "fast"}, ["MPICOMM_TORCH_PROGRESS='fast' is not one of async, sync"]),
    ({"MPICOMM_ALGORITHM_MODULES": "no_such_package.algos"}, ["cannot import algorithm module 'no_such_package.algos'"]),
])
@pytest.mark.parametrize("where", ["one", "all"])
def test_a_bad_setting_is_refused_at_comm_creation_on_every_rank(monkeypatch, setting, fragments, where):
    """A bad name or value - on the last rank only, or everywhere - raises when the Comm is made, with one message
    on every rank naming the variable, the ranks that have it and the valid values; no hang."""
    bad = where == "all" or MPI.COMM_WORLD.Get_rank() == P - 1
    got = _made_everywhere(monkeypatch, setting if bad else {})
    assert all(kind == "ValueError" for kind, _, _ in got), got
    assert len({m for _, _, m in got}) == 1, got
    message = got[0][2]
    for fragment in fragments:
        assert fragment in message, message
    ranks = ", ".join(map(str, range(P))) if where == "all" else str(P - 1)
    assert message.endswith(f"(rank{'s' if where == 'all' and P > 1 else ''} {ranks})"), message
    mpicomm.Comm(MPI.COMM_WORLD).Barrier()  # the job goes on


def test_a_trace_file_nobody_can_write_is_refused_at_comm_creation(monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"  # a directory under a regular file: not writable, for root too
    blocker.write_text("")
    got = _made_everywhere(monkeypatch, {"MPICOMM_TRACE": str(blocker / "trace.json")})
    assert all(kind == "ValueError" for kind, _, _ in got), got
    assert "MPICOMM_TRACE=" in got[0][2] and "cannot write the trace file" in got[0][2] and "(rank 0)" in got[0][2]


def test_known_settings_and_the_suite_s_own_pass(monkeypatch):
    got = _made_everywhere(monkeypatch, {"MPICOMM_BCAST_ALGORITHM": "binomial", "MPICOMM_NTASKS": "4",
                                         "MPICOMM_TEST_SOMETHING": "x", "MPICOMM_TORCH_PROGRESS": "sync",
                                         "MPICOMM_ALLREDUCE_ALGORITHM": "auto"})
    assert all(kind == "" for kind, _, _ in got), got


def test_every_known_setting_is_documented():
    for name in config.KNOWN:
        assert f"``{name}``" in config.__doc__, f"{name} is read but not in mpicomm.config's table"


def test_refusal_names_each_problem_with_its_ranks():
    message = config.refusal([["a"], [], ["a", "b"]])
    assert message == "mpicomm settings refused: a (ranks 0, 2); b (rank 2)"
    assert config.refusal([[], []]) is None


# ---------------------------------------------------------------- a freed communicator


def test_a_freed_comm_raises_mpicomm_s_error_for_every_use(comm):
    dup = mpicomm.Comm(MPI.COMM_WORLD.Dup())
    other = mpicomm.Comm.__new__(mpicomm.Comm, dup)  # a second wrapper of the same communicator
    other.__init__(dup)
    request = dup.Allreduce_init(np.ones(2), np.empty(2))
    dup.Free()
    x = np.arange(3.0)
    uses: list[tuple[str, Callable[[], Any]]] = [
        ("Allreduce", lambda: dup.Allreduce(MPI.IN_PLACE, x)),
        ("Barrier", lambda: dup.Barrier()),
        ("Iallreduce", lambda: dup.Iallreduce(MPI.IN_PLACE, x)),
        ("Allreduce_init", lambda: dup.Allreduce_init(MPI.IN_PLACE, x)),
        ("local_rank", lambda: dup.local_rank),
        ("node_comm", lambda: dup.node_comm),
        ("send_array", lambda: dup.send_array(x, 0)),
        ("irecv_array", lambda: dup.irecv_array()),
        ("mpicomm.allreduce", lambda: mpicomm.allreduce(x, comm=dup)),
        ("another wrapper", lambda: other.Allreduce(MPI.IN_PLACE, x)),
        ("a persistent request", lambda: request.Start()),
    ]
    for _name, use in uses:
        with pytest.raises(mpicomm.FreedError, match=r"was freed \(Comm.Free\).*make a new one"):
            use()
    assert repr(dup) == "<mpicomm.Comm (freed)>"
    still = mpicomm.Comm(MPI.COMM_WORLD)
    y = np.ones(2)
    still.Allreduce(MPI.IN_PLACE, y)  # the other communicators go on
    assert np.array_equal(y, np.full(2, float(P)))


def test_a_persistent_collective_request_refuses_cancel_and_completes(comm):
    x = np.arange(5.0) + comm.Get_rank()
    y = np.empty_like(x)
    request = comm.Allreduce_init(x, y)
    request.Start()
    with pytest.raises(ValueError, match="cannot be cancelled"):
        request.Cancel()
    request.Wait()
    assert np.array_equal(y, sum(np.arange(5.0) + r for r in range(P)))
    request.Free()


@pytest.mark.skipif(P != 2, reason="the probe's case: with more ranks the program's message may meet another step")
def test_a_program_s_own_message_on_the_private_channel_is_named_not_blamed_on_the_algorithm(comm):
    """A program that sends on ``comm.library_comm`` with a collective's tag: the collective's receive takes its
    message (longer than posted) and every rank raises a RuntimeError that names the channel, the tags and what
    to do instead (it said "a bug in the algorithm"). 20 runs, each on a fresh communicator."""
    rank = comm.Get_rank()
    for run in range(20):
        dup = comm.Dup()
        mine = np.full(1500, float(rank + run))  # 12 KB: longer than the allreduce's 8 KB block
        sent = dup.library_comm.Isend(mine, 1 - rank, tag=1)  # tag 1: a fresh communicator's collectives' data
        x, y = np.arange(1024.0) + rank, np.empty(1024)
        try:
            dup.Allreduce(x, y, algorithm="recursive_doubling")
            message = ""
        except RuntimeError as exc:
            message = str(exc)
        sent.Wait()  # (the allreduce's receive took it)
        dup.library_comm.Recv(np.empty(1024), 1 - rank, tag=1)  # and left the peer's block unread: take it, or a
        # later communicator that reuses this one's context could read it as its own
        everyone = MPI.COMM_WORLD.allgather(message.partition(": ")[2])
        assert everyone[0] and all(m == everyone[0] for m in everyone), (run, everyone)
        assert "arrived on mpicomm's private communicator (comm.library_comm, tag 1 or 2 for this call)" in message
        assert "send on the communicator itself (or a Dup of it), or on comm.library_comm only with tags from " \
               "comm.collective_tag()" in message, message
        assert "bug in the algorithm" not in message, message
        dup.Free()


# ---------------------------------------------------------------- one Comm, two threads


def test_a_second_thread_inside_a_call_is_refused_everywhere(comm):
    dup = mpicomm.Comm(MPI.COMM_WORLD.Dup())
    try:
        held, release = threading.Event(), threading.Event()

        def hold() -> None:  # stands for a thread inside a long collective on dup
            with dup._state.lock:
                held.set()
                release.wait(30)

        other = threading.Thread(target=hold, name="holder")
        other.start()
        held.wait(30)
        x = np.arange(3.0)
        try:
            with pytest.raises(RuntimeError) as info:
                dup.Allreduce(x, np.empty_like(x))
        finally:
            release.set()
            other.join()
        message = str(info.value)
        assert "from two threads at once" in message and "comm.Dup() for each thread" in message
        assert "MPI library provides MPI_THREAD_" in message
        # the communicator is now refused on every rank alike (the poisoned rank's problem reaches the agreement)
        everywhere(comm, lambda: dup.Allreduce(x, np.empty_like(x)), "from two threads at once")
    finally:
        dup.Free()


def test_one_comm_per_thread_works(comm):
    dups = [mpicomm.Comm(MPI.COMM_WORLD.Dup()) for _ in range(2)]
    wrong: list[str] = []

    def work(t: int) -> None:
        c = dups[t]
        for i in range(50):
            x = np.full(4, 1000.0 * c.Get_rank() + 10 * t + i)
            out = np.empty(4)
            c.Allreduce(x, out)
            want = sum(1000.0 * r + 10 * t + i for r in range(c.Get_size()))
            if not np.all(out == want):
                wrong.append(f"thread {t} call {i}: {out[0]} != {want}")

    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        pytest.skip("the MPI library does not provide MPI_THREAD_MULTIPLE")
    threads = [threading.Thread(target=work, args=(t,)) for t in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for d in dups:
        d.Free()
    assert not wrong, wrong


_THREADS = """
import threading, numpy as np
from mpi4py import MPI
import mpicomm
c = mpicomm.Comm(MPI.COMM_WORLD.Dup())
r, p = c.Get_rank(), c.Get_size()
def work(t):
    for i in range(300):
        x = np.full(4, r * 1000.0 + t * 10 + i)
        out = np.empty(4)
        try:
            c.Allreduce(x, out)
        except Exception as e:
            print(f"ERROR rank {r} thread {t} call {i}: {type(e).__name__}: {e}", flush=True)
            return
        want = sum(q * 1000.0 + t * 10 + i for q in range(p))
        if not np.all(out == want):
            print(f"WRONG rank {r} thread {t} call {i}: {out[0]} != {want}", flush=True)
threads = [threading.Thread(target=work, args=(t,)) for t in range(2)]
for t in threads: t.start()
for t in threads: t.join()
print(f"DONE rank {r}", flush=True)
"""


@pytest.mark.launches
def test_two_threads_on_one_comm_never_give_a_wrong_result():
    result = mpirun.run(2, [sys.executable, "-c", _THREADS], timeout=60, env={"MPICOMM_TIMEOUT": "10"})
    out = result.stdout + result.stderr
    assert "WRONG" not in out, out
    assert "from two threads at once" in out, out
    assert "one communicator per thread" in out, out


# ---------------------------------------------------------------- the watchdog


_MISSING = """
import time, numpy as np
from mpi4py import MPI
import mpicomm
c = mpicomm.Comm()
r, p = c.Get_rank(), c.Get_size()
x = np.arange(4.0)
c.Bcast(x, root=0)
c.Allreduce(x, np.empty_like(x), algorithm="recursive_doubling")
if r != p - 1:
    c.Allreduce(x, np.empty_like(x), algorithm="recursive_doubling")  # the last rank never calls it
else:
    time.sleep(60)
"""


@pytest.mark.launches
@pytest.mark.parametrize("validate", ["1", "0"])
def test_the_watchdog_names_the_call_the_missing_rank_and_the_recent_calls(validate):
    ranks = 3
    result = mpirun.run(ranks, [sys.executable, "-c", _MISSING], timeout=60,
                        env={"MPICOMM_TIMEOUT": "3", "MPICOMM_VALIDATE": validate,
                             "MPIR_CVAR_CH4_PROGRESS_THROTTLE": "1"})
    err = result.stderr
    assert result.returncode != 0 and not result.timed_out, (result.returncode, err)
    assert "mpicomm watchdog: rank 0 of MPI_COMM_WORLD waited more than 3 s" in err, err
    assert "allreduce #2 (recursive_doubling): 4 × float64, op sum" in err, err
    assert f"never arrived: rank(s) {ranks - 1}" in err, err
    assert "in allreduce #2 (recursive_doubling): rank(s) 0, 1" in err, err
    assert "flight recorder, rank 0 (last calls on this communicator, oldest first): bcast #0" in err, err
    assert "allreduce #1 (recursive_doubling): 4 × float64, op sum [done]" in err, err
    assert "flight recorder, rank 1: bcast #0" in err, err
    if validate == "1":
        assert "argument agreement" in err, err  # (it travels in the first messages of the call)


def test_the_flight_recorder_keeps_the_last_calls(comm):
    from mpicomm.engine.watchdog import recorder
    from mpicomm.state import RECENT

    dup = mpicomm.Comm(MPI.COMM_WORLD.Dup())
    try:
        x = np.arange(3.0)
        for _ in range(RECENT + 2):
            dup.Allreduce(x, np.empty_like(x))
        outcome(lambda: dup.Allreduce(x, np.empty(2)))  # fails on every rank
        lines = recorder(dup._state)
        assert len(lines) == RECENT
        assert lines[-1].startswith(f"allreduce #{RECENT + 2} (") and lines[-1].endswith("[failed]"), lines
        assert lines[0].endswith("3 × float64, op sum [done]"), lines
    finally:
        dup.Free()
