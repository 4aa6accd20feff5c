"""mpicomm.coll.scan: every scan and exscan algorithm against the MPI library's own Scan and Exscan.

MPI leaves rank 0's exscan result undefined: results are compared on ranks ≥ 1,
and rank 0's receive buffer must come back untouched.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from mpicomm import registry

from ..conftest import host
from . import reference as R

CASES = [(c, a) for c in ("scan", "exscan") for a in mpicomm.algorithms(c)]
ORDERED = [(c, a) for c, a in CASES if not registry.lookup(c, a).commutative_only]


def case_id(case: tuple[str, str]) -> str:
    return "-".join(case)


def expected(collective: str, x, op):
    """The MPI library's Scan or Exscan of every rank's *x* (on the host)."""
    x = host(x)
    out = np.zeros_like(x)
    getattr(R.native(), collective.capitalize())(x, out, op=op)
    return out


def prefix(comm, collective: str, x, op, algorithm: str, in_place: bool, xp=np):
    """mpicomm's Scan or Exscan of *x* into a new buffer (filled first with values unlike any result)."""
    method = getattr(comm, collective.capitalize())
    if in_place:
        recv = x.copy()
        method(MPI.IN_PLACE, recv, op=op, algorithm=algorithm)
    else:
        recv = untouched(x, xp)
        method(x, recv, op=op, algorithm=algorithm)
    return recv


def untouched(x, xp=np):
    """What an out-of-place receive buffer holds before the call."""
    return xp.asarray(R.data(97, x.size, x.dtype)).reshape(x.shape)  # rank 97: unlike any real data


def check(comm, collective: str, got, want, x, in_place: bool, context: str) -> None:
    """Compare with the library's result; exscan on rank 0: the buffer is as it was before the call."""
    if collective == "exscan" and comm.rank == 0:
        before = x if in_place else untouched(x)
        R.assert_matches(got, before, context + ": exscan touched rank 0's receive buffer")
    else:
        R.assert_matches(got, want, context)


@pytest.mark.mpi
@pytest.mark.parametrize("in_place", [False, True], ids=["out_of_place", "in_place"])
@pytest.mark.parametrize("dtype, op", R.DTYPE_OPS, ids=R.DTYPE_OP_IDS)
@pytest.mark.parametrize("collective, algorithm", CASES, ids=map(case_id, CASES))
def test_matches_library(comm, xp, collective, algorithm, dtype, op, in_place):
    for count in R.counts(comm.size):
        x = R.data(comm.rank, count, dtype, xp)
        before = host(x).copy()
        got = prefix(comm, collective, x, op, algorithm, in_place, xp)
        want = expected(collective, before, R.mpi_op(op))
        assert type(got) is type(x)
        context = f"{collective}/{algorithm} count={count}"
        check(comm, collective, got, want, before, in_place, context)
        if not in_place:
            R.assert_matches(x, before, context + ": the send buffer changed")


@pytest.mark.mpi
@pytest.mark.parametrize("collective, algorithm", ORDERED, ids=map(case_id, ORDERED))
def test_non_commutative_op_keeps_rank_order(comm, collective, algorithm):
    p = comm.size
    for nmat in sorted({0, 1, p + 1, 250}):  # counts in units of 4 elements (one 2×2 matrix)
        for in_place in (False, True):
            x = R.matrices(comm.rank, nmat)
            got = prefix(comm, collective, x, R.MATMUL, algorithm, in_place)
            want = expected(collective, x, R.native_matmul())
            context = f"{collective}/{algorithm} matrices={nmat} in_place={in_place}"
            check(comm, collective, got, want, x, in_place, context)


@pytest.mark.mpi
@pytest.mark.parametrize("collective, algorithm", CASES, ids=map(case_id, CASES))
def test_large(comm, collective, algorithm):
    x = R.data(comm.rank, R.LARGE, np.int64)
    got = prefix(comm, collective, x, "sum", algorithm, in_place=False)
    want = expected(collective, x, MPI.SUM)
    check(comm, collective, got, want, x, False, f"{collective}/{algorithm} count={R.LARGE}")


@pytest.mark.mpi
@pytest.mark.parametrize("collective, algorithm", CASES, ids=map(case_id, CASES))
def test_two_in_flight(comm, path, collective, algorithm):
    # same count and op: only the calls' tags keep the two apart
    count = 1000
    start = getattr(comm, "I" + collective)
    a = R.data(comm.rank, count, np.int64)
    b = R.data(comm.rank + comm.size, count, np.int64)
    ra, rb = untouched(a), untouched(b)
    first = start(a, ra, op=MPI.SUM, algorithm=algorithm)
    second = start(b, rb, op=MPI.SUM, algorithm=algorithm)
    assert isinstance(first, mpicomm.Request) and isinstance(second, mpicomm.Request)
    second.Wait()
    first.Wait()
    check(comm, collective, ra, expected(collective, a, MPI.SUM), a, False, f"{collective}/{algorithm}: first")
    check(comm, collective, rb, expected(collective, b, MPI.SUM), b, False, f"{collective}/{algorithm}: second")
