"""mpicomm.engine.watchdog: a wait that lasts longer than ``MPICOMM_TIMEOUT`` names what it waits for and the
ranks that never came, prints every rank's recent calls, and ends the job."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from mpi4py import MPI

from mpicomm.engine.requests import RequestStep
from mpicomm.engine.watchdog import describe, recorder


@pytest.fixture
def private():
    """A private duplicate of COMM_WORLD for plain mpi4py traffic (collective: every rank makes it)."""
    d = MPI.COMM_WORLD.Dup()
    yield d
    d.Free()


def test_watchdog_describes_agreement_and_library_steps(private):
    pending = private.Irecv(np.empty(1), source=private.Get_rank(), tag=77)  # nobody sends: it stays pending
    try:
        agreement = describe(("allgather #4 (ring)", 0, RequestStep([pending], peers=[("all", -1)])))
        library = describe(("allgather #4 (ring)", 1, RequestStep([pending], peers=[("library", -1)])))
    finally:
        pending.Cancel()
        pending.Wait()
    assert agreement.startswith("stuck in allgather #4 (ring), step 1: waiting for every rank to enter it")
    assert library.startswith("stuck in allgather #4 (ring), step 2: in the MPI library's own collective")
    assert "some rank has not called this collective" in library


@pytest.mark.launches
@pytest.mark.parametrize("validate", ["1", "0"])
def test_watchdog_names_the_stuck_collective_and_the_missing_peer(validate):
    from tests import mpirun

    env = {"MPICOMM_TIMEOUT": "2", "MPICOMM_VALIDATE": validate}
    result = mpirun.run(3, [sys.executable, "-m", "tests.programs", "stuck"], timeout=60, env=env)
    assert not result.timed_out and result.returncode != 0
    assert result.seconds < 30, f"the watchdog took {result.seconds:.1f} s"
    assert "mpicomm watchdog" in result.stderr and "MPICOMM_TIMEOUT" in result.stderr
    assert "allreduce #" in result.stderr and "(recursive_doubling)" in result.stderr
    if validate == "0":  # the algorithm's own step: rank 1 is the partner that never came
        assert "never arrived from rank(s) 1" in result.stderr
    else:  # stuck in the agreement before any data moved
        assert "allreduce #" in result.stderr


@pytest.mark.launches
def test_watchdog_covers_nonblocking_waits():
    from tests import mpirun

    env = {"MPICOMM_TIMEOUT": "2", "MPICOMM_VALIDATE": "0"}
    result = mpirun.run(3, [sys.executable, "-m", "tests.programs", "stuck_nonblocking"], timeout=60, env=env)
    assert not result.timed_out and result.returncode != 0 and result.seconds < 30
    assert "gather #0 (linear)" in result.stderr
    assert "never arrived from rank(s) 2\n" in result.stderr  # rank 1 did send


def test_watchdog_setting_is_checked(monkeypatch):
    from mpicomm import config

    monkeypatch.setenv("MPICOMM_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="MPICOMM_TIMEOUT='soon'"):
        config.timeout()
    monkeypatch.setenv("MPICOMM_TIMEOUT", "0.5")
    assert config.timeout() == 0.5


def test_watchdog_names_a_collectives_count_and_type_and_prints_the_flight_recorder():
    class Call:  # what the watchdog reads of a collective's label (duck-typed: requests.py sits below coll)
        details = "allreduce #7 (ring): 1000 × float64, op sum"
        status = "entered"

        def __str__(self) -> str:
            return "allreduce #7 (ring)"

    class State:
        recent = [Call()]

    line = describe((Call(), 2, RequestStep([], peers=[])))
    assert line.startswith("stuck in allreduce #7 (ring): 1000 × float64, op sum, step 3"), line
    assert recorder(State()) == ["allreduce #7 (ring): 1000 × float64, op sum [entered]"]
    assert describe(("irecv_array", 0, RequestStep([], peers=[]))).startswith("stuck in irecv_array, step 1")
