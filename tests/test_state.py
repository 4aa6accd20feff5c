"""The per-communicator State: one object per MPI communicator, shared by its wrappers, freed with it."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from mpicomm.state import State, as_state, state_of

pytestmark = pytest.mark.mpi


def test_a_communicator_has_one_state_whatever_wraps_it():
    dup = MPI.COMM_WORLD.Dup()
    try:
        comm = mpicomm.Comm(dup)
        assert comm._state is state_of(dup) is as_state(comm) is as_state(dup)
        assert as_state(comm._state) is comm._state
        assert isinstance(comm._state, State)
        seq = comm._state.next_seq()
        assert comm._state.next_seq() == seq + 1
        data, agree = comm._state.tags(comm._state.epoch)
        assert data != agree and 0 < data < comm._state.tag_modulus and comm._state.watch_tag not in (data, agree)
        comm._state.new_epoch()  # a call failed on a disagreement: fresh tags for every later call
        assert comm._state.tags(comm._state.epoch) != (data, agree) and not comm._state.plans
    finally:
        dup.Free()


def test_free_releases_the_shared_memory_windows_the_levels_and_the_plans():
    comm = mpicomm.Comm(MPI.COMM_WORLD.Dup())
    state = comm._state
    x = np.arange(16.0) + comm.rank
    out = np.empty_like(x)
    if comm.nodes == 1:
        comm.Allreduce(x, out, algorithm="shm")
    comm.Allreduce(x, out, algorithm="hierarchical")
    node, leaders = state.levels  # the hierarchy's two levels, made by its first run
    arena = state.arena
    windows = [arena.control.win] if arena is not None else []
    level_comms = [node.comm] + ([leaders.comm] if leaders is not None else [])
    library = state.library_comm
    comm.Free()
    assert state.freed and state.arena is None and state.levels is None and not state.plans
    assert all(w == MPI.WIN_NULL for w in windows), "the shared-memory windows outlived Comm.Free"
    assert all(c == MPI.COMM_NULL for c in level_comms), "the hierarchy's communicators outlived Comm.Free"
    assert library == MPI.COMM_NULL
