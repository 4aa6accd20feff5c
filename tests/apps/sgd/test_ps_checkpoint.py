"""apps.sgd's parameter-server modes checkpoint and resume: ps-sync bit for bit, ps-async from the saved versions.

Runs through :func:`apps.sgd.train.train` on the pass's COMM_WORLD: co-located
servers from 1 rank, dedicated ones from 2 (the last rank serves). The model
(float64, Adam - whose step counter is state - with dropout, whose keys follow
the step) trains on the teacher data, which depends on the sample index only.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import mpicomm
from apps import checkpoint as ck
from apps.sgd.cli import config_from, parse
from apps.sgd.train import PREFIX, Config, train

BASE = Config(mode="ps-sync", data="teacher", samples=240, features=6, classes=3, hidden=(10,), dropout=0.1,
              dtype="float64", batch=12, steps=8, optimizer="adam", lr=1e-2, progress=False, eval_every=2)


def _quiet(comm, cfg):
    said = []
    report = train(comm, cfg, said.append)
    return report, said


def _worker_or_skip(comm, servers):
    """Whether this rank is a worker (a dedicated server's model keeps its initial weights); skip where the
    dedicated servers would leave no worker."""
    if servers >= comm.Get_size():
        pytest.skip(f"{servers} dedicated server(s) need at least {servers + 1} ranks")
    return servers == 0 or comm.Get_rank() < comm.Get_size() - servers


def _saved(comm, path, step):
    """The arrays of the checkpoint at *step* (rank 0 reads, every rank gets them)."""
    def read():
        body = ck.verify(ck.manifest_path(path, PREFIX, step))
        return ck.read_arrays(ck.data_path(path, PREFIX, step), body["arrays"])

    return comm.bcast(read() if comm.Get_rank() == 0 else None, root=0)


@pytest.mark.mpi
@pytest.mark.parametrize("servers", [0, 1])
def test_a_resumed_ps_sync_run_equals_an_uninterrupted_one_bit_for_bit(shared_dir, servers):
    """Checkpoints at steps 3 and 5 (an interrupted run), resumed from step 5 to 8: the same parameters, the same
    test loss, on every rank; the checkpoint holds the servers' version 5 and the optimizer's step 5."""
    comm = mpicomm.Comm()
    worker = _worker_or_skip(comm, servers)
    cfg = replace(BASE, servers=servers, checkpoint_dir=shared_dir)
    straight, _ = _quiet(comm, cfg)
    first, _ = _quiet(comm, replace(cfg, steps=5, checkpoint_every=3))
    assert ck.steps(shared_dir, PREFIX) == [5, 3]
    saved = _saved(comm, shared_dir, 5)
    assert saved["optimizer.step"].tolist() in (5, [5])
    if worker:  # ps-sync: every worker holds version 5
        np.testing.assert_array_equal(saved["params"], first.model.params)
    resumed, said = _quiet(comm, replace(cfg, checkpoint_every=3, restart=True))
    assert resumed.start_step == 5 and said[0] == f"resumed from step 5 in {shared_dir}"
    final = _saved(comm, shared_dir, 8)
    assert not np.array_equal(final["params"], saved["params"])
    if worker:  # (a dedicated server's model is never trained: its shard is in the checkpoint)
        np.testing.assert_array_equal(final["params"], straight.model.params)
        np.testing.assert_array_equal(resumed.model.params, straight.model.params)
    assert ck.steps(shared_dir, PREFIX) == [8, 6]  # --keep 2
    if comm.Get_rank() == 0:
        assert resumed.history[-1]["test_loss"] == straight.history[-1]["test_loss"]


@pytest.mark.mpi
@pytest.mark.parametrize("servers", [0, 1])
def test_a_ps_async_run_resumes_from_the_saved_step_and_versions(shared_dir, servers):
    """Staleness 2 (deterministic): a checkpoint at step 5 holds the servers' version 5, not the stale weights a
    worker computes with; the resumed run starts there (its first clocks use version 5: max(5, c - 2)) and
    finishes; resumed twice, it ends the same."""
    comm = mpicomm.Comm()
    worker = _worker_or_skip(comm, servers)
    cfg = replace(BASE, mode="ps-async", staleness=2, servers=servers, checkpoint_dir=shared_dir)
    first, _ = _quiet(comm, replace(cfg, steps=5, checkpoint_every=5))
    saved = _saved(comm, shared_dir, 5)
    assert saved["optimizer.step"].tolist() in (5, [5])
    if worker:  # the final pull is version 5, exactly
        np.testing.assert_array_equal(saved["params"], first.model.params)
    resumed, said = _quiet(comm, replace(cfg, checkpoint_every=5, restart=True))
    assert resumed.start_step == 5 and said[0] == f"resumed from step 5 in {shared_dir}"
    assert ck.steps(shared_dir, PREFIX) == [8, 5]
    final = _saved(comm, shared_dir, 8)
    assert final["optimizer.step"].tolist() in (8, [8])  # three more versions on every shard
    assert np.all(np.isfinite(final["params"])) and not np.array_equal(final["params"], saved["params"])
    if worker:
        np.testing.assert_array_equal(final["params"], resumed.model.params)
    comm.Barrier()  # every rank has looked at step 8 before rank 0 removes it: resume from step 5 again
    if comm.Get_rank() == 0:
        ck.remove(shared_dir, PREFIX, 8)
    comm.Barrier()
    again, _ = _quiet(comm, replace(cfg, checkpoint_every=5, restart=True))
    np.testing.assert_array_equal(again.model.params, resumed.model.params)


@pytest.mark.serial
def test_the_command_line_takes_colocated_servers_and_checkpoints_for_ps_modes():
    _, args = parse(["train", "--mode", "ps-sync", "--servers", "colocated", "--checkpoint-every", "4",
                     "--checkpoint-dir", "ck", "--restart"])
    cfg = config_from(args)
    assert (cfg.servers, cfg.checkpoint_every, cfg.checkpoint_dir, cfg.restart) == (0, 4, "ck", True)
    _, args = parse(["train", "--mode", "ps-async", "--servers", "0", "--staleness", "1"])
    assert config_from(args).servers == 0
    with pytest.raises(SystemExit):
        parse(["train", "--mode", "ps-sync", "--servers", "many"])
    with pytest.raises(SystemExit):
        parse(["train", "--mode", "ps-sync", "--servers", "-1"])
