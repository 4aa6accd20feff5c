"""mpicomm.coll.barrier: dissemination and native barriers, blocking and nonblocking."""

from __future__ import annotations

import logging
import time

import pytest
from mpi4py import MPI

import mpicomm
from mpicomm.coll.patterns import dissemination as dissemination_schedule

ALGORITHMS = ["native", "dissemination"]


def test_dissemination_schedule_literal_table():
    # p = 5: three rounds at distances 1, 2, 4
    table = {rank: list(dissemination_schedule(rank, 5)) for rank in range(5)}
    assert table == {
        0: [(1, 4), (2, 3), (4, 1)],
        1: [(2, 0), (3, 4), (0, 2)],
        2: [(3, 1), (4, 0), (1, 3)],
        3: [(4, 2), (0, 1), (2, 4)],
        4: [(0, 3), (1, 2), (3, 0)],
    }


@pytest.mark.parametrize("p", range(1, 18))
def test_dissemination_rounds_and_reach(p):
    rounds = {rank: list(dissemination_schedule(rank, p)) for rank in range(p)}
    assert all(len(r) == (p - 1).bit_length() for r in rounds.values())  # ⌈lg p⌉
    # every receive in round k matches the sender's send in round k
    for rank, steps in rounds.items():
        for k, (to, frm) in enumerate(steps):
            assert rounds[to][k][1] == rank and rounds[frm][k][0] == rank
    # after the last round every rank has (transitively) heard from every other
    heard = {rank: {rank} for rank in range(p)}
    for k in range((p - 1).bit_length()):
        heard = {rank: heard[rank] | heard[rounds[rank][k][1]] for rank in range(p)}
    assert all(h == set(range(p)) for h in heard.values())


def _late_root_timings(comm, wait):
    """Rank 0 arrives 0.2 s late; returns (rank 0's arrival, every rank's departure)."""
    comm.Barrier(algorithm="native")
    arrival = time.time()
    if comm.rank == 0:
        time.sleep(0.2)
        arrival = time.time()
    wait()
    departure = time.time()
    return comm.bcast(arrival, root=0), comm.allgather(departure)


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_nobody_leaves_before_everyone_arrives(comm, algorithm):
    arrival, departures = _late_root_timings(comm, lambda: comm.Barrier(algorithm=algorithm))
    assert min(departures) >= arrival


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_ibarrier_completes_only_after_everyone_arrives(comm, algorithm):
    def wait():
        request = comm.Ibarrier(algorithm=algorithm)
        assert isinstance(request, mpicomm.Request)
        request.Wait()

    arrival, departures = _late_root_timings(comm, wait)
    assert min(departures) >= arrival


@pytest.mark.mpi
def test_many_barriers_in_a_row_and_in_flight(comm):
    for i in range(50):
        comm.Barrier(algorithm=ALGORITHMS[i % 2])
    requests = [comm.Ibarrier(algorithm=ALGORITHMS[i % 2]) for i in range(6)]
    mpicomm.Request.Waitall(requests)
    assert all(r.done for r in requests)


@pytest.mark.mpi
def test_environment_and_communicator_defaults(comm, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG, logger="mpicomm")
    monkeypatch.setenv("MPICOMM_BARRIER_ALGORITHM", "dissemination")
    comm.Barrier()
    dup = comm.Dup()
    try:
        dup.set_algorithm("barrier", "native")
        dup.Barrier()
        dup.Barrier(algorithm="dissemination")
    finally:
        dup.Free()
    choices = [r.getMessage() for r in caplog.records if r.name == "mpicomm"]
    assert choices == [
        "barrier: algorithm dissemination (from the environment)",
        "barrier: algorithm native (from the communicator)",
        "barrier: algorithm dissemination (from the call)",
    ]


@pytest.mark.mpi
def test_unknown_algorithm_lists_names_on_every_rank(comm):
    with pytest.raises(ValueError, match="unknown barrier algorithm 'tree'; registered: dissemination, native"):
        comm.Barrier(algorithm="tree")
    with pytest.raises(ValueError, match="registered"):
        comm.Ibarrier(algorithm="tree")


@pytest.mark.mpi
def test_barrier_traffic_does_not_touch_user_messages(comm):
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    request = comm.Isend([None, 0, MPI.BYTE], right, tag=0)
    comm.Barrier(algorithm="dissemination")
    status = MPI.Status()
    comm.Recv([None, 0, MPI.BYTE], source=left, tag=0, status=status)
    request.Wait()
    assert status.Get_source() == left
