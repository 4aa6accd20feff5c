"""apps.torchddp.train in this MPI job (any rank count): --check passes with uneven blocks; resume is exact.

Run under ``mpiexec -n N python -m mpi4py -m pytest --with-mpi``; the default
process group is the mpicomm backend (made here unless an earlier test made it).
"""

from __future__ import annotations

import os

import pytest

from tests.apps.torchddp import NO_TORCH

torch = pytest.importorskip("torch", reason=NO_TORCH)

import torch.distributed as dist  # noqa: E402

from apps.torchddp.models import ModelSpec  # noqa: E402
from apps.torchddp.train import Config, train  # noqa: E402

pytestmark = pytest.mark.mpi

SPECS = {"mlp": ModelSpec("mlp", features=6, hidden=(16, 16), classes=4),
         "transformer": ModelSpec("transformer", vocab=40, seq=6, d_model=8, heads=2, layers=1, ff=16, classes=4)}


@pytest.fixture(scope="module")
def world():
    import mpicomm.torch  # noqa: F401 - registers the backend, fills RANK/WORLD_SIZE/MASTER_* from MPI

    if not dist.is_initialized():
        dist.init_process_group("mpicomm")
    return dist.get_rank(), dist.get_world_size()


def _quiet(text: str) -> None:
    pass


def _shared_tmp(tmp_path) -> str:
    """Rank 0's temporary directory, on every rank (pytest gives each rank its own)."""
    box = [str(tmp_path)]
    dist.broadcast_object_list(box, src=0)
    return box[0]


@pytest.mark.parametrize("kind", ["mlp", "transformer"])
def test_check_passes_with_uneven_blocks(world, kind):
    rank, p = world
    cfg = Config(spec=SPECS[kind], steps=4, batch=2 * p + 1, dtype="float64", check=True, eval_samples=20,
                 progress=False)
    report = train(cfg, _quiet)
    assert report.check["passed"], report.check
    digests = [None] * p
    dist.all_gather_object(digests, report.digest)
    assert len(set(digests)) == 1  # DDP kept every rank's replica equal


def test_resume_repeats_the_uninterrupted_run_bit_for_bit(world, tmp_path):
    rank, p = world
    directory = _shared_tmp(tmp_path) + "/ckpt"
    common = dict(spec=SPECS["transformer"], batch=2 * p + 2, eval_samples=10, progress=False, optimizer="adamw")
    straight = train(Config(steps=6, **common), _quiet)
    first = train(Config(steps=3, checkpoint_dir=directory, checkpoint_every=2, keep=1, **common), _quiet)
    assert first.checkpoint.endswith("torchddp-00000003.ckpt") and first.steps == 3
    if rank == 0:
        assert sorted(os.listdir(directory)) == ["torchddp-00000003.ckpt"]  # --keep 1: step 2's is gone
    dist.barrier()  # before the next run's directory probes (every rank's .probe-* file) can appear there
    resumed = train(Config(steps=6, checkpoint_dir=directory, restart=True, **common), _quiet)
    assert resumed.start_step == 3 and resumed.notes[0].startswith("resumed from step 3")
    assert resumed.digest == straight.digest


def test_check_fails_when_ranks_train_on_the_wrong_samples(world, monkeypatch):
    """--check has teeth: every rank training on rank 0's block (some samples twice, others never) fails it."""
    rank, p = world
    if p < 2:
        pytest.skip("one rank trains on the whole batch whatever the blocks are")
    import apps.torchddp.train as module

    monkeypatch.setattr(module, "block", lambda n, p, r: (0, n // p))
    cfg = Config(spec=SPECS["mlp"], steps=3, batch=2 * p, dtype="float64", check=True, eval_samples=8,
                 progress=False)
    report = train(cfg, _quiet)
    assert not report.check["passed"] and report.check["worst_vs_tolerance"] > 1e3, report.check
