"""mpicomm.engine.lane: the compiled lane runs a plan's data steps without the GIL, with NumPy's results bit for bit.

Its reductions against NumPy's ufuncs on every element type and op it takes, on data with NaNs, signed zeros,
infinities and integer wrap-around; which plans get a lane (host arrays and built-in ops) and which stay in the
executor's Python loop; a blocking collective that waits in the lane lets the rank's other threads run; and a
disagreement or a message longer than posted, found in the lane, raises the same error on every rank as before.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from mpicomm.engine import lane
from mpicomm.ops import BUILTIN

from ..conftest import rank_data

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not lane.available(), reason=f"no compiled lane here: {lane.why_not}")]

_UFUNCS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum, "land": np.logical_and,
           "lor": np.logical_or, "lxor": np.logical_xor, "band": np.bitwise_and, "bor": np.bitwise_or,
           "bxor": np.bitwise_xor}
_TYPES = [np.float32, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
          np.bool_, np.complex64, np.complex128]


def _operands(dtype: type, n: int = 257) -> tuple[np.ndarray, np.ndarray]:
    """Two arrays whose values depend on the index, with the edge cases of *dtype* among them."""
    rng = np.random.default_rng(7)
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.random(n) < 0.5, rng.random(n) < 0.5
    if dt.kind in "iu":
        info = np.iinfo(dt)
        a = rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
        b = rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
        a[:4] = [info.max, info.min, 0, info.max]
        b[:4] = [1, -1 if dt.kind == "i" else info.max, 0, info.max]
        return a, b
    special = np.array([np.nan, -0.0, 0.0, np.inf, -np.inf, 1.5, np.nan, 0.0])
    other = np.array([1.0, 0.0, -0.0, -np.inf, np.nan, np.nan, np.nan, 0.0])
    a = (rng.standard_normal(n) * 1e3).astype(dt.kind == "c" and np.float64 or dt)
    b = (rng.standard_normal(n) * 1e-3).astype(a.dtype)
    a[: len(special)], b[: len(other)] = special, other
    if dt.kind == "c":
        return (a + 1j * b[::-1]).astype(dt), (b - 1j * a[::-1]).astype(dt)
    return a, b


def _cases() -> list[tuple[str, type]]:
    return [(name, t) for name, op in BUILTIN.items() if op.ufunc for t in _TYPES
            if lane.dtype_code(t) is not None and lane._native.supported(op.code, lane.dtype_code(t))]


@pytest.mark.parametrize("name,dtype", _cases(), ids=lambda v: getattr(v, "__name__", v))
def test_every_reduction_equals_numpy_bit_for_bit(name, dtype):
    a, b = _operands(dtype)
    expected = _UFUNCS[name](a, b).astype(a.dtype)
    for out, into in (("new", np.empty_like(a)), ("a", a.copy()), ("b", b.copy())):  # (out may be an input)
        x = into if out == "a" else a
        y = into if out == "b" else b
        record = lane.combine(BUILTIN[name].code, x, y, into)
        assert record is not None
        lane._native.combine(*record[1:])
        assert into.tobytes() == expected.tobytes(), (name, dtype, out)


def test_the_supported_table_is_every_elementwise_op_on_its_types():
    """Reductions the lane leaves to NumPy: float16, complex products (NumPy's bits depend on the CPU's fused
    multiply-add there), complex order, bit operations on floats, maxloc/minloc."""
    # sum: the 13 types; prod, min, max, land, lor, lxor: the 11 real ones; band, bor, bxor: integers and bool
    assert len(_cases()) == 13 + 6 * 11 + 3 * 9
    assert lane.dtype_code(np.float16) is None
    assert lane.combine(BUILTIN["sum"].code, *(np.ones(3, np.float16),) * 3) is None
    assert lane.combine(BUILTIN["max"].code, *(np.ones(3, np.complex128),) * 3) is None
    assert lane.combine(BUILTIN["prod"].code, *(np.ones(3, np.complex64),) * 3) is None
    assert lane.combine(BUILTIN["sum"].code, np.ones(4)[::2], np.ones(2), np.ones(2)) is None  # not contiguous


def _plans(comm):
    return list(comm._state.plans.values())


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("count", [0, 1, 1000])
def test_host_plans_with_builtin_ops_run_in_the_lane(comm, count):
    """Small (the agreement fused into the data's messages) and larger (the agreement beside) alike."""
    fresh = comm.Dup()
    try:
        x = rank_data(fresh.rank, count)
        y = np.empty_like(x)
        fresh.Allreduce(x, y, algorithm="ring")
        expected = np.empty_like(x)
        MPI.COMM_WORLD.Allreduce(x, expected)
        assert np.array_equal(y, expected)
        [plan] = _plans(fresh)
        assert plan.program.lane is not None
    finally:
        fresh.Free()


@pytest.mark.mpi(min_size=2)
def test_user_ops_and_float16_stay_in_the_python_loop(comm):
    fresh = comm.Dup()
    try:
        x = rank_data(fresh.rank, 10)
        fresh.Allreduce(x, np.empty_like(x), op=mpicomm.ops.create(lambda a, b: a + b, commutative=True))
        fresh.Allreduce(x.astype(np.float16), np.empty(10, np.float16))
        python = fresh.allgather([p.program.lane is None for p in _plans(fresh)])
        assert all(any(ranks) for ranks in zip(*python))  # (a rank whose part has no reduction may have a lane)
    finally:
        fresh.Free()


@pytest.mark.mpi(min_size=2)
def test_a_blocking_wait_in_the_lane_lets_other_threads_run(comm):
    """Rank 0 waits in the lane for rank 1, which joins 0.3 s late; a thread of rank 0 counts meanwhile (it could
    not, were the GIL held through the wait)."""
    fresh = comm.Dup()
    try:
        x = rank_data(fresh.rank, 100)
        y = np.empty_like(x)
        fresh.Allreduce(x, y, algorithm="recursive_doubling")  # (the plan is made; the next call runs it)
        assert _plans(fresh)[0].program.lane is not None
        counted = [0]
        stop = threading.Event()

        def count() -> None:
            while not stop.is_set():
                counted[0] += 1

        fresh.Barrier()
        if fresh.rank == 0:
            counter = threading.Thread(target=count)
            counter.start()
            time.sleep(0.01)
            before = counted[0]
            fresh.Allreduce(x, y, algorithm="recursive_doubling")
            during = counted[0] - before
            stop.set()
            counter.join()
            assert during > 1000, f"the other thread counted {during} times while the allreduce waited"
        else:
            time.sleep(0.3)
            fresh.Allreduce(x, y, algorithm="recursive_doubling")
    finally:
        fresh.Free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("count", [3, 5000])
def test_a_disagreement_found_in_the_lane_raises_everywhere(comm, count):
    """Rank 0 gives another count: the words differ, the lane hands the run back, every rank raises the same."""
    fresh = comm.Dup()
    try:
        x = rank_data(fresh.rank, count + (fresh.rank == 0))
        y = np.empty_like(x)
        with pytest.raises(mpicomm.ArgumentError, match="count") as info:
            fresh.Allreduce(x, y, algorithm="recursive_doubling")
        messages = fresh.allgather(str(info.value))
        assert len(set(messages)) == 1
        good = rank_data(fresh.rank, count)  # the communicator goes on
        out = np.empty_like(good)
        fresh.Allreduce(good, out, algorithm="recursive_doubling")
        expected = np.empty_like(good)
        MPI.COMM_WORLD.Allreduce(good, expected)
        assert np.array_equal(out, expected)
    finally:
        fresh.Free()
