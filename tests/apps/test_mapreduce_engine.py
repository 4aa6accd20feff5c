"""apps/mapreduce/engine.py: user jobs on the engine, spills everywhere, checkpoint and restart, errors, progress."""

from __future__ import annotations

import io
import os

import pytest
from mpi4py import MPI

from apps.mapreduce import Budget, InputError, MapReduce, memory_usage

TINY = Budget(8 << 20, block=128, store=3000, round=256, group=3000)


@pytest.fixture
def shared(comm, tmp_path_factory):
    """A directory every rank sees, holding six files whose lines depend on file index and line number."""
    path = comm.bcast(str(tmp_path_factory.mktemp("engine")) if comm.rank == 0 else None, root=0)
    if comm.rank == 0:
        for i in range(6):
            with open(os.path.join(path, f"in{i}.txt"), "w") as f:
                f.write("".join(f"{i * 1000 + j} " + "x" * ((i * 7 + j) % 23) + "\n" for j in range(40 * i)))
    comm.Barrier()
    yield path
    comm.Barrier()


def _paths(directory: str) -> list[str]:
    return [os.path.join(directory, f"in{i}.txt") for i in range(6)]


def _lines(directory: str):
    for i, path in enumerate(_paths(directory)):
        with open(path) as f:
            for line in f:
                yield i, line.rstrip("\n")


def _length_mapper(text: str, kv, block) -> None:
    for line in text.splitlines():
        number, _, xs = line.partition(" ")
        kv.add(len(xs), int(number))


@pytest.mark.mpi
@pytest.mark.parametrize("budget", [None, TINY], ids=["default", "tiny"])
@pytest.mark.parametrize("combine, reference", [("max", max), ("min", min), (lambda a, b: a ^ b, lambda a, b: a ^ b)],
                         ids=["max", "min", "custom-xor"])
def test_int_keys_with_each_combiner_and_a_reducer(comm, shared, budget, combine, reference):
    mr = MapReduce(comm, key="int", value="int", combine=combine, budget=budget)
    mr.map_files(_paths(shared), _length_mapper)
    mr.collate()
    mr.reduce(lambda key, value: None if key == 3 else value * 10 + key)
    got = mr.gather()
    summary = mr.summary()
    mr.close()
    expected: dict[int, int] = {}
    for _, line in _lines(shared):
        number, _, xs = line.partition(" ")
        k = len(xs)
        expected[k] = reference(expected[k], int(number)) if k in expected else int(number)
    expected = {k: v * 10 + k for k, v in expected.items() if k != 3}
    if comm.rank == 0:
        assert got == expected
    assert sum(s["counters"]["keys"] for s in summary) == len(expected)


@pytest.mark.mpi
def test_collect_hands_every_value_to_the_reducer(comm, shared):
    mr = MapReduce(comm, key="str", value="ints", combine=None, budget=TINY)
    mr.map_files(_paths(shared), lambda text, kv, block: kv.add_pairs(
        (f"len{len(line)}", block.index * 100_000 + int(line.split()[0])) for line in text.splitlines()))
    mr.collate()
    mr.reduce(lambda key, values: sorted(values))
    got = mr.gather()
    mr.close()
    expected: dict[str, list[int]] = {}
    for i, line in _lines(shared):
        expected.setdefault(f"len{len(line)}", []).append(i * 100_000 + int(line.split()[0]))
    if comm.rank == 0:
        assert got == {k: sorted(v) for k, v in expected.items()}


@pytest.mark.mpi
def test_spilled_and_in_memory_jobs_write_the_same_sorted_output_and_parts(comm, shared):
    outputs = []
    for budget in (None, TINY):
        mr = MapReduce(comm, key="str", value="int", combine="sum", budget=budget, spill_dir=shared)
        mr.map_files(_paths(shared), lambda text, kv, block: kv.add_keys(text.split()))
        mr.collate()
        mr.reduce()
        out = os.path.join(shared, f"sorted-{budget is None}.tsv")
        mr.write_sorted(out, lambda kv: (-kv[1], kv[0]), lambda k, v: f"{k}\t{v}")
        part = mr.write_parts(os.path.join(shared, f"part-{budget is None}-{{rank}}-of-{{size}}.tsv"),
                              lambda kv: kv[0], lambda k, v: f"{k}\t{v}")
        summary = mr.summary()
        spill_path = mr.spill._path
        mr.close()
        assert spill_path is None or not os.path.exists(spill_path)  # the spill directory is gone
        if comm.rank == 0:
            with open(out) as f:
                outputs.append(f.read())
        lines = open(part).read().splitlines()
        assert lines == sorted(lines, key=lambda line: line.split("\t")[0])
        parts = comm.allgather(lines)
        if budget is not None:
            assert sum(s["counters"]["map_spills"] for s in summary) > 0
            assert all(s["counters"]["buckets"] > 1 for s in summary if s["counters"]["items_received"] > 100)
            assert sum(s["counters"]["results_spilled"] for s in summary) > 0
            assert sum(s["counters"]["rounds"] for s in summary) > comm.size
    if comm.rank == 0:
        assert outputs[0] == outputs[1] and outputs[0].count("\n") == len(sum(parts, []))
        assert sorted(outputs[1].splitlines()) == sorted(sum(parts, []))
    with pytest.raises(ValueError, match="must contain \\{rank\\}"):
        mr.write_parts(os.path.join(shared, "same.tsv"), lambda kv: kv, lambda k, v: "")


def _count(directory: str, comm, budget=None, **kwargs) -> tuple[dict | None, MapReduce]:
    mr = MapReduce(comm, key="str", value="int", combine="sum", name="restart", budget=budget)
    mr.map_files(_paths(directory), kwargs.pop("mapper", lambda text, kv, block: kv.add_keys(text.split())), **kwargs)
    mr.collate()
    mr.reduce()
    got = mr.gather()
    mr.close()
    return got, mr


def _refuse(text, kv, block):
    raise AssertionError("the map phase ran although a valid checkpoint exists")


@pytest.mark.mpi
def test_restart_skips_the_map_and_gives_identical_results(comm, shared):
    ckpt = os.path.join(shared, "ckpt")
    first, mr = _count(shared, comm, TINY, checkpoint_dir=ckpt)
    assert mr.restored_from is None and "checkpoint" in mr.timings
    again, mr = _count(shared, comm, checkpoint_dir=ckpt, restart=True, mapper=_refuse)
    assert mr.restored_from and mr.restored_from.endswith("restart-map-00000001.json") and again == first
    # another rank count restores the same checkpoint (re-partitioned)
    if comm.size > 1:
        sub = comm.Split(0 if comm.rank < comm.size - 1 else MPI.UNDEFINED, comm.rank)
        if sub != MPI.COMM_NULL:
            fewer, mr = _count(shared, sub, checkpoint_dir=ckpt, restart=True, mapper=_refuse)
            assert mr.restored_from and (sub.Get_rank() != 0 or fewer == first)
            sub.Free()
        comm.Barrier()
    # other options: not this job's checkpoint; the map runs again
    other, mr = _count(shared, comm, checkpoint_dir=ckpt, restart=True, fingerprint={"option": 2})
    assert mr.restored_from is None and other == first
    # a damaged data file: refused, mapped again, same answer
    if comm.rank == 0:
        victim = sorted(f for f in os.listdir(ckpt) if f.endswith(".bin"))[0]
        with open(os.path.join(ckpt, victim), "r+b") as f:
            f.write(b"\x00garbage")
    comm.Barrier()
    out = io.StringIO()
    mr = MapReduce(comm, key="str", value="int", combine="sum", name="restart", progress=out)
    mr.map_files(_paths(shared), lambda text, kv, block: kv.add_keys(text.split()), checkpoint_dir=ckpt,
                 fingerprint={"option": 2}, restart=True)
    assert mr.restored_from is None
    if comm.rank == 0:
        assert "checksum mismatch" in out.getvalue() or "of another job" in out.getvalue()
    mr.close()


@pytest.mark.mpi
def test_progress_goes_to_rank_0_only_and_timings_are_recorded(comm, shared):
    out = io.StringIO()
    mr = MapReduce(comm, progress=out)
    mr.map_files(_paths(shared), lambda text, kv, block: kv.add_keys(text.split()))
    mr.collate()
    mr.reduce()
    top = mr.top(3, lambda kv: (-kv[1], kv[0]))
    mr.close()
    text = out.getvalue()
    if comm.rank == 0:
        assert "map:" in text and "mapped in" in text and "keys moved" in text and "reduce:" in text
        lines = text.splitlines()  # mpicomm.cli.Progress: a [i/3] line at the end of each phase, notes between
        steps = [line.split(" ", 2)[1] for line in lines if line.startswith("mapreduce [")]
        assert steps == ["[1/3]", "[2/3]", "[3/3]"]
        assert all(line.startswith(("mapreduce [", "mapreduce: ")) for line in lines), text
        assert len(top) == 3 and top[0][1] >= top[1][1] >= top[2][1]
    else:
        assert text == "" and top is None
    assert set(mr.timings) == {"map", "shuffle", "reduce", "output"} and all(t >= 0 for t in mr.timings.values())


@pytest.mark.mpi
def test_a_mapper_input_error_on_one_rank_is_raised_on_every_rank(comm, shared):
    def mapper(text, kv, block):
        if block.index == 5:
            raise InputError(f"{block.path!r}: refused on purpose")

    message = None
    mr = MapReduce(comm)
    try:
        mr.map_files(_paths(shared), mapper)
    except InputError as exc:
        message = str(exc)
    mr.close()
    assert message is not None and "in5.txt': refused on purpose" in message
    assert comm.allgather(message) == [message] * comm.size


def test_bad_arguments_are_refused_with_the_fix(comm, tmp_path):
    with pytest.raises(ValueError, match="below the minimum of 32.0 MiB"):
        MapReduce(comm, memory_limit="16M")
    with pytest.raises(ValueError, match="must be a whole number with an optional unit"):
        MapReduce(comm, memory_limit="lots")
    with pytest.raises(ValueError, match="works on values of kind int, float, not 'str'"):
        MapReduce(comm, value="str", combine="sum")
    with pytest.raises(ValueError, match="without path separators"):
        MapReduce(comm, name="a/b")
    with pytest.raises(TypeError, match="expected a Budget"):
        MapReduce(comm, budget=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="expected an mpicomm.Comm"):
        MapReduce("world")
    with pytest.raises(ValueError, match="not an existing directory"):
        MapReduce(comm, spill_dir=str(tmp_path / "missing"))
    mr = MapReduce(comm)
    with pytest.raises(TypeError, match="mapper"):
        mr.map_files(["x"], "not callable")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="errors 'ignore'"):
        mr.map_files(["x"], lambda *a: None, errors="ignore")
    with pytest.raises(ValueError, match="restart=True needs checkpoint_dir"):
        mr.map_files(["x"], lambda *a: None, restart=True)
    with pytest.raises(RuntimeError, match="call collate"):
        mr.reduce()
    with pytest.raises(ValueError, match="k -1"):
        mr.top(-1, lambda kv: kv)


def test_memory_usage_reads_proc():
    if not os.path.exists("/proc/self/status"):
        pytest.skip("no /proc on this system")
    before = memory_usage(reset=True)
    block = bytearray(64 << 20)
    block[::4096] = b"x" * len(block[::4096])  # touch every page
    after = memory_usage()
    assert after["peak"] - before["rss"] >= 60 << 20
    del block
