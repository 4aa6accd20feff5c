"""apps.sgd.train's checkpoints: a damaged, edited or forged manifest is a CheckpointError on every rank.

Before the fix, a forged manifest with no files raised a bare IndexError on
rank 0 only (the other ranks then waited), and arrays of the wrong shape or an
unknown optimizer state reached the model and strategy. A checkpoint that
cannot be written (a full disk) was an OSError on rank 0 only, naming no file;
now the same CheckpointError on every rank, naming it.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from apps import checkpoint as ck
from apps.nn import mlp
from apps.nn.optim import make as make_optimizer
from apps.sgd.train import PREFIX, Config, build, load_checkpoint, save_checkpoint
from tests.apps.forge import forge, load

SIGNATURE = {"layers": [4, 3]}
PARAMS = 15
STATE = ("momentum", "step")


@pytest.fixture
def directory():
    comm = MPI.COMM_WORLD
    path = comm.bcast(tempfile.mkdtemp(prefix="sgd-ckpt-") if comm.Get_rank() == 0 else None, root=0)
    if comm.Get_rank() == 0:
        arrays = {"params": np.arange(PARAMS, dtype=np.float32), "optimizer.momentum": np.ones(PARAMS, np.float32),
                  "optimizer.step": np.array(7, np.int64)}
        record, entries = ck.write_arrays(ck.data_path(path, PREFIX, 10), arrays)
        ck.save_manifest(ck.manifest_path(path, PREFIX, 10), 10, [record], arrays=entries, model=SIGNATURE,
                         mode="ddp", ranks=2, batch=64)
    comm.Barrier()
    yield path
    comm.Barrier()
    if comm.Get_rank() == 0:
        shutil.rmtree(path, ignore_errors=True)


def _load(path):
    return load_checkpoint(MPI.COMM_WORLD, Config(checkpoint_dir=path, restart=True), SIGNATURE, PARAMS, STATE)


def _edit(path, change, checksum=True):
    comm = MPI.COMM_WORLD
    if comm.Get_rank() == 0:
        manifest = ck.manifest_path(path, PREFIX, 10)
        body = load(manifest)
        change(body)
        if checksum:
            forge(manifest, body)
        else:
            with open(manifest, "w") as f:
                json.dump(body, f)
    comm.Barrier()


@pytest.mark.mpi
def test_a_sound_checkpoint_loads_on_every_rank(directory):
    step, arrays = _load(directory)
    assert step == 10 and arrays["params"].tolist() == list(range(PARAMS)) and arrays["optimizer.step"].item() == 7


@pytest.mark.mpi
@pytest.mark.parametrize("change,checksum,reason", [
    (lambda b: b["arrays"][0].update(offset=4), False, "manifest checksum mismatch"),
    (lambda b: b.update(files=[]), True, "names 0 data files"),
    (lambda b: b["arrays"][0].update(dtype="|O"), True, "object dtype"),
    (lambda b: b["arrays"][1].pop("shape"), True, "lacks shape"),
    (lambda b: b["arrays"].append({"name": "evil", "dtype": "<f4", "shape": [0], "offset": 0, "bytes": 0}), True,
     "expected 'params'"),
    (lambda b: b["arrays"][0].update(shape=[3, 5]), True, "15 floating-point parameters"),
    (lambda b: b["arrays"][0].update(dtype="<i4"), True, "15 floating-point parameters"),
    (lambda b: b["arrays"][1].update(name="optimizer.velocity"), True, "this optimizer keeps"),
    (lambda b: b["arrays"][2].update(dtype="<f8"), True, "optimizer.step is <f8"),
    (lambda b: b["files"][0].update(file="../../etc/passwd"), True, "not a plain name"),
])
def test_a_bad_manifest_is_a_checkpoint_error_on_every_rank(directory, change, checksum, reason):
    _edit(directory, change, checksum)
    with pytest.raises(ck.CheckpointError, match=reason):
        _load(directory)
    assert os.path.exists(ck.manifest_path(directory, PREFIX, 10))


@pytest.mark.mpi
def test_a_full_disk_during_a_checkpoint_is_the_same_error_on_every_rank_naming_the_file(shared_dir, monkeypatch):
    """The disk fills while rank 0 writes a checkpoint (every write of checkpoint data fails with ENOSPC, as
    ``write(2)`` does): every rank raises the same CheckpointError naming the file, and nothing is left in the
    directory. 20 checkpoints of a ddp run's real strategy."""

    def full(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    comm = mpicomm.Comm()
    cfg = Config(data="digits", hidden=(8,), batch=64, steps=20, checkpoint_every=1, checkpoint_dir=shared_dir)
    model = mlp([64, 8, 10], seed=cfg.seed)
    strategy = build(comm, cfg, model, make_optimizer("sgd", lr=0.1, momentum=0.9), 20, 0)
    signature = cfg.model_signature(64, 10)
    monkeypatch.setattr(ck._Hashing, "write", full)
    for step in range(1, 21):
        try:
            save_checkpoint(comm, cfg, strategy, step, signature)
            got = ("saved", "")
        except ck.CheckpointError as exc:
            got = ("CheckpointError", str(exc))
        expected = (f"--checkpoint-dir {shared_dir}: the checkpoint of step {step} cannot be written: "
                    f"{ck.data_path(shared_dir, PREFIX, step)}: {os.strerror(errno.ENOSPC)}; make room there or "
                    f"pass another --checkpoint-dir")
        everyone = comm.allgather(got)
        assert everyone == [("CheckpointError", expected)] * comm.Get_size(), (step, everyone)
        assert comm.bcast(os.listdir(shared_dir) if comm.Get_rank() == 0 else None) == [], step  # no temporary
