"""What every collective test compares with: data, counts, ops, and the MPI library's own answer.

* :func:`counts` - the element counts every algorithm is run at: 0, 1, p−1,
  p+1, 1000 (and :data:`LARGE` = 10⁶ in one case per algorithm);
* :func:`data` - values that depend on rank *and* index (uniform data hides
  misplaced blocks and reordered reductions);
* :func:`assert_matches` - bit-exact for integers and bools, a tolerance
  scaled to the dtype for floats (algorithms sum in different orders);
* :data:`MATMUL` / :func:`native_matmul` - a non-commutative op (products of
  2×2 integer matrices packed in 4 int64s; integer arithmetic wraps but stays
  associative, so results are bit-exact) for mpicomm and for MPI;
* :func:`native` - mpi4py's ``MPI.COMM_WORLD`` (the library's own collectives);
* :func:`outcome`, :func:`expect_everywhere`, :func:`still_works` - what the
  validation and reliability tests assert of a wrong call: the same
  ArgumentError on every rank, and the communicator still working after it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

import mpicomm
import mpicomm.ops

from ..conftest import host, rank_data

LARGE = 1_000_000

#: dtypes (and an op defined on each) the algorithm matrices run.
DTYPE_OPS = [
    (np.int64, "sum"),
    (np.float32, "sum"),
    (np.complex128, "prod"),
    (np.uint8, "bxor"),
    (np.bool_, "lor"),
    (np.float16, "max"),
    (np.int32, "min"),
]
DTYPE_OP_IDS = [f"{np.dtype(d)}-{op}" for d, op in DTYPE_OPS]


def counts(p: int) -> list[int]:
    """0, 1, p−1, p+1 and 1000, without repeats."""
    return sorted({0, 1, max(p - 1, 0), p + 1, 1000})


def data(rank: int, count: int, dtype=np.int64, xp=np):
    """Rank- and index-dependent values (see ``tests/conftest.py:rank_data``)."""
    if np.dtype(dtype) == np.complex128:  # keep products of p values finite and distinct
        values = (1 + 0.001 * rank) + 0.0001j * (np.arange(count) % 97)
        return xp.asarray(values.astype(np.complex128))
    return rank_data(rank, count, dtype, xp)


def native() -> MPI.Intracomm:
    """The MPI library's communicator for reference results."""
    return MPI.COMM_WORLD


def mpi_op(op: str) -> MPI.Op:
    """The MPI.Op named *op*."""
    return mpicomm.ops.BUILTIN[op].mpi


def assert_matches(actual, expected, context: str = "") -> None:
    """Integers and bools bit-exact; floats and complex within a tolerance for reordered sums."""
    a, e = host(actual), host(expected)
    assert a.shape == e.shape and a.dtype == e.dtype, f"{context}: {a.shape} {a.dtype} vs {e.shape} {e.dtype}"
    if a.dtype.kind in "fc":
        rtol = {2: 2e-2, 4: 1e-4, 8: 1e-10, 16: 1e-4}.get(a.dtype.itemsize, 1e-10)
        if a.dtype.kind == "c":
            rtol = 1e-4 if a.dtype.itemsize == 8 else 1e-10
        ok = np.allclose(a, e, rtol=rtol, atol=rtol)
    else:
        ok = np.array_equal(a, e)
    if not ok:
        bad = np.flatnonzero(a != e)[:5] if a.shape == e.shape else []
        raise AssertionError(f"{context}: results differ at {list(bad)}: got {a[bad]}, expected {e[bad]}")


# ---------------------------------------------------------------- a non-commutative op


def _matmul(a, b):
    return (a.reshape(-1, 2, 2) @ b.reshape(-1, 2, 2)).reshape(-1)


#: mpicomm's non-commutative op: a ⊕ b = A·B for each packed 2×2 matrix (a from lower ranks).
MATMUL = mpicomm.ops.create(_matmul, commutative=False, name="matmul2x2")

_NATIVE_MATMUL: list[MPI.Op] = []


def native_matmul() -> MPI.Op:
    """The same op for the MPI library (inoutvec = invec · inoutvec, invec from lower ranks)."""
    if not _NATIVE_MATMUL:
        def fn(inbuf, inoutbuf, datatype):
            a = np.frombuffer(inbuf, np.int64)
            b = np.frombuffer(inoutbuf, np.int64)
            b[...] = _matmul(a, b)

        _NATIVE_MATMUL.append(MPI.Op.Create(fn, commute=False))
    return _NATIVE_MATMUL[0]


def matrices(rank: int, nmat: int, xp=np):
    """*nmat* packed 2×2 int64 matrices, different per rank and per matrix (4·nmat elements)."""
    rng = np.random.default_rng(7919 * rank + nmat)
    return xp.asarray(rng.integers(-3, 4, size=4 * nmat).astype(np.int64))


# ---------------------------------------------------------------- roots, uneven counts, displacements

#: Fills receive-buffer gaps between v-variant blocks, which must stay untouched.
SENTINEL = 249


def roots(p: int) -> list[int]:
    """0, the last rank and a middle one."""
    return sorted({0, p - 1, p // 2})


def uneven(p: int, scale: int = 1) -> list[int]:
    """Per-rank counts, uneven and with zeros (ranks 1 and 4 give nothing)."""
    pattern = [3, 0, 5, 1, 0, 7, 2]
    return [pattern[r % len(pattern)] * scale for r in range(p)]


#: Displacement layouts of v-variant buffers (see :func:`layout`).
LAYOUTS = ["packed", "reversed", "interleaved"]


def layout(counts: list[int], how: str) -> tuple[list[int], int]:
    """Displacements for *counts* and the buffer size they need.

    ``packed``: prefix sums. ``reversed``: last rank first, a gap of 2 before
    each block. ``interleaved``: odd ranks, then even ones, gaps of 3.
    """
    p = len(counts)
    order = {"packed": range(p), "reversed": range(p - 1, -1, -1),
             "interleaved": [*range(1, p, 2), *range(0, p, 2)]}[how]
    gap = {"packed": 0, "reversed": 2, "interleaved": 3}[how]
    displs, offset = [0] * p, 0
    for r in order:
        offset += gap
        displs[r] = offset
        offset += counts[r]
    return displs, offset + gap


def layouts(counts: list[int]) -> dict[str, tuple[list[int], int]]:
    """Every layout of :data:`LAYOUTS` for *counts*: name → (displacements, buffer size)."""
    return {how: layout(counts, how) for how in LAYOUTS}


def unfilled(size: int, dtype, xp=np):
    """A receive buffer of SENTINELs."""
    return xp.full(size, SENTINEL, dtype)


def outcome(call: Callable[[], Any]) -> tuple[str, bool, str]:
    """(exception type, is it an ArgumentError, message) of *call* on this rank ("" when it returned)."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - every rank reports whatever it got, so none waits alone
        return type(exc).__name__, isinstance(exc, mpicomm.ArgumentError), str(exc)
    return "", False, ""


def body(message: str) -> str:
    """The message after its ``"allreduce #12 (ring): "`` label."""
    return message.partition(": ")[2]


def still_works(comm) -> None:
    """A normal collective after a failed one gives the library's result (nothing was left half-done)."""
    x = data(comm.Get_rank(), 7, np.int64)
    out, expected = np.empty_like(x), np.empty_like(x)
    comm.Allreduce(x, out, algorithm="recursive_doubling")
    native().Allreduce(x, expected)
    assert_matches(out, expected, "allreduce after a failed collective")
    buf = data(comm.Get_rank(), 3, np.float64)
    comm.Bcast(buf, root=comm.Get_size() - 1)
    assert_matches(buf, data(comm.Get_size() - 1, 3, np.float64), "bcast after a failed collective")


def expect_everywhere(comm, call: Callable[[], Any], *fragments: str) -> str:
    """*call* raises an ArgumentError on every rank, with one message naming the problem; return it."""
    everyone = MPI.COMM_WORLD.allgather(outcome(call))
    message = everyone[MPI.COMM_WORLD.Get_rank()][2]
    assert all(a for _, a, _ in everyone), f"not an ArgumentError on every rank: {everyone}"
    assert len({body(m) for _, _, m in everyone}) == 1, f"messages differ across ranks: {everyone}"
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    still_works(comm)
    return message
