"""apps.checkpoint: atomic writes, manifests last, every kind of damage refused, no pickle, nothing touched outside."""

from __future__ import annotations

import errno
import json
import os

import numpy as np
import pytest

from apps import checkpoint as ck
from tests.apps.forge import forge

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


def test_a_system_error_that_names_no_file_is_raised_naming_the_checkpoint_file(tmp_path):
    path = str(tmp_path / "x.bin")

    def write(f):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as write(2) on a full disk: no file named

    with pytest.raises(OSError) as caught:
        ck.write_atomic(path, write)
    assert (caught.value.errno, caught.value.filename) == (errno.ENOSPC, path)
    assert os.listdir(tmp_path) == []


def test_no_pickle(tmp_path):
    with pytest.raises(TypeError, match="only plain"):
        ck.write_arrays(str(tmp_path / "o.bin"), {"o": np.array([{"a": 1}], dtype=object)})
    _save(tmp_path, 1, _arrays(1))
    with open(ck.data_path(str(tmp_path), "t", 1), "rb") as f:
        assert b"\x80\x04" not in f.read(2)  # not a pickle stream


# ---------------------------------------------------------------- tried as an attacker would


def _manifest(directory, step):
    return json.load(open(ck.manifest_path(str(directory), "t", step)))


def _bystanders(tmp_path):
    """Files outside the checkpoint directory a forged manifest might name: (dir, {path: (bytes, mtime)})."""
    d = tmp_path / "ckpt"
    d.mkdir()
    outside = {}
    for name in ("victim.bin", "sentinel"):
        path = tmp_path / name
        path.write_bytes(b"keep me " + name.encode())
        os.utime(path, ns=(10**18, 10**18))
        outside[str(path)] = (path.read_bytes(), path.stat().st_mtime_ns)
    return d, outside


def _untouched(outside):
    for path, (data, mtime) in outside.items():
        assert os.path.exists(path), f"{path} was deleted"
        assert open(path, "rb").read() == data and os.stat(path).st_mtime_ns == mtime, f"{path} was changed"


@pytest.mark.parametrize("valid_checksum", [True, False], ids=["forged", "edited"])
@pytest.mark.parametrize("name", ["ABS", "../victim.bin", "sub/t-00000002.bin", "t-00000001.bin", "u-00000002.bin",
                                  "t-00000002.bin/..", ".", "", "t-00000002..bin"])
def test_names_outside_the_checkpoint_are_refused_and_never_deleted(tmp_path, name, valid_checksum):
    d, outside = _bystanders(tmp_path)
    name = str(tmp_path / "victim.bin") if name == "ABS" else name
    _save(d, 1, _arrays(1))
    _save(d, 2, _arrays(2))
    body = _manifest(d, 2)
    body["files"][0]["file"] = name
    if valid_checksum:
        forge(ck.manifest_path(str(d), "t", 2), body)
    else:
        json.dump(body, open(ck.manifest_path(str(d), "t", 2), "w"))
    got, refused = ck.newest_valid(str(d), "t")
    assert got["step"] == 1 and len(refused) == 1
    assert ("not a plain name" if valid_checksum else "checksum mismatch") in refused[0]
    ck.sweep(str(d), "t")
    ck.remove(str(d), "t", 2)  # what a restart from step 1 does to the newer checkpoint
    ck.prune(str(d), "t", keep=0)
    _untouched(outside)
    assert os.listdir(d) == []


def test_remove_deletes_only_its_own_checkpoint(tmp_path):
    d, outside = _bystanders(tmp_path)
    for step in (1, 2):
        _save(d, step, _arrays(step))
    others = ["t-00000002x.bin", "t-x-00000002.bin", "tt-00000002.bin", "t-00000002.bin.keep", "notes.txt"]
    for name in others:
        (d / name).write_bytes(b"not the series'")
    os.symlink(tmp_path / "sentinel", d / "t-00000003.bin")  # a link named like a data file: removed, target kept
    ck.remove(str(d), "t", 2)
    ck.remove(str(d), "t", 3)
    assert ck.sweep(str(d), "t") == []
    assert sorted(os.listdir(d)) == sorted(others + ["t-00000001.bin", "t-00000001.json"])
    _untouched(outside)


@pytest.mark.parametrize("planted", ["old-name", "final"])
def test_temporary_files_never_follow_a_planted_link(tmp_path, planted):
    d, outside = _bystanders(tmp_path)
    path = ck.data_path(str(d), "t", 5)
    link = f"{path}.tmp{os.getpid()}" if planted == "old-name" else path
    os.symlink(tmp_path / "sentinel", link)
    record, _ = ck.write_arrays(path, _arrays(5))
    ck.save_manifest(ck.manifest_path(str(d), "t", 5), 5, [record])
    _untouched(outside)
    assert not os.path.islink(path) and ck.verify(ck.manifest_path(str(d), "t", 5))["step"] == 5
    tmp = ck.temporary(path)
    assert ".tmp" in tmp and os.path.dirname(tmp) == str(d) and tmp != ck.temporary(path)


def test_a_linked_data_file_or_manifest_is_refused(tmp_path):
    d, outside = _bystanders(tmp_path)
    path = _save(d, 1, _arrays(1))
    os.replace(path, tmp_path / "moved.bin")
    os.symlink(tmp_path / "moved.bin", path)  # same bytes, behind a link
    with pytest.raises(ck.CheckpointError, match="symbolic link"):
        ck.verify(ck.manifest_path(str(d), "t", 1))
    with pytest.raises(ck.CheckpointError, match="symbolic link"):
        ck.read_arrays(path, _manifest(d, 1)["arrays"])
    os.symlink(ck.manifest_path(str(d), "t", 1), ck.manifest_path(str(d), "t", 2))
    with pytest.raises(ck.CheckpointError, match="symbolic link"):
        ck.load_manifest(ck.manifest_path(str(d), "t", 2))
    _untouched(outside)


def test_one_changed_byte_in_the_manifest_is_refused(tmp_path):
    _save(tmp_path, 1, _arrays(1))
    path = ck.manifest_path(str(tmp_path), "t", 1)
    text = open(path).read()
    edited = text.replace('"offset": 96', '"offset": 97')
    assert edited != text
    open(path, "w").write(edited)
    with pytest.raises(ck.CheckpointError, match="manifest checksum mismatch"):
        ck.load_manifest(path)
    assert ck.newest_valid(str(tmp_path), "t")[0] is None


@pytest.mark.parametrize("edit,match", [
    (lambda b: b["arrays"][0].update(dtype="|O"), "object dtype"),
    (lambda b: b["arrays"][0].update(dtype="float64"), "canonical form"),
    (lambda b: b["arrays"][0].update(dtype=["<f8"]), "not a dtype string"),
    (lambda b: b["arrays"][0].update(dtype="<f4"), "shape .* takes"),
    (lambda b: b["arrays"][0].pop("offset"), "lacks offset"),
    (lambda b: b["arrays"][1].update(offset=-8), "integers >= 0"),
    (lambda b: b["arrays"][1].update(offset=10**15), "beyond the file"),
    (lambda b: b["arrays"][1].update(offset=8), "overlap"),
    (lambda b: b["arrays"][0].update(shape=[3, "4"]), "not a list of integers"),
    (lambda b: b["arrays"][0].update(bytes=True), "integers >= 0"),
    (lambda b: b.update(arrays={"a": 1}), "must be a list"),
])
def test_edited_array_entries_are_checkpoint_errors(tmp_path, edit, match):
    """Even with a right manifest checksum, a bad entry is a CheckpointError naming it (no bare TypeError/KeyError)."""
    path = _save(tmp_path, 1, _arrays(1))
    body = _manifest(tmp_path, 1)
    edit(body)
    forge(ck.manifest_path(str(tmp_path), "t", 1), body)
    loaded = ck.verify(ck.manifest_path(str(tmp_path), "t", 1))
    with pytest.raises(ck.CheckpointError, match=match):
        ck.read_arrays(path, loaded["arrays"])


@pytest.mark.parametrize("edit,match", [
    (lambda b: b.pop("files"), "lacks 'step' or 'files'"),
    (lambda b: b.pop("step"), "lacks 'step' or 'files'"),
    (lambda b: b.update(step="1"), "not an integer"),
    (lambda b: b.update(step=2), "its name says 1"),
    (lambda b: b["files"][0].update(bytes=-1), "not an integer >= 0"),
    (lambda b: b["files"][0].update(bytes=1.5), "not an integer >= 0"),
    (lambda b: b["files"][0].update(sha256="00"), "64 lowercase hex"),
    (lambda b: b["files"][0].pop("sha256"), "not an object with file"),
    (lambda b: b["files"].append(dict(b["files"][0])), "twice"),
    (lambda b: b.update(files={}), "must be a list"),
    (lambda b: b.update(format="mpicomm-checkpoint/1"), "older version"),
])
def test_edited_manifest_fields_are_refused(tmp_path, edit, match):
    _save(tmp_path, 1, _arrays(1))
    body = _manifest(tmp_path, 1)
    edit(body)
    forge(ck.manifest_path(str(tmp_path), "t", 1), body)
    with pytest.raises(ck.CheckpointError, match=match):
        ck.verify(ck.manifest_path(str(tmp_path), "t", 1))
    body, refused = ck.newest_valid(str(tmp_path), "t")
    assert body is None and len(refused) == 1


def test_a_manifest_without_its_checksum_is_refused(tmp_path):
    _save(tmp_path, 1, _arrays(1))
    body = _manifest(tmp_path, 1)
    del body[ck.CHECKSUM_KEY]
    json.dump(body, open(ck.manifest_path(str(tmp_path), "t", 1), "w"))
    with pytest.raises(ck.CheckpointError, match="lacks its checksum"):
        ck.load_manifest(ck.manifest_path(str(tmp_path), "t", 1))


def test_verify_refuses_a_wanted_file_the_manifest_does_not_name(tmp_path):
    _save(tmp_path, 1, _arrays(1))
    with pytest.raises(ck.CheckpointError, match="does not name data file '../x'"):
        ck.verify(ck.manifest_path(str(tmp_path), "t", 1), files=["../x"])


def test_the_application_check_refuses_like_damage(tmp_path):
    _save(tmp_path, 1, _arrays(1))
    _save(tmp_path, 2, _arrays(2))

    def check(body):
        if body["step"] == 2:
            raise ck.CheckpointError(f"{body['path']}: not for this run")

    body, refused = ck.newest_valid(str(tmp_path), "t", check=check)
    assert body["step"] == 1 and refused == [f"{ck.manifest_path(str(tmp_path), 't', 2)}: not for this run"]


def test_writers_refuse_names_and_keys_that_could_not_be_read_back(tmp_path):
    with pytest.raises(ValueError, match="part '../x'"):
        ck.data_path(str(tmp_path), "t", 1, "../x")
    with pytest.raises(ValueError, match="prefix 'a/b'"):
        ck.manifest_path(str(tmp_path), "a/b", 1)
    with pytest.raises(ValueError, match="step -1"):
        ck.data_path(str(tmp_path), "t", -1)
    record, _ = ck.write_arrays(ck.data_path(str(tmp_path), "t", 1), _arrays(1))
    with pytest.raises(ValueError, match="not a plain name"):
        ck.save_manifest(ck.manifest_path(str(tmp_path), "t", 2), 2, [record])
    with pytest.raises(ValueError, match="'files' are reserved|'format' are reserved"):
        ck.save_manifest(ck.manifest_path(str(tmp_path), "t", 1), 1, [record], format="mine")


def test_a_fifo_planted_under_a_checkpoint_name_is_refused_not_waited_on(tmp_path):
    path = _save(tmp_path, 1, _arrays(1))
    os.remove(path)
    os.mkfifo(path)
    body, refused = ck.newest_valid(str(tmp_path), "t")
    assert body is None and "not a regular file" in refused[0]
    ck.remove(str(tmp_path), "t", 1)
    assert os.listdir(tmp_path) == []
