"""mpicomm.engine.progress: nonblocking and persistent collectives complete whatever their rank does meanwhile.

The program the core issue names: rank 0 starts an Iallreduce and enters a native collective on the same
communicator before its Wait, while rank 1 waits first - legal MPI, which plain mpi4py finishes; a rank
that computes or sleeps while its collective is in flight; persistent requests started in different
orders (an error on every rank, never each other's data); Free with a request pending (it completes);
the watchdog on a persistent request.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from mpicomm.engine import lane

from ..conftest import rank_data

pytestmark = pytest.mark.timeout(120)


def _sum_of(comm, x):
    out = np.empty_like(x)
    MPI.COMM_WORLD.Allreduce(x, out)
    return out


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("native", ["Barrier", "Allreduce"])
def test_a_native_collective_between_start_and_wait(comm, native):
    x = rank_data(comm.rank, 1000)
    expected = _sum_of(comm, x)
    y = np.empty_like(x)
    request = comm.Iallreduce(x, y)
    one = np.array([comm.rank], np.int64)
    total = np.empty(1, np.int64)
    if comm.rank == 0:  # the library's own collective on the same communicator, before the Wait
        MPI.Intracomm.Barrier(comm) if native == "Barrier" else MPI.Intracomm.Allreduce(comm, one, total)
        request.Wait()
    else:
        request.Wait()  # needs rank 0's part of the Iallreduce while rank 0 sits in the native call
        MPI.Intracomm.Barrier(comm) if native == "Barrier" else MPI.Intracomm.Allreduce(comm, one, total)
    assert np.array_equal(y, expected)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("reduction", ["allreduce", "reduce", "scan", "exscan"])
def test_the_first_pickled_reduction_on_a_communicator_while_a_collective_is_pending(comm, reduction):
    """mpi4py holds the GIL through its first pickle-based reduction on a communicator (it duplicates it): with
    the progress thread unable to run, rank 0's pending Iallreduce stopped and rank 1, waiting for it before
    its own reduction, waited forever."""
    fresh = comm.Dup()
    try:
        r, p = fresh.rank, fresh.size
        x = rank_data(r, 4 * p + 1)
        expected = _sum_of(fresh, x)
        y = np.empty_like(x)
        request = fresh.Iallreduce(x, y, algorithm="ring")  # 2(p-1) rounds: the peers need rank 0's later ones
        call = {"allreduce": lambda: fresh.allreduce(r + 1), "reduce": lambda: fresh.reduce(r + 1, root=0),
                "scan": lambda: fresh.scan(r + 1), "exscan": lambda: fresh.exscan(r + 1)}[reduction]
        if r == 0:
            got = call()
            request.Wait()
        else:
            request.Wait()
            got = call()
        want = {"allreduce": p * (p + 1) // 2, "reduce": p * (p + 1) // 2 if r == 0 else None,
                "scan": (r + 1) * (r + 2) // 2, "exscan": r * (r + 1) // 2 if r else None}[reduction]
        assert got == want and np.array_equal(y, expected)
    finally:
        fresh.Free()


@pytest.mark.mpi(min_size=2)
def test_the_native_call_program_finishes_20_times_also_as_the_progress_thread_goes_idle(comm):
    """The core issue's program, 20 times over, each started as the progress thread goes idle (it lingers
    ``LINGER`` s after its last run): a ring allreduce (2(p-1) rounds, so the waiting peers need this rank's
    later rounds) pending while rank 0 sits in a call that is not mpicomm's - the library's barrier, a
    pickled collective, a point-to-point exchange, a barrier on another communicator, in turn."""
    from mpicomm.engine import progress

    other = comm.library_comm  # another communicator over the same ranks
    r, p = comm.rank, comm.size
    x = rank_data(r, 4 * p + 1)
    expected = _sum_of(comm, x)
    for i in range(20):
        between = ("library", "pickled", "p2p", "other communicator")[i % 4]
        time.sleep(progress.ProgressThread.LINGER * (0.9 + 0.02 * i))  # before, at and after the idle moment
        y = np.empty_like(x)
        request = comm.Iallreduce(x, y, algorithm="ring")
        if r == 0:
            if between == "library":
                MPI.Intracomm.Barrier(comm)
            elif between == "pickled":
                assert comm.allreduce(i) == i * p
            elif between == "p2p":
                for peer in range(1, p):
                    assert comm.recv(source=peer, tag=7) == (peer, i)
            else:
                other.Barrier()
            request.Wait()
        else:
            request.Wait()  # needs rank 0's later rounds while rank 0 sits in the other call
            if between == "library":
                MPI.Intracomm.Barrier(comm)
            elif between == "pickled":
                assert comm.allreduce(i) == i * p
            elif between == "p2p":
                comm.send((r, i), dest=0, tag=7)
            else:
                other.Barrier()
        assert np.array_equal(y, expected), i


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("busy", ["sleeps", "computes"])
def test_a_collective_completes_while_its_rank_is_busy(comm, busy):
    x = rank_data(comm.rank, 4096)
    expected = _sum_of(comm, x)
    y = np.empty_like(x)
    MPI.COMM_WORLD.Barrier()
    request = comm.Iallreduce(x, y)
    if comm.rank == 0:
        began = time.perf_counter()
        if busy == "sleeps":
            time.sleep(1.5)
        else:
            total = 0
            while time.perf_counter() - began < 1.5:  # pure Python: holds the GIL but for the switch interval
                total += sum(range(1000))
        request.Wait()
        waited = 0.0
    else:
        began = time.perf_counter()
        request.Wait()
        waited = time.perf_counter() - began
    waits = comm.library_comm.allgather(waited)
    assert np.array_equal(y, expected)
    assert max(waits) < 1.0, f"the peers of a busy rank waited {max(waits):.2f} s: its collective did not progress"


@pytest.mark.mpi(min_size=2)
@pytest.mark.skipif(not lane.available(), reason=f"no compiled lane here: {lane.why_not}")
def test_collectives_on_several_communicators_complete_while_their_rank_sleeps(comm, monkeypatch):
    """Three communicators, each with a collective in flight while rank 0 sleeps: the progress thread completes all
    of them (the peers' waits end long before rank 0 wakes), waiting for the three in one call into the lane."""
    naps = []
    monkeypatch.setattr(lane, "nap", lambda runs, *a, _f=lane.nap: naps.append(len(runs)) or _f(runs, *a))
    comms = [comm] + [mpicomm.Comm(comm.library_comm.Dup()) for _ in range(2)]
    xs = [rank_data(comm.rank, 1 << 17) * (i + 1) for i in range(3)]  # (1 MiB: rounds that need rank 0's progress)
    expected = [_sum_of(comm, x) for x in xs]
    ys = [np.empty_like(x) for x in xs]
    for c in comms:
        c.Barrier()
    MPI.COMM_WORLD.Barrier()
    if comm.rank != 0:  # rank 0 starts first, and sleeps: its runs stay in flight until the thread completes them
        time.sleep(0.2)
    requests = [c.Iallreduce(x, y) for c, x, y in zip(comms, xs, ys)]
    began = time.perf_counter()
    if comm.rank == 0:
        time.sleep(1.5)
    for r in requests:
        r.Wait()
    waited = time.perf_counter() - began
    waits = comm.library_comm.allgather(waited)
    for i, (y, e) in enumerate(zip(ys, expected)):
        assert np.array_equal(y, e), f"communicator {i}"
    assert max(waits[1:]) < 1.0, f"the peers of a sleeping rank waited {max(waits[1:]):.2f} s"
    if comm.rank == 0:
        assert max(naps, default=0) >= 2, f"the thread's waits in the lane took {sorted(set(naps))} runs at once"
    for c in comms[1:]:
        c.Free()


@pytest.mark.mpi(min_size=2)
def test_persistent_requests_started_in_different_orders_raise_on_every_rank(comm):
    x, y = rank_data(comm.rank, 6), np.empty(6)
    u, v = rank_data(comm.rank + 7, 6), np.empty(6)
    first, second = comm.Allreduce_init(x, y), comm.Allreduce_init(u, v)  # the same signature
    order = [first, second] if comm.rank == 0 else [second, first]
    for request in order:
        request.Start()
    errors = []
    for request in (first, second):
        try:
            request.Wait()
        except (mpicomm.ArgumentError, RuntimeError) as exc:
            errors.append(exc)
    assert errors, "requests started in different orders exchanged each other's data"
    disagreements = [e for e in errors if isinstance(e, mpicomm.ArgumentError)]
    assert disagreements and "which persistent request this is" in str(disagreements[0])
    assert "start persistent requests in the same order on every rank" in str(disagreements[0])
    for request in (first, second):  # the communicator and the requests still work
        request.Start()
        request.Wait()
    assert np.array_equal(y, _sum_of(comm, x)) and np.array_equal(v, _sum_of(comm, u))


@pytest.mark.mpi
def test_free_with_a_request_pending_lets_it_complete(comm):
    dup = comm.Dup()
    x = rank_data(dup.rank, 100)
    y = np.empty_like(x)
    request = dup.Iallreduce(x, y)
    dup.Free()
    request.Wait()
    assert np.array_equal(y, _sum_of(comm, x))


@pytest.mark.mpi
def test_collective_tag_on_one_rank_changes_nothing(comm):
    dup = comm.Dup()  # (its tag counter differs between ranks afterwards: keep that out of the shared comm)
    if dup.rank == 0:
        for _ in range(5):
            dup.collective_tag()
    x = rank_data(dup.rank, 10)
    y = np.empty_like(x)
    dup.Allreduce(x, y)
    request = dup.Ibcast(y, root=dup.size - 1)
    request.Wait()
    dup.Free()
    assert np.array_equal(y, _sum_of(comm, x))


@pytest.mark.mpi
def test_a_collective_request_refuses_cancel_and_completes(comm):
    x = rank_data(comm.rank, 10)
    y = np.empty_like(x)
    request = comm.Iallreduce(x, y)
    with pytest.raises(ValueError, match="cannot be cancelled"):
        request.Cancel()
    request.Wait()
    assert np.array_equal(y, _sum_of(comm, x))


@pytest.mark.launches
def test_the_watchdog_names_a_stuck_persistent_request():
    from tests import mpirun

    env = {"MPICOMM_TIMEOUT": "2"}
    result = mpirun.run(2, [sys.executable, "-m", "tests.programs", "stuck_persistent"], timeout=60, env=env)
    assert not result.timed_out and result.returncode != 0 and result.seconds < 30
    assert "mpicomm watchdog" in result.stderr and "allreduce #" in result.stderr, result.stderr[-2000:]
    assert "AttributeError" not in result.stderr


@pytest.mark.launches
def test_a_persistent_and_a_blocking_call_from_two_threads_never_mix_results():
    from tests import mpirun

    result = mpirun.run(2, [sys.executable, "-m", "tests.programs", "two_threads"], timeout=90,
                        env={"MPICOMM_TIMEOUT": "20"})
    assert not result.timed_out, result.stderr[-2000:]
    if result.returncode == 0:
        reports = json.loads(result.stdout.strip().splitlines()[-1])
        assert all(r["wrong"] == 0 for r in reports), reports
    else:  # a clear error: the refusal or the disagreement, never a silent mix
        assert "two threads" in result.stderr or "ranks disagree" in result.stderr, result.stderr[-2000:]
