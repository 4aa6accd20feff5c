"""apps/mapreduce/inputs.py: sizes, byte-range splits at line boundaries, blocks, decoding, collective input checks."""

from __future__ import annotations

import os
import random

import pytest

from apps.mapreduce.inputs import (
    InputError,
    Split,
    adjust,
    check_inputs,
    decode,
    format_size,
    parse_size,
    plan_splits,
    read_blocks,
)


@pytest.mark.parametrize("text, value", [("512M", 512 << 20), ("1.5G", 3 << 29), ("64KiB", 64 << 10),
                                         ("100000", 100000), ("2 gb", 2 << 30), (4096, 4096), ("1T", 1 << 40),
                                         ("1e6", 10**6), ("64kb", 64 << 10), ("64K", 64 << 10)])
def test_parse_size_reads_units_in_powers_of_1024(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["512M", "1.5G", "64KiB", "1e6", "100000"])
def test_parse_size_is_mpicomm_cli_parse_size(text):
    from mpicomm import cli

    assert parse_size(text) == cli.parse_size(text)  # one size parser for every command


@pytest.mark.parametrize("text", ["abc", "", "12Q", "-5M", "0", "0M", "1.2.3G", "1e6K", -5])
def test_parse_size_refuses_what_is_not_a_size_and_says_how(text):
    with pytest.raises(ValueError, match="must be a whole number with an optional unit|must be >= 1, got"):
        parse_size(text, "--memory-limit")


def test_parse_size_refuses_other_types():
    with pytest.raises(TypeError, match="expected a size"):
        parse_size(True)
    with pytest.raises(TypeError, match="expected a size"):
        parse_size(3.5)  # type: ignore[arg-type]


def test_format_size():
    assert format_size(10) == "10 B" and format_size(1536) == "1.5 KiB" and format_size(200 << 20) == "200.0 MiB"


@pytest.mark.parametrize("p", [1, 2, 3, 5, 8])
def test_splits_tile_the_concatenated_files_exactly(p):
    rng = random.Random(p)
    sizes = [rng.choice([0, 1, 2, 7, 100, 1000]) for _ in range(9)]
    paths = [f"f{i}" for i in range(len(sizes))]
    plans = plan_splits(paths, sizes, p)
    assert len(plans) == p
    covered = {i: [] for i in range(len(sizes))}
    for plan in plans:
        for s in plan:
            assert s.path == paths[s.index] and 0 <= s.start < s.stop <= sizes[s.index]
            covered[s.index].append((s.start, s.stop))
    for i, ranges in covered.items():
        ranges.sort()
        assert sum(b - a for a, b in ranges) == sizes[i]
        assert all(ranges[k][1] == ranges[k + 1][0] for k in range(len(ranges) - 1))
    total = sum(sizes)
    for plan in plans:  # equal shares: each rank within one byte of T/p
        assert abs(sum(s.stop - s.start for s in plan) - total / p) < 1


def test_plan_splits_refuses_bad_arguments():
    with pytest.raises(ValueError, match="at least one rank"):
        plan_splits(["a"], [1], 0)
    with pytest.raises(ValueError, match="one size per path"):
        plan_splits(["a", "b"], [1], 2)


def _write(path, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


def _read_all(path: str, p: int, block: int) -> list:
    size = os.path.getsize(path)
    blocks = []
    for plan in plan_splits([path], [size], p):
        for split in plan:
            blocks.extend(read_blocks(split, block, size))
    return blocks


@pytest.mark.parametrize("p", [1, 2, 3, 4, 7, 50])
@pytest.mark.parametrize("block", [1, 5, 64, 1 << 20])
def test_every_line_is_read_once_and_whole(tmp_path, p, block):
    rng = random.Random(p * 1000 + block)
    lines = [" ".join("wörd" * rng.randint(0, 3) + str(k) for k in range(rng.randint(0, 9))) for _ in range(40)]
    data = ("\n".join(lines) + "\r\n" + "tail without newline").encode()
    path = _write(tmp_path / "f.txt", data)
    blocks = _read_all(path, p, block)
    assert b"".join(b.data for b in blocks) == data
    pos = 0
    for b in blocks:
        assert b.offset == pos and b.index == 0 and b.path == path
        pos += len(b.data)
        b.data.decode("utf-8")  # never a cut character
        # a block ends at a line end or at whitespace, except the file's last
        assert b.data.endswith((b"\n", b" ", b"\t", b"\r")) or pos == len(data)


def test_a_split_inside_a_multibyte_character_moves_to_the_next_line(tmp_path):
    data = ("𠀀" * 5 + "\n" + "é" * 7 + "\n" + "日本" * 3 + "\n").encode()
    path = _write(tmp_path / "m.txt", data)
    size = len(data)
    with open(path, "rb") as f:
        for x in range(size + 1):
            y = adjust(f, x, size)
            assert y == 0 or y == size or data[y - 1:y] == b"\n"
            assert y >= x
    for p in range(1, size + 1):
        blocks = _read_all(path, p, 3)
        assert b"".join(b.data for b in blocks) == data
        for b in blocks:
            b.data.decode("utf-8")


def test_one_giant_line_without_whitespace_grows_one_block(tmp_path):
    data = b"x" * 5000 + b" y z\n" + b"w" * 1000
    path = _write(tmp_path / "g.txt", data)
    blocks = _read_all(path, 1, 100)
    assert b"".join(b.data for b in blocks) == data
    assert blocks[0].data == b"x" * 5000 + b" y z\n"  # grown until a cut is possible, then cut at the newline
    assert blocks[-1].data == b"w" * 1000  # the same again: no whitespace up to the end of the file


def test_more_ranks_than_lines_read_nothing(tmp_path):
    path = _write(tmp_path / "one.txt", b"only one line here\n")
    plans = plan_splits([path], [os.path.getsize(path)], 6)
    got = [[b.data for s in plan for b in read_blocks(s, 64)] for plan in plans]
    assert got[0] == [b"only one line here\n"] and all(g == [] for g in got[1:])


def test_read_blocks_refuses_a_zero_block(tmp_path):
    path = _write(tmp_path / "a.txt", b"a\n")
    with pytest.raises(ValueError, match="block_size 0"):
        list(read_blocks(Split(0, path, 0, 2), 0))


def test_decode_names_file_and_byte_under_strict_and_replaces_otherwise():
    data = b"ok " + b"\xff\xfe" + b" end"
    with pytest.raises(InputError, match=r"'f.txt': byte 103: invalid UTF-8.*--errors replace"):
        decode(data, "strict", "f.txt", 100)
    assert decode(data, "replace", "f.txt", 100) == "ok \ufffd\ufffd end"


@pytest.mark.mpi
def test_check_inputs_raises_the_same_error_on_every_rank(comm, tmp_path_factory):
    base = comm.bcast(str(tmp_path_factory.mktemp("inputs")) if comm.rank == 0 else None, root=0)
    good = os.path.join(base, "good.txt")
    if comm.rank == 0:
        _write(good, b"hello\n")
    comm.Barrier()
    assert check_inputs(comm, [good, good]) == [6, 6]
    missing = os.path.join(base, "nope.txt")
    with pytest.raises(InputError) as info:
        check_inputs(comm, [good, missing, base])
    text = str(info.value)
    assert f"{missing!r} does not exist" in text and f"{base!r} is a directory" in text
    assert comm.allgather(text) == [text] * comm.size
    with pytest.raises(InputError, match="no input files"):
        check_inputs(comm, [])
    with pytest.raises(TypeError, match="list of file names"):
        check_inputs(comm, "good.txt")
