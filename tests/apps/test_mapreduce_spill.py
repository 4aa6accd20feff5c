"""apps/mapreduce/spill.py: the private spill directory, run files and segment files."""

from __future__ import annotations

import os

import numpy as np
import pytest

from apps.mapreduce.shuffle import Spec, pack, pack_partitioned, unpack
from apps.mapreduce.spill import Run, SegmentFile, SpillDir, read_segments, write_run


def test_spill_dir_is_made_on_first_use_and_removed_on_close(tmp_path):
    spill = SpillDir(str(tmp_path))
    assert os.listdir(tmp_path) == []
    name = spill.new_file("run")
    assert os.path.dirname(name) == spill.path and os.path.dirname(spill.path) == str(tmp_path)
    with open(name, "wb") as f:
        f.write(b"x")
    path = spill.path
    spill.close()
    assert not os.path.exists(path) and os.listdir(tmp_path) == []
    spill.close()  # twice is fine


def test_spill_dir_refuses_a_missing_parent(tmp_path):
    with pytest.raises(ValueError, match="not an existing directory"):
        SpillDir(str(tmp_path / "missing"))
    with pytest.raises(TypeError, match="directory name"):
        SpillDir(3)  # type: ignore[arg-type]


def test_a_run_spills_to_disk_and_loads_back_the_same(tmp_path):
    spec = Spec("str", "ints")
    keys = [f"key{i}é" for i in range(200)]
    values = [list(range(i % 4)) for i in range(200)]
    batch, dest = pack_partitioned(keys, values, spec, 3)
    run = Run(count=200, nbytes=sum(a.nbytes for a in batch.values()), batch=batch, dest=dest)
    with SpillDir(str(tmp_path)) as spill:
        run.spill(spill)
        assert run.batch is None and os.path.getsize(run.path) == run.nbytes + dest.nbytes
        assert spill.bytes_written == run.nbytes
        loaded, got_dest = run.load()
        assert got_dest.tolist() == dest.tolist() and unpack(loaded, spec) == unpack(batch, spec)
        path = run.path
        run.drop()
        assert not os.path.exists(path)


def test_write_run_entries_name_every_array(tmp_path):
    arrays = {"a": np.arange(5, dtype=np.int64), "b": np.array([1.5], np.float32)}
    entries = write_run(str(tmp_path / "r.bin"), arrays)
    assert [(e["name"], e["offset"], e["bytes"]) for e in entries] == [("a", 0, 40), ("b", 40, 4)]


def test_segment_files_read_back_one_segment_at_a_time(tmp_path):
    spec = Spec("int", "str")
    path = str(tmp_path / "s.bin")
    f = SegmentFile(path, spec)
    parts = [([i, i + 1], [f"v{i}", ""]) for i in range(0, 10, 2)]
    for keys, values in parts:
        f.append(pack(keys, values, spec))
    f.close()
    assert f.count == 10 and os.path.getsize(path) == f.nbytes
    assert [unpack(p, spec) for p in read_segments(path, spec)] == parts
    with open(path, "r+b") as g:
        g.truncate(f.nbytes - 12)
    with pytest.raises(ValueError, match="cut short"):
        list(read_segments(path, spec))
