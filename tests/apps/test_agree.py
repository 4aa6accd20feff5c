"""apps.agree: a problem that any rank finds stops every rank with the same message (at any rank count)."""

from __future__ import annotations

import pytest
from mpi4py import MPI

from apps.agree import agree, describe, from_root, gather, verdict

pytestmark = pytest.mark.mpi


class Refused(RuntimeError):
    pass


def _outcome(fn) -> tuple[str, str]:
    try:
        return "ok", repr(fn())
    except Refused as exc:
        return "Refused", str(exc)
    except ValueError as exc:
        return "ValueError", str(exc)


def test_no_problem_raises_nothing_anywhere():
    comm = MPI.COMM_WORLD
    agree(comm, None)
    agree(comm, [])
    verdict(comm, None)
    assert gather(comm, None) == {}


def test_one_rank_s_problem_stops_every_rank_naming_it():
    comm = MPI.COMM_WORLD
    rank, p = comm.Get_rank(), comm.Get_size()
    last = p - 1
    problem = f"'f{rank}.txt' cannot be read" if rank == last else None
    got = comm.allgather(_outcome(lambda: agree(comm, problem, Refused, prefix="bad input: ")))
    suffix = "" if p == 1 else f" (rank {last})"
    assert got == [("Refused", f"bad input: 'f{last}.txt' cannot be read{suffix}")] * p


def test_problems_are_grouped_by_text_with_their_ranks():
    comm = MPI.COMM_WORLD
    rank, p = comm.Get_rank(), comm.Get_size()
    mine = ["shared problem", f"odd problem of rank {rank}"] if rank % 2 else ["shared problem"]
    found = gather(comm, mine)
    assert found["shared problem"] == list(range(p))
    assert list(found)[0] == "shared problem"
    odd = [r for r in range(p) if r % 2]
    assert [k for k in found if k != "shared problem"] == [f"odd problem of rank {r}" for r in odd]
    message = describe(found, p)
    assert message.startswith("shared problem")  # every rank found it: said once, no ranks
    for r in odd:
        assert f"odd problem of rank {r} (rank {r})" in message
    got = comm.allgather(_outcome(lambda: agree(comm, mine)))
    assert got == [("ValueError", message)] * p


def test_describe_names_ranks_only_when_not_every_rank_found_it():
    assert describe({"x": [0, 1, 2]}, 3) == "x"
    assert describe({"x": [0, 2], "y": [1]}, 3) == "x (ranks 0, 2); y (rank 1)"


def test_verdict_is_the_root_s_alone():
    comm = MPI.COMM_WORLD
    rank, p = comm.Get_rank(), comm.Get_size()
    got = comm.allgather(_outcome(lambda: verdict(comm, "--log x: Permission denied" if rank == 0 else "ignored",
                                                  Refused)))
    assert got == [("Refused", "--log x: Permission denied")] * p
    if p > 1:
        verdict(comm, "only on rank 1" if rank == 1 else None)  # another rank's problem is not a verdict


def test_from_root_shares_the_value_or_the_error():
    comm = MPI.COMM_WORLD
    rank, p = comm.Get_rank(), comm.Get_size()
    assert from_root(comm, lambda: {"step": 10 + rank}) == {"step": 10}

    def fails_with(exc: BaseException):
        def work():
            assert comm.Get_rank() == 0, "work runs on the root only"
            raise exc
        return work

    own = comm.allgather(_outcome(lambda: from_root(comm, fails_with(Refused("damaged header")), Refused,
                                                    what="--checkpoint-dir d")))
    assert own == [("Refused", "damaged header")] * p  # the error type's own message, as it is
    system = comm.allgather(_outcome(lambda: from_root(
        comm, fails_with(PermissionError(13, "Permission denied", "d/x")), Refused, what="--checkpoint-dir d")))
    assert system == [("Refused", "--checkpoint-dir d: Permission denied (d/x)")] * p
