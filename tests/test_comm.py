"""mpicomm.comm: the Intracomm subclass, its topology, caching and constructors."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from mpicomm.state import State
from tests import mpirun


@pytest.mark.mpi
def test_is_an_mpi4py_intracomm_over_the_same_communicator(comm):
    assert isinstance(comm, MPI.Intracomm)
    assert comm == MPI.COMM_WORLD  # same handle, not a copy
    assert comm.Compare(MPI.COMM_WORLD) == MPI.IDENT
    assert (comm.rank, comm.size, comm.world_size) == (MPI.COMM_WORLD.rank, MPI.COMM_WORLD.size, MPI.COMM_WORLD.size)


@pytest.mark.mpi
def test_mpi4py_methods_keep_working(comm):
    # uppercase buffer methods and lowercase pickle methods, as written for mpi4py
    x = np.arange(4, dtype=np.int64) + comm.rank * 1_000_000
    total = np.empty_like(x)
    comm.Allreduce(x, total, op=MPI.SUM)
    assert np.array_equal(total, sum(np.arange(4) + r * 1_000_000 for r in range(comm.size)))
    assert comm.allgather(comm.rank) == list(range(comm.size))
    assert comm.bcast({"from": "root"} if comm.rank == 0 else None, root=0) == {"from": "root"}


@pytest.mark.mpi
def test_topology_is_consistent_across_ranks(comm):
    rows = comm.allgather((comm.rank, comm.local_rank, comm.local_size, comm.node, comm.nodes, comm.host))
    assert all(r[4] == rows[0][4] for r in rows)  # one node count
    nodes = {}
    for rank, local_rank, local_size, node, _, _host in rows:
        nodes.setdefault(node, []).append((rank, local_rank, local_size))
    assert sorted(nodes) == list(range(comm.nodes))
    for members in nodes.values():
        assert sorted(lr for _, lr, _ in members) == list(range(len(members)))  # local ranks 0..k-1
        assert all(ls == len(members) for _, _, ls in members)
    lowest = [min(r for r, _, _ in members) for _, members in sorted(nodes.items())]
    assert lowest == sorted(lowest)  # nodes numbered by their lowest rank
    assert comm.node_comm.Get_size() == comm.local_size
    assert comm.node_comm.Get_rank() == comm.local_rank


@pytest.mark.mpi
def test_leader_comm(comm):
    assert comm.is_leader == (comm.local_rank == 0)
    if comm.is_leader:
        assert comm.leader_comm.Get_size() == comm.nodes
        assert comm.leader_comm.Get_rank() == comm.node
    else:
        assert comm.leader_comm is None


@pytest.mark.mpi
def test_state_is_built_once_per_communicator(comm):
    again = mpicomm.Comm(MPI.COMM_WORLD)
    assert again._state is comm._state
    assert again.library_comm is comm.library_comm
    assert comm.library_comm != MPI.COMM_WORLD
    assert comm.library_comm.Compare(MPI.COMM_WORLD) == MPI.CONGRUENT


@pytest.mark.mpi
def test_dup_is_a_comm_with_its_own_state(comm):
    dup = comm.Dup()
    try:
        assert isinstance(dup, mpicomm.Comm)
        assert dup.Compare(comm) == MPI.CONGRUENT
        assert dup._state is not comm._state
        assert (dup.local_rank, dup.node, dup.nodes) == (comm.local_rank, comm.node, comm.nodes)
        dup.Barrier(algorithm="dissemination")
    finally:
        dup.Free()


@pytest.mark.mpi
def test_free_releases_the_private_communicators(comm):
    dup = mpicomm.Comm(MPI.COMM_WORLD.Dup())
    state = dup._state
    dup.Free()
    assert state.library_comm == MPI.COMM_NULL
    assert state.node_comm == MPI.COMM_NULL


@pytest.mark.mpi(min_size=2)
def test_wraps_a_sub_communicator(comm):
    plain = MPI.COMM_WORLD.Split(comm.rank % 2, key=comm.rank)
    assert type(plain) is MPI.Intracomm
    sub = mpicomm.Comm(plain)
    try:
        assert sub.size == len(range(comm.rank % 2, comm.size, 2))
        assert sub.nodes >= 1 and 0 <= sub.local_rank < sub.local_size
        sub.Barrier(algorithm="dissemination")
    finally:
        sub.Free()


@pytest.mark.mpi
def test_split_of_a_comm_is_a_comm_and_wrapping_it_again_shares_its_state(comm):
    half = comm.Split(comm.rank % 2, key=comm.rank)  # (tests/test_topology.py: every derived constructor)
    try:
        assert type(half) is mpicomm.Comm
        assert mpicomm.Comm(half)._state is half._state
        half.Barrier(algorithm="dissemination")
    finally:
        half.Free()


def _sums_rank_data(new, size):
    x = np.arange(4, dtype=np.int64) + 1000 * new.rank
    total = np.empty_like(x)
    new.Allreduce(x, total)
    assert np.array_equal(total, sum(np.arange(4) + 1000 * r for r in range(size)))


@pytest.mark.mpi
def test_idup_returns_a_comm_whose_state_its_request_builds(comm):
    new, request = comm.Idup()
    assert type(new) is mpicomm.Comm and isinstance(request, mpicomm.DupRequest)
    assert isinstance(request, MPI.Request)
    assert "state not built yet" in repr(new)
    with pytest.raises(RuntimeError, match="comes from Idup and its request has not completed"):
        new.Allreduce(np.zeros(1), np.zeros(1))  # refused on this rank alone, before any message
    with pytest.raises(RuntimeError, match="request has not completed"):
        assert new.local_rank is None
    request.Wait()
    assert type(new._state) is State and new._state is not comm._state  # built by Wait, collectively
    if comm.rank == 0:  # a topology query on one rank only: the state exists, nothing to wait for
        assert (new.local_rank, new.node) == (comm.local_rank, comm.node)
    _sums_rank_data(new, comm.size)
    assert new.Compare(comm) == MPI.CONGRUENT
    assert (new.local_rank, new.local_size, new.node) == (comm.local_rank, comm.local_size, comm.node)
    assert request.Wait() is True  # again: at once
    new.Free()
    assert new == MPI.COMM_NULL


@pytest.mark.mpi
def test_idup_with_info_built_by_the_test_that_completes(comm):
    new, request = comm.Idup_with_info(MPI.INFO_NULL)
    assert type(new) is mpicomm.Comm
    while not request.Test():
        pass
    assert type(new._state) is State
    _sums_rank_data(new, comm.size)
    new.Free()


@pytest.mark.mpi
def test_idup_completed_elsewhere_builds_the_state_at_the_first_use(comm):
    new, request = comm.Idup()
    other, other_request = comm.Idup()
    MPI.Request.Waitall([request, other_request])  # mpicomm does not see these complete
    assert "state not built yet" in repr(new)
    _sums_rank_data(new, comm.size)  # the first use, on every rank: builds the state, then runs
    assert type(new._state) is State and new.local_size == comm.local_size
    other_request.Wait()  # complete already: returns at once, and builds other's state (collective)
    assert type(other._state) is State
    _sums_rank_data(other, comm.size)
    new.Free()
    other.Free()


@pytest.mark.mpi
def test_copies_and_pickles_of_a_predefined_communicator_are_it(comm):
    import copy
    import pickle

    self_comm = mpicomm.Comm(MPI.COMM_SELF)
    # as mpi4py's MPI.COMM_WORLD: one object per process, whatever makes it
    assert mpicomm.Comm() is mpicomm.Comm(MPI.COMM_WORLD)
    clone = mpicomm.Comm(MPI.Intracomm(MPI.COMM_WORLD))  # another object over the same handle: a new one, as mpi4py
    assert clone is not mpicomm.Comm() and clone == mpicomm.Comm() and clone._state is mpicomm.Comm()._state
    for _ in range(2):  # mpi4py's safe free(): the predefined objects stay, others are emptied (their state too)
        mpicomm.Comm().free()
        self_comm.free()
        clone.free()
        assert mpicomm.Comm() and self_comm and not clone
    with pytest.raises(mpicomm.FreedError):
        assert clone.local_rank is None  # (raises before comparing)
    _sums_rank_data(mpicomm.Comm(), comm.size)
    assert self_comm is mpicomm.Comm(MPI.COMM_SELF) and self_comm is not mpicomm.Comm()
    for original, size in ((mpicomm.Comm(), comm.size), (self_comm, 1)):
        for twin in (copy.copy(original), copy.deepcopy(original), pickle.loads(pickle.dumps(original))):
            assert twin is original
            assert twin == original and twin.Compare(original) == MPI.IDENT  # the same handle, as in mpi4py
            assert twin._state is original._state  # and the same state: nothing collective to make it
            assert (twin.local_rank, twin.node, twin.nodes) == (original.local_rank, original.node, original.nodes)
            _sums_rank_data(twin, size)


@pytest.mark.mpi
def test_copies_and_pickles_of_another_communicator_are_refused_as_in_mpi4py(comm):
    import copy
    import pickle

    plain = MPI.COMM_WORLD.Dup()
    dup = comm.Dup()
    cart = comm.Create_cart([comm.size])
    try:
        for how in (copy.copy, copy.deepcopy, pickle.dumps):
            with pytest.raises(ValueError, match="cannot serialize"):
                how(plain)  # mpi4py's rule
            for new in (dup, cart):
                with pytest.raises(ValueError, match=r"cannot serialize .*COMM_WORLD or MPI.COMM_SELF.*comm.Dup\(\)"):
                    how(new)
        _sums_rank_data(dup, comm.size)  # unharmed
    finally:
        plain.Free()
        dup.Free()
        cart.Free()


@pytest.mark.mpi
def test_collective_tags_agree_advance_and_stay_out_of_the_collectives_way(comm):
    first = comm.collective_tag()
    second = comm.collective_tag()
    assert second == first + 1 and first >= comm._state.tag_modulus
    assert comm.allgather(first) == [first] * comm.size
    assert {first, second}.isdisjoint({*comm._state.tags(comm._state.epoch), comm._state.watch_tag})


@pytest.mark.mpi
def test_ppn_is_the_most_ranks_of_any_node(comm):
    assert comm.ppn == max(comm.allgather(comm.local_size))
    assert comm.allgather(comm.ppn) == [comm.ppn] * comm.size


@pytest.mark.mpi
def test_machine_is_the_saved_fit_on_every_rank(comm, monkeypatch):
    import dataclasses
    import shutil
    import tempfile

    from mpicomm import model

    folder = comm.bcast(tempfile.mkdtemp(prefix="mpicomm-fit-") if comm.rank == 0 else None, root=0)
    monkeypatch.setenv("MPICOMM_CACHE_DIR", folder)
    try:
        empty = comm.Dup()
        assert empty.machine is None, "no fit saved: no model"
        empty.Free()
        fit = dataclasses.replace(model.NOMINAL, gamma=1.25e-10, host=comm.host, nodes=comm.nodes, ppn=comm.ppn)
        if comm.rank == 0:
            model.save(fit, model.path_for(comm.host, model.layout_key(comm.size, comm.nodes, comm.local_size)))
        comm.Barrier()
        fitted = comm.Dup()
        try:
            assert fitted.machine is not None and fitted.machine.gamma == 1.25e-10
            assert comm.allgather(fitted.machine.to_json()) == [fit.to_json()] * comm.size  # rank 0's, everywhere
            assert comm.machine is not fitted.machine  # loaded when the state was built, per communicator
        finally:
            fitted.Free()
    finally:
        comm.Barrier()
        if comm.rank == 0:
            shutil.rmtree(folder, ignore_errors=True)


def test_predict_is_exported():
    from mpicomm import state

    assert mpicomm.predict is state.predict


def test_bad_constructor_arguments():
    with pytest.raises(TypeError, match="Intracomm"):
        mpicomm.Comm("world")
    with pytest.raises(ValueError, match="COMM_NULL"):
        mpicomm.Comm(MPI.COMM_NULL)


@pytest.mark.mpi
def test_set_algorithm(comm):
    dup = comm.Dup()
    try:
        dup.set_algorithm("barrier", "dissemination")
        assert dup.get_algorithm("barrier") == "dissemination"
        assert comm.get_algorithm("barrier") is None  # per communicator
        with pytest.raises(ValueError, match="registered: dissemination, native"):
            dup.set_algorithm("barrier", "nope")
        dup.set_algorithm("barrier", "auto")
        assert dup.get_algorithm("barrier") is None
    finally:
        dup.Free()


def test_repr(comm):
    assert repr(comm).startswith(f"<mpicomm.Comm rank {comm.rank}/{comm.size}")


@pytest.mark.launches
def test_two_simulated_nodes():
    """4 ranks as hydra hosts nodeA:2,nodeB:2: MPI's shared-memory split sees two nodes."""
    if mpirun.flavor() != "hydra":
        pytest.skip("simulated hosts use hydra's -launcher fork -hosts (MPICH)")
    result = mpirun.run(4, [sys.executable, "-m", "tests.programs", "topology"],
                        launcher="fork", hosts="nodeA:2,nodeB:2", timeout=120)
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout.strip().splitlines()[-1])
    assert [r["rank"] for r in rows] == [0, 1, 2, 3]
    assert [r["nodes"] for r in rows] == [2, 2, 2, 2]
    assert [r["node"] for r in rows] == [0, 0, 1, 1]
    assert [r["local_rank"] for r in rows] == [0, 1, 0, 1]
    assert [r["local_size"] for r in rows] == [2, 2, 2, 2]
    assert [r["is_leader"] for r in rows] == [True, False, True, False]
    assert [r["leader_size"] for r in rows] == [2, None, 2, None]
    for r in rows:  # the launcher's environment agrees with MPI
        assert r["env"]["launcher"] == "hydra"
        assert (r["env"]["rank"], r["env"]["size"]) == (r["rank"], 4)
        assert (r["env"]["local_rank"], r["env"]["local_size"]) == (r["local_rank"], r["local_size"])
