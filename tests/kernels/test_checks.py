"""kernels/checks.py and kernels/jit.py: box normalisation, the shared argument checks, numba's availability."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from kernels.checks import box_shape, box_size, check_box, check_scalar, shifted, slices
from kernels.jit import numba_reason

pytestmark = pytest.mark.serial  # no MPI: the serial pass runs it


def test_box_is_normalised_to_int_pairs():
    box = check_box("heat", [np.array([1, 5]), (np.int64(2), 4)], (6, 6), ghost=1)
    assert box == ((1, 5), (2, 4)) and all(type(x) is int for pair in box for x in pair)
    assert box_shape(box) == (4, 2) and box_size(box) == 8
    assert slices(box) == (slice(1, 5), slice(2, 4))
    assert shifted(box, 1, -1) == (slice(1, 5), slice(1, 3))


def test_empty_box_is_none_without_range_checks():
    assert check_box("heat", ((0, 0), (-5, 100)), (6, 6), ghost=1) is None
    assert check_box("heat", ((4, 2), (1, 5)), (6, 6), ghost=1) is None


def test_box_errors_name_box_shape_and_fix():
    with pytest.raises(ValueError, match=r"box \(\(1, 5\), \(1, 6\)\) does not fit an array of shape \(6, 6\): on axis 1 "
                                         r"it must leave 1 ghost cell on each side \(1 <= lo and hi <= 5\).*ghost layers"):
        check_box("heat", ((1, 5), (1, 6)), (6, 6), ghost=1)
    with pytest.raises(TypeError, match="not a sequence of \\(lo, hi\\) pairs"):
        check_box("heat", 5, (6, 6), ghost=1)
    with pytest.raises(ValueError, match="one \\(lo, hi\\) pair for each of the 2 dimensions"):
        check_box("heat", ((1, 2, 3), (1, 2)), (6, 6), ghost=1)


def test_scalars_take_the_array_dtype():
    c = check_scalar("heat", "c", 0.1, np.dtype(np.float32))
    assert isinstance(c, np.float32) and c == np.float32(0.1)
    assert check_scalar("heat", "c", 1, np.dtype(np.float64)) == 1.0
    with pytest.raises(TypeError, match="c is True"):
        check_scalar("heat", "c", True, np.dtype(np.float64))
    with pytest.raises(TypeError, match="c is 1j"):
        check_scalar("heat", "c", 1j, np.dtype(np.float64))


def test_numba_reason_follows_the_installation():
    reason = numba_reason()
    if importlib.util.find_spec("numba") is None:
        assert reason.startswith("numba is not installed") and "pip install -e '.[compiled]'" in reason
    else:
        assert reason is None
