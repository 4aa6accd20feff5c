"""kernels/star.py: the PRK star stencil on every path, against the reference, plain loops and PRK's closed form."""

from __future__ import annotations

import numpy as np
import pytest

from kernels.star import weights
from tests.kernels import loops
from tests.kernels.conftest import DTYPE_IDS, DTYPES, assert_agrees, assert_scalar_agrees, field, host, on

pytestmark = pytest.mark.serial  # no MPI: the serial pass runs it


def boxes(shape, r):
    inner = tuple((r, n - r) for n in shape)
    out = {"interior": inner}
    for axis, n in enumerate(shape):
        for name, lo in (("low", r), ("high", n - r - 1)):
            out[f"strip{axis}{name}"] = tuple((lo, lo + 1) if a == axis else pair for a, pair in enumerate(inner))
    return out


CASES = [(shape, r, name, box) for shape, radii in (((7, 5), (1, 2)), ((12, 9), (1, 2, 3)), ((40, 33), (1, 4)))
         for r in radii for name, box in boxes(shape, r).items()]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape, r, name, box", CASES, ids=[f"{'x'.join(map(str, s))}-r{r}-{n}" for s, r, n, _ in CASES])
def test_every_path_equals_the_reference(other, ref, shape, r, name, box, dtype):
    k = other
    inp = field(shape, dtype, seed=r)
    out_ref = field(shape, dtype, seed=50 + r)
    out = on(k, out_ref)
    want = ref.star(inp, out_ref, r, box)
    got = k.star(on(k, inp), out, r, box)
    assert_agrees(k, out, out_ref, scale=float(np.abs(out_ref).max()))
    assert_scalar_agrees(k, got, want, dtype, scale=float(np.abs(out_ref).sum()))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("r", [1, 2, 3])
def test_reference_equals_plain_loops(ref, r, dtype):
    shape = (2 * r + 5, 2 * r + 4)
    inp, out = field(shape, dtype, seed=11), field(shape, dtype, seed=12)
    out_loops = out.copy()
    box = ((r, shape[0] - r), (r, shape[1] - r))
    norm = ref.star(inp, out, r, box)
    want = loops.star(inp, out_loops, r, box)
    assert np.array_equal(out, out_loops)
    assert norm == pytest.approx(want, rel=1e-12)  # the loops sum the norm in another order


def test_weights():
    assert np.array_equal(weights(2, np.dtype(np.float64)), [0.25, 0.125])
    assert weights(3, np.dtype(np.float32)).dtype == np.float32
    assert weights(3, np.dtype(np.float64))[2] == 1.0 / 18.0


def test_hand_checked_3x3(k):
    # r = 1, weights ±1/2: out = 5 + (-1/2·1 + 1/2·5) + (-1/2·2 + 1/2·10) = 5 + 2 + 4 = 11; the centre does not count
    inp = np.array([[0.0, 1.0, 0.0],
                    [2.0, 100.0, 10.0],
                    [0.0, 5.0, 0.0]])
    out = on(k, np.full((3, 3), 5.0))
    assert k.star(on(k, inp), out, 1, ((1, 2), (1, 2))) == 11.0
    expected = np.full((3, 3), 5.0)
    expected[1, 1] = 11.0
    assert np.array_equal(host(out), expected)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("r", [1, 2, 3, 4])
def test_prk_closed_form(k, r, dtype):
    """PRK: in[i, j] = i + j, in += 1 after each sweep: every sweep adds exactly 2 to each updated cell.

    Σ_axis Σ_k (1/(2kr))·((x + k) - (x - k)) = Σ_axis Σ_k 1/r = 2. For r = 1, 2 the weights are powers of
    two and every product and sum is exact, so out == 2·T exactly; for r = 3, 4 (weights 1/6, 1/24…) to rounding.
    """
    n, sweeps = 24, 6
    i, j = np.meshgrid(np.arange(n), np.arange(n + 3), indexing="ij")
    inp = on(k, (i + j).astype(dtype))
    out = on(k, np.zeros((n, n + 3), dtype=dtype))
    box = ((r + 1, n - r), (r, n + 3 - r - 2))  # an off-centre block, as one rank's part would be
    cells = (box[0][1] - box[0][0]) * (box[1][1] - box[1][0])
    exact = r <= 2 and k.name != "cupy"
    for t in range(1, sweeps + 1):
        norm = k.star(inp, out, r, box)
        inp += 1
        if exact:
            assert norm == 2.0 * t * cells
        else:
            assert norm == pytest.approx(2.0 * t * cells, rel=1e-5 if dtype == np.float32 else 1e-12)
    got = host(out)
    inside = got[box[0][0]:box[0][1], box[1][0]:box[1][1]]
    if exact:
        assert np.all(inside == 2.0 * sweeps)
    else:
        np.testing.assert_allclose(inside, 2.0 * sweeps, rtol=1e-4 if dtype == np.float32 else 1e-12)
    got[box[0][0]:box[0][1], box[1][0]:box[1][1]] = 0
    assert not got.any(), "cells outside the box changed"


def test_empty_box_does_nothing(k):
    out = on(k, np.ones((9, 9)))
    assert k.star(on(k, field((9, 9))), out, 2, ((4, 4), (2, 7))) == 0.0
    assert np.all(host(out) == 1.0)


def test_three_dimensional_arrays_are_refused(k):
    u = on(k, field((7, 7, 7)))
    with pytest.raises(ValueError, match="inp is 3-D .*star takes 2-D arrays"):
        k.star(u, k.xp.zeros_like(u), 1, ((1, 6),) * 3)


@pytest.mark.parametrize("box, axis", [(((1, 7), (2, 7)), 0), (((2, 8), (2, 7)), 0), (((2, 7), (2, 8)), 1)])
def test_box_must_leave_r_ghost_cells(k, box, axis):
    inp = on(k, field((9, 9)))
    with pytest.raises(ValueError, match=rf"axis {axis}.*leave 2 ghost cells.*2 <= lo and hi <= 7"):
        k.star(inp, k.xp.zeros_like(inp), 2, box)


def test_bad_radius_is_named(k):
    inp = on(k, field((9, 9)))
    with pytest.raises(ValueError, match="r = 0; the radius must be >= 1"):
        k.star(inp, k.xp.zeros_like(inp), 0, ((2, 7), (2, 7)))
    with pytest.raises(TypeError, match="r is 1.5"):
        k.star(inp, k.xp.zeros_like(inp), 1.5, ((2, 7), (2, 7)))
    with pytest.raises(ValueError, match="share memory"):
        k.star(inp, inp, 1, ((2, 7), (2, 7)))
