"""mpicomm.engine.executor: how a run waits for the one nested run its step is waiting on.

A run whose step waits on one nested run sleeps in that run's own wait (its lane, or MPI on its requests)
instead of backing off - but never while its own agreement round is in flight, which only Python starts
the next round of: a peer may be asleep on that round (a Bruck alltoallv at 5 ranks on nodes of
2 + 2 + 1 hung so). On COMM_SELF: a nested run whose step is a receive.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from mpicomm.engine.executor import Program, Run, Step

pytestmark = pytest.mark.timeout(30)  # (a wait that should not have happened never ends)


def _parent_of_a_receive(tag: int) -> tuple[Run, Run, np.ndarray]:
    """A started run whose one step waits on a started nested run whose one step receives 8 bytes (*tag*)."""
    got = np.zeros(1, np.float64)
    receive = Step("receive")
    receive.reqs = [MPI.COMM_SELF.Recv_init(got, 0, tag)]
    child = Run(Program([receive.finish()], "nested"))

    def make(run: Run) -> Run:
        child.start()
        return child

    wait = Step("the nested run")
    wait.nested = (make,)
    parent = Run(Program([wait.finish()], "parent"))
    parent.start()
    assert parent.children == [child] and not child.done
    return parent, child, got


def test_a_run_sleeps_in_its_nested_runs_wait():
    parent, child, got = _parent_of_a_receive(tag=71)
    send = MPI.COMM_SELF.Isend(np.full(1, 2.5), 0, 71)
    assert parent.sleep_in_child()  # (it waited in the receive: the message is there)
    send.Wait()
    assert got[0] == 2.5
    assert parent.poll() and child.done and parent.error is None
    child.program.steps[0].reqs[0].Free()


def test_not_while_its_own_agreement_round_is_in_flight():
    parent, child, got = _parent_of_a_receive(tag=72)
    parent.a = 0  # (an agreement round in flight: only this rank's Python starts the next one)
    assert not parent.sleep_in_child()  # at once: the receive has no message, a wait there would never end
    parent.a = -1
    send = MPI.COMM_SELF.Isend(np.full(1, 4.0), 0, 72)
    assert parent.sleep_in_child()
    send.Wait()
    assert parent.poll() and got[0] == 4.0
    child.program.steps[0].reqs[0].Free()


def test_not_where_the_step_waits_on_more_than_one_nested_run():
    parent, child, _ = _parent_of_a_receive(tag=73)
    parent.children = [child, child]
    assert not parent.sleep_in_child()
    parent.children = [child]
    send = MPI.COMM_SELF.Isend(np.full(1, 1.0), 0, 73)
    assert parent.sleep_in_child()
    send.Wait()
    assert parent.poll()
    child.program.steps[0].reqs[0].Free()


def test_the_graveyard_lets_go_of_requests_that_completed_even_with_an_error():
    """prune() drops what completed - also a buried receive that a longer message truncated, whose test raises
    (a disagreement's drain prunes: the error is the abandoned call's, never the caller's) - and keeps the rest."""
    from mpicomm.engine import executor

    short, waiting = np.zeros(1, np.uint8), np.zeros(8, np.uint8)
    truncated = MPI.COMM_SELF.Irecv(short, 0, tag=72)
    pending = MPI.COMM_SELF.Irecv(waiting, 0, tag=73)
    MPI.COMM_SELF.Send(np.arange(8, dtype=np.uint8), 0, tag=72)
    before = list(executor.graveyard)
    executor.graveyard[:] = []
    try:
        executor.bury(truncated)
        executor.bury(pending)
        assert executor.prune() == 1
        assert executor.graveyard == [pending]
        MPI.COMM_SELF.Send(np.arange(8, dtype=np.uint8), 0, tag=73)
        assert executor.prune() == 0
    finally:
        executor.graveyard[:] = before
