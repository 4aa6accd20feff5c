"""mpicomm.transport.buffers: array checks, dtype mappings, element views, the staging pool and transfer paths."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from mpicomm.transport import buffers
from mpicomm.transport.buffers import (
    DTYPES,
    HostPool,
    array_module,
    check_array,
    cuda_aware,
    dtype_code,
    dtype_from_code,
    element_view,
    mpi_datatype,
    numpy_dtype,
    ops_for,
    recv_buffer,
    send_buffer,
    transfer_path,
)

from ..conftest import rank_data

ROUND_TRIP_DTYPES = [np.float64, np.int32, np.uint8, np.bool_, np.complex128, np.float16, np.longdouble]


def host(a) -> np.ndarray:
    """A NumPy copy of a NumPy or CuPy array (for comparisons)."""
    return a if isinstance(a, np.ndarray) else a.get()


@pytest.fixture
def default_env(monkeypatch):
    """No transfer or CUDA-awareness override from the caller's environment."""
    monkeypatch.delenv("MPICOMM_TRANSFER", raising=False)
    monkeypatch.delenv("MPICOMM_CUDA_AWARE", raising=False)


# ---------------------------------------------------------------- array_module


def test_array_module_numpy():
    assert array_module(np.zeros(3)) is np
    assert array_module(np.zeros((2, 3), np.int8)) is np
    assert array_module(np.array(1.0)) is np  # 0-d
    assert array_module(np.zeros(0)) is np  # 0-size


@pytest.mark.parametrize(
    "value, type_name",
    [([1, 2, 3], "list"), (b"abc", "bytes"), (memoryview(b"abc"), "memoryview"), (None, "NoneType")],
    ids=["list", "bytes", "memoryview", "None"],
)
def test_array_module_rejects_non_arrays_naming_the_type(value, type_name):
    with pytest.raises(TypeError) as info:
        array_module(value)
    message = str(info.value)
    assert type_name in message
    assert "numpy.asarray" in message  # the fix


def test_array_module_cupy(xp):
    assert array_module(xp.zeros(3)) is xp


# ---------------------------------------------------------------- check_array


def test_check_array_accepts_supported_arrays():
    for dt in DTYPES:
        assert check_array(np.zeros(4, dt), "buf") is np
    assert check_array(np.zeros((2, 3)), "buf", writable=True) is np
    assert check_array(np.array(2.5), "buf", writable=True) is np  # 0-d
    assert check_array(np.zeros(0), "buf", writable=True) is np  # 0-size
    assert check_array(np.zeros((3, 0, 2)), "buf", writable=True) is np
    assert check_array(np.zeros(3, np.longlong), "buf") is np  # an alias of int64
    readonly = np.zeros(3)
    readonly.flags.writeable = False
    assert check_array(readonly, "buf") is np  # read-only is fine to send


def test_check_array_python_list():
    with pytest.raises(TypeError) as info:
        check_array([1.0, 2.0], "recvbuf")
    message = str(info.value)
    assert message.startswith("recvbuf must be a NumPy or CuPy array")
    assert "list" in message
    assert "numpy.asarray(recvbuf)" in message


@pytest.mark.parametrize(
    "make",
    [
        lambda xp: xp.arange(10.0)[::2],
        lambda xp: xp.zeros((4, 6))[:, 1:3],
        lambda xp: xp.asfortranarray(xp.zeros((3, 4))),
        lambda xp: xp.zeros((4, 4)).T,
    ],
    ids=["step-slice", "column-slice", "fortran-2d", "transpose"],
)
def test_check_array_not_c_contiguous(make, xp):
    x = make(xp)
    with pytest.raises(ValueError) as info:
        check_array(x, "recvbuf", writable=True)
    message = str(info.value)
    assert message.startswith("recvbuf is not C-contiguous")
    assert str(tuple(x.shape)) in message
    assert f"{xp.__name__}.ascontiguousarray(recvbuf)" in message


def test_check_array_read_only_when_writable():
    x = np.zeros(5)
    x.flags.writeable = False
    with pytest.raises(ValueError) as info:
        check_array(x, "recvbuf", writable=True)
    message = str(info.value)
    assert "recvbuf is read-only" in message
    assert "recvbuf.copy()" in message
    # a read-only view of a writable array is read-only too
    base = np.zeros(5)
    view = base[:]
    view.flags.writeable = False
    with pytest.raises(ValueError, match="recvbuf is read-only"):
        check_array(view, "recvbuf", writable=True)


@pytest.mark.parametrize(
    "dtype",
    [
        np.dtype(object),
        np.dtype([("a", np.float64), ("b", np.int32)]),
        np.dtype("datetime64[s]"),
        np.dtype("timedelta64[ms]"),
        np.dtype("U4"),
        np.dtype("S4"),
        np.dtype("V8"),
    ],
    ids=["object", "structured", "datetime64", "timedelta64", "unicode", "bytes", "void"],
)
def test_check_array_unsupported_dtype(dtype):
    x = np.zeros(3, dtype)
    with pytest.raises(TypeError) as info:
        check_array(x, "sendbuf")
    message = str(info.value)
    assert message.startswith(f"sendbuf has dtype {dtype}")
    assert "supported:" in message
    for dt in DTYPES:  # lists what it does move
        assert str(dt) in message


@pytest.mark.parametrize("code", [">f8", ">i4", ">c16", ">u2"] if np.little_endian else ["<f8", "<i4", "<c16", "<u2"])
def test_check_array_byte_swapped_dtype(code):
    x = np.zeros(4, np.dtype(code))
    assert not x.dtype.isnative
    with pytest.raises(TypeError) as info:
        check_array(x, "sendbuf")
    message = str(info.value)
    assert "sendbuf" in message
    assert "byte order" in message
    assert x.dtype.str in message
    assert "sendbuf.astype(sendbuf.dtype.newbyteorder('='))" in message
    # the suggested fix works
    fixed = x.astype(x.dtype.newbyteorder("="))
    assert check_array(fixed, "sendbuf") is np


def test_check_array_dtype_is_checked_before_layout():
    x = np.zeros((3, 4), ">f8", order="F")
    with pytest.raises(TypeError, match="byte order"):
        check_array(x, "buf")


# ---------------------------------------------------------------- dtype mappings


def test_dtypes_are_unique_and_native():
    assert len(set(DTYPES)) == len(DTYPES) == 16
    assert all(dt.isnative for dt in DTYPES)


@pytest.mark.parametrize("dtype", DTYPES, ids=[str(d) for d in DTYPES])
def test_dtype_code_round_trip(dtype):
    code = dtype_code(dtype)
    assert isinstance(code, int)
    assert 0 <= code < len(DTYPES)
    assert DTYPES[code] == dtype
    assert dtype_from_code(code) == dtype
    assert dtype_code(dtype.type) == code  # scalar types are accepted too
    assert dtype_code(dtype.str) == code


@pytest.mark.parametrize("dtype", DTYPES, ids=[str(d) for d in DTYPES])
def test_mpi_datatype_round_trip(dtype):
    datatype = mpi_datatype(dtype)
    assert isinstance(datatype, MPI.Datatype)
    assert datatype != MPI.DATATYPE_NULL
    assert datatype.Get_size() == dtype.itemsize
    assert numpy_dtype(datatype) == dtype


def test_dtype_codes_are_distinct():
    assert sorted(dtype_code(dt) for dt in DTYPES) == list(range(len(DTYPES)))


@pytest.mark.parametrize("code", [-1, len(DTYPES), len(DTYPES) + 100, -1000])
def test_dtype_from_code_out_of_range(code):
    with pytest.raises(ValueError) as info:
        dtype_from_code(code)
    message = str(info.value)
    assert str(code) in message
    assert f"0..{len(DTYPES) - 1}" in message


@pytest.mark.parametrize("dtype", [object, "datetime64[s]", ">f8", [("a", "f8")]])
def test_dtype_code_of_unsupported_dtype(dtype):
    with pytest.raises(TypeError, match="supported"):
        dtype_code(dtype)


def test_mpi_datatype_of_unsupported_dtype():
    with pytest.raises(TypeError, match="no MPI datatype"):
        mpi_datatype(object)


# ---------------------------------------------------------------- element_view


def test_element_view_is_a_view():
    x = np.arange(12.0).reshape(3, 4)
    v = element_view(x, 5, 4)
    assert v.shape == (4,)
    assert np.array_equal(v, [5.0, 6.0, 7.0, 8.0])
    assert np.shares_memory(v, x)
    v[:] = -1
    assert np.array_equal(x.reshape(-1)[5:9], [-1, -1, -1, -1])  # writes show through
    x[2, 0] = 99
    assert v[3] == 99  # and the other way


def test_element_view_whole_and_empty():
    x = np.arange(6, dtype=np.int32)
    whole = element_view(x, 0, 6)
    assert np.shares_memory(whole, x) and np.array_equal(whole, x)
    empty = element_view(x, 6, 0)  # empty at the end is in bounds
    assert empty.size == 0 and empty.dtype == x.dtype
    assert element_view(x, 3, 0).size == 0


def test_element_view_0d():
    x = np.array(4.5)
    v = element_view(x, 0, 1)
    assert v.shape == (1,) and v[0] == 4.5
    assert np.shares_memory(v, x)
    v[0] = 7.0
    assert x[()] == 7.0
    with pytest.raises(ValueError, match="which has 1 elements"):
        element_view(x, 1, 1)


def test_element_view_0_size():
    x = np.zeros((3, 0))
    assert element_view(x, 0, 0).size == 0
    with pytest.raises(ValueError, match="which has 0 elements"):
        element_view(x, 0, 1)


@pytest.mark.parametrize("offset, count", [(-1, 2), (-5, 0), (0, 11), (8, 3), (10, 1), (11, 0), (2, -1)])
def test_element_view_out_of_bounds(offset, count):
    x = np.arange(10.0)
    with pytest.raises(ValueError) as info:
        element_view(x, offset, count, "weights")
    message = str(info.value)
    assert "weights" in message
    assert "10 elements" in message
    assert f"[{offset}, {offset + count})" in message


def test_element_view_cupy(xp):
    x = xp.arange(10, dtype=xp.float32)
    v = element_view(x, 2, 3)
    v[:] = 0
    assert np.array_equal(host(x), [0, 1, 0, 0, 0, 5, 6, 7, 8, 9])


# ---------------------------------------------------------------- HostPool


class CountingAlloc:
    def __init__(self):
        self.sizes = []

    def __call__(self, nbytes):
        self.sizes.append(nbytes)
        return np.empty(nbytes, np.uint8)


@pytest.mark.parametrize(
    "nbytes, expected",
    [(0, 4096), (1, 4096), (100, 4096), (4095, 4096), (4096, 4096), (4097, 8192), (8192, 8192),
     (8193, 16384), (1 << 20, 1 << 20), ((1 << 20) + 1, 1 << 21), (8_000_000, 1 << 23)],
)
def test_host_pool_size_class(nbytes, expected):
    cls = HostPool.size_class(nbytes)
    assert cls == expected
    assert cls >= max(nbytes, HostPool.MIN_BYTES)
    assert cls & (cls - 1) == 0  # a power of two


def test_host_pool_minimum():
    assert HostPool.MIN_BYTES == 4096
    assert all(HostPool.size_class(n) >= 4096 for n in range(0, 5000, 7))


def test_host_pool_buffers_are_large_enough():
    alloc = CountingAlloc()
    pool = HostPool(alloc)
    for n in (0, 1, 4096, 4097, 10_000, 123_457, 1 << 20):
        buf = pool.acquire(n)
        assert isinstance(buf, np.ndarray) and buf.dtype == np.uint8
        assert buf.nbytes >= n
        assert buf.nbytes == HostPool.size_class(n)
        pool.release(buf)
    assert all(s & (s - 1) == 0 and s >= 4096 for s in alloc.sizes)


def test_host_pool_reuse():
    alloc = CountingAlloc()
    pool = HostPool(alloc)
    a = pool.acquire(5000)
    assert pool.allocated == 1
    pool.release(a)
    b = pool.acquire(6000)  # same size class (8 KiB)
    assert b is a
    assert pool.allocated == 1
    pool.release(b)
    for _ in range(10):  # steady state allocates nothing
        pool.release(pool.acquire(8000))
    assert pool.allocated == 1 and alloc.sizes == [8192]


def test_host_pool_outstanding_buffers_are_distinct():
    pool = HostPool(CountingAlloc())
    a, b = pool.acquire(100), pool.acquire(100)
    assert a is not b and not np.shares_memory(a, b)
    assert pool.allocated == 2
    pool.release(a)
    pool.release(b)
    c, d = pool.acquire(1), pool.acquire(4096)
    assert {id(c), id(d)} == {id(a), id(b)}
    assert pool.allocated == 2
    other = pool.acquire(4097)  # a different class is a new buffer
    assert other.nbytes == 8192 and pool.allocated == 3


def test_host_pool_clear():
    pool = HostPool(CountingAlloc())
    pool.release(pool.acquire(10))
    pool.clear()
    pool.acquire(10)
    assert pool.allocated == 2


# ---------------------------------------------------------------- settings: transfer path and CUDA-awareness


def test_transfer_path_numpy_default(default_env):
    assert transfer_path(np.zeros(3)) == "direct"
    assert transfer_path(np.zeros(0)) == "direct"


@pytest.mark.parametrize("value", ["auto", "AUTO", " auto ", ""])
def test_transfer_path_auto(value, monkeypatch):
    monkeypatch.delenv("MPICOMM_CUDA_AWARE", raising=False)
    monkeypatch.setenv("MPICOMM_TRANSFER", value)
    assert transfer_path(np.zeros(3)) == "direct"


def test_transfer_path_staged(staged):
    assert transfer_path(np.zeros(3)) == "staged"
    assert transfer_path(np.array(1.0)) == "staged"


@pytest.mark.parametrize("value", ["Staged", "STAGED"])
def test_transfer_mode_is_case_insensitive(value, monkeypatch):
    monkeypatch.setenv("MPICOMM_TRANSFER", value)
    assert transfer_path(np.zeros(3)) == "staged"


def test_transfer_path_cupy(xp, monkeypatch):
    monkeypatch.delenv("MPICOMM_TRANSFER", raising=False)
    x = xp.zeros(3)
    monkeypatch.setenv("MPICOMM_CUDA_AWARE", "1")
    assert transfer_path(x) == "direct"
    monkeypatch.setenv("MPICOMM_CUDA_AWARE", "0")
    assert transfer_path(x) == ("direct" if xp is np else "staged")
    monkeypatch.setenv("MPICOMM_TRANSFER", "staged")
    monkeypatch.setenv("MPICOMM_CUDA_AWARE", "1")
    assert transfer_path(x) == "staged"


@pytest.mark.parametrize("value", ["direct", "yes", "1", "gpu"])
def test_bad_transfer_setting_is_named(value, monkeypatch):
    monkeypatch.setenv("MPICOMM_TRANSFER", value)
    with pytest.raises(ValueError) as info:
        transfer_path(np.zeros(3))
    message = str(info.value)
    assert "MPICOMM_TRANSFER" in message
    assert repr(value) in message
    assert "auto" in message and "staged" in message
    with pytest.raises(ValueError, match="MPICOMM_TRANSFER"):
        send_buffer(np.zeros(3))


@pytest.mark.parametrize("value", ["2", "maybe", "on"])
def test_bad_cuda_aware_setting_is_named(value, monkeypatch):
    monkeypatch.setenv("MPICOMM_CUDA_AWARE", value)
    with pytest.raises(ValueError) as info:
        cuda_aware()
    message = str(info.value)
    assert "MPICOMM_CUDA_AWARE" in message
    assert repr(value) in message


@pytest.mark.parametrize("value, expected", [("1", True), ("0", False), ("yes", True), ("no", False),
                                             ("TRUE", True), ("false", False)])
def test_cuda_aware_forced(value, expected, monkeypatch):
    monkeypatch.setenv("MPICOMM_CUDA_AWARE", value)
    assert cuda_aware() is expected


@pytest.mark.parametrize("value", [None, "auto", ""])
def test_cuda_aware_default_asks_the_library(value, monkeypatch):
    if value is None:
        monkeypatch.delenv("MPICOMM_CUDA_AWARE", raising=False)
    else:
        monkeypatch.setenv("MPICOMM_CUDA_AWARE", value)
    answer = cuda_aware()
    assert isinstance(answer, bool)
    assert answer is buffers.library_cuda_support()


def test_library_cuda_support_is_a_bool():
    answer = buffers.library_cuda_support()
    assert isinstance(answer, bool)
    if "pypi.org/p/mpich" in MPI.Get_library_version().lower():
        assert answer is False  # the PyPI MPICH wheel is built without CUDA


# ---------------------------------------------------------------- send_buffer / recv_buffer


def test_direct_buffers_hand_mpi_the_array(default_env):
    x = np.arange(6, dtype=np.int16)
    for make in (send_buffer, recv_buffer):
        t = make(x)
        obj, nbytes, datatype = t.buf
        assert obj is x
        assert nbytes == x.nbytes
        assert datatype == MPI.BYTE
        assert t.finish() is None  # nothing to do


@pytest.mark.parametrize("dtype", DTYPES, ids=[str(d) for d in DTYPES])
def test_staged_send_buffer(dtype, staged):
    pool = ops_for(np).pool
    x = rank_data(3, 37, dtype).reshape(37, 1)
    t = send_buffer(x)
    raw, nbytes, datatype = t.buf
    assert datatype == MPI.BYTE and nbytes == x.nbytes
    assert isinstance(raw, np.ndarray) and raw.dtype == np.uint8
    assert raw.nbytes >= x.nbytes and raw.nbytes == HostPool.size_class(x.nbytes)
    assert not np.shares_memory(raw, x)  # MPI reads a different memory ...
    assert raw[:nbytes].tobytes() == x.tobytes()  # ... holding a copy
    allocated = pool.allocated
    t.finish()
    again = send_buffer(x)  # the buffer went back to the pool
    assert again.buf[0] is raw
    assert pool.allocated == allocated
    again.finish()


@pytest.mark.parametrize("dtype", DTYPES, ids=[str(d) for d in DTYPES])
def test_staged_recv_buffer(dtype, staged):
    pool = ops_for(np).pool
    expected = rank_data(5, 24, dtype).reshape(2, 3, 4)
    x = np.zeros_like(expected)
    t = recv_buffer(x)
    raw, nbytes, datatype = t.buf
    assert datatype == MPI.BYTE and nbytes == x.nbytes
    assert not np.shares_memory(raw, x)
    raw[:nbytes] = np.frombuffer(expected.tobytes(), np.uint8)  # what MPI would write
    assert not x.any()  # not there yet
    allocated = pool.allocated
    t.finish()  # copies back
    assert np.array_equal(x, expected)
    assert x.dtype == expected.dtype
    t2 = recv_buffer(x)
    assert t2.buf[0] is raw  # the pool got its buffer back
    assert pool.allocated == allocated
    t2.finish()


@pytest.mark.parametrize("shape", [(), (0,), (4, 0)], ids=["0-d", "0-size", "0-size-2d"])
def test_staged_buffers_for_0d_and_empty_arrays(shape, staged):
    x = np.full(shape, 2.5)
    t = send_buffer(x)
    assert t.buf[1] == x.nbytes
    assert t.buf[0][: x.nbytes].tobytes() == x.tobytes()
    t.finish()
    y = np.zeros(shape)
    t = recv_buffer(y)
    t.buf[0][: y.nbytes] = np.frombuffer(x.tobytes(), np.uint8)
    t.finish()
    assert np.array_equal(y, x)


def test_staged_pool_reuse_steady_state(staged):
    pool = ops_for(np).pool
    x = np.arange(3000.0)  # 24000 bytes -> 32 KiB class
    for _ in range(2):  # warm up: one send and one receive buffer of the class
        s, r = send_buffer(x), recv_buffer(np.empty_like(x))
        s.finish()
        r.finish()
    allocated = pool.allocated
    for _ in range(20):
        s, r = send_buffer(x), recv_buffer(np.empty_like(x))
        assert s.buf[0] is not r.buf[0]  # two live buffers never alias
        s.finish()
        r.finish()
    assert pool.allocated == allocated


def test_staged_buffers_cupy(xp, staged):
    x = rank_data(1, 100, np.float32, xp)
    t = send_buffer(x)
    assert isinstance(t.buf[0], np.ndarray)  # host memory
    assert t.buf[0][: x.nbytes].tobytes() == host(x).tobytes()
    t.finish()
    y = xp.zeros(100, np.float32)
    t = recv_buffer(y)
    t.buf[0][: y.nbytes] = np.frombuffer(host(x).tobytes(), np.uint8)
    t.finish()
    assert np.array_equal(host(y), host(x))


# ---------------------------------------------------------------- MPI round trips through the staged path


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", ROUND_TRIP_DTYPES, ids=[np.dtype(d).name for d in ROUND_TRIP_DTYPES])
def test_staged_ring_sendrecv(comm, dtype, staged):
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    x = rank_data(comm.rank, 1000, dtype).reshape(10, 100)
    status = MPI.Status()
    got = comm.sendrecv_array(x, right, left, sendtag=7, recvtag=7, status=status)
    assert got.dtype == np.dtype(dtype) and got.shape == (10, 100)
    assert np.array_equal(got, rank_data(left, 1000, dtype).reshape(10, 100))
    assert (status.Get_source(), status.Get_tag()) == (left, 7)
    assert status.Get_count(mpi_datatype(dtype)) == 1000


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", ROUND_TRIP_DTYPES, ids=[np.dtype(d).name for d in ROUND_TRIP_DTYPES])
def test_staged_ring_isend_recv_into_buffer(comm, dtype, staged):
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    n = 300_000 if np.dtype(dtype).itemsize >= 8 else 5_000  # large ones go past the eager limit
    x = rank_data(comm.rank, n, dtype)
    request = comm.isend_array(x, right, tag=3)
    buf = np.zeros(n, dtype)
    got = comm.recv_array(buf, source=left, tag=3)
    request.Wait()
    assert got is buf
    assert np.array_equal(buf, rank_data(left, n, dtype))
    assert np.array_equal(x, rank_data(comm.rank, n, dtype))  # the send left its array alone


@pytest.mark.mpi
@pytest.mark.parametrize("shape", [(), (0,), (3, 0), (1,), (2, 3, 4)], ids=["0-d", "0-size", "0-size-2d", "1", "3-d"])
def test_staged_ring_shapes(comm, shape, staged):
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    count = int(np.prod(shape, dtype=np.int64))
    x = rank_data(comm.rank, count, np.int64).reshape(shape)
    got = comm.sendrecv_array(x, right, left, sendtag=11, recvtag=11)
    assert got.shape == shape and got.dtype == np.int64
    assert np.array_equal(got, rank_data(left, count, np.int64).reshape(shape))


@pytest.mark.mpi
def test_staged_round_trip_reuses_the_pool(comm, staged):
    pool = ops_for(np).pool
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    x = rank_data(comm.rank, 20_000, np.float64)

    def exchange():
        request = comm.isend_array(x, right, tag=21)
        got = comm.recv_array(source=left, tag=21)
        request.Wait()
        return got

    # at most two staging buffers of this size class are ever live at once (one send, one receive), so
    # however the steps interleave, ten exchanges allocate at most two: the others come from the pool
    allocated = pool.allocated
    for _ in range(10):
        assert np.array_equal(exchange(), rank_data(left, 20_000, np.float64))
    assert pool.allocated - allocated <= 2


@pytest.mark.mpi
def test_staged_and_direct_ranks_interoperate(comm, monkeypatch):
    """The path is a local choice: a staged sender and a direct receiver agree on the bytes."""
    if comm.rank % 2:
        monkeypatch.setenv("MPICOMM_TRANSFER", "staged")
    else:
        monkeypatch.delenv("MPICOMM_TRANSFER", raising=False)
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    x = rank_data(comm.rank, 4000, np.complex64)
    got = comm.sendrecv_array(x, right, left, sendtag=5, recvtag=5)
    assert np.array_equal(got, rank_data(left, 4000, np.complex64))


@pytest.mark.mpi
def test_staged_ring_cupy(comm, xp, staged):
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    x = rank_data(comm.rank, 5000, np.float32, xp)
    got = comm.sendrecv_array(x, right, left, sendtag=9, recvtag=9)
    assert array_module(got) is xp
    assert np.array_equal(host(got), host(rank_data(left, 5000, np.float32)))
    buf = xp.zeros(5000, np.float32)
    request = comm.isend_array(x, right, tag=10)
    comm.recv_array(buf, source=left, tag=10)
    request.Wait()
    assert np.array_equal(host(buf), host(rank_data(left, 5000, np.float32)))


# ---------------------------------------------------------------- overlap of send and receive buffers


def test_overlap_tells_disjoint_same_and_partial_apart():
    big = np.arange(10.0)
    assert buffers.overlap(big[:4], big[4:8]) is None  # neighbours in one array
    assert buffers.overlap(big[:4], big[2:6]) == "partial"
    assert buffers.overlap(big[:4], big[:4].view()) == "same"
    assert buffers.overlap(big, big) == "same"
    assert buffers.overlap(np.zeros(3), np.zeros(3)) is None  # two owners
    assert buffers.overlap(big[:0], big) is None and buffers.overlap(None, big) is None  # empty: nothing shared
    shared = np.frombuffer(bytearray(80))  # not its own memory owner: compared by address
    assert buffers.overlap(shared[:4], shared[3:7]) == "partial"
    assert buffers.overlap(big.view(np.uint8)[:9], big[1:2]) == "partial"  # byte ranges, not elements


def test_byte_range_is_the_arrays_bytes():
    x = np.arange(6, dtype=np.int32)
    start, end = buffers.byte_range(x[2:5])
    assert start == x.__array_interface__["data"][0] + 8 and end - start == 12


def test_overlap_on_the_device(xp):
    if xp is np:
        pytest.skip("the device case (NumPy is covered above)")
    big = xp.arange(10.0)
    assert buffers.overlap(big[:4], big[2:6]) == "partial" and buffers.overlap(big[:4], big[4:8]) is None
