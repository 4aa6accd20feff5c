"""apps/mapreduce/shuffle.py: packing, stable hashing, segments, and the all-to-all-v exchange in rounds."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from apps.mapreduce.shuffle import (
    Spec,
    bounds,
    buckets,
    concat_batches,
    exchange,
    fmix32,
    item_bytes,
    iter_segments,
    owners,
    pack,
    pack_partitioned,
    read_segment,
    segment_nbytes,
    slice_batch,
    take,
    unpack,
    write_segment,
)

CASES = [
    (Spec("str", "int"), ["a", "", "naïve", "日本語", "x" * 300], [1, -2, 3 << 40, 0, 7]),
    (Spec("str", "float"), ["p", "q"], [0.5, -1e300]),
    (Spec("str", "str"), ["k1", "k2", "k3"], ["", "vé", "v" * 70]),
    (Spec("str", "ints"), ["a", "b", "c"], [[1, 2, 3], [], [-(1 << 62)]]),
    (Spec("int", "int"), [5, -(1 << 63), (1 << 63) - 1], [1, 2, 3]),
    (Spec("int", "ints"), [0, 1], [[9], [8, 7]]),
]


@pytest.mark.parametrize("spec, keys, values", CASES, ids=[f"{s.key}-{s.value}" for s, _, _ in CASES])
def test_pack_unpack_round_trip(spec, keys, values):
    batch = pack(keys, values, spec)
    assert [name for name, _ in spec.columns] == list(batch)
    assert unpack(batch, spec) == (keys, values)
    bnd = bounds(batch, spec)
    assert item_bytes(batch, spec, bnd).sum() == sum(a.nbytes for a in batch.values())
    mid = len(keys) // 2
    left, right = slice_batch(batch, spec, bnd, 0, mid), slice_batch(batch, spec, bnd, mid, len(keys))
    assert unpack(left, spec) == (keys[:mid], values[:mid]) and unpack(right, spec) == (keys[mid:], values[mid:])
    assert unpack(concat_batches([left, right], spec), spec) == (keys, values)


@pytest.mark.parametrize("spec, keys, values", CASES, ids=[f"{s.key}-{s.value}" for s, _, _ in CASES])
def test_segments_round_trip_back_to_back(spec, keys, values):
    batch = pack(keys, values, spec)
    n = segment_nbytes(batch, spec)
    assert n % 8 == 0
    buf = np.zeros(2 * n, np.uint8)
    assert write_segment(buf, batch, spec) == n and write_segment(buf[n:], batch, spec) == n
    part, used = read_segment(buf, spec)
    assert used == n and unpack(part, spec) == (keys, values)
    assert [unpack(p, spec) for p in iter_segments(buf, spec)] == [(keys, values)] * 2
    with pytest.raises(ValueError, match="cut short|damaged"):
        read_segment(buf[: n // 2 if n > 8 * len(spec.columns) + 8 else 4], spec)


def test_hashes_are_stable_across_processes_and_runs():
    """Literal values: CRC-32 then MurmurHash3's finalizer; a change here moves keys between ranks."""
    batch = pack(["the", "naïve", ""], [1, 1, 1], Spec())
    expected = fmix32(np.array([zlib.crc32(b"the"), zlib.crc32("naïve".encode()), 0], np.uint32))
    assert batch["hash"].tolist() == expected.tolist()
    assert fmix32(np.array([0, 1, 0xDEADBEEF], np.uint32)).tolist() == [0, 0x514E28B7, 0x0DE5C6A9]
    assert owners(np.array([0, 1 << 31, 0xFFFFFFFF], np.uint32), 3).tolist() == [0, 1, 2]
    b = buckets(np.arange(1000, dtype=np.uint32), 7)
    assert b.min() == 0 and b.max() == 6 and len(set(b.tolist())) == 7


def test_pack_partitioned_groups_items_by_owner():
    keys = [f"k{i}" for i in range(500)]
    values = list(range(500))
    batch, dest = pack_partitioned(keys, values, Spec(), 4)
    assert dest[0] == 0 and dest[-1] == 500 and (np.diff(dest) > 50).all()
    own = owners(batch["hash"], 4)
    for r in range(4):
        assert (own[dest[r]:dest[r + 1]] == r).all()
    got_keys, got_values = unpack(batch, Spec())
    assert sorted(zip(got_keys, got_values)) == sorted(zip(keys, values))


def test_str_keys_may_come_as_utf8_bytes():
    for keys in ([b"ab", "cd", "\u00e9".encode()], ["ab", b"cd", "\u00e9"], [b"ab", b"cd", "\u00e9".encode()]):
        batch = pack(keys, [1, 2, 3], Spec())
        assert unpack(batch, Spec()) == (["ab", "cd", "\u00e9"], [1, 2, 3])
        assert batch["hash"].tolist() == pack(["ab", "cd", "\u00e9"], [1, 2, 3], Spec())["hash"].tolist()


def test_take_and_bad_input():
    assert take(["a", "b", "c"], np.array([2, 0])) == ["c", "a"] and take(["a"], np.array([0])) == ["a"]
    assert take([], np.array([], np.int64)) == []
    with pytest.raises(ValueError, match="U\\+0000"):
        pack(["a\0b"], [1], Spec())
    with pytest.raises(TypeError, match="this job's keys are str"):
        pack([3], [1], Spec())
    with pytest.raises(TypeError, match="int64 range"):
        pack(["a"], [1 << 70], Spec())
    with pytest.raises(ValueError, match="one value per key"):
        pack(["a"], [], Spec())
    with pytest.raises(ValueError, match="keys are one of"):
        Spec("float", "int")
    with pytest.raises(ValueError, match="values are one of"):
        Spec("str", "set")


@pytest.mark.mpi
@pytest.mark.parametrize("round_bytes", [64, 4096, 1 << 24])
def test_exchange_delivers_every_item_to_its_owner_once(comm, round_bytes):
    p, rank = comm.size, comm.rank
    spec = Spec("str", "int")
    runs = []
    for run in range(rank % 3 + 1):  # ranks hold different numbers of runs (one of them may hold an empty one)
        n = 0 if (run == 1 and rank == 1) else 300 + 17 * rank
        keys = [f"r{rank}-{run}-{i}" + "é" * (i % 5) for i in range(n)]
        values = [rank * 1_000_000 + run * 10_000 + i for i in range(n)]
        runs.append(pack_partitioned(keys, values, spec, p))
    got: dict[str, int] = {}
    sources = set()

    def deliver(part, source):
        sources.add(source)
        keys, values = unpack(part, spec)
        assert (owners(part["hash"], p) == rank).all()
        for k, v in zip(keys, values):
            assert k not in got, f"{k} delivered twice"
            got[k] = v

    stats = exchange(comm, iter(runs), spec, round_bytes, deliver)
    everything = {}
    for r in range(p):
        for run in range(r % 3 + 1):
            n = 0 if (run == 1 and r == 1) else 300 + 17 * r
            for i in range(n):
                everything[f"r{r}-{run}-{i}" + "é" * (i % 5)] = r * 1_000_000 + run * 10_000 + i
    mine = {k: v for k, v in everything.items() if owners(pack([k], [0], spec)["hash"], p)[0] == rank}
    assert got == mine
    assert stats.items_received == len(mine) and comm.allreduce(stats.items_sent) == len(everything)
    if round_bytes == 64:
        assert stats.rounds > 10  # a tiny round size really makes rounds
    rounds = comm.allgather(stats.rounds)
    assert len(set(rounds)) == 1  # every rank took part in every round


@pytest.mark.mpi
def test_exchange_with_nothing_anywhere_returns_after_one_round(comm):
    stats = exchange(comm, iter([]), Spec(), 1 << 20, lambda part, source: pytest.fail("nothing to deliver"))
    assert stats.rounds == 1 and stats.items_sent == 0


@pytest.mark.mpi
def test_exchange_refuses_a_run_partitioned_for_another_size(comm):
    batch, dest = pack_partitioned(["a"], [1], Spec(), comm.size + 1)
    problem = None
    try:
        exchange(comm, iter([(batch, dest)]), Spec(), 1 << 20, lambda part, source: None)
    except ValueError as exc:
        problem = str(exc)
    assert problem is not None and "partitioned for" in problem
