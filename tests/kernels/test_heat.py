"""kernels/heat.py: the heat / Jacobi step on every path, against the reference and plain loops."""

from __future__ import annotations

import numpy as np
import pytest

import kernels
from tests.kernels import loops
from tests.kernels.conftest import DTYPE_IDS, DTYPES, assert_agrees, assert_scalar_agrees, field, host, on

pytestmark = pytest.mark.serial  # no MPI: the serial pass runs it

SHAPES = [(7, 5), (12, 9), (40, 33), (5, 6, 7), (9, 8, 11)]


def boxes(shape):
    """Full interior, thin strips (width 1 along each axis, at both edges), an off-centre box."""
    inner = tuple((1, n - 1) for n in shape)
    out = {"interior": inner}
    for axis, n in enumerate(shape):
        for name, lo in (("low", 1), ("high", n - 2)):
            out[f"strip{axis}{name}"] = tuple((lo, lo + 1) if a == axis else pair for a, pair in enumerate(inner))
    out["offcentre"] = tuple((2, max(3, n - 2)) if n > 4 else (1, n - 1) for n in shape)
    return out


CASES = [(shape, name, box) for shape in SHAPES for name, box in boxes(shape).items()]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape, name, box", CASES, ids=[f"{'x'.join(map(str, s))}-{n}" for s, n, _ in CASES])
def test_every_path_equals_the_reference(other, ref, shape, name, box, dtype):
    k = other
    u = field(shape, dtype, seed=len(shape))
    c = 1.0 / (2 * len(shape)) * 0.9
    v_ref = field(shape, dtype, seed=99)  # cells outside the box must stay as they were
    v = on(k, v_ref)
    want = ref.heat(u, v_ref, c, box)
    got = k.heat(on(k, u), v, c, box)
    assert_agrees(k, v, v_ref, scale=float(np.abs(u).max()))
    assert_scalar_agrees(k, got, want, dtype, scale=float(np.abs(u).max()))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", [(7, 5), (5, 6, 7)], ids=["7x5", "5x6x7"])
def test_reference_equals_plain_loops(ref, shape, dtype):
    u = field(shape, dtype, seed=3)
    box = tuple((1, n - 1) for n in shape)
    v, v_loops = np.zeros_like(u), np.zeros_like(u)
    got = ref.heat(u, v, 0.15, box)
    want = loops.heat(u, v_loops, 0.15, box)
    assert np.array_equal(v, v_loops)
    assert got == want


def test_residual_is_the_max_change_over_the_box(k):
    u = field((30, 27), np.float64, seed=5)
    box = ((3, 25), (2, 20))
    v = on(k, np.zeros_like(u))
    res = k.heat(on(k, u), v, 0.2, box)
    v = host(v)
    assert res == float(np.max(np.abs(v[3:25, 2:20] - u[3:25, 2:20])))
    assert res > 0


def test_residual_false_returns_none_and_still_updates(other, ref):
    k = other
    u = field((9, 8, 11), np.float32, seed=6)
    box = ((1, 8), (1, 7), (1, 10))
    v, v_ref = on(k, np.zeros_like(u)), np.zeros_like(u)
    assert k.heat(on(k, u), v, 0.1, box, residual=False) is None
    ref.heat(u, v_ref, 0.1, box, residual=False)
    assert_agrees(k, v, v_ref, scale=float(np.abs(u).max()))


def test_hand_checked_3x3(k):
    # One interior cell; neighbours 1, 2 (axis 0) and 3, 4 (axis 1), centre 10, c = 0.25:
    # v = 10 + 0.25 * ((1 + 2 + 3 + 4) - 4*10) = 10 - 7.5 = 2.5, residual 7.5
    u = np.array([[0.0, 1.0, 0.0],
                  [3.0, 10.0, 4.0],
                  [0.0, 2.0, 0.0]])
    v = on(k, np.full((3, 3), -1.0))
    assert k.heat(on(k, u), v, 0.25, ((1, 2), (1, 2))) == 7.5
    expected = np.full((3, 3), -1.0)
    expected[1, 1] = 2.5
    assert np.array_equal(host(v), expected)


def test_hand_checked_3x3x3(k):
    # centre 1, its six neighbours 1..6, c = 0.5: v = 1 + 0.5 * (21 - 6) = 8.5, residual 7.5
    u = np.zeros((3, 3, 3))
    u[1, 1, 1] = 1.0
    for value, (axis, side) in enumerate([(a, s) for a in range(3) for s in (0, 2)], start=1):
        index = [1, 1, 1]
        index[axis] = side
        u[tuple(index)] = value
    v = on(k, np.zeros_like(u))
    res = k.heat(on(k, u), v, 0.5, ((1, 2),) * 3)
    assert host(v)[1, 1, 1] == 8.5 and res == 7.5


def test_jacobi_converges_to_the_harmonic_solution(k):
    # Laplace on a square with u = x on the boundary: the solution is u = x (linear), a fixed point.
    n = 12
    x = np.broadcast_to(np.arange(n, dtype=np.float64)[:, None], (n, n)).copy()
    u = x.copy()
    u[1:-1, 1:-1] = 0.0
    u, v = on(k, u), on(k, u)
    box = ((1, n - 1), (1, n - 1))
    res = None
    for _ in range(600):
        res = k.heat(u, v, 0.25, box)
        u, v = v, u
    assert res < 1e-8
    np.testing.assert_allclose(host(u), x, atol=1e-7)


def test_nan_propagates_into_the_residual(k):
    u = field((8, 9), np.float64, seed=8)
    u[4, 4] = np.nan
    v = on(k, np.zeros_like(u))
    assert np.isnan(k.heat(on(k, u), v, 0.2, ((1, 7), (1, 8))))


@pytest.mark.parametrize("box", [((3, 3), (1, 4)), ((1, 4), (5, 2)), ((0, 0), (0, 0))])
def test_empty_box_does_nothing(k, box):
    u = field((6, 6), np.float64)
    v = on(k, np.full((6, 6), 7.0))
    assert k.heat(on(k, u), v, 0.25, box) == 0.0
    assert k.heat(on(k, u), v, 0.25, box, residual=False) is None
    assert np.all(host(v) == 7.0)


@pytest.mark.parametrize("box, axis", [(((0, 5), (1, 5)), 0), (((1, 6), (1, 5)), 0), (((1, 5), (1, 7)), 1)])
def test_box_must_leave_a_ghost_cell(k, box, axis):
    u = on(k, field((6, 6)))
    with pytest.raises(ValueError, match=rf"box .* shape \(6, 6\).*axis {axis}.*ghost cell"):
        k.heat(u, on(k, field((6, 6))), 0.25, box)


def test_bad_arguments_are_named(k):
    xp = k.xp
    u = on(k, field((6, 6)))
    with pytest.raises(ValueError, match="box .* one \\(lo, hi\\) pair for each of the 2 dimensions"):
        k.heat(u, xp.zeros_like(u), 0.25, ((1, 5),))
    with pytest.raises(TypeError, match="box lo 1.5"):
        k.heat(u, xp.zeros_like(u), 0.25, ((1.5, 5), (1, 5)))
    with pytest.raises(ValueError, match="same shape and dtype"):
        k.heat(u, xp.zeros((6, 7)), 0.25, ((1, 5), (1, 5)))
    with pytest.raises(ValueError, match="share memory"):
        k.heat(u, u, 0.25, ((1, 5), (1, 5)))
    with pytest.raises(ValueError, match="dtype int64"):
        k.heat(xp.zeros((6, 6), dtype=np.int64), xp.zeros((6, 6), dtype=np.int64), 0.25, ((1, 5), (1, 5)))
    with pytest.raises(ValueError, match="1-D"):
        k.heat(xp.zeros(6), xp.zeros(6), 0.25, ((1, 5),))
    with pytest.raises(ValueError, match="not C-contiguous"):
        k.heat(xp.zeros((6, 6)).T, xp.zeros((6, 6)), 0.25, ((1, 5), (1, 5)))
    with pytest.raises(TypeError, match="c is '0.25'"):
        k.heat(u, xp.zeros_like(u), "0.25", ((1, 5), (1, 5)))


def test_wrong_array_kind_names_the_fix():
    k = kernels.select("numpy")
    with pytest.raises(TypeError, match="u is a builtins.list.*numpy.ndarray"):
        k.heat([[0.0] * 3] * 3, np.zeros((3, 3)), 0.25, ((1, 2), (1, 2)))
