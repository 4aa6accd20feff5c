"""mpicomm.bench: size parsing, and the ping-pong benchmark end to end at small sizes."""

from __future__ import annotations

import argparse
import sys

import pytest

from mpicomm.bench import parse_sizes
from tests import mpirun


def test_sizes():
    assert parse_sizes("8:64") == [8, 16, 32, 64]
    assert parse_sizes("1K:4K") == [1024, 2048, 4096]
    assert parse_sizes("8,100,2M") == [8, 100, 2 << 20]
    assert parse_sizes("64kb") == [65536]


@pytest.mark.parametrize("bad", ["0", "x", "8:4", "-3", "4Q"])
def test_bad_sizes_are_named(bad):
    with pytest.raises(argparse.ArgumentTypeError, match="size|larger"):
        parse_sizes(bad)


@pytest.mark.launches
def test_pingpong_writes_its_table(tmp_path):
    out = tmp_path / "pingpong.md"
    result = mpirun.run(2, [sys.executable, "-m", "mpicomm.bench", "pingpong", "--sizes", "8,20000,65536",
                            "--iters", "20", "--out", str(out)], timeout=120)
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [int(r.split("|")[1]) for r in rows] == [8, 20000, 65536]
    for row in rows:
        native, ours, ratio = (float(v) for v in row.split("|")[2:5])
        assert native > 0 and ours > 0 and ratio == pytest.approx(ours / native, rel=0.01)
    text = out.read_text()
    assert "Command: `mpiexec -n 2 python -m mpicomm.bench pingpong --sizes 8,20000,65536" in text
    assert "| 65536 |" in text


@pytest.mark.launches
def test_pingpong_needs_two_ranks():
    result = mpirun.run(1, [sys.executable, "-m", "mpicomm.bench", "pingpong", "--sizes", "8"], timeout=60)
    assert result.returncode != 0
    assert "pingpong needs 2 ranks" in result.stderr
