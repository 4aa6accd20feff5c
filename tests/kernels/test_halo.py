"""kernels/halo.py: pack and unpack every face of 2-D and 3-D fields, at halo widths 1 to 3, on every path."""

from __future__ import annotations

import numpy as np
import pytest

from tests.kernels.conftest import DTYPE_IDS, DTYPES, field, host, on

pytestmark = pytest.mark.serial  # no MPI: the serial pass runs it


def faces(shape, g, w):
    """(name, send box, receive box) for every face of a field with g ghost layers and halo width w.

    The send box is the w layers of owned cells next to the face; the receive box the w ghost layers beyond it.
    """
    owned = [(g, n - g) for n in shape]
    out = []
    for axis, n in enumerate(shape):
        for side, send, recv in (("low", (g, g + w), (g - w, g)), ("high", (n - g - w, n - g), (n - g, n - g + w))):
            out.append((f"axis{axis}-{side}",
                        tuple(send if a == axis else pair for a, pair in enumerate(owned)),
                        tuple(recv if a == axis else pair for a, pair in enumerate(owned))))
    return out


CASES = [(shape, w, name, send, recv) for shape in ((11, 9), (9, 10, 11)) for w in (1, 2, 3)
         for name, send, recv in faces(shape, 3, w)]


def index(box):
    return tuple(slice(lo, hi) for lo, hi in box)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape, w, name, send, recv", CASES,
                         ids=[f"{'x'.join(map(str, c[0]))}-w{c[1]}-{c[2]}" for c in CASES])
def test_pack_unpack_round_trip(k, shape, w, name, send, recv, dtype):
    u_host = field(shape, dtype, seed=w)
    n = int(np.prod([hi - lo for lo, hi in send]))
    buf = on(k, np.full(n + 5, -7, dtype=dtype))  # larger than needed: the tail stays untouched
    k.pack(on(k, u_host), send, buf)
    got = host(buf)
    assert np.array_equal(got[:n], u_host[index(send)].ravel())
    assert np.all(got[n:] == -7)
    # the neighbour unpacks into its ghost layers: everything else unchanged
    target_host = field(shape, dtype, seed=100 + w)
    target = on(k, target_host)
    k.unpack(buf, target, recv)
    expected = target_host.copy()
    expected[index(recv)] = u_host[index(send)]
    assert np.array_equal(host(target), expected)


def test_compiled_2d_and_3d_agree_with_numpy(other, ref):
    for shape in ((7, 5), (5, 6, 7)):
        u = field(shape, np.float32)
        box = tuple((1, n - 1) for n in shape)
        want, got = np.zeros(u.size, np.float32), on(other, np.zeros(u.size, np.float32))
        ref.pack(u, box, want)
        other.pack(on(other, u), box, got)
        assert np.array_equal(host(got), want)


def test_empty_box_copies_nothing(k):
    u = on(k, field((6, 6)))
    buf = on(k, np.zeros(0))
    k.pack(u, ((2, 2), (0, 6)), buf)
    k.unpack(buf, u, ((0, 6), (3, 1)))


def test_bad_buffers_are_named(k):
    xp = k.xp
    u = on(k, field((6, 7)))
    box = ((0, 2), (1, 6))  # 10 cells
    with pytest.raises(ValueError, match=r"buf holds 9 elements but box \(\(0, 2\), \(1, 6\)\) has 10 cells.*at least 10"):
        k.pack(u, box, xp.zeros(9))
    with pytest.raises(ValueError, match="buf has dtype float32 but u has float64"):
        k.unpack(xp.zeros(10, dtype=np.float32), u, box)
    with pytest.raises(ValueError, match="contiguous 1-D"):
        k.pack(u, box, xp.zeros((2, 5)))
    with pytest.raises(ValueError, match="contiguous 1-D"):
        k.pack(u, box, xp.zeros(20)[::2])
    with pytest.raises(TypeError, match="buf is a list"):
        k.pack(u, box, [0.0] * 10)
    with pytest.raises(ValueError, match="shares memory"):
        k.pack(u, box, u.reshape(-1))


def test_box_must_lie_inside_the_array(k):
    u = on(k, field((6, 7)))
    with pytest.raises(ValueError, match=r"axis 1 it must lie inside the array \(0 <= lo and hi <= 7\)"):
        k.pack(u, ((0, 2), (5, 8)), k.xp.zeros(10))
    with pytest.raises(ValueError, match="axis 0"):
        k.unpack(k.xp.zeros(10), u, ((-1, 1), (0, 5)))


SIMT_CASES = [(shape, w, name, send, recv) for shape, w in (((11, 9), 2), ((9, 10, 11), 1))
              for name, send, recv in faces(shape, 3, w)]


@pytest.mark.parametrize("shape, w, name, send, recv", SIMT_CASES,
                         ids=[f"{'x'.join(map(str, c[0]))}-w{c[1]}-{c[2]}" for c in SIMT_CASES])
def test_simt_pack_unpack_round_trip(simt, shape, w, name, send, recv):
    """The SIMT kernels (numba's simulator here, CuPy on a GPU): blocks of 4 threads, so rows span blocks."""
    from kernels import halo

    u_host = field(shape, np.float32, seed=w)
    n = int(np.prod([hi - lo for lo, hi in send]))
    buf = simt.asarray(np.full(n + 3, -7, dtype=np.float32))
    halo.pack_simt(simt.asarray(u_host), send, buf, threads=4)
    got = host(buf)
    assert np.array_equal(got[:n], u_host[index(send)].ravel())
    assert np.all(got[n:] == -7)
    target_host = field(shape, np.float32, seed=100 + w)
    target = simt.asarray(target_host)
    halo.unpack_simt(buf, target, recv, threads=4)
    expected = target_host.copy()
    expected[index(recv)] = u_host[index(send)]
    assert np.array_equal(host(target), expected)


def test_simt_checks_its_arguments_as_the_paths_do():
    from kernels import halo

    u = field((6, 7))
    with pytest.raises(ValueError, match=r"buf holds 9 elements but box \(\(0, 2\), \(1, 6\)\) has 10 cells"):
        halo.pack_simt(u, ((0, 2), (1, 6)), np.zeros(9))
    with pytest.raises(ValueError, match="threads = 0"):
        halo.unpack_simt(np.zeros(10), u, ((0, 2), (1, 6)), threads=0)
    halo.pack_simt(u, ((2, 2), (0, 6)), np.zeros(0))  # an empty box: nothing launched
