"""mpicomm.transport.specs: mpi4py buffer specs read into flat arrays, counts and displacements (no communication)."""

from __future__ import annotations

import array

import numpy as np
import pytest
from mpi4py import MPI

from mpicomm.ops import pair_dtype
from mpicomm.transport import specs
from mpicomm.transport.specs import Unsupported, block, block_counts, is_in_place, simple, vector, writable


def shares(flat, buf) -> bool:
    return np.shares_memory(flat, np.asarray(buf))


# ---------------------------------------------------------------- simple


def test_bare_array_is_its_whole_buffer_flat_without_copy():
    x = np.arange(12.0).reshape(3, 4)
    b = simple(x, "sendbuf")
    assert b.xp is np and b.count == 12 and b.dtype == np.float64 and b.array.shape == (12,)
    assert shares(b.array, x)
    b.array[5] = -1
    assert x[1, 1] == -1


def test_plain_arrays_take_the_short_path_and_read_the_same():
    x = np.arange(12.0).reshape(3, 4)
    flat = specs.plain(x)
    assert flat is not None and flat.shape == (12,) and shares(flat, x)
    assert flat.tolist() == simple(x, "buf").array.tolist()
    readonly = np.frombuffer(np.arange(4.0).tobytes())
    assert specs.plain(readonly) is not None  # writability is the reader's check (writable())
    for other in (x[:, ::2],                                  # not contiguous
                  np.arange(4.0).astype(">f8"),               # not native byte order
                  np.zeros(2, pair_dtype(np.float64)),        # structured
                  np.zeros(2, object),                        # not an element type mpicomm moves
                  np.ma.masked_array(np.arange(3.0)),         # a subclass
                  [x, 4], bytearray(8), None, MPI.IN_PLACE):
        assert specs.plain(other) is None, other


def test_count_takes_the_first_elements():
    x = np.arange(10, dtype=np.int32)
    b = simple([x, 4], "sendbuf")
    assert b.count == 4 and b.array.tolist() == [0, 1, 2, 3] and shares(b.array, x)
    assert simple([x, 0], "sendbuf").count == 0
    assert simple((x, np.int64(10)), "sendbuf").count == 10  # tuples and NumPy integers too


@pytest.mark.parametrize("datatype", [MPI.INT, "i", "int32"], ids=["MPI.INT", "i", "int32"])
def test_datatype_reinterprets_the_bytes(datatype):
    x = np.arange(4, dtype=np.float64)
    b = simple([x, datatype], "recvbuf")
    assert b.dtype == np.int32 and b.count == 8 and shares(b.array, x)


def test_count_and_datatype():
    x = np.zeros(16, np.uint8)
    b = simple([x, 3, MPI.FLOAT], "buf")
    assert b.dtype == np.float32 and b.count == 3 and shares(b.array, x)
    b = simple([x, 2, "d"], "buf")
    assert b.dtype == np.float64 and b.count == 2
    b = simple([np.arange(6.0), 6, MPI.DOUBLE], "buf")
    assert b.array.tolist() == list(range(6))


@pytest.mark.parametrize("code,dtype", [("d", np.float64), ("f", np.float32), ("i", np.int32), ("b", np.int8),
                                        ("B", np.uint8), ("q", np.int64), ("F", np.complex64), ("?", np.bool_)])
def test_typecode_strings(code, dtype):
    b = simple([bytearray(32), code], "buf")
    assert b.dtype == np.dtype(dtype) and b.count == 32 // np.dtype(dtype).itemsize


def test_bytearray_and_array_array():
    ba = bytearray(b"\x01\x02\x03\x04")
    b = simple(ba, "buf")
    assert b.xp is np and b.dtype == np.uint8 and b.array.tolist() == [1, 2, 3, 4]
    b.array[0] = 9
    assert ba[0] == 9  # a view, not a copy
    a = array.array("d", [1.5, 2.5, 3.5])
    b = simple(a, "buf")
    assert b.dtype == np.float64 and b.array.tolist() == [1.5, 2.5, 3.5]
    b.array[1] = 0
    assert a[1] == 0
    assert simple(array.array("i", [1, 2]), "buf").dtype == np.int32
    assert simple([array.array("i", [1, 2, 3]), 2], "buf").array.tolist() == [1, 2]
    assert simple([bytearray(16), MPI.DOUBLE], "buf").count == 2
    assert simple(memoryview(bytearray(6)), "buf").count == 6


def test_read_only_buffers_read_but_are_not_writable():
    b = simple(b"abcd", "sendbuf")
    assert b.count == 4
    with pytest.raises(ValueError, match="recvbuf is read-only; a receive buffer must be writable"):
        writable(simple(b"abcd", "recvbuf"), "recvbuf")
    x = np.zeros(3)
    x.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        writable(simple(x, "recvbuf"), "recvbuf")
    assert writable(simple(np.zeros(3), "recvbuf"), "recvbuf").count == 3


def test_pair_dtype_arrays_are_moved():
    x = np.zeros(5, pair_dtype(np.float64))
    b = simple(x, "sendbuf")
    assert b.dtype == x.dtype and b.count == 5


def test_zero_size_and_scalar_arrays():
    assert simple(np.zeros(0), "buf").count == 0
    assert simple(np.float64(3.0).reshape(()), "buf").count == 1
    assert simple(np.zeros((2, 0, 3)), "buf").count == 0


@pytest.mark.parametrize("spec,kind,fragment", [
    ([np.zeros(3), 4], ValueError, "sendbuf count 4 is more than the buffer's 3 elements of float64"),
    ([np.zeros(3), -1], ValueError, "sendbuf count is -1; counts are >= 0"),
    ([np.zeros(3), True], TypeError, "sendbuf count must be an integer, got True"),
    ([np.zeros(3), 2.0], TypeError, "sendbuf count must be an integer, got 2.0"),
    ([np.zeros(3), 1, MPI.DOUBLE, 0], TypeError, "got a sequence of 4"),
    ([np.zeros(3)], TypeError, "got a sequence of 1"),
    ([np.zeros(3), "zz"], TypeError, "datatype 'zz' is not a NumPy type code"),
    ([np.zeros(3), 1, 3.5], TypeError, "expected an MPI.Datatype or a type code, got 3.5"),
    ([np.zeros(3), MPI.DATATYPE_NULL], TypeError, "MPI.DATATYPE_NULL"),
    ([bytearray(7), "d"], ValueError, "sendbuf has 7 bytes, not a whole number of float64 elements (8 bytes)"),
    (np.zeros(3, ">f8"), TypeError, "non-native byte order"),
    (np.zeros((4, 4))[:, 1], ValueError, "sendbuf is not C-contiguous (shape (4,), strides (32,))"),
    (np.zeros((4, 4)).T, ValueError, "not C-contiguous"),
    ({"a": 1}, TypeError, "sendbuf must be an array or a buffer (NumPy, CuPy, DLPack, __cuda_array_interface__, bytearray...), got dict"),
    ([1.0, 2.0], TypeError, "got float"),
    (3, TypeError, "got int"),
    ("abc", TypeError, "got str"),
    (None, TypeError, "got NoneType"),
])
def test_simple_errors(spec, kind, fragment):
    with pytest.raises(kind) as info:
        simple(spec, "sendbuf")
    assert fragment in str(info.value)
    assert not isinstance(info.value, Unsupported)


# ---------------------------------------------------------------- Unsupported: handed to the MPI library


def test_unsupported_specs_say_why():
    vec = MPI.DOUBLE.Create_vector(2, 1, 2)
    vec.Commit()
    try:
        with pytest.raises(Unsupported, match="not contiguous"):
            simple([np.zeros(4), 1, vec], "sendbuf")
    finally:
        vec.Free()
    resized = MPI.DOUBLE.Create_resized(0, 16)
    resized.Commit()
    try:
        with pytest.raises(Unsupported, match="has no NumPy equivalent|not contiguous"):
            simple([np.zeros(4), 2, resized], "sendbuf")
    finally:
        resized.Free()
    with pytest.raises(Unsupported, match="MPI.BOTTOM"):
        simple(MPI.BOTTOM, "sendbuf")
    with pytest.raises(Unsupported, match=r"\(count, displacement\)"):
        simple([np.zeros(4), (2, 1), MPI.DOUBLE], "sendbuf")
    with pytest.raises(Unsupported, match="element type <U1 is not one mpicomm moves"):
        simple(np.zeros(3, "U1"), "sendbuf")  # mpi4py maps it: the library takes it
    with pytest.raises(Unsupported, match="MPI_DOUBLE_INT is not contiguous"):
        simple([np.zeros(6), MPI.DOUBLE_INT], "sendbuf")  # a datatype given: the library takes it
    assert issubclass(Unsupported, Exception) and not issubclass(Unsupported, (TypeError, ValueError))


@pytest.mark.parametrize("dtype", ["U3", "S2", "O", [("a", "f8"), ("b", "f8")], [("value", "f8"), ("index", "i4")]])
def test_element_types_nobody_maps_are_an_argument_error(dtype):
    """Neither mpicomm nor mpi4py moves them without a datatype: a problem on this rank, not a library call
    (which raised ``KeyError`` on that rank only, while the others waited in the library)."""
    with pytest.raises(TypeError, match=r"neither mpicomm nor the MPI library moves without a datatype; "
                                        r"convert it with \.astype\(\) to a numeric type, or give the MPI datatype"):
        simple(np.zeros(3, dtype), "sendbuf")


def test_a_contiguous_derived_type_with_a_numpy_equivalent_is_run():
    dup = MPI.DOUBLE.Dup()
    try:
        b = simple([np.arange(4.0), dup], "sendbuf")
        assert b.dtype == np.float64 and b.count == 4
    finally:
        dup.Free()


# ---------------------------------------------------------------- vector


def test_vector_bare_buffer_splits_equally():
    v = vector(np.arange(6.0), "recvbuf", 3)
    assert v.counts == (2, 2, 2) and v.displs == (0, 2, 4) and v.count == 6
    with pytest.raises(ValueError, match="recvbuf has 7 elements, not divisible among 3 ranks; give counts"):
        vector(np.arange(7.0), "recvbuf", 3)


@pytest.mark.parametrize("spec,counts,displs", [
    ([np.arange(6.0), [2, 1, 3]], (2, 1, 3), (0, 2, 3)),
    ([np.arange(6.0), (2, 1, 3)], (2, 1, 3), (0, 2, 3)),
    ([np.arange(6.0), np.array([2, 1, 3])], (2, 1, 3), (0, 2, 3)),
    ([np.arange(6.0), [0, 0, 0]], (0, 0, 0), (0, 0, 0)),
    ([np.arange(6.0), None], (2, 2, 2), (0, 2, 4)),
    ([np.arange(6.0), 1], (1, 1, 1), (0, 1, 2)),
    ([np.arange(6.0), ([2, 1, 3], [4, 0, 1])], (2, 1, 3), (4, 0, 1)),
    ([np.arange(6.0), ([2, 1, 3], None)], (2, 1, 3), (0, 2, 3)),
    ([np.arange(6.0), [1, 1, 1], [5, 3, 0]], (1, 1, 1), (5, 3, 0)),
    ([np.arange(6.0), [1, 1, 1], None], (1, 1, 1), (0, 1, 2)),
    ([np.arange(6.0), [2, 1, 3], [4, 0, 1], MPI.DOUBLE], (2, 1, 3), (4, 0, 1)),
    ([np.arange(6.0), [2, 1, 3], MPI.DOUBLE], (2, 1, 3), (0, 2, 3)),
    ([np.arange(6.0), ([2, 1, 3], [4, 0, 1]), "d"], (2, 1, 3), (4, 0, 1)),
    ([np.arange(6.0), MPI.DOUBLE], (2, 2, 2), (0, 2, 4)),
    # mpi4py's reading: a last None in [buf, counts, None] and [buf, counts, displs, None] is the datatype, inferred
    ([np.arange(6.0), ([2, 1, 3], None), None], (2, 1, 3), (0, 2, 3)),
    ([np.arange(6.0), ([2, 1, 3], [4, 0, 1]), None], (2, 1, 3), (4, 0, 1)),
    ([np.arange(6.0), [2, 1, 3], [4, 0, 1], None], (2, 1, 3), (4, 0, 1)),
    ([np.arange(6.0), 1, None, None], (1, 1, 1), (0, 1, 2)),
    # counts and displacements as 0-d NumPy arrays, as mpi4py takes them
    ([np.arange(6.0), np.array(2)], (2, 2, 2), (0, 2, 4)),
    ([np.arange(6.0), (np.array(1), [np.array(5), np.array(3), np.array(0)])], (1, 1, 1), (5, 3, 0)),
    ([np.arange(6.0), (1, np.array(2))], (1, 1, 1), (0, 2, 4)),
], ids=lambda v: None)
def test_vector_spec_forms(spec, counts, displs):
    v = vector(spec, "recvbuf", 3)
    assert (v.counts, v.displs) == (counts, displs)
    assert v.dtype == np.float64 and shares(v.array, spec[0])
    assert all(isinstance(c, int) for c in v.counts + v.displs)


@pytest.mark.parametrize("bad", [np.array(2.0), [np.array(1.5), 1, 1]])
def test_vector_counts_must_be_integers_also_as_0d_arrays(bad):
    with pytest.raises(TypeError, match="must be an integer"):
        vector([np.arange(6.0), bad], "recvbuf", 3)


def test_a_type_string_numpy_misreads_is_refused():
    with pytest.raises(TypeError, match="is not a NumPy type code"):
        vector([bytearray(8), 0, [0], "\0"], "sendbuf", 1)  # NumPy reads "\0" as bool


def test_vector_datatype_reinterprets():
    v = vector([np.zeros(6), [4, 4, 4], MPI.INT], "recvbuf", 3)
    assert v.dtype == np.int32 and v.count == 12 and v.displs == (0, 4, 8)


def test_vector_overlapping_and_gapped_blocks_are_allowed():
    v = vector([np.arange(10.0), [3, 3], [0, 1]], "sendbuf", 2)  # overlapping reads (a send spec)
    assert v.displs == (0, 1)
    v = vector([np.arange(10.0), [2, 2], [8, 0]], "recvbuf", 2)  # gaps, reversed order
    assert v.displs == (8, 0)


@pytest.mark.parametrize("spec,kind,fragment", [
    ([np.arange(6.0), [1, 1]], ValueError, "recvbuf has 2 counts for 3 ranks; give one per rank"),
    ([np.arange(6.0), [1, 1, 1, 1]], ValueError, "recvbuf has 4 counts for 3 ranks"),
    ([np.arange(6.0), [1, 1, 1], [0, 1]], ValueError, "recvbuf has 2 displacements for 3 ranks"),
    ([np.arange(6.0), [1, 1, 1], [0, 1, 6]], ValueError,
     "recvbuf block of rank 2 (elements [6, 7)) lies outside the buffer's 6 elements"),
    ([np.arange(6.0), [4, 1, 2]], ValueError, "recvbuf block of rank 2 (elements [5, 7)) lies outside"),
    ([np.arange(6.0), [1, -1, 1]], ValueError, "recvbuf count is -1; counts are >= 0"),
    ([np.arange(6.0), [1, 1, 1], [0, -2, 1]], ValueError, "recvbuf displacement count is -2"),
    ([np.arange(6.0), [1, 1.5, 1]], TypeError, "recvbuf count must be an integer, got 1.5"),
    ([np.arange(6.0), 1, 2, 3, 4], TypeError, "recvbuf spec has 5 items; use [buf, counts, displs, datatype] at most"),
    ([np.arange(6.0), [1, 1, 1], "zz"], TypeError, "not a NumPy type code"),
    ([{}, [1, 1, 1]], TypeError, "recvbuf must be an array or a buffer"),
])
def test_vector_errors(spec, kind, fragment):
    with pytest.raises(kind) as info:
        vector(spec, "recvbuf", 3)
    assert fragment in str(info.value)


def test_vector_unsupported():
    types = [MPI.DOUBLE] * 3
    with pytest.raises(Unsupported, match="one datatype per rank"):
        vector([np.zeros(6), [1, 1, 1], [0, 1, 2], types], "recvbuf", 3)
    with pytest.raises(Unsupported, match="MPI.BOTTOM"):
        vector([MPI.BOTTOM, [1, 1, 1]], "recvbuf", 3)
    vec = MPI.DOUBLE.Create_vector(2, 1, 2)
    vec.Commit()
    try:
        with pytest.raises(Unsupported, match="not contiguous"):
            vector([np.zeros(12), [1, 1, 1], vec], "recvbuf", 3)
    finally:
        vec.Free()


# ---------------------------------------------------------------- block (Gather's receive buffer...)


@pytest.mark.parametrize("spec,per_rank,size", [
    (np.arange(6.0), 2, 6),
    ([np.arange(7.0), 2], 2, 6),  # [buf, count]: count per rank, the buffer cut to p·count
    ([np.arange(7.0), 2, MPI.DOUBLE], 2, 6),
    ([np.arange(6.0), MPI.DOUBLE], 2, 6),
    ([np.arange(6.0), "d"], 2, 6),
    ([np.arange(6.0), 0], 0, 0),
    (np.zeros(0), 0, 0),
    ([np.zeros(3), 2, MPI.INT], 2, 6),  # 3 doubles read as 6 int32s
], ids=lambda v: None)
def test_block_spec_forms(spec, per_rank, size):
    buf, n = block(spec, "recvbuf", 3)
    assert n == per_rank and buf.count == size
    assert shares(buf.array, spec[0] if isinstance(spec, list) else spec) or size == 0


def test_block_errors():
    with pytest.raises(ValueError, match="recvbuf has 7 elements, not divisible among 3 ranks"):
        block(np.arange(7.0), "recvbuf", 3)
    with pytest.raises(ValueError, match="recvbuf holds 6 elements, fewer than 3 ranks × 3"):
        block([np.arange(6.0), 3], "recvbuf", 3)
    with pytest.raises(ValueError, match="recvbuf count is -2"):
        block([np.arange(6.0), -2], "recvbuf", 3)
    with pytest.raises(TypeError, match="recvbuf must be an array or a buffer"):
        block([1, 2], "recvbuf", 3)
    vec = MPI.DOUBLE.Create_vector(2, 1, 2)
    vec.Commit()
    try:
        with pytest.raises(Unsupported):
            block([np.zeros(12), 1, vec], "recvbuf", 3)
    finally:
        vec.Free()


def test_block_counts():
    assert block_counts(12, 4, "x") == (3, 3, 3, 3)
    assert block_counts(0, 3, "x") == (0, 0, 0)
    assert block_counts(5, 1, "x") == (5,)
    with pytest.raises(ValueError, match="x has 10 elements, not divisible among 4 ranks"):
        block_counts(10, 4, "x")


# ---------------------------------------------------------------- in place


def test_in_place_markers():
    assert is_in_place(MPI.IN_PLACE) and is_in_place(None)
    assert not is_in_place(np.zeros(0)) and not is_in_place(0) and not is_in_place(MPI.BOTTOM)
    assert not is_in_place([None, 0])


def test_public_names():
    assert set(specs.__all__) >= {"Unsupported", "Buffer", "VBuffer", "is_in_place", "simple", "vector", "block",
                                  "block_counts", "writable"}


# ---------------------------------------------------------------- Alltoallw's w-specs: a datatype per block, bytes


def test_a_w_spec_is_read_as_bytes_in_every_form_mpi4py_takes():
    buf = np.arange(6, dtype=np.int32)
    types = [MPI.INT32_T, MPI.INT16_T, MPI.DOUBLE]
    for spec in ([buf, ([1, 2, 0], [0, 8, 20]), types], [buf, [1, 2, 0], [0, 8, 20], types]):
        w = specs.wvector(spec, "sendbuf", 3)
        assert w.array.dtype == np.uint8 and w.array.size == 24
        assert w.counts == (4, 4, 0) and w.displs == (0, 8, 20)  # count × the datatype's bytes; displacements in bytes
    w = specs.wvector([buf, types], "sendbuf", 3)  # one of each at 0, as mpi4py reads [buf, datatypes]
    assert w.counts == (4, 2, 8) and w.displs == (0, 0, 0)
    assert specs.wvector([buf, None, None, types], "sendbuf", 3).counts == (4, 2, 8)
    contiguous = MPI.INT16_T.Create_contiguous(3).Commit()
    assert specs.wvector([buf, [2], [0], [contiguous]], "recvbuf", 1).counts == (12,)
    contiguous.Free()


def test_a_w_spec_names_what_is_wrong_and_leaves_gaps_to_the_library():
    buf = np.zeros(8, np.int32)
    strided = MPI.INT32_T.Create_vector(2, 1, 2).Commit()
    with pytest.raises(Unsupported, match="block 1 .* not contiguous"):
        specs.wvector([buf, [1, 1], [0, 16], [MPI.INT32_T, strided]], "sendbuf", 2)
    strided.Free()
    with pytest.raises(Unsupported, match="MPI.BOTTOM"):
        specs.wvector([MPI.BOTTOM, [1], [0], [MPI.INT32_T]], "sendbuf", 1)
    with pytest.raises(ValueError, match="2 counts for 3 blocks"):
        specs.wvector([buf, [1, 1], [0, 4, 8], [MPI.INT32_T] * 3], "sendbuf", 3)
    with pytest.raises(ValueError, match=r"block 1 \(bytes \[28, 36\)\) lies outside the buffer's 32 bytes"):
        specs.wvector([buf, [1, 2], [0, 28], [MPI.INT32_T] * 2], "recvbuf", 2)
    with pytest.raises(TypeError, match="give an MPI.Datatype per block"):
        specs.wvector([buf, [1], [0], ["i"]], "sendbuf", 1)
    with pytest.raises(TypeError, match=r"\(counts, displs\) pair"):
        specs.wvector([buf, [1], [MPI.INT32_T]], "sendbuf", 1)
