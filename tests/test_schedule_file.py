"""mpicomm.schedule_file: schedules written as JSON and read back, checked, and registered as an algorithm.

Without MPI: every registered algorithm a file can express, of every collective, at p = 1…5 and counts 0, 1,
p−1, p+1 (per-rank counts for the v-forms) is written, read back and compared, field for field; files with
mistakes are refused with what is wrong; a registered file describes exactly its schedules, and refuses other
calls. Under MPI (2 ranks and more): file-registered algorithms run and match the MPI library's collectives.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile

import numpy as np
import pytest

import mpicomm
from mpicomm import __main__ as commands
from mpicomm import registry, verify
from mpicomm.catalogue import CATALOGUE
from mpicomm.facts import Facts
from mpicomm.plan.preview import schedule_for, schedules_for
from mpicomm.schedule import RECV, SEND, Copy, Round, View
from mpicomm.schedule_file import FORMAT, VERSION, check, from_json, run, to_json

from .conftest import rank_data

serial = pytest.mark.serial


def _calls(collective: str, p: int) -> list[tuple[int, list[int] | None]]:
    """(count, per-rank counts) of the calls every algorithm is written at: counts 0, 1, p−1, p+1; the v-forms
    get per-rank counts around them (zeros included)."""
    counts = sorted({0, 1, max(p - 1, 0), p + 1})
    if CATALOGUE[collective].vector:
        return [(c, [(c + 2 * r) % (p + 2) for r in range(p)]) for c in counts]
    return [(c, None) for c in counts]


@pytest.fixture
def register():
    """``register(path, name)``: mpicomm.register_schedule_file, the algorithm removed from the table afterwards
    (so that tests collected later never see it)."""
    done = []

    def register_(path: str, name: str | None = None) -> registry.Algorithm:
        algorithm = mpicomm.register_schedule_file(path, name)
        done.append((algorithm.collective, algorithm.name))
        return algorithm

    yield register_
    for collective, name in done:
        registry._TABLE[collective].pop(name, None)
        registry._COSTS.pop((collective, name), None)


def _write(directory: str, schedules: list, name: str = "schedules.json") -> str:
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write(to_json(schedules))
    return path


# ---------------------------------------------------------------- writing and reading


@serial
def test_every_expressible_algorithm_round_trips_exactly():
    written, refused = 0, set()
    for collective, algorithms in sorted(registry.table().items()):
        for name in sorted(algorithms):
            for p in range(1, 6):
                for count, counts in _calls(collective, p):
                    try:
                        schedules = schedules_for(collective, name, p, count, counts=counts, root=p - 1)
                    except ValueError:
                        continue  # the algorithm refuses this call (a prime p...)
                    try:
                        text = to_json(schedules)
                    except ValueError as exc:
                        assert "cannot be written as a schedule file" in str(exc)
                        refused.add(f"{collective}/{name}")
                        continue
                    back = from_json(text)
                    assert back == schedules, f"{collective}/{name} p={p} count={count} counts={counts}"
                    assert to_json(back) == text
                    assert check(back) == []
                    written += 1
    assert written > 900
    # what cannot be written: shared memory, nested calls (hierarchical), the library's own, run-time rounds
    assert {"allreduce/shm", "allreduce/hierarchical", "barrier/native"} <= refused
    assert "allreduce/ring" not in refused and "alltoall/bruck" not in refused


@serial
def test_a_small_file_literally():
    text = to_json(schedules_for("bcast", "binomial", 3, 2, dtype=np.int32, root=1))
    assert text == (
        '{"format": "mpicomm-schedule", "version": 1, "collective": "bcast", "algorithm": "binomial", "p": 3, '
        '"root": 1, "count": 2, "dtype": "int32",\n'
        ' "ranks": [\n'
        '  {"rank": 0, "buffers": [[2, "int32"], [2, "int32"]], "arguments": [],\n'
        '   "rounds": [\n'
        '    {"recvs": [[1, [1, 0, 2]]], "sends": [], "ops": []}]},\n'
        '  {"rank": 1, "buffers": [[2, "int32"], [2, "int32"]], "arguments": [],\n'
        '   "rounds": [\n'
        '    {"recvs": [], "sends": [[0, [1, 0, 2]], [2, [1, 0, 2]]], "ops": []}]},\n'
        '  {"rank": 2, "buffers": [[2, "int32"], [2, "int32"]], "arguments": [],\n'
        '   "rounds": [\n'
        '    {"recvs": [[1, [1, 0, 2]]], "sends": [], "ops": []}]}\n'
        ' ]}\n')
    doc = json.loads(text)
    assert (doc["format"], doc["version"]) == (FORMAT, VERSION)


@serial
def test_copies_combines_scratch_and_per_rank_arguments_are_written():
    schedules = schedules_for("allreduce", "ring", 3, 4, dtype=np.int64)
    doc = json.loads(to_json(schedules))
    rank0 = doc["ranks"][0]
    assert rank0["buffers"][2:] == [[2, "int64"], [2, "int64"]]
    assert rank0["rounds"][0] == {"recvs": [], "sends": [], "ops": [["copy", [RECV, 0, 4], [SEND, 0, 4]]]}
    assert rank0["rounds"][1]["ops"] == [["combine", [2, 0, 1], [1, 2, 3], [1, 2, 3]]]
    v = from_json(to_json(schedules_for("gatherv", "linear", 3, counts=[2, 0, 1])))
    assert v[1].arguments == (None, None, None)  # not the root: no output buffer, and not given the counts
    assert v[0].arguments == ((2, 0, 1), (0, 2, 2)) and v[0].count == -1


@serial
@pytest.mark.parametrize("collective, name, why", [
    ("allreduce", "shm", "named local step .*shared control window"),
    ("allreduce", "hierarchical", "named local step .*communicators"),
    ("barrier", "native", "MPI library's own"),
])
def test_what_a_file_cannot_hold_is_refused_with_the_reason(collective, name, why):
    from mpicomm.plan.preview import Layout

    with pytest.raises(ValueError, match=f"{collective}/{name} cannot be written.*{why}.*not expressible as files"):
        to_json(schedules_for(collective, name, 4, 8, layout=Layout.even(4, 2)))


@serial
def test_schedules_of_different_calls_are_not_one_file():
    with pytest.raises(ValueError, match="needs the schedules of every rank"):
        to_json([])
    with pytest.raises(ValueError, match=r"one schedule per rank 0..2 in order, got ranks \[0, 2\]"):
        to_json([schedule_for("allreduce", "ring", 3, r) for r in (0, 2)])
    mixed = [schedule_for("allreduce", "ring", 2, 0, 4), schedule_for("allreduce", "ring", 2, 1, 5)]
    with pytest.raises(ValueError, match="rank 1's schedule is of another call"):
        to_json(mixed)


def _edited(edit) -> str:
    doc = json.loads(to_json(schedules_for("allreduce", "recursive_doubling", 2, 3)))
    edit(doc)
    return json.dumps(doc)


@serial
@pytest.mark.parametrize("text, message", [
    ("{", "not JSON"),
    ('{"format": "mpicomm-results"}', "not a schedule file .*'mpicomm-results'.*--schedule-file"),
    (_edited(lambda d: d.update(version=2)), "version 2 .*reads versions 1..1"),
    (_edited(lambda d: d.update(collective="allreduse")), "unknown collective 'allreduse'"),
    (_edited(lambda d: d.pop("p")), "no 'p'"),
    (_edited(lambda d: d.update(p="2")), "p = '2' is not an int"),
    (_edited(lambda d: d.update(root=5)), "0 <= root < p"),
    (_edited(lambda d: d.update(dtype="float99")), "'float99' is not a NumPy element type"),
    (_edited(lambda d: d["ranks"].pop()), "1 entries in ranks for p = 2"),
    (_edited(lambda d: d["ranks"][1].update(rank=0)), r"ranks\[1\]: rank 0 at position 1"),
    (_edited(lambda d: d["ranks"][0].update(buffers=[[3, "float64"]])), "the input and the output come first"),
    (_edited(lambda d: d["ranks"][0]["rounds"][0]["sends"][0].pop()),
     r"ranks\[0\].rounds\[0\].sends\[0\]: expected \[peer, \[buffer, start, stop\]\]"),
    (_edited(lambda d: d["ranks"][0]["rounds"][0]["recvs"][0][1].append(9)), "a view \\[buffer, start, stop\\]"),
    (_edited(lambda d: d["ranks"][0]["rounds"][0].update(ops=[["add", [1, 0, 1]]])),
     r'ops\[0\]: expected \["copy", dst, src\] or \["combine", a, b, out\]'),
    (_edited(lambda d: d["ranks"][0]["rounds"][0].update(waits=[])), "an object with recvs, sends and ops"),
])
def test_a_malformed_file_is_refused_naming_the_entry(text, message):
    with pytest.raises(ValueError, match=message):
        from_json(text, "f.json")


@serial
def test_check_finds_views_out_of_bounds_and_messages_that_do_not_meet():
    ok = from_json(to_json(schedules_for("allreduce", "recursive_doubling", 2, 3)))
    assert check(ok) == []
    s = [dataclasses.replace(x) for x in ok]
    s[0].rounds[0].sends[0] = (1, View(RECV, 0, 4))
    assert check(s) == ["rank 0 round 0: send [1, 0, 4] is outside buffer 1 (3 elements)"]
    s[0].rounds[0].sends[0] = (1, View(7, 0, 1))
    assert "names buffer 7, which does not exist" in check(s)[0]
    s[0].rounds[0].sends[0] = (1, View(RECV, 0, 2))
    assert check(s) == ["rank 0 sends messages of [16] bytes to rank 1, which receives [24]"]
    s[0].rounds[0].sends[0] = (1, View(2, 0, 3))  # sends the scratch it receives into
    assert check(s) == ["rank 0 round 0: recv [2, 0, 3] overlaps another message of its round"]
    s[0].rounds[0].sends[0] = (1, View(SEND, 0, 3))
    s[1].rounds[0].ops.append(Copy(View(RECV, 0, 2), View(SEND, 0, 3)))
    assert "views of different sizes" in check(s)[0]


@serial
def test_check_runs_the_rounds_and_finds_deadlocks_and_wrong_results():
    s = from_json(to_json(schedules_for("allreduce", "recursive_doubling", 2, 3)))
    for x in s:  # each rank sends in one round and receives in the next: both wait for the other's receive
        x.rounds[0:1] = [Round(sends=x.rounds[0].sends), Round(recvs=x.rounds[0].recvs, ops=x.rounds[0].ops)]
    assert check(s) == ["the rounds deadlock when a send completes only once its receive is posted: rank 0 in "
                        "round 0, rank 1 in round 0 wait for each other"]
    s = from_json(to_json(schedules_for("allreduce", "ring", 3, 4)))
    s[0].rounds[1].ops = [Copy(op.out, op.b) for op in s[0].rounds[1].ops]  # drops what rank 2 sent
    problems = check(s)
    assert len(problems) == 3 and "where allreduce gives" in problems[0], problems
    s = from_json(to_json(schedules_for("gatherv", "linear", 3, counts=[2, 0, 1], root=1)))
    outputs = run(s, [{SEND: np.arange(n) + 10 * r} for r, n in enumerate([2, 0, 1])])
    assert list(outputs[1][RECV]) == [0, 1, 20]


# ---------------------------------------------------------------- registering


@serial
def test_a_registered_file_describes_its_schedules_and_refuses_other_calls(register, tmp_path):
    schedules = schedules_for("allgatherv", "ring", 3, counts=[2, 0, 3])
    algorithm = register(_write(str(tmp_path), schedules), "ring_from_file")
    assert algorithm.fixed_p == 3 and algorithm.fixed_count is None and not algorithm.in_place
    assert not algorithm.commutative_only  # nothing to combine
    again = schedules_for("allgatherv", "ring_from_file", 3, counts=[2, 0, 3])
    assert [dataclasses.replace(s, algorithm="ring") for s in again] == schedules
    with pytest.raises(ValueError, match="'ring_from_file' is a schedule file made for p = 3.*but rank 0's input "
                                         "holds 3 elements, the file's 2; use another algorithm"):
        schedules_for("allgatherv", "ring_from_file", 3, counts=[3, 0, 2])
    with pytest.raises(ValueError, match="rank 0 has counts, displacements or neighbours \\[2, 1, 2\\], the file "
                                         "\\[2, 0, 3\\]"):
        schedules_for("allgatherv", "ring_from_file", 3, counts=[2, 1, 2])
    assert registry.allowed(algorithm, Facts(p=4)) == "is a schedule file made for p = 3 only, but p = 4"
    assert registry.allowed(algorithm, Facts(p=3)) is None
    doc = algorithm.steps.__doc__
    assert "Steps:" in doc and "Restrictions:" in doc and "Cost:" not in doc
    assert algorithm.cost.startswith("R·α + S·β + C·γ of the busiest rank")  # its cost function's docstring
    assert registry.predict("allgatherv", "ring_from_file", 40, 3) > 0


@serial
def test_a_reducing_file_needs_its_count_and_a_commutative_op(register, tmp_path):
    schedules = schedules_for("allreduce", "rabenseifner", 4, 5, dtype=np.float32)
    algorithm = register(_write(str(tmp_path), schedules), "raben_file")
    assert algorithm.commutative_only and algorithm.fixed_count == 5
    assert "made for count 5 only, but the count is 6" in registry.allowed(algorithm, Facts(p=4, count=6))
    assert "commutative" in registry.allowed(algorithm, Facts(p=4, count=5, commutative=False))
    # another element type runs the same rounds, scratch of the call's type
    again = schedules_for("allreduce", "raben_file", 4, 5, dtype=np.int64)
    assert [s.rounds for s in again] == [s.rounds for s in schedules]
    assert all(dt == np.int64 for s in again for _, dt in s.buffers)
    with pytest.raises(ValueError, match="this call has root|this call has count 6"):
        schedules_for("allreduce", "raben_file", 4, 6)


@serial
def test_a_file_with_problems_or_a_taken_name_is_not_registered(register, tmp_path):
    schedules = schedules_for("allreduce", "recursive_doubling", 2, 3)
    path = _write(str(tmp_path), schedules)
    with pytest.raises(ValueError, match="'recursive_doubling' is registered already.*name='recursive_doubling_file'"):
        register(path)
    doc = json.loads(to_json(schedules))
    doc["ranks"][1]["rounds"][0]["recvs"] = []
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"broken.json \(allreduce/recursive_doubling, p = 2\): 1 problem\(s\): "
                                         r"rank 0 sends 1 message\(s\) to rank 1, which receives 0"):
        register(str(broken), "broken")
    doc = json.loads(to_json(schedules_for("allreduce", "ring", 3, 4)))
    doc["ranks"][0]["rounds"][1]["ops"] = []  # forgets to add what it received
    broken.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"3 problem\(s\): rank 0's output at 2 is 1000004, where allreduce "
                                         r"gives 3000006"):
        register(str(broken), "broken")
    with pytest.raises(ValueError, match="cannot read schedule file"):
        register(str(tmp_path / "missing.json"), "missing")
    assert "broken" not in registry.algorithms("allreduce")


@serial
def test_the_command_writes_a_schedule_file(tmp_path, capsys):
    path = tmp_path / "ring.json"
    assert commands.main(["algorithms", "--schedule", "allreduce", "ring", "-p", "3", "--count", "4",
                          "--schedule-file", str(path)]) == 0
    assert from_json(path.read_text()) == schedules_for("allreduce", "ring", 3, 4)
    assert commands.main(["algorithms", "--schedule", "allreduce", "shm", "-p", "3", "--schedule-file",
                          str(tmp_path / "shm.json")]) == 2
    assert "allreduce/shm cannot be written as a schedule file" in capsys.readouterr().err
    assert not (tmp_path / "shm.json").exists()


# ---------------------------------------------------------------- running under MPI


@pytest.mark.mpi(min_size=2)
def test_file_algorithms_match_the_library(comm, register):
    from mpi4py import MPI

    p, rank, world = comm.size, comm.rank, MPI.COMM_WORLD
    with tempfile.TemporaryDirectory() as directory:  # one per rank: every process registers the file itself
        path = _write(directory, schedules_for("allreduce", "ring", p, p + 1, dtype=np.int64))
        register(path, "ring_file_mpi")
        path = _write(directory, schedules_for("allgatherv", "ring", p, counts=[r % 3 for r in range(p)]), "v.json")
        register(path, "allgatherv_file_mpi")
        path = _write(directory, schedules_for("bcast", "binomial", p, 3, root=p - 1), "b.json")
        register(path, "bcast_file_mpi")

    x = rank_data(rank, p + 1, np.int64)
    got, want = np.zeros_like(x), np.zeros_like(x)
    comm.Allreduce(x, got, algorithm="ring_file_mpi")
    world.Allreduce(x, want)
    np.testing.assert_array_equal(got, want)
    y = rank_data(rank, p + 1, np.float64)  # another element type: the same rounds
    got, want = np.zeros_like(y), np.zeros_like(y)
    comm.Allreduce(y, got, algorithm="ring_file_mpi")
    world.Allreduce(y, want)
    np.testing.assert_array_equal(got, want)

    counts = [r % 3 for r in range(p)]
    displs = [sum(counts[:r]) for r in range(p)]
    mine = rank_data(rank, counts[rank], np.int64)
    got, want = np.full(sum(counts), -1, np.int64), np.full(sum(counts), -1, np.int64)
    comm.Allgatherv(mine, [got, counts, displs, MPI.INT64_T], algorithm="allgatherv_file_mpi")
    world.Allgatherv(mine, [want, counts, displs, MPI.INT64_T])
    np.testing.assert_array_equal(got, want)

    got = rank_data(rank, 3, np.int64)
    comm.Bcast(got, root=p - 1, algorithm="bcast_file_mpi")
    np.testing.assert_array_equal(got, rank_data(p - 1, 3, np.int64))

    # another count: refused alike on every rank, naming the file's; the communicator still works
    with pytest.raises(ValueError, match=f"schedule file made for count {p + 1} only, but the count is {p}"):
        comm.Allreduce(x[:p], np.zeros(p, np.int64), algorithm="ring_file_mpi")
    with pytest.raises(ValueError, match="schedule file made for p = .*root"):
        comm.Bcast(got, root=0, algorithm="bcast_file_mpi")
    comm.Allreduce(x, got := np.zeros_like(x), algorithm="ring_file_mpi")
    world.Allreduce(x, want := np.zeros_like(x))
    np.testing.assert_array_equal(got, want)

    # python -m mpicomm verify's cases: the file's count runs (int64 and float64 sums, in place, blocking,
    # nonblocking, persistent), the other counts and the non-commutative op are skipped with the reason
    report = verify.run_cases(comm, "allreduce", "ring_file_mpi", quick=True)
    if rank == 0:
        assert report["failed"] == [] and report["passed"] == 12, report
        assert any(f"made for count {p + 1} only" in why for why in report["skipped"]), report["skipped"]
