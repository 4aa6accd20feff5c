"""apps.mapreduce: a checkpoint directory any rank cannot write is refused before the map, on every rank (each
rank writes its own files there: rank 0 alone used to check, with os.access, which a read-only mount on another
node passes); and ``corpus`` refuses a vocabulary that cannot fit in memory instead of running out of it."""

from __future__ import annotations

import os

import pytest

from apps import checkpoint as ck
from apps.mapreduce import MapReduce
from apps.mapreduce.__main__ import main
from apps.mapreduce.inputs import InputError


@pytest.fixture
def shared(comm, tmp_path_factory):
    """A directory every rank sees: one input file and a regular file ``a-file``."""
    path = comm.bcast(str(tmp_path_factory.mktemp("mrlimits")) if comm.rank == 0 else None, root=0)
    if comm.rank == 0:
        with open(os.path.join(path, "in.txt"), "w") as f:
            f.write("a b c a\n" * 50)
        open(os.path.join(path, "a-file"), "w").close()
    comm.Barrier()
    yield path
    comm.Barrier()


def _map(comm, directory: str, checkpoint_dir: str) -> tuple[str, str]:
    mr = MapReduce(comm, key="str", value="int", combine="sum", name="limits")
    try:
        mr.map_files([os.path.join(directory, "in.txt")], lambda text, kv, block: kv.add_keys(text.split()),
                     checkpoint_dir=checkpoint_dir)
        got = ("ran", "")
    except InputError as exc:
        got = ("InputError", str(exc))
    finally:
        mr.close()
    return got


@pytest.mark.mpi
def test_an_unwritable_checkpoint_directory_stops_every_rank_before_the_map(comm, shared):
    target = os.path.join(shared, "a-file", "ckpt")
    got = comm.allgather(_map(comm, shared, target))
    assert all(kind == "InputError" for kind, _ in got) and len(set(got)) == 1, got
    assert got[0][1].startswith(f"--checkpoint-dir {target}: checkpoints cannot be written there: "), got
    assert "cannot create it (Not a directory)" in got[0][1], got


@pytest.mark.mpi
def test_a_directory_only_the_last_rank_cannot_write_stops_every_rank(comm, shared, monkeypatch):
    last = comm.size - 1
    if comm.rank == last:
        monkeypatch.setattr(ck, "unwritable", lambda directory: "cannot create a file in it (Read-only file system)")
    got = comm.allgather(_map(comm, shared, os.path.join(shared, "ckpt")))
    assert all(kind == "InputError" for kind, _ in got) and len(set(got)) == 1, got
    assert "cannot create a file in it (Read-only file system)" in got[0][1], got


@pytest.mark.serial
def test_corpus_refuses_a_vocabulary_that_cannot_fit(tmp_path, capsys):
    assert main(["corpus", str(tmp_path / "c"), "--vocabulary", str(10 ** 12)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m apps.mapreduce corpus: error: --vocabulary 1000000000000: needs about 218 TiB "
                          "of memory, but this machine has "), err
    assert "use --vocabulary <= " in err and not (tmp_path / "c").exists()
