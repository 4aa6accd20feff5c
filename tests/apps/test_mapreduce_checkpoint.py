"""apps/mapreduce checkpoints tried as an attacker would: one changed byte, forged fields, hostile names.

The map output's manifest must protect itself (its own SHA-256) and every field
must be checked, so a damaged or edited checkpoint is refused with the reason
(the map then runs again and the answer is right), never loaded as wrong pairs
(one changed offset once gave exit 0 and counts like 18850611462144) and never
a bare ``KeyError``/``TypeError`` on some rank. Nothing outside the directory is
read as data or touched.
"""

from __future__ import annotations

import io
import json
import os

import pytest

from apps.mapreduce import Budget, MapReduce
from tests.apps.forge import forge, load

SMALL = Budget(8 << 20, block=1024, store=6000, round=4096, group=1 << 20)  # a few runs per rank


@pytest.fixture
def shared(comm, tmp_path_factory):
    """A directory every rank sees: four input files, and ``outside/`` with a file that must not change."""
    path = comm.bcast(str(tmp_path_factory.mktemp("mrckpt")) if comm.rank == 0 else None, root=0)
    if comm.rank == 0:
        for i in range(4):
            with open(os.path.join(path, f"in{i}.txt"), "w") as f:
                f.write("".join(f"w{(i * 31 + j) % 97} w{j % 13} common\n" for j in range(60 * (i + 1))))
        os.mkdir(os.path.join(path, "outside"))
        with open(os.path.join(path, "outside", "sentinel"), "wb") as f:
            f.write(b"keep me")
        os.utime(os.path.join(path, "outside", "sentinel"), ns=(10**18, 10**18))
    comm.Barrier()
    yield path
    comm.Barrier()


def _count(comm, directory, **kwargs):
    out = io.StringIO()
    mr = MapReduce(comm, key="str", value="int", combine="sum", name="safety", progress=out, budget=SMALL)
    mr.map_files([os.path.join(directory, f"in{i}.txt") for i in range(4)],
                 lambda text, kv, block: kv.add_keys(text.split()), **kwargs)
    mr.collate()
    mr.reduce()
    got = mr.gather()
    mr.close()
    return got, mr, out.getvalue()


def _sentinel_unchanged(directory):
    path = os.path.join(directory, "outside", "sentinel")
    assert open(path, "rb").read() == b"keep me" and os.stat(path).st_mtime_ns == 10**18


def _edit(comm, ckpt, change, checksum=True):
    if comm.rank == 0:
        path = os.path.join(ckpt, "safety-map-00000001.json")
        body = load(path)
        change(body)
        if checksum:
            forge(path, body)
        else:
            with open(path, "w") as f:
                json.dump(body, f)
    comm.Barrier()


@pytest.mark.mpi
def test_one_changed_offset_is_refused_and_the_answer_is_right(comm, shared):
    ckpt = os.path.join(shared, "ckpt")
    first, _, _ = _count(comm, shared, checkpoint_dir=ckpt)

    def shift(body):
        body["runs"][0][0]["entries"][1]["offset"] += 1  # one changed byte in the manifest

    _edit(comm, ckpt, shift, checksum=False)
    again, mr, said = _count(comm, shared, checkpoint_dir=ckpt, restart=True)
    assert again == first and mr.restored_from is None
    if comm.rank == 0:
        assert "manifest checksum mismatch" in said, said


def _set(path, value):
    def change(body):
        *parents, last = path
        node = body
        for key in parents:
            node = node[key]
        if value is KeyError:
            del node[last]
        else:
            node[last] = value
    return change


FORGED = [
    (_set(["runs", 0, 0, "entries", 0, "dtype"], "|O"), "object dtype"),
    (_set(["runs", 0, 0, "entries", 0, "dtype"], "<u4 "), "is not a dtype"),
    (_set(["runs", 0, 0, "entries", 1, "offset"], 10**12), "beyond the file"),
    (_set(["runs", 0, 0, "entries", 1, "offset"], -1), "integers >= 0"),
    (_set(["runs", 0, 0, "entries", 0, "offset"], KeyError), "lacks offset"),
    (_set(["runs", 0, 0, "entries"], KeyError), "is not an object with record"),
    (_set(["runs", 0, 0, "count"], "many"), "count 'many'"),
    (_set(["runs", 0, 0, "dest_bytes"], [-1]), "dest_bytes must be"),
    (_set(["runs", 0, 0, "record", "file"], "../outside/sentinel"), "not one of the manifest's files"),
    (_set(["files", 0, "file"], "../outside/sentinel"), "not a plain name"),
    (_set(["ranks"], KeyError), "ranks None"),
    (_set(["ranks"], 99), "list of 99 lists"),
    (_set(["runs"], {"0": []}), "'runs' must be a list"),
    (_set(["spec"], ["int", "int"]), "spec"),
]


@pytest.mark.mpi
def test_forged_fields_are_refused_with_the_reason_on_every_rank(comm, shared):
    ckpt = os.path.join(shared, "ckpt")
    first, _, _ = _count(comm, shared, checkpoint_dir=ckpt)
    pristine = comm.bcast(load(os.path.join(ckpt, "safety-map-00000001.json")) if comm.rank == 0 else None, root=0)
    for change, reason in FORGED:
        if comm.rank == 0:
            forge(os.path.join(ckpt, "safety-map-00000001.json"), json.loads(json.dumps(pristine)))
        comm.Barrier()
        _edit(comm, ckpt, change)
        # the map runs again and saves the same map output (same files, same checksums) for the next edit
        again, mr, said = _count(comm, shared, checkpoint_dir=ckpt, restart=True)
        assert again == first and mr.restored_from is None, reason
        if comm.rank == 0:
            assert reason in said, (reason, said)
    _sentinel_unchanged(shared)


@pytest.mark.mpi
def test_a_new_checkpoint_sweeps_only_its_own_stale_files(comm, shared):
    ckpt = os.path.join(shared, "ckpt")
    if comm.rank == 0:
        os.makedirs(ckpt)
        for name in ("safety-map-00000001.rank99-run0.bin", "safety-map-00000001.bin.tmp123"):
            open(os.path.join(ckpt, name), "wb").close()
        os.symlink(os.path.join(shared, "outside", "sentinel"), os.path.join(ckpt, "safety-map-00000001.json.tmp7"))
        for name in ("notes.txt", "other-map-00000001.rank0-run0.bin"):
            open(os.path.join(ckpt, name), "w").write("not ours")
    comm.Barrier()
    first, _, _ = _count(comm, shared, checkpoint_dir=ckpt)
    if comm.rank == 0:
        names = set(os.listdir(ckpt))
        assert {"notes.txt", "other-map-00000001.rank0-run0.bin", "safety-map-00000001.json"} <= names
        assert not names & {"safety-map-00000001.rank99-run0.bin", "safety-map-00000001.bin.tmp123",
                            "safety-map-00000001.json.tmp7"}
    _sentinel_unchanged(shared)
    again, mr, _ = _count(comm, shared, checkpoint_dir=ckpt, restart=True)
    assert again == first and mr.restored_from
