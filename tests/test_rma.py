"""mpicomm.rma: ``comm.expose`` → Window; passive-target get/put, publish/collect, checks, staging.

Every test that creates a window makes the same collective calls on every
rank (expose, Barrier, Free), and checks that must fail raise locally before
any RMA, so a failing assertion never leaves a peer waiting.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from tests.conftest import SOME_DTYPE_IDS, SOME_DTYPES, host, rank_data

DTYPES, DTYPE_IDS = SOME_DTYPES, SOME_DTYPE_IDS




def uneven(rank: int, size: int) -> int:
    """Elements rank *rank* exposes: rank·3+1, except that the last of several ranks exposes none."""
    return 0 if size > 1 and rank == size - 1 else rank * 3 + 1


def counts(size: int) -> list[int]:
    """The edge counts 0, 1, p-1, p+1 (deduplicated)."""
    return sorted({0, 1, size - 1, size + 1})


def payload(origin: int, target: int, count: int, dtype, size: int, xp=np):
    """What *origin* puts into *target*: depends on both ranks and on the index."""
    return rank_data(size + origin * size + target, count, dtype, xp)


# ---------------------------------------------------------------- get


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_get_whole_windows_of_uneven_sizes(comm, xp, path, dtype):
    r, p = comm.rank, comm.size
    local = rank_data(r, uneven(r, p), dtype, xp)
    win = comm.expose(local)
    try:
        got = {t: win.get(t) for t in range(p)}
        comm.Barrier()
    finally:
        win.Free()
    assert win.sizes == [uneven(t, p) for t in range(p)]
    assert win.dtype == np.dtype(dtype)
    assert win.staged == (path == "staged")
    for t in range(p):
        assert got[t].dtype == np.dtype(dtype)
        assert got[t].shape == (uneven(t, p),)
        assert np.array_equal(host(got[t]), rank_data(t, uneven(t, p), dtype)), f"target {t}"


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_get_counts_at_offsets(comm, path, dtype):
    r, p = comm.rank, comm.size
    sizes = [2 * p + 5 + t for t in range(p)]
    got, want = [], []
    with comm.expose(rank_data(r, sizes[r], dtype)) as win:
        for t in range(p):
            full = rank_data(t, sizes[t], dtype)
            for c in counts(p):
                for offset in sorted({0, 1, (sizes[t] - c) // 2, sizes[t] - c}):
                    got.append(win.get(t, offset, c))
                    want.append(full[offset : offset + c])
            for offset in (0, 3, sizes[t] - 1, sizes[t]):  # count omitted: to the end
                got.append(win.get(t, offset=offset))
                want.append(full[offset:])
        comm.Barrier()
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape, i
        assert np.array_equal(g, w), i


@pytest.mark.mpi
def test_get_into_out(comm, xp, path):
    r, p = comm.rank, comm.size
    n = 12
    results = []
    with comm.expose(rank_data(r, n, np.int64, xp)) as win:
        for t in range(p):
            out = xp.full(5, -7, np.int64)
            returned = win.get(t, 4, 5, out=out)
            results.append((t, returned is out, host(out), slice(4, 9)))
            out2 = xp.full((2, 3), -7, np.int64)  # any shape with the right number of elements
            returned = win.get(t, 6, out=out2)
            results.append((t, returned is out2, host(out2).reshape(-1), slice(6, 12)))
            empty = xp.empty(0, np.int64)
            returned = win.get(t, n, 0, out=empty)
            results.append((t, returned is empty, host(empty), slice(n, n)))
        as_numpy = win.get(r, 1, 2, xp=np)
        numpy_ints = win.get(np.int32((r + 1) % p), np.int64(3), np.uint8(4))  # NumPy integers are integers
        comm.Barrier()
    for t, same, value, where in results:
        assert same, f"get(out=...) from {t} did not return out itself"
        assert np.array_equal(value, rank_data(t, n, np.int64)[where]), (t, where)
    assert isinstance(as_numpy, np.ndarray)
    assert np.array_equal(as_numpy, rank_data(r, n, np.int64)[1:3])
    assert np.array_equal(host(numpy_ints), rank_data((r + 1) % p, n, np.int64)[3:7])


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_rget_starts_reads_that_complete_later(comm, xp, path, dtype):
    """Nonblocking gets from every rank at once, into new arrays and into out, completed by one Waitall (or
    each by wait(), which returns the array), equal what get reads; PROC_NULL completes at once."""
    r, p = comm.rank, comm.size
    n = 2 * p + 3
    with comm.expose(rank_data(r, n, dtype, xp)) as win:
        requests = [win.rget(t, t % 3, n - t % 3) for t in range(p)]
        outs = [xp.full(2, 0, dtype) for _ in range(p)]
        into = [win.rget(t, 1, out=outs[t][:0], count=0) for t in range(p)] + \
               [win.rget(t, n - 2, out=outs[t]) for t in range(p)]
        mpicomm.Request.Waitall(into)
        arrays = [q.wait() for q in requests]
        null = win.rget(MPI.PROC_NULL)
        assert null.Test() and null.wait() is None
        comm.Barrier()
    for t in range(p):
        full = rank_data(t, n, dtype)
        assert arrays[t].dtype == np.dtype(dtype) and np.array_equal(host(arrays[t]), full[t % 3:]), t
        assert np.array_equal(host(outs[t]), full[n - 2:]), t


@pytest.mark.mpi
def test_rget_checks_its_arguments_before_any_rma(comm):
    with comm.expose(np.arange(4.0)) as win:
        with pytest.raises(ValueError, match="out is float64 with 3 elements"):
            win.rget(0, 1, 2, out=np.empty(3))
        with pytest.raises(ValueError):
            win.rget(0, 3, 5)
        comm.Barrier()


@pytest.mark.mpi
def test_get_with_a_bad_out_raises_locally(comm, xp):
    r, p = comm.rank, comm.size
    t = (r + 1) % p
    with comm.expose(rank_data(r, 8, np.int64, xp)) as win:
        with pytest.raises(ValueError, match="out is float64 with 3 elements but the window holds int64 and 3"):
            win.get(t, 0, 3, out=xp.zeros(3, np.float64))
        with pytest.raises(ValueError, match="out is int64 with 4 elements but the window holds int64 and 3"):
            win.get(t, 0, 3, out=xp.zeros(4, np.int64))
        with pytest.raises(ValueError, match="out is int64 with 3 elements .* and 8 elements were asked for"):
            win.get(t, out=xp.zeros(3, np.int64))
        with pytest.raises(ValueError, match="out is not C-contiguous"):
            win.get(t, 0, 3, out=xp.zeros(6, np.int64)[::2])
        readonly = np.zeros(3, np.int64)
        readonly.flags.writeable = False
        with pytest.raises(ValueError, match="out is read-only"):
            win.get(t, 0, 3, out=readonly)
        with pytest.raises(TypeError, match=r"out must\ be\ an\ array\ or\ a\ buffer\ \(NumPy,\ CuPy,\ DLPack,\ __cuda_array_interface__,\ bytearray\.\.\.\),\ got\ list"):
            win.get(t, 0, 3, out=[0, 0, 0])
        still = win.get(t, 2, 3)  # the window is fine afterwards
        comm.Barrier()
    assert np.array_equal(host(still), rank_data(t, 8, np.int64)[2:5])


@pytest.mark.mpi
def test_proc_null_target_is_a_no_op(comm, path):
    r, p = comm.rank, comm.size
    local = rank_data(r, 6, np.float32)
    with comm.expose(local) as win:
        nothing = win.get(MPI.PROC_NULL)
        nothing_at_offset = win.get(MPI.PROC_NULL, 100, 100)  # nothing is read, so nothing is out of range
        out = np.full(4, 5.0, np.float32)
        same = win.get(MPI.PROC_NULL, 0, 4, out=out)
        assert win.put(rank_data(p + r, 6, np.float32), MPI.PROC_NULL) is None
        comm.Barrier()
        win.collect()
        after = local.copy()
        comm.Barrier()
    assert nothing is None and nothing_at_offset is None
    assert same is out and np.array_equal(out, np.full(4, 5.0, np.float32))
    assert np.array_equal(after, rank_data(r, 6, np.float32))


@pytest.mark.mpi
def test_out_of_range_and_bad_arguments_raise_locally_before_any_rma(comm, path):
    r, p = comm.rank, comm.size
    local = rank_data(r, uneven(r, p), np.int64)
    with comm.expose(local) as win:
        for t in range(p):
            n = uneven(t, p)
            where = f"outside rank {t}'s window, which has {n} elements"
            with pytest.raises(ValueError, match=re.escape(f"elements [{n + 1}, {n}) are {where}")):
                win.get(t, n + 1)  # count omitted: would be negative
            with pytest.raises(ValueError, match=re.escape(f"elements [{n}, {n + 1}) are {where}")):
                win.get(t, n, 1)
            with pytest.raises(ValueError, match=re.escape(f"elements [0, {n + 1}) are {where}")):
                win.get(t, 0, n + 1)
            with pytest.raises(ValueError, match=re.escape(f"elements [-1, {n}) are {where}")):
                win.get(t, -1)
            with pytest.raises(ValueError, match=re.escape(f"elements [0, -1) are {where}")):
                win.get(t, 0, -1)
            with pytest.raises(ValueError, match=re.escape(f"elements [{n}, {n + 2}) are {where}")):
                win.put(rank_data(p + r, 2, np.int64), t, n)
            last = max(n - 1, 0)
            with pytest.raises(ValueError, match=re.escape(f"elements [{last}, {last + 2}) are {where}")):
                win.put(rank_data(p + r, 2, np.int64), t, last)
            with pytest.raises(ValueError, match=re.escape(f"elements [-1, 0) are {where}")):
                win.put(rank_data(p + r, 1, np.int64), t, -1)
            with pytest.raises(TypeError, match=r"offset must be an integer, got 1\.0"):
                win.get(t, 1.0)
            with pytest.raises(TypeError, match="offset must be an integer, got True"):
                win.put(rank_data(p + r, 1, np.int64), t, True)
            with pytest.raises(TypeError, match="count must be an integer, got '2'"):
                win.get(t, 0, "2")
        for bad in (p, -7, MPI.ANY_SOURCE, 1 << 40):
            with pytest.raises(ValueError, match=f"target={bad} is not a rank of this communicator of size {p}"):
                win.get(bad)
            with pytest.raises(ValueError, match=f"target={bad} is not a rank"):
                win.put(rank_data(p + r, 1, np.int64), bad)
        with pytest.raises(TypeError, match="target must be an integer"):
            win.get(0.0)
        comm.Barrier()  # any put that had slipped through would have landed by now
        win.collect()
        after = local.copy()
        comm.Barrier()
    assert np.array_equal(after, rank_data(r, uneven(r, p), np.int64))


@pytest.mark.mpi
def test_put_with_a_wrong_dtype_or_buffer_raises_type_error(comm, path):
    r, p = comm.rank, comm.size
    local = rank_data(r, 5, np.int64)
    with comm.expose(local) as win:
        for t in range(p):
            with pytest.raises(TypeError, match="x is float32 but the window holds int64; cast with x.astype"):
                win.put(rank_data(r, 2, np.float32), t, 1)
            with pytest.raises(TypeError, match="x is int32 but the window holds int64"):
                win.put(np.arange(2, dtype=np.int32), t)
            with pytest.raises(TypeError, match=r"x must\ be\ an\ array\ or\ a\ buffer\ \(NumPy,\ CuPy,\ DLPack,\ __cuda_array_interface__,\ bytearray\.\.\.\),\ got\ list"):
                win.put([1, 2], t)
            with pytest.raises(ValueError, match="x is not C-contiguous"):
                win.put(rank_data(r, 4, np.int64)[::2], t)
            with pytest.raises(TypeError, match="x has dtype object, which mpicomm does not move"):
                win.put(np.array([1, 2], dtype=object), t)
        comm.Barrier()
        win.collect()
        after = local.copy()
        comm.Barrier()
    assert np.array_equal(after, rank_data(r, 5, np.int64))


# ---------------------------------------------------------------- put / publish / collect


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_every_rank_puts_into_every_window_then_owner_collects(comm, xp, path, dtype):
    """Origin o writes its own chunk of every window (o·k+1 on), at offsets, with counts 0, 1, p-1, p+1."""
    r, p = comm.rank, comm.size
    k = p + 1  # the largest count
    n = p * k + 2  # element 0 and the last one are never written
    local = rank_data(r, n, dtype, xp)
    with comm.expose(local) as win:
        for t in range(p):
            for c in counts(p):
                for slot in sorted({0, k - c}):  # at the start and at the end of this origin's chunk
                    win.put(payload(r, t, c, dtype, p, xp), t, 1 + r * k + slot)
        comm.Barrier()
        win.collect()
        after = host(local).copy()
        comm.Barrier()
    want = rank_data(r, n, dtype)
    for o in range(p):  # replay every origin's puts, in its order
        for c in counts(p):
            for slot in sorted({0, k - c}):
                start = 1 + o * k + slot
                want[start : start + c] = payload(o, r, c, dtype, p)
    assert np.array_equal(after, want)


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", [np.int64, np.complex128, np.float16], ids=["int64", "complex128", "float16"])
def test_owner_writes_publish_then_peers_get_new_values(comm, xp, path, dtype):
    r, p = comm.rank, comm.size
    n = 7
    local = rank_data(r, n, dtype, xp)
    rounds = []
    with comm.expose(local) as win:
        for round_ in (1, 2):  # twice: publishing is not a one-off
            local[:] = rank_data(round_ * p + r, n, dtype, xp)  # the owner writes its own array
            win.publish()
            comm.Barrier()
            rounds.append([host(win.get(t)) for t in range(p)])
            comm.Barrier()  # nobody reads while the owner writes the next round
    for round_, got in zip((1, 2), rounds):
        for t in range(p):
            assert np.array_equal(got[t], rank_data(round_ * p + t, n, dtype)), (round_, t)


@pytest.mark.mpi
def test_peers_put_then_owner_collects_repeatedly(comm, xp, path):
    r, p = comm.rank, comm.size
    n = p + 2
    local = xp.zeros(n, np.int64)
    seen = []
    with comm.expose(local) as win:
        for round_ in (1, 2):
            right = (r + 1) % p
            win.put(xp.asarray([round_ * 1000 + r * 10 + right]), right, 1 + r)  # each rank writes its own slot
            comm.Barrier()
            win.collect()
            seen.append(host(local).copy())
            comm.Barrier()  # no put of the next round lands before the owner has read
    for round_, got in zip((1, 2), seen):
        want = np.zeros(n, np.int64)
        left = (r - 1) % p
        want[1 + left] = round_ * 1000 + left * 10 + r
        assert np.array_equal(got, want), round_


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_staged_window_is_a_host_mirror_synchronised_by_publish_and_collect(comm, xp, staged, dtype):
    """Staged (forced here for NumPy): peers see only published values; the owner sees puts only after collect."""
    r, p = comm.rank, comm.size
    n = 2 * p + 1
    local = rank_data(r, n, dtype, xp)
    with comm.expose(local) as win:
        is_staged, text = win.staged, repr(win)
        local[:] = rank_data(p + r, n, dtype, xp)  # written after creation, not yet published
        comm.Barrier()
        before_publish = [host(win.get(t)) for t in range(p)]
        comm.Barrier()
        win.publish()
        comm.Barrier()
        after_publish = [host(win.get(t)) for t in range(p)]
        out = xp.empty(2, dtype)
        into_out = host(win.get((r + 1) % p, 1, out=out, count=2))
        comm.Barrier()
        win.put(payload(r, (r + 1) % p, 2, dtype, p, xp), (r + 1) % p, 2 * r)  # slot [2r, 2r+2) of the right
        comm.Barrier()
        before_collect = host(local).copy()
        win.collect()
        after_collect = host(local).copy()
        comm.Barrier()
    assert is_staged
    assert text == f"<mpicomm.Window {np.dtype(dtype)} sizes={[n] * p} (host mirror)>"
    for t in range(p):
        assert np.array_equal(before_publish[t], rank_data(t, n, dtype)), t
        assert np.array_equal(after_publish[t], rank_data(p + t, n, dtype)), t
    assert np.array_equal(into_out, rank_data(p + (r + 1) % p, n, dtype)[1:3])
    assert np.array_equal(before_collect, rank_data(p + r, n, dtype))
    want = rank_data(p + r, n, dtype)
    left = (r - 1) % p
    want[2 * left : 2 * left + 2] = payload(left, r, 2, dtype, p)
    assert np.array_equal(after_collect, want)


# ---------------------------------------------------------------- shapes and sizes


@pytest.mark.mpi
def test_zero_length_windows_everywhere(comm, path):
    p = comm.size
    local = np.empty(0, np.complex128)
    with comm.expose(local) as win:
        sizes = list(win.sizes)
        got = [win.get(t) for t in range(p)]
        got_zero = [win.get(t, 0, 0) for t in range(p)]
        for t in range(p):
            win.put(np.empty(0, np.complex128), t)
            with pytest.raises(ValueError, match=re.escape(f"elements [0, 1) are outside rank {t}'s window, which has 0 elem")):
                win.get(t, 0, 1)
            with pytest.raises(ValueError, match=re.escape(f"elements [0, 1) are outside rank {t}'s window, which has 0")):
                win.put(np.zeros(1, np.complex128), t)
        win.publish()
        comm.Barrier()
        win.collect()
        comm.Barrier()
    assert sizes == [0] * p
    for g in got + got_zero:
        assert g.dtype == np.complex128 and g.shape == (0,)


@pytest.mark.mpi
def test_multidimensional_window_is_addressed_by_flat_element(comm, path):
    r, p = comm.rank, comm.size
    local = rank_data(r, 2 * (r + 2), np.int64).reshape(2, r + 2)
    with comm.expose(local) as win:
        sizes = list(win.sizes)
        got = [win.get(t) for t in range(p)]
        middle = [win.get(t, 1, 2) for t in range(p)]
        comm.Barrier()
        right = (r + 1) % p
        win.put(np.array([-1 - r, -2 - r], np.int64), right, right + 1)  # across the row boundary of the right
        comm.Barrier()
        win.collect()
        after = local.copy()
        comm.Barrier()
    assert sizes == [2 * (t + 2) for t in range(p)]
    for t in range(p):
        assert got[t].shape == (2 * (t + 2),)  # a get is 1-D whatever the owner's shape
        assert np.array_equal(got[t], rank_data(t, 2 * (t + 2), np.int64))
        assert np.array_equal(middle[t], rank_data(t, 2 * (t + 2), np.int64)[1:3])
    left = (r - 1) % p
    want = rank_data(r, 2 * (r + 2), np.int64)
    want[r + 1 : r + 3] = [-1 - left, -2 - left]
    assert after.shape == (2, r + 2)
    assert np.array_equal(after.reshape(-1), want)


# ---------------------------------------------------------------- expose: collective checks


@pytest.mark.mpi(min_size=2)
def test_expose_with_mismatched_dtypes_raises_on_every_rank(comm):
    r, p = comm.rank, comm.size
    kinds = [np.int64 if t % 2 == 0 else np.float32 for t in range(p)]
    names = ", ".join(f"rank {t}: {np.dtype(kinds[t])}" for t in range(p))
    text = f"expose: every rank must expose the same dtype, got {names}; cast with .astype(...)"
    with pytest.raises(ValueError, match=re.escape(text)):
        comm.expose(rank_data(r, 3, kinds[r]))
    # only the last rank differs (and it exposes nothing): still refused everywhere, naming it
    odd = np.empty(0, np.float64) if r == p - 1 else rank_data(r, 3, np.int64)
    with pytest.raises(ValueError, match=re.escape(f"rank {p - 1}: float64")):
        comm.expose(odd)
    # nothing was left half-created: a matching expose works
    with comm.expose(rank_data(r, 3, np.int64)) as win:
        got = win.get((r + 1) % p)
        comm.Barrier()
    assert np.array_equal(got, rank_data((r + 1) % p, 3, np.int64))


def _bad_buffer(kind: str):
    if kind == "list":
        return [1, 2, 3], "buf must be an array or a buffer (NumPy, CuPy, DLPack, __cuda_array_interface__, bytearray...), got list"
    if kind == "non-contiguous":
        return np.zeros(8, np.int64)[::2], "buf is not C-contiguous"
    if kind == "read-only":
        x = np.zeros(4, np.int64)
        x.flags.writeable = False
        return x, "buf is read-only"
    if kind == "unsupported dtype":
        return np.zeros(4, "U2"), "buf has dtype <U2, which mpicomm does not move"
    raise AssertionError(kind)


@pytest.mark.mpi
@pytest.mark.parametrize("kind", ["list", "non-contiguous", "read-only", "unsupported dtype"])
def test_expose_with_a_bad_buffer_on_one_rank_raises_on_every_rank(comm, kind):
    r, p = comm.rank, comm.size
    bad_rank = p - 1
    bad, why = _bad_buffer(kind)
    with pytest.raises(ValueError, match=re.escape(f"expose: rank {bad_rank}: {why}")):
        comm.expose(bad if r == bad_rank else rank_data(r, 4, np.int64))
    with comm.expose(rank_data(r, 4, np.int64)) as win:  # nothing left half-entered
        got = win.get((r + 1) % p, 1, 2)
        comm.Barrier()
    assert np.array_equal(got, rank_data((r + 1) % p, 4, np.int64)[1:3])


@pytest.mark.mpi(min_size=2)
def test_expose_names_every_bad_rank(comm):
    r, p = comm.rank, comm.size
    bad = {0: [0.5], p - 1: np.zeros(8, np.int64)[::2]}
    with pytest.raises(ValueError, match=rf"expose: rank 0: buf must be an array or a buffer .*; rank {p - 1}: buf is not C-contig"):
        comm.expose(bad.get(r, rank_data(r, 4, np.int64)))


# ---------------------------------------------------------------- freeing


@pytest.mark.mpi
def test_free_is_collective_and_idempotent(comm):
    r, p = comm.rank, comm.size
    with comm.expose(rank_data(r, 3, np.float32)) as win:
        got = win.get((r + 1) % p)
        comm.Barrier()
    assert win.win == MPI.WIN_NULL  # the with block freed it
    win.Free()  # a second Free is a no-op
    other = comm.expose(rank_data(r, 3, np.float32))
    assert other.win != MPI.WIN_NULL
    other.Free()
    other.Free()
    assert other.win == MPI.WIN_NULL
    assert np.array_equal(got, rank_data((r + 1) % p, 3, np.float32))


@pytest.mark.mpi
def test_window_is_exported(comm):
    with comm.expose(np.zeros(2, np.int64)) as win:
        assert isinstance(win, mpicomm.Window)
        where = "host mirror" if win.staged else "in place"
        assert repr(win) == f"<mpicomm.Window int64 sizes={[2] * comm.size} ({where})>"
