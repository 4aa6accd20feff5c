"""apps.checkpoint: atomic writes, manifests last, every kind of damage refused, no pickle."""

from __future__ import annotations

import os

import numpy as np
import pytest

from apps import checkpoint as ck

pytestmark = pytest.mark.serial  # no MPI: the serial pass runs it


def _save(directory, step, arrays):
    path = ck.data_path(str(directory), "t", step)
    record, entries = ck.write_arrays(path, arrays)
    ck.save_manifest(ck.manifest_path(str(directory), "t", step), step, [record], arrays=entries, note="x")
    return path


def _arrays(step):
    return {"a": np.arange(12.0).reshape(3, 4) * (step + 1), "b": np.arange(5, dtype=np.int32) - step}


def test_round_trip(tmp_path):
    _save(tmp_path, 7, _arrays(7))
    body, refused = ck.newest_valid(str(tmp_path), "t")
    assert refused == [] and body["step"] == 7 and body["note"] == "x"
    got = ck.read_arrays(os.path.join(tmp_path, body["files"][0]["file"]), body["arrays"])
    for name, a in _arrays(7).items():
        assert got[name].dtype == a.dtype and np.array_equal(got[name], a)


@pytest.mark.parametrize("damage", ["flip", "truncate", "remove", "manifest"])
def test_damaged_newest_is_refused_and_older_used(tmp_path, damage):
    _save(tmp_path, 1, _arrays(1))
    newest = _save(tmp_path, 2, _arrays(2))
    if damage == "flip":
        with open(newest, "r+b") as f:
            f.seek(17)
            byte = f.read(1)
            f.seek(17)
            f.write(bytes([byte[0] ^ 0x40]))
    elif damage == "truncate":
        os.truncate(newest, 10)
    elif damage == "remove":
        os.remove(newest)
    else:
        with open(ck.manifest_path(str(tmp_path), "t", 2), "w") as f:
            f.write('{"format": "mpicomm-checkpoint/1", "step": 2, "fi')
    body, refused = ck.newest_valid(str(tmp_path), "t")
    assert body["step"] == 1
    assert len(refused) == 1
    expected = {"flip": "checksum mismatch", "truncate": "partial", "remove": "missing", "manifest": "unreadable"}[damage]
    assert expected in refused[0]


def test_no_valid_checkpoint(tmp_path):
    newest = _save(tmp_path, 3, _arrays(3))
    os.truncate(newest, 0)
    body, refused = ck.newest_valid(str(tmp_path), "t")
    assert body is None and len(refused) == 1
    assert ck.newest_valid(str(tmp_path / "nothing"), "t") == (None, [])


def test_foreign_manifest_refused(tmp_path):
    path = ck.manifest_path(str(tmp_path), "t", 4)
    with open(path, "w") as f:
        f.write('{"format": "something-else", "step": 4, "files": []}')
    with pytest.raises(ck.CheckpointError, match="not an mpicomm checkpoint"):
        ck.load_manifest(path)


def test_prune_keeps_newest(tmp_path):
    for step in (1, 2, 3, 4):
        _save(tmp_path, step, _arrays(step))
    ck.prune(str(tmp_path), "t", keep=2)
    assert ck.steps(str(tmp_path), "t") == [4, 3]
    assert sorted(os.listdir(tmp_path)) == sorted(
        os.path.basename(p) for s in (3, 4) for p in (ck.data_path(str(tmp_path), "t", s), ck.manifest_path(str(tmp_path), "t", s))
    )


def test_failed_write_leaves_nothing(tmp_path):
    path = str(tmp_path / "x.bin")

    def write(f):
        f.write(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        ck.write_atomic(path, write)
    assert os.listdir(tmp_path) == []


def test_no_pickle(tmp_path):
    with pytest.raises(TypeError, match="only plain"):
        ck.write_arrays(str(tmp_path / "o.bin"), {"o": np.array([{"a": 1}], dtype=object)})
    _save(tmp_path, 1, _arrays(1))
    with open(ck.data_path(str(tmp_path), "t", 1), "rb") as f:
        assert b"\x80\x04" not in f.read(2)  # not a pickle stream
