"""mpicomm.coll.reduce: every reduce algorithm against the MPI library's own Reduce."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from mpicomm import registry, selection
from mpicomm.facts import Facts

from ..conftest import host
from . import reference as R

ALGORITHMS = mpicomm.algorithms("reduce")
ORDERED = [a for a in ALGORITHMS if not registry.lookup("reduce", a).commutative_only]
COMMUTATIVE_ONLY = [a for a in ALGORITHMS if registry.lookup("reduce", a).commutative_only]


def roots(p: int) -> list[int]:
    """0, p−1 and a middle rank, without repeats."""
    return sorted({0, p - 1, p // 2})


def expected(x, op, root: int):
    """The MPI library's Reduce of every rank's *x* (on the host), on the root; None elsewhere."""
    x = host(x)
    out = np.empty_like(x) if R.native().Get_rank() == root else None
    R.native().Reduce(x, out, op=op, root=root)
    return out


def reduce(comm, x, op, root: int, algorithm: str, in_place: bool, xp=np):
    """mpicomm's Reduce of *x*; the root's result (None elsewhere). In place: the root passes MPI.IN_PLACE."""
    if comm.rank != root:
        comm.Reduce(x, None, op=op, root=root, algorithm=algorithm)
        return None
    if in_place:
        recv = x.copy()
        comm.Reduce(MPI.IN_PLACE, recv, op=op, root=root, algorithm=algorithm)
    else:
        recv = xp.full_like(x, 7)
        comm.Reduce(x, recv, op=op, root=root, algorithm=algorithm)
    return recv


@pytest.mark.mpi
@pytest.mark.parametrize("in_place", [False, True], ids=["out_of_place", "in_place"])
@pytest.mark.parametrize("dtype, op", R.DTYPE_OPS, ids=R.DTYPE_OP_IDS)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_matches_library(comm, xp, algorithm, dtype, op, in_place):
    for count in R.counts(comm.size):
        for root in roots(comm.size):
            x = R.data(comm.rank, count, dtype, xp)
            before = host(x).copy()
            got = reduce(comm, x, op, root, algorithm, in_place, xp)
            want = expected(before, R.mpi_op(op), root)
            context = f"{algorithm} count={count} root={root}"
            if comm.rank == root:
                assert type(got) is type(x)
                R.assert_matches(got, want, context)
            if not (in_place and comm.rank == root):
                R.assert_matches(x, before, context + ": the send buffer changed")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ORDERED)
def test_non_commutative_op_keeps_rank_order(comm, algorithm):
    p = comm.size
    for nmat in sorted({0, 1, p + 1, 250}):  # counts in units of 4 elements (one 2×2 matrix)
        for root in roots(p):
            for in_place in (False, True):
                x = R.matrices(comm.rank, nmat)
                got = reduce(comm, x, R.MATMUL, root, algorithm, in_place)
                want = expected(x, R.native_matmul(), root)
                if comm.rank == root:
                    R.assert_matches(got, want, f"{algorithm} matrices={nmat} root={root} in_place={in_place}")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", COMMUTATIVE_ONLY)
def test_commutative_only_refuses_non_commutative_op(comm, algorithm):
    x = R.matrices(comm.rank, comm.size + 1)
    root = comm.size - 1
    recv = np.empty_like(x) if comm.rank == root else None
    with pytest.raises(ValueError, match=f"'{algorithm}'.*matmul2x2") as info:
        comm.Reduce(x, recv, op=R.MATMUL, root=root, algorithm=algorithm)
    for name in ORDERED:
        if comm.nodes == 1 or not registry.lookup("reduce", name).single_node:  # those that can run here
            assert name in str(info.value)  # the message names the algorithms that keep rank order


@pytest.mark.mpi
def test_auto_keeps_rank_order_for_non_commutative_op(comm):
    # 128 KiB, where the table may choose an algorithm that reorders operands for a commutative op
    x = R.matrices(comm.rank, 4096)
    facts = Facts(p=comm.size, bytes=x.nbytes, count=x.size, commutative=False)
    assert selection.auto("reduce", facts).name in ORDERED
    root = comm.size - 1
    got = reduce(comm, x, R.MATMUL, root, "auto", in_place=False)
    want = expected(x, R.native_matmul(), root)
    if comm.rank == root:
        R.assert_matches(got, want, "auto")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_large(comm, algorithm):
    root = comm.size // 2
    x = R.data(comm.rank, R.LARGE, np.int64)
    got = reduce(comm, x, "sum", root, algorithm, in_place=False)
    want = expected(x, MPI.SUM, root)
    if comm.rank == root:
        R.assert_matches(got, want, f"{algorithm} count={R.LARGE}")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_two_in_flight(comm, path, algorithm):
    # same root, count and op: only the calls' tags keep the two apart
    root, count = comm.size // 2, 1000
    a = R.data(comm.rank, count, np.int64)
    b = R.data(comm.rank + comm.size, count, np.int64)
    ra, rb = (np.zeros(count, np.int64), np.zeros(count, np.int64)) if comm.rank == root else (None, None)
    first = comm.Ireduce(a, ra, op=MPI.SUM, root=root, algorithm=algorithm)
    second = comm.Ireduce(b, rb, op=MPI.SUM, root=root, algorithm=algorithm)
    assert isinstance(first, mpicomm.Request) and isinstance(second, mpicomm.Request)
    second.Wait()
    first.Wait()
    want_a, want_b = expected(a, MPI.SUM, root), expected(b, MPI.SUM, root)
    if comm.rank == root:
        R.assert_matches(ra, want_a, f"{algorithm}: first")
        R.assert_matches(rb, want_b, f"{algorithm}: second")
