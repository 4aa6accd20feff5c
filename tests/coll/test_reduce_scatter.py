"""mpicomm.coll.reduce_scatter: every reduce_scatter(_block) algorithm against the MPI library's own."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from mpicomm import registry, selection
from mpicomm.facts import Facts

from ..conftest import host
from . import reference as R

COLLECTIVES = ("reduce_scatter", "reduce_scatter_block")
CASES = [(c, a) for c in COLLECTIVES for a in mpicomm.algorithms(c)]
ORDERED = [(c, a) for c, a in CASES if not registry.lookup(c, a).commutative_only]
COMMUTATIVE_ONLY = [(c, a) for c, a in CASES if registry.lookup(c, a).commutative_only]


def case_id(case: tuple[str, str]) -> str:
    return "-".join(case)


def recvcounts(collective: str, p: int, unit: int = 1) -> list[tuple[int, ...]]:
    """The receive counts each case runs at, times *unit*.

    reduce_scatter_block: every block size of ``reference.counts``; reduce_scatter:
    uneven counts with zeros first, last and in between, all on one rank, all zero.
    """
    if collective == "reduce_scatter_block":
        shapes = [(b,) * p for b in R.counts(p)]
    else:
        shapes = [
            (0,) * p,
            (1,) * p,
            tuple(r % 3 for r in range(p)),  # zeros at ranks 0, 3, 6
            tuple((5 * r + 3) % 8 for r in range(p)),  # 3, 0, 5, 2, 7, 4, 1
            tuple(1000 if r == p - 1 else 0 for r in range(p)),
            tuple(0 if r in (0, p - 1) else 97 * r + 13 for r in range(p)),
            tuple(1000 // p + 3 * r for r in range(p)),
        ]
    return sorted({tuple(unit * c for c in shape) for shape in shapes})


def expected(collective: str, x, counts, op):
    """The MPI library's result of every rank's *x* (on the host): this rank's reduced block."""
    x = host(x)
    out = np.empty(counts[R.native().Get_rank()], x.dtype)
    if collective == "reduce_scatter":
        R.native().Reduce_scatter(x, out, list(counts), op=op)
    else:
        R.native().Reduce_scatter_block(x, out, op=op)
    return out


def reduce_scatter(comm, collective: str, x, counts, op, algorithm: str | None, in_place: bool, xp=np):
    """mpicomm's result for this rank (in place: the start of a copy of *x*, given as MPI.IN_PLACE)."""
    mine = counts[comm.rank]
    if in_place:
        recv = x.copy()
        send = MPI.IN_PLACE
    else:
        recv = xp.asarray(R.data(97, mine, x.dtype))  # rank 97: unlike any result
        send = x
    if collective == "reduce_scatter":
        comm.Reduce_scatter(send, recv, list(counts), op=op, algorithm=algorithm)
    else:
        comm.Reduce_scatter_block(send, recv, op=op, algorithm=algorithm)
    return recv[:mine]


def test_every_algorithm_is_registered_for_both_collectives():
    for collective in COLLECTIVES:
        assert {"ring", "recursive_halving", "pairwise"} <= set(mpicomm.algorithms(collective))
        for name in ("ring", "recursive_halving"):
            assert registry.lookup(collective, name).commutative_only
        assert not registry.lookup(collective, "pairwise").commutative_only
        assert not any(registry.lookup(collective, name).in_place for name in ("ring", "recursive_halving", "pairwise"))


@pytest.mark.mpi
@pytest.mark.parametrize("in_place", [False, True], ids=["out_of_place", "in_place"])
@pytest.mark.parametrize("dtype, op", R.DTYPE_OPS, ids=R.DTYPE_OP_IDS)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_matches_library(comm, xp, case, dtype, op, in_place):
    collective, algorithm = case
    for counts in recvcounts(collective, comm.size):
        x = R.data(comm.rank, sum(counts), dtype, xp)
        before = host(x).copy()
        got = reduce_scatter(comm, collective, x, counts, op, algorithm, in_place, xp)
        context = f"{collective} {algorithm} counts={counts} in_place={in_place}"
        assert type(got) is type(x)
        R.assert_matches(got, expected(collective, before, counts, R.mpi_op(op)), context)
        R.assert_matches(x, before, context + ": the send buffer changed")


@pytest.mark.mpi
@pytest.mark.parametrize("case", ORDERED, ids=case_id)
def test_non_commutative_op_keeps_rank_order(comm, case):
    collective, algorithm = case
    for counts in recvcounts(collective, comm.size, unit=4):  # in units of 4 elements (one 2×2 matrix)
        for in_place in (False, True):
            x = R.matrices(comm.rank, sum(counts) // 4)
            got = reduce_scatter(comm, collective, x, counts, R.MATMUL, algorithm, in_place)
            want = expected(collective, x, counts, R.native_matmul())
            R.assert_matches(got, want, f"{collective} {algorithm} counts={counts} in_place={in_place}")


@pytest.mark.mpi
@pytest.mark.parametrize("case", COMMUTATIVE_ONLY, ids=case_id)
def test_commutative_only_refuses_non_commutative_op(comm, case):
    collective, algorithm = case
    counts = (4,) * comm.size
    x = R.matrices(comm.rank, comm.size)
    with pytest.raises(ValueError, match=f"'{algorithm}'.*matmul2x2") as info:
        reduce_scatter(comm, collective, x, counts, R.MATMUL, algorithm, in_place=False)
    for c, name in ORDERED:
        if c == collective and (comm.nodes == 1 or not registry.lookup(c, name).single_node):
            assert name in str(info.value)  # the message names the algorithms that keep rank order


@pytest.mark.mpi
@pytest.mark.parametrize("nmat", [1, 40_000])  # per rank: 32 B and 1.3 MB, on both sides of the table's size rule
@pytest.mark.parametrize("collective", COLLECTIVES)
def test_auto_picks_an_order_keeping_algorithm_for_a_non_commutative_op(comm, collective, nmat):
    counts = tuple(4 * (nmat + r % 2) for r in range(comm.size)) if collective == "reduce_scatter" else (4 * nmat,) * comm.size
    x = R.matrices(comm.rank, sum(counts) // 4)
    facts = Facts(p=comm.size, bytes=x.nbytes, count=counts[0], commutative=False)
    assert (collective, selection.select(collective, None, facts=facts).name) in ORDERED
    got = reduce_scatter(comm, collective, x, counts, R.MATMUL, None, in_place=False)
    R.assert_matches(got, expected(collective, x, counts, R.native_matmul()), f"{collective} auto matrices={nmat}")


@pytest.mark.mpi
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_large(comm, case):
    collective, algorithm = case
    p = comm.size
    if collective == "reduce_scatter":  # uneven: rank r gets a share ∝ r, rank 0 none, the last the rest
        counts = [R.LARGE * 2 * r // (p * (p + 1)) for r in range(p)]
        counts[-1] += R.LARGE - sum(counts)
    else:
        counts = [R.LARGE // p] * p
    x = R.data(comm.rank, sum(counts), np.int64)
    got = reduce_scatter(comm, collective, x, counts, "sum", algorithm, in_place=False)
    R.assert_matches(got, expected(collective, x, counts, MPI.SUM), f"{collective} {algorithm} counts={counts}")


@pytest.mark.mpi
def test_receive_counts_gathered_when_not_given(comm):
    # mpi4py's rule: without recvcounts each rank's receive buffer size is its count
    counts = tuple((5 * r + 3) % 8 for r in range(comm.size))
    x = R.data(comm.rank, sum(counts), np.int64)
    recv = np.empty(counts[comm.rank], np.int64)
    comm.Reduce_scatter(x, recv, op=MPI.SUM, algorithm="pairwise")
    R.assert_matches(recv, expected("reduce_scatter", x, counts, MPI.SUM), "gathered counts")


@pytest.mark.mpi
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_two_in_flight(comm, path, case):
    # same counts and op: only the calls' tags keep the two apart
    collective, algorithm = case
    p = comm.size
    counts = tuple(100 + 7 * r for r in range(p)) if collective == "reduce_scatter" else (100,) * p
    a = R.data(comm.rank, sum(counts), np.int64)
    b = R.data(comm.rank + p, sum(counts), np.int64)
    ra, rb = np.zeros(counts[comm.rank], np.int64), b.copy()
    if collective == "reduce_scatter":
        first = comm.Ireduce_scatter(a, ra, list(counts), op=MPI.SUM, algorithm=algorithm)
        second = comm.Ireduce_scatter(MPI.IN_PLACE, rb, list(counts), op=MPI.SUM, algorithm=algorithm)
    else:
        first = comm.Ireduce_scatter_block(a, ra, op=MPI.SUM, algorithm=algorithm)
        second = comm.Ireduce_scatter_block(MPI.IN_PLACE, rb, op=MPI.SUM, algorithm=algorithm)
    assert isinstance(first, mpicomm.Request) and isinstance(second, mpicomm.Request)
    second.Wait()
    first.Wait()
    R.assert_matches(ra, expected(collective, a, counts, MPI.SUM), f"{collective} {algorithm}: first")
    R.assert_matches(rb[: counts[comm.rank]], expected(collective, b, counts, MPI.SUM), f"{collective} {algorithm}: second")
