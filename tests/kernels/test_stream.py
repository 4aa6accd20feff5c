"""kernels/stream.py: the STREAM triad on every path."""

from __future__ import annotations

import numpy as np
import pytest

from tests.kernels.conftest import DTYPE_IDS, DTYPES, assert_agrees, field, host, on

pytestmark = pytest.mark.serial  # no MPI: the serial pass runs it


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", [(1,), (1001,), (7, 5), (5, 6, 7)])
def test_triad_is_b_plus_s_times_c(k, shape, dtype):
    b, c = field(shape, dtype, seed=1), field(shape, dtype, seed=2)
    s = 3.7
    a = on(k, np.zeros(shape, dtype))
    k.triad(a, on(k, b), on(k, c), s)
    want = b + dtype(s) * c  # numpy scalars keep the dtype
    assert_agrees(k, a, want, scale=float(np.abs(want).max()))


def test_hand_checked(k):
    a = on(k, np.zeros(3))
    k.triad(a, on(k, np.array([1.0, 2.0, 3.0])), on(k, np.array([10.0, 20.0, 30.0])), 0.5)
    assert host(a).tolist() == [6.0, 12.0, 18.0]


def test_bad_arguments_are_named(k):
    xp = k.xp
    a, b = xp.zeros(10), xp.ones(10)
    with pytest.raises(ValueError, match=r"c \(float64, shape \(9,\)\) must have a's shape and dtype"):
        k.triad(a, b, xp.ones(9), 2.0)
    with pytest.raises(ValueError, match="shares memory with b"):
        k.triad(a, a, b, 2.0)
    with pytest.raises(ValueError, match="float32 or float64"):
        k.triad(xp.zeros(10, dtype=np.int32), xp.zeros(10, dtype=np.int32), xp.zeros(10, dtype=np.int32), 2)
    with pytest.raises(TypeError, match="s is None"):
        k.triad(a, b, xp.ones(10), None)
