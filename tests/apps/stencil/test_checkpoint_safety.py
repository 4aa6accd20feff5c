"""apps.stencil checkpoints tried as an attacker would: forged names, planted links, edited manifests.

Each test fails on the code before the fix: a forged manifest made ``--restart``
delete files outside the directory, a link planted under the MPI-IO temporary
name had field data written through it, and an edited offset or dtype
restarted from wrong data or raised a bare error.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import pytest
from mpi4py import MPI

from apps.checkpoint import CheckpointError
from apps.stencil.solver import Config, solve
from tests.apps.forge import forge, load

SMALL = dict(stream=False, progress=False, kernel="numpy", size=12)


def _solve(comm, **kw):
    return solve(comm, Config(**(SMALL | kw)))


@pytest.fixture
def root():
    """A fresh directory every rank sees: ``ckpt/`` for checkpoints and ``outside/`` with files that must not change."""
    comm = MPI.COMM_WORLD
    path = comm.bcast(tempfile.mkdtemp(prefix="stencil-safety-") if comm.Get_rank() == 0 else None, root=0)
    if comm.Get_rank() == 0:
        os.mkdir(os.path.join(path, "outside"))
        for name in ("victim.bin", "sentinel"):
            with open(os.path.join(path, "outside", name), "wb") as f:
                f.write(b"keep me: " + name.encode())
            os.utime(os.path.join(path, "outside", name), ns=(10**18, 10**18))
    comm.Barrier()
    yield path
    comm.Barrier()
    if comm.Get_rank() == 0:
        shutil.rmtree(path, ignore_errors=True)


def _unchanged(root):
    for name in ("victim.bin", "sentinel"):
        path = os.path.join(root, "outside", name)
        assert os.path.exists(path), f"{path} was deleted"
        assert open(path, "rb").read() == b"keep me: " + name.encode(), f"{path} was overwritten"
        assert os.stat(path).st_mtime_ns == 10**18, f"{path} was written"


def _on_rank0(comm, work):
    comm.Barrier()
    if comm.Get_rank() == 0:
        work()
    comm.Barrier()


@pytest.mark.mpi
@pytest.mark.parametrize("name", ["ABS", "../outside/victim.bin", "../outside/sentinel"])
@pytest.mark.parametrize("checksum", ["forged", "stale"])
def test_a_forged_manifest_cannot_make_restart_delete_outside(root, name, checksum):
    comm = MPI.COMM_WORLD
    d = os.path.join(root, "ckpt")
    _solve(comm, iters=10, checkpoint_every=5, checkpoint_dir=d, keep=3)
    target = os.path.join(root, "outside", "victim.bin") if name == "ABS" else name

    def spoil():
        path = os.path.join(d, "stencil-00000010.json")
        body = load(path)
        body["files"][0]["file"] = target
        if checksum == "forged":
            forge(path, body)
        else:
            with open(path, "w") as f:
                f.write(json.dumps(body))

    _on_rank0(comm, spoil)
    res = _solve(comm, iters=15, checkpoint_every=5, checkpoint_dir=d, keep=1, restart=True)
    comm.Barrier()
    _unchanged(root)
    assert res.start_iteration == 5 and len(res.refused) == 1
    assert ("not a plain name" if checksum == "forged" else "checksum mismatch") in res.refused[0]
    assert sorted(os.listdir(d)) == ["stencil-00000015.bin", "stencil-00000015.json"]


@pytest.mark.mpi
def test_links_planted_under_temporary_names_are_not_written_through(root):
    comm = MPI.COMM_WORLD
    d = os.path.join(root, "ckpt")

    def plant():
        os.mkdir(d)
        for step in (5, 10):
            for suffix in (".bin.tmp", ".bin", ".json", f".json.tmp{os.getpid()}"):
                os.symlink(os.path.join(root, "outside", "sentinel"), os.path.join(d, f"stencil-{step:08d}{suffix}"))

    _on_rank0(comm, plant)
    with pytest.raises(CheckpointError, match="already holds checkpoints"):
        _solve(comm, iters=10, checkpoint_every=5, checkpoint_dir=d)  # the planted .json names count as checkpoints
    _on_rank0(comm, lambda: [os.remove(os.path.join(d, n)) for n in os.listdir(d) if ".json" in n])
    res = _solve(comm, iters=10, checkpoint_every=5, checkpoint_dir=d, keep=3)
    comm.Barrier()
    _unchanged(root)
    names = sorted(os.listdir(d))
    assert names == ["stencil-00000005.bin", "stencil-00000005.json", "stencil-00000010.bin", "stencil-00000010.json"]
    assert not any(os.path.islink(os.path.join(d, n)) for n in names)
    again = _solve(comm, iters=10, checkpoint_dir=d, restart=True)
    assert again.start_iteration == 10 and again.digest == res.digest


@pytest.mark.mpi
def test_edited_manifests_are_refused_with_the_reason_on_every_rank(root):
    comm = MPI.COMM_WORLD
    d = os.path.join(root, "ckpt")
    straight = _solve(comm, iters=15)
    _solve(comm, iters=10, checkpoint_every=5, checkpoint_dir=d, keep=3)
    path = os.path.join(d, "stencil-00000010.json")
    original = comm.bcast(load(path) if comm.Get_rank() == 0 else None, root=0)

    def edit(change, checksum=True):
        def work():
            body = json.loads(json.dumps(original))
            change(body)
            if checksum:
                forge(path, body)
            else:
                with open(path, "w") as f:
                    f.write(json.dumps(body))
        _on_rank0(comm, work)

    # one changed byte (the offset), the checksum left as it was: refused, the older checkpoint used
    edit(lambda b: b["arrays"][0].update(offset=8), checksum=False)
    res = _solve(comm, iters=15, checkpoint_dir=d, restart=True)
    assert res.start_iteration == 5 and res.digest == straight.digest and "checksum mismatch" in res.refused[0]
    # forged (right checksum) but impossible fields: refused by the field checks, the older one used
    for change, reason in [(lambda b: b["arrays"][0].update(dtype="|O"), "object dtype"),
                           (lambda b: b["arrays"][0].pop("offset"), "lacks offset"),
                           (lambda b: b["arrays"][0].update(offset=8), "beyond the file"),
                           (lambda b: b.pop("arrays"), "lacks 'arrays'"),
                           (lambda b: b.update(residual="small"), "residual 'small'"),
                           (lambda b: b["files"][0].update(file="/etc/hostname"), "not a plain name")]:
        edit(change)
        res = _solve(comm, iters=15, checkpoint_dir=d, restart=True)
        assert res.start_iteration == 5 and res.digest == straight.digest, reason
        assert len(res.refused) == 1 and reason in res.refused[0], (reason, res.refused)
    # forged and self-consistent, but not this problem's field: a CheckpointError on every rank
    n = original["arrays"][0]["shape"][0]
    edit(lambda b: b["arrays"][0].update(dtype="<f4", shape=[n, 2 * n]))
    with pytest.raises(CheckpointError, match="is stored as <f4"):
        _solve(comm, iters=15, checkpoint_dir=d, restart=True)
    edit(lambda b: b["arrays"][0].update(dtype="<i8"))
    with pytest.raises(CheckpointError, match="is stored as <i8"):
        _solve(comm, iters=15, checkpoint_dir=d, restart=True)
