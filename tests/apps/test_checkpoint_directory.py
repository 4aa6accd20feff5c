"""apps.checkpoint.prepare_directory: an unusable checkpoint directory is refused at start, on every rank alike.

A path under a regular file cannot be created by anyone, root included (chmod
would not stop root), so it stands for "not writable" here.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from mpi4py import MPI

from apps import checkpoint as ck


@pytest.fixture
def shared():
    """A directory every rank sees (made by rank 0), with a regular file ``a-file`` in it."""
    comm = MPI.COMM_WORLD
    path = comm.bcast(tempfile.mkdtemp(prefix="ckpt-dir-") if comm.Get_rank() == 0 else None, root=0)
    if comm.Get_rank() == 0:
        with open(os.path.join(path, "a-file"), "w") as f:
            f.write("not a directory\n")
    comm.Barrier()
    yield path
    comm.Barrier()
    if comm.Get_rank() == 0:
        shutil.rmtree(path, ignore_errors=True)


def _outcome(directory: str) -> tuple[str, str]:
    try:
        ck.prepare_directory(MPI.COMM_WORLD, directory)
    except ck.CheckpointError as exc:
        return "refused", str(exc)
    return "ok", ""


@pytest.mark.mpi
def test_a_missing_directory_is_created_and_no_probe_is_left(shared):
    comm = MPI.COMM_WORLD
    target = os.path.join(shared, "new", "ckpt")
    assert comm.allgather(_outcome(target)) == [("ok", "")] * comm.Get_size()
    comm.Barrier()
    assert os.path.isdir(target) and os.listdir(target) == []


@pytest.mark.mpi
def test_a_directory_nobody_can_create_is_refused_on_every_rank(shared):
    comm = MPI.COMM_WORLD
    target = os.path.join(shared, "a-file", "ckpt")
    got = comm.allgather(_outcome(target))
    assert all(kind == "refused" for kind, _ in got), got
    assert len({m for _, m in got}) == 1, got
    message = got[0][1]
    assert message.startswith(f"--checkpoint-dir {target}: checkpoints cannot be written there: "), message
    assert "cannot create it (Not a directory" in message, message
    assert "choose a directory that can be created and written" in message and "pass --checkpoint-dir DIR" in message
    if comm.Get_size() > 1:
        assert f"ranks {', '.join(map(str, range(comm.Get_size())))} cannot create it" in message, message


@pytest.mark.mpi
def test_a_directory_only_one_rank_cannot_write_stops_every_rank(shared, monkeypatch):
    """As a directory that is read-only on one node: the last rank's probe fails, the others' succeed."""
    comm = MPI.COMM_WORLD
    last = comm.Get_size() - 1
    if comm.Get_rank() == last:
        monkeypatch.setattr(ck, "unwritable", lambda directory: "cannot create a file in it (Read-only file system)")
    target = os.path.join(shared, "ckpt")
    got = comm.allgather(_outcome(target))
    assert all(kind == "refused" for kind, _ in got), got
    assert len({m for _, m in got}) == 1, got
    who = f"rank {last} " if comm.Get_size() > 1 else ""
    assert f"there: {who}cannot create a file in it (Read-only file system); choose" in got[0][1], got


@pytest.mark.serial
def test_unwritable_names_the_step_that_failed(tmp_path):
    (tmp_path / "a-file").write_text("")
    assert ck.unwritable(str(tmp_path / "made")) is None
    assert os.listdir(tmp_path / "made") == []
    why = ck.unwritable(str(tmp_path / "a-file" / "ckpt"))
    assert why is not None and why.startswith("cannot create it (Not a directory"), why
