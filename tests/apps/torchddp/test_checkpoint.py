"""apps.torchddp.checkpoint: atomic writes, the newest --keep kept, every kind of damage refused by name, the newest
valid one found, no code run on load."""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import pytest

from tests.apps.torchddp import NO_TORCH

torch = pytest.importorskip("torch", reason=NO_TORCH)

from apps.torchddp import checkpoint as ck  # noqa: E402

pytestmark = pytest.mark.serial

STATE = {"model": {"w": torch.arange(6.0).reshape(2, 3)}, "optimizer": {"state": {0: {"step": torch.tensor(3.0)}},
                                                                        "param_groups": [{"lr": 0.1, "params": [0]}]}}


def _write(directory, step=5, **header):
    return ck.write(str(directory), {"step": step, "identity": {"model": "mlp"}, **header}, ck.dump_payload(STATE))


def test_round_trip_and_no_temporary_file_left(tmp_path):
    path = _write(tmp_path)
    assert path == str(tmp_path / "torchddp-00000005.ckpt") and os.listdir(tmp_path) == ["torchddp-00000005.ckpt"]
    header, payload = ck.read(path)
    assert header["step"] == 5 and header["format"] == ck.FORMAT and header["bytes"] == len(payload)
    state = ck.load_payload(payload)
    assert torch.equal(state["model"]["w"], STATE["model"]["w"])
    assert state["optimizer"]["param_groups"][0]["lr"] == 0.1


def test_keep_leaves_the_newest_and_later_steps_of_an_abandoned_run_go(tmp_path):
    for step in (1, 2, 3):
        ck.write(str(tmp_path), {"step": step, "identity": {}}, ck.dump_payload(STATE), keep=2)
    assert ck.steps(str(tmp_path)) == [3, 2] and sorted(os.listdir(tmp_path)) == [
        "torchddp-00000002.ckpt", "torchddp-00000003.ckpt"]
    (tmp_path / "notes.txt").write_text("not ours")
    # a restart from step 2 writes step 3 again and step 4: the abandoned run's 3 is replaced, never kept over them
    ck.write(str(tmp_path), {"step": 3, "identity": {"again": 1}}, ck.dump_payload(STATE), keep=1)
    assert ck.steps(str(tmp_path)) == [3] and ck.read(ck.path_in(str(tmp_path), 3))[0]["identity"] == {"again": 1}
    assert (tmp_path / "notes.txt").read_text() == "not ours"  # only the series' own names are removed
    ck.write(str(tmp_path), {"step": 1, "identity": {}}, ck.dump_payload(STATE))  # back behind 3: 3 goes
    assert ck.steps(str(tmp_path)) == [1]


def test_newest_passes_over_damaged_files_and_says_why(tmp_path):
    assert ck.newest(str(tmp_path / "absent")) == (None, [])
    for step in (2, 4, 6):
        _write(tmp_path, step=step)
    _damage(ck.path_in(str(tmp_path), 6), "flip")
    _damage(ck.path_in(str(tmp_path), 4), "truncate")
    found, refused = ck.newest(str(tmp_path))
    assert found[0]["step"] == 2 and found[2] == ck.path_in(str(tmp_path), 2)
    assert len(refused) == 2 and "torchddp-00000006.ckpt: checksum mismatch" in refused[0]
    assert "torchddp-00000004.ckpt" in refused[1] and "cut short" in refused[1]
    _damage(ck.path_in(str(tmp_path), 2), "magic")
    with pytest.raises(ck.CheckpointError, match=r"^no valid checkpoint in .*: checkpoint .*torchddp-00000006"):
        ck.newest(str(tmp_path))
    _write(tmp_path, step=2)
    shutil.copy(ck.path_in(str(tmp_path), 2), ck.path_in(str(tmp_path), 8))  # a file whose name and header disagree
    found, refused = ck.newest(str(tmp_path))
    assert found[0]["step"] == 2 and "torchddp-00000008.ckpt: its header says step 2" in refused[0]


def test_the_temporary_file_is_exclusive_unpredictable_and_removed_on_failure(tmp_path, monkeypatch):
    seen = []
    real = tempfile.mkstemp

    def spy(**kw):
        fd, name = real(**kw)
        seen.append(name)
        return fd, name

    monkeypatch.setattr(tempfile, "mkstemp", spy)
    _write(tmp_path)
    _write(tmp_path)
    assert len(seen) == 2 and seen[0] != seen[1]  # a fresh random name each time
    assert all(os.path.dirname(n) == str(tmp_path) and os.path.basename(n).startswith("torchddp-00000005.ckpt.tmp")
               for n in seen)

    def broken(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ck.os, "replace", broken)
    with pytest.raises(OSError):
        _write(tmp_path, step=9)
    assert os.listdir(tmp_path) == ["torchddp-00000005.ckpt"]  # the temporary file is gone, the old checkpoint intact
    assert ck.read(ck.path_in(str(tmp_path), 5))[0]["step"] == 5


def _damage(path, how):
    data = bytearray(open(path, "rb").read())
    if how == "flip":
        data[-10] ^= 0x01
    elif how == "truncate":
        data = data[:-7]
    elif how == "magic":
        data[:4] = b"XXXX"
    elif how == "header":
        start = len(ck.MAGIC)
        data[start:start + 1] = b"#"
    elif how == "format":
        end = data.index(b"\n", len(ck.MAGIC))
        header = json.loads(data[len(ck.MAGIC):end])
        header["format"] = "mpicomm-torchddp-checkpoint/0"
        data[len(ck.MAGIC):end] = json.dumps(header).encode()
    open(path, "wb").write(bytes(data))


@pytest.mark.parametrize("how,text", [
    ("flip", "checksum mismatch"), ("truncate", "cut short"), ("magic", "not an apps.torchddp checkpoint"),
    ("header", "damaged header"), ("format", "format 'mpicomm-torchddp-checkpoint/0'"),
])
def test_damage_is_refused_naming_the_file(tmp_path, how, text):
    path = _write(tmp_path)
    _damage(path, how)
    with pytest.raises(ck.CheckpointError, match=text) as info:
        ck.read(path)
    assert path in str(info.value)


def test_a_missing_file_is_a_checkpoint_error(tmp_path):
    with pytest.raises(ck.CheckpointError, match="cannot read it"):
        ck.read(ck.path_in(str(tmp_path), 1))


def test_loading_runs_no_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo owned",))

    import pickle

    payload = ck.dump_payload({"model": Evil()})  # torch.save pickles anything; the loader must not run it
    with pytest.raises(pickle.UnpicklingError):
        ck.load_payload(payload)


def test_mismatch_names_every_difference():
    assert ck.mismatch("D/x", {"model": "mlp", "seed": 0}, {"model": "mlp", "seed": 0}) is None
    why = ck.mismatch("D/x", {"model": "mlp", "seed": 0, "hidden": "64"}, {"model": "mlp", "seed": 3})
    assert why.startswith("checkpoint D/x belongs to another run (")
    assert "hidden: (unset) here, 64 in the checkpoint" in why and "seed: 3 here, 0 in the checkpoint" in why


def _rewrite_header(path, change, checksum=False):
    data = open(path, "rb").read()
    end = data.index(b"\n", len(ck.MAGIC))
    header = json.loads(data[len(ck.MAGIC):end])
    change(header)
    if checksum:  # forged: the header's own checksum recomputed
        import hashlib

        body = {k: v for k, v in header.items() if k != ck.HEADER_CHECKSUM}
        header[ck.HEADER_CHECKSUM] = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"))
                                                    .encode()).hexdigest()
    open(path, "wb").write(data[:len(ck.MAGIC)] + json.dumps(header).encode() + data[end:])


@pytest.mark.parametrize("change,checksum", [
    (lambda h: h.update(step=50), False),
    (lambda h: h["identity"].update(model="cnn"), False),
    (lambda h: h.pop(ck.HEADER_CHECKSUM), False),
    (lambda h: h.update(bytes=str(h["bytes"])), True),
    (lambda h: h.update(bytes=-1), True),
    (lambda h: h.update(sha256=None), True),
])
def test_an_edited_header_is_refused(tmp_path, change, checksum):
    """The header protects itself: an edited step or identity is not trusted (it was, before the header checksum)."""
    path = _write(tmp_path)
    _rewrite_header(path, change, checksum)
    with pytest.raises(ck.CheckpointError, match="damaged header") as info:
        ck.read(path)
    assert path in str(info.value)


def test_a_linked_checkpoint_is_not_read(tmp_path):
    os.makedirs(tmp_path / "real")
    os.makedirs(tmp_path / "run")
    real = _write(tmp_path / "real")
    os.symlink(real, ck.path_in(str(tmp_path / "run"), 5))
    with pytest.raises(ck.CheckpointError, match="cannot read it"):
        ck.read(ck.path_in(str(tmp_path / "run"), 5))
