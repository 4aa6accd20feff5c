"""``python -m mpicomm verify`` (mpicomm.verify): the cases a job runs, the pair check, and whole runs.

The runs start MPI jobs of their own (``launches``), at p = 2 and 3 (4 for the
torus, whose smaller grids are plain rings) with ``--quick``: a built-in
algorithm that passes, the worked example of a user algorithm
(docs/examples/torus_allreduce.py) through ``--module``, and a wrong user
algorithm whose failures must be reported with what failed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from mpicomm import verify
from mpicomm.verify import Case, cases, counts_for, pair_check, parse_ranks
from tests import mpirun

TIMEOUT = 240


# ---------------------------------------------------------------- without MPI


@pytest.mark.serial
@pytest.mark.parametrize("text, ps", [("2..7", [2, 3, 4, 5, 6, 7]), ("2,3,5", [2, 3, 5]), ("4", [4]),
                                      ("2..4,7", [2, 3, 4, 7]), ("3,3", [3])])
def test_ranks_are_a_range_a_list_or_one(text, ps):
    assert parse_ranks(text) == ps


@pytest.mark.serial
@pytest.mark.parametrize("text, message", [("0", "p must be >= 1"), ("5..2", "the range 5..2 is empty"),
                                           ("two", "not a number of ranks"), ("2..", "not a number of ranks")])
def test_bad_ranks_say_what_is_accepted(text, message):
    with pytest.raises(ValueError, match=message):
        parse_ranks(text)


@pytest.mark.serial
def test_cases_cover_counts_ops_roots_in_place_and_forms():
    assert counts_for(3) == [0, 1, 2, 4, verify.LARGE] and counts_for(1, quick=True) == [0, 1, 2]
    allreduce = cases("allreduce", 3, quick=True)
    assert len(allreduce) == 4 * 3 * 2 * 3  # counts × (int64 sum, float64 sum, matrices) × in place × forms
    assert {(c.dtype, c.op) for c in allreduce} == {("int64", "sum"), ("float64", "sum"), ("int64", "matmul2x2")}
    assert {c.mode for c in allreduce} == {"blocking", "nonblocking", "persistent"}
    assert {c.root for c in cases("reduce", 4, quick=True)} == {0, 2, 3}
    assert {c.in_place for c in cases("bcast", 4, quick=True)} == {False}, "bcast has no in-place form"
    assert {c.op for c in cases("allgather", 4, quick=True)} == {None}
    assert len(cases("barrier", 5)) == 3
    case = Case(4, "int64", "matmul2x2", 1, True, "persistent")
    assert case.label("reduce", "binomial") == ("reduce/binomial count=4 matrices dtype=int64 op=matmul2x2 root=1 "
                                                "mode=persistent in place")


@pytest.mark.serial
def test_pair_check_covers_every_count_and_root():
    checked, problems, refusals = pair_check("bcast", "binomial", 4, quick=True)
    assert checked == 4 * 3 and problems == [] and refusals == []  # counts 0, 1, 3, 5 × roots 0, 2, 3
    checked, problems, _ = pair_check("allreduce", "recursive_doubling", 3)
    # the calls of every count, in elements and in matrices of 4 elements (4 elements are count 4 and 1 matrix)
    assert checked == len({c * unit for c in counts_for(3) for unit in (1, 4)}) == 8 and problems == []


@pytest.mark.serial
@pytest.mark.parametrize("argv, message", [
    (["verify", "allreduce", "ring"], "verify needs -p"),
    (["verify", "allreduce", "-p", "2"], "verify takes COLLECTIVE ALGORITHM, got allreduce"),
    (["verify", "allreduce", "rong", "-p", "2"], "unknown allreduce algorithm 'rong' (did you mean 'ring'?); registered: "),
    (["verify", "allreduse", "ring", "-p", "2"], "unknown collective 'allreduse'"),
    (["verify", "neighbor_alltoall", "direct", "-p", "2"], "neighbor_alltoall needs one (a graph or a Cartesian grid)"),
    (["verify", "allreduce", "ring", "-p", "0..2"], "p = 0 is not a number of ranks"),
    (["verify", "allreduce", "ring", "-p", "2", "--timeout", "0"], "--timeout 0: must be > 0"),
    (["verify", "allreduce", "ring", "-p", "2", "--count", "3"], "--count goes with algorithms --schedule"),
    (["algorithms", "--quick"], "--quick goes with the verify command"),
    (["info", "allreduce", "ring"], "only verify takes COLLECTIVE ALGORITHM"),
])
def test_verify_usage_errors(capsys, argv, message):
    from mpicomm import __main__ as main

    with pytest.raises(SystemExit) as exit_info:
        main.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


# ---------------------------------------------------------------- in this job's ranks


@pytest.mark.mpi
def test_every_collectives_cases_are_set_up_so_the_library_takes_them():
    """Each case's arguments, as verify builds them, run through the MPI library's own collective: a set-up
    the library refuses is verify's bug, and fails every algorithm of that collective (alltoallw's did: its
    blocks need byte displacements and a datatype each)."""
    from mpi4py import MPI

    from mpicomm.catalogue import COLLECTIVES, NEIGHBORHOOD, row

    library = verify._library()
    rank, p = library.Get_rank(), library.Get_size()
    refused = []
    for collective in COLLECTIVES:
        if collective in NEIGHBORHOOD:  # (verify needs a topology for them: it has no cases)
            continue
        spec = row(collective)
        for case in cases(collective, p, quick=True):
            if case.op == verify.MATMUL:
                continue
            call = verify._setup(collective, case, rank, p)
            call.fill(0)
            keywords = dict(call.keywords, **({"op": MPI.SUM} if "op" in call.keywords else {}))
            try:
                getattr(library, spec.method)(*call.theirs, **keywords)
            except Exception as exc:  # noqa: BLE001 - collected, then named
                refused.append(f"{case.label(collective, '-')}: {type(exc).__name__}: {exc}")
    assert refused == [], refused[:5]


@pytest.mark.mpi
def test_alltoallw_passes_in_this_job(comm):
    """Every alltoallw case (counts, types, forms) against the library's own, on this job's ranks."""
    report = verify.run_cases(comm, "alltoallw", "pairwise", quick=True)
    if report:  # (rank 0)
        assert report["failed"] == [] and report["passed"] > 0, report["failed"][:3]


# ---------------------------------------------------------------- whole runs (MPI jobs of their own)


def _verify(*argv: str, cwd: str = mpirun.REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mpicomm", "verify", *argv], cwd=cwd, env=mpirun.clean_env(),
                          capture_output=True, text=True, timeout=TIMEOUT + 60)


@pytest.mark.launches
def test_a_built_in_algorithm_passes_at_two_and_three_ranks(tmp_path):
    path = tmp_path / "verify.json"
    done = _verify("allreduce", "ring", "-p", "2,3", "--quick", "--json", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    for p, counts in ((2, "0,1,3"), (3, "0,1,2,4")):
        line = next(line for line in lines if line.startswith(f"p={p}: "))
        assert line.startswith(f"p={p}: passed ") and f"counts {counts}; int64 sum and float64 sum; in place too; " \
                                                       f"blocking, nonblocking, persistent" in line, line
        assert "schedules pair up" in line
        assert "skipped" in line and "op matmul2x2: reorders operands and needs a commutative op" in line, line
    assert lines[-1].startswith("verify allreduce/ring at p = 2, 3: all passed (")
    assert "verify [2/2] p=3" in done.stderr  # the progress lines
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    assert [row["p"] for row in doc["results"]] == [2, 3]
    assert all(row["passed"] > 0 and row["failed"] == [] and row["pairs"]["problems"] == [] for row in doc["results"])
    assert doc["summary"]["ok"] is True and doc["summary"]["failed"] == 0


@pytest.mark.launches
def test_the_torus_example_passes_through_module():
    done = _verify("allreduce", "torus2d", "-p", "2..4", "--quick", "--module", "docs.examples.torus_allreduce")
    assert done.returncode == 0, done.stdout + done.stderr
    assert [line.split(":")[0] for line in done.stdout.splitlines()[:3]] == ["p=2", "p=3", "p=4"]
    assert all(line.startswith(f"p={p}: passed ") for p, line in zip((2, 3, 4), done.stdout.splitlines()))
    assert done.stdout.splitlines()[-1].startswith("verify allreduce/torus2d at p = 2, 3, 4: all passed")


@pytest.mark.launches
def test_a_wrong_algorithm_fails_and_says_where(tmp_path):
    """A user allreduce that only combines with one neighbour: right at p = 2, wrong at p = 3."""
    (tmp_path / "wrong_allreduce.py").write_text(textwrap.dedent('''
        from mpicomm import register_algorithm

        @register_algorithm("allreduce", "pairs_only")
        def pairs_only(s, send, recv):
            """Wrong on purpose: ranks 2k and 2k + 1 combine their vectors, nobody else's.
            Cost: α + n·β + n·γ"""
            s.copy(recv, send)
            partner = s.rank ^ 1
            if partner < s.p:
                tmp = s.empty(recv.size)
                s.sendrecv(partner, send, partner, tmp)
                if partner < s.rank:
                    s.combine(tmp, send, recv)
                else:
                    s.combine(send, tmp, recv)
    '''))
    done = _verify("allreduce", "pairs_only", "-p", "3", "--quick", "--module", "wrong_allreduce", cwd=str(tmp_path))
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("p=3: FAILED ")
    failures = [line for line in lines if line.startswith("  FAILED ")]
    assert any(line.startswith("  FAILED allreduce/pairs_only count=1 dtype=int64 op=sum mode=blocking: rank 0: "
                               "recvbuf: differ at 1 of 1 elements") for line in failures), failures
    assert any("op=matmul2x2" in line and "in place" in line and "mode=persistent" in line for line in failures)
    assert not any("count=0 " in line for line in failures), "nothing to get wrong at count 0"
    assert lines[-1].startswith("verify allreduce/pairs_only at p = 3: FAILED at p = 3: ")


@pytest.mark.serial
def test_schedules_that_would_hang_are_not_run(tmp_path):
    """Messages that meet no receive: reported from the schedules, and no MPI job is started to hang."""
    (tmp_path / "hanging_allreduce.py").write_text(textwrap.dedent('''
        from mpicomm import register_algorithm

        @register_algorithm("allreduce", "waits_forever")
        def waits_forever(s, send, recv):
            """Wrong on purpose: every rank waits for its right neighbour's vector, which nobody sends.
            Cost: α"""
            s.copy(recv, send)
            if recv.size > 1:
                s.recv((s.rank + 1) % s.p, recv)
    '''))
    done = _verify("allreduce", "waits_forever", "-p", "2", "--quick", "--module", "hanging_allreduce",
                   cwd=str(tmp_path))
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == ("p=2: FAILED: its schedules do not pair up (6 problem(s)); not run under MPI, where they "
                        "would hang")
    assert "  FAILED schedules: allreduce/waits_forever count=3: rank 0 sends 0 message(s) to rank 1, which " \
           "receives 1" in lines
    assert lines[-1].startswith("verify allreduce/waits_forever at p = 2: FAILED at p = 2: ")
