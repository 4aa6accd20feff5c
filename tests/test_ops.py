"""mpicomm.ops: the built-in ops against NumPy and the MPI library, op resolution, user ops, maxloc/minloc."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from mpicomm import ops
from mpicomm.ops import BUILTIN, create, is_pair_dtype, pair_dtype, resolve
from mpicomm.transport.buffers import DTYPES
from tests.conftest import runnable

UFUNC_OF = {"sum": "add", "prod": "multiply", "min": "minimum", "max": "maximum", "land": "logical_and",
            "lor": "logical_or", "lxor": "logical_xor", "band": "bitwise_and", "bor": "bitwise_or",
            "bxor": "bitwise_xor"}
ELEMENTWISE = sorted(UFUNC_OF)
#: what each built-in op accepts, written out here (not read from the module under test)
ACCEPTS = {"sum": "iufc", "prod": "iufc", "min": "iuf", "max": "iuf", "land": "biuf", "lor": "biuf",
           "lxor": "biuf", "band": "biu", "bor": "biu", "bxor": "biu"}


def operands(dtype, n=50, seed=0):
    """Two arrays of *dtype* with small values (no overflow surprises), some equal elements and zeros."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "b":
        a, b = rng.integers(0, 2, n).astype(bool), rng.integers(0, 2, n).astype(bool)
    elif dt.kind == "u":
        a, b = rng.integers(0, 10, n).astype(dt), rng.integers(0, 10, n).astype(dt)
    elif dt.kind == "i":
        a, b = rng.integers(-5, 6, n).astype(dt), rng.integers(-5, 6, n).astype(dt)
    elif dt.kind == "f":
        a, b = rng.integers(-8, 9, n).astype(dt) / 4, rng.normal(size=n).astype(dt)
    else:
        a = (rng.normal(size=n) + 1j * rng.normal(size=n)).astype(dt)
        b = (rng.normal(size=n) + 1j * rng.normal(size=n)).astype(dt)
    b[:5] = a[:5]  # ties
    a[5:8] = 0
    return a, b


def accepted_pairs():
    return [(name, dt) for name in ELEMENTWISE for dt in DTYPES if dt.kind in ACCEPTS[name]]


def refused_pairs():
    return [(name, dt) for name in ELEMENTWISE for dt in DTYPES if dt.kind not in ACCEPTS[name]]


# ---------------------------------------------------------------- built-in ops vs NumPy and MPI


@pytest.mark.parametrize("name,dtype", accepted_pairs(), ids=lambda v: str(v))
def test_builtin_op_matches_numpy(name, dtype):
    op = BUILTIN[name]
    assert op.check_dtype(dtype) is None
    a, b = operands(dtype)
    expected = getattr(np, UFUNC_OF[name])(a, b).astype(dtype)
    out = np.empty_like(a)
    op(a, b, out)
    np.testing.assert_array_equal(out, expected)
    # out may be either operand
    a1, b1 = a.copy(), b.copy()
    op(a1, b, a1)
    np.testing.assert_array_equal(a1, expected)
    op(a, b1, b1)
    np.testing.assert_array_equal(b1, expected)


@pytest.mark.parametrize("name", ELEMENTWISE)
def test_builtin_op_matches_the_mpi_library(name):
    """Where the MPI library defines the op on the type, its Reduce_local agrees with mpicomm's."""
    op, compared = BUILTIN[name], 0
    for dt in DTYPES:
        if dt.kind not in ACCEPTS[name]:
            continue
        datatype = MPI._typedict.get(dt.char)  # the predefined type (a duplicate is not valid for built-in ops)
        if datatype is None:
            continue
        a, b = operands(dt, seed=3)
        ref = b.copy()
        try:
            op.mpi.Reduce_local([a, datatype], [ref, datatype])  # ref = a ⊕ ref
        except MPI.Exception:
            continue  # not defined by the MPI standard on this type (mpicomm is more lenient)
        out = np.empty_like(a)
        op(a, b, out)
        if dt.kind in "fc":  # the library may round complex products differently (fused multiply-add)
            np.testing.assert_allclose(out, ref, rtol=1e-6, err_msg=f"{name} on {dt}")
        else:
            np.testing.assert_array_equal(out, ref, err_msg=f"{name} on {dt}")
        compared += 1
    assert compared > 0


@pytest.mark.parametrize("name,dtype", refused_pairs(), ids=lambda v: str(v))
def test_check_dtype_refuses_with_a_message(name, dtype):
    message = BUILTIN[name].check_dtype(dtype)
    assert message is not None
    assert f"op {name} is not defined on dtype {np.dtype(dtype)}" in message
    assert "it takes" in message


def test_check_dtype_refusals_name_what_the_op_takes():
    assert "it takes bool, signed integers, unsigned integers" in BUILTIN["band"].check_dtype(np.dtype(np.float64))
    assert "signed integers, unsigned integers, floats" in BUILTIN["max"].check_dtype(np.dtype(np.complex128))
    assert "complex" in BUILTIN["sum"].check_dtype(np.dtype(np.bool_))
    # elementwise ops refuse pair types; maxloc/minloc take only pair types
    assert "not defined on dtype" in BUILTIN["sum"].check_dtype(pair_dtype(np.float64))
    for loc in ("maxloc", "minloc"):
        message = BUILTIN[loc].check_dtype(np.dtype(np.float64))
        assert f"op {loc} reduces (value, index) pairs, not float64" in message and "pair_dtype" in message
        assert BUILTIN[loc].check_dtype(pair_dtype(np.float64)) is None


def test_every_builtin_is_commutative_and_named_after_mpi():
    assert sorted(BUILTIN) == sorted(ELEMENTWISE + ["maxloc", "minloc"])
    codes = {op.code for op in BUILTIN.values()}
    assert len(codes) == len(BUILTIN)
    for name, op in BUILTIN.items():
        assert op.name == name and op.commutative
        assert op.mpi == getattr(MPI, name.upper())


# ---------------------------------------------------------------- maxloc / minloc


def pairs(values, indices, value_dtype=np.float64):
    out = np.empty(len(values), pair_dtype(value_dtype))
    out["value"], out["index"] = values, indices
    return out


@pytest.mark.parametrize("value_dtype", [np.float64, np.float32, np.int32, np.int64, np.int16])
def test_maxloc_minloc_ties_keep_the_smaller_index(value_dtype):
    a = pairs([1, 2, 3, 5, 7, 7], [3, 5, 1, 8, 0, 4], value_dtype)
    b = pairs([1, 1, 3, 6, 7, 7], [2, 9, 4, 1, 0, 2], value_dtype)
    out = np.empty_like(a)
    BUILTIN["maxloc"](a, b, out)
    assert out["value"].tolist() == [1, 2, 3, 6, 7, 7]
    assert out["index"].tolist() == [2, 5, 1, 1, 0, 2]
    BUILTIN["minloc"](a, b, out)
    assert out["value"].tolist() == [1, 1, 3, 5, 7, 7]
    assert out["index"].tolist() == [2, 9, 1, 8, 0, 2]
    # and in place (out is one of the operands)
    b2 = b.copy()
    BUILTIN["maxloc"](a, b2, b2)
    assert b2["index"].tolist() == [2, 5, 1, 1, 0, 2]


@pytest.mark.parametrize("value_dtype,datatype", [(np.float64, MPI.DOUBLE_INT), (np.float32, MPI.FLOAT_INT),
                                                  (np.int32, MPI.TWOINT), (np.int64, MPI.LONG_INT),
                                                  (np.int16, MPI.SHORT_INT)])
def test_pair_dtype_is_laid_out_like_the_mpi_pair_type(value_dtype, datatype):
    dt = pair_dtype(value_dtype)
    assert dt.names == ("value", "index")
    assert dt.fields["value"][1] == 0 and dt.fields["index"][0] == np.dtype(np.int32)
    lb, extent = datatype.Get_extent()
    assert (lb, extent) == (0, dt.itemsize)
    assert is_pair_dtype(dt)
    # mpicomm's maxloc agrees with the library's on that type, ties included
    rng = np.random.default_rng(5)
    a = pairs(rng.integers(0, 4, 40), rng.integers(0, 9, 40), value_dtype)
    b = pairs(rng.integers(0, 4, 40), rng.integers(0, 9, 40), value_dtype)
    for name in ("maxloc", "minloc"):
        ref = b.copy()
        getattr(MPI, name.upper()).Reduce_local([a, datatype], [ref, datatype])
        out = np.empty_like(a)
        BUILTIN[name](a, b, out)
        assert out.tolist() == ref.tolist(), name


def test_pair_dtype_refuses_other_value_types_and_is_pair_dtype_checks_layout():
    with pytest.raises(TypeError, match="no MPI pair type has value dtype complex128"):
        pair_dtype(np.complex128)
    packed = np.dtype([("value", np.float64), ("index", np.int32)])  # no padding: not MPI's layout
    assert not is_pair_dtype(packed)
    assert not is_pair_dtype(np.dtype([("value", np.float64), ("index", np.int64)], align=True))
    assert not is_pair_dtype(np.dtype(np.float64))
    assert not is_pair_dtype(np.dtype([("a", np.float64), ("b", np.int32), ("c", np.int32)]))
    assert is_pair_dtype(np.dtype([("v", np.float64), ("i", np.int32)], align=True))  # field names are free


# ---------------------------------------------------------------- resolve


@pytest.mark.parametrize("text", ["sum", "SUM", " Sum ", "MPI.SUM", "mpi.sum", "Mpi.Sum"])
def test_resolve_strings_case_insensitive(text):
    assert resolve(text) is BUILTIN["sum"]


def test_resolve_every_builtin_by_name_and_by_mpi_op():
    for name, op in BUILTIN.items():
        assert resolve(name) is op
        assert resolve(name.upper()) is op
        assert resolve("MPI." + name.upper()) is op
        assert resolve(getattr(MPI, name.upper())) is op
        assert resolve(op) is op


def test_resolve_unknown_string_lists_the_names():
    with pytest.raises(ValueError, match="unknown op 'summ'; use one of sum, prod, .*maxloc, minloc"):
        resolve("summ")
    with pytest.raises(ValueError, match="unknown op"):
        resolve("MPI.")


@pytest.mark.parametrize("bad,kind,fragment", [
    (42, TypeError, "op must be a name ('sum'...), an MPI.Op, a ufunc or a callable, got 42"),
    (None, TypeError, "got None"),
    (3.5, TypeError, "got 3.5"),
    (MPI.OP_NULL, ValueError, "MPI.OP_NULL"),
    (MPI.REPLACE, ValueError, "one-sided accumulate only"),
    (MPI.NO_OP, ValueError, "one-sided accumulate only"),
    (np.negative, TypeError, "a reduction op needs a binary ufunc"),
])
def test_resolve_bad_ops(bad, kind, fragment):
    with pytest.raises(kind) as info:
        resolve(bad)
    assert fragment in str(info.value)


def test_ufuncs_map_to_builtins():
    builtin_of = {np.add: "sum", np.multiply: "prod", np.minimum: "min", np.maximum: "max",
                  np.logical_and: "land", np.logical_or: "lor", np.logical_xor: "lxor", np.bitwise_and: "band",
                  np.bitwise_or: "bor", np.bitwise_xor: "bxor"}
    for ufunc, name in builtin_of.items():
        assert resolve(ufunc) is BUILTIN[name]


def test_other_binary_ufunc_is_a_non_commutative_user_op():
    op = resolve(np.subtract)
    assert op.name == "subtract" and not op.commutative and op.mpi is None
    assert op.code == resolve(np.subtract).code != resolve(np.fmod).code  # the same ufunc: the same code
    assert 1000 <= op.code < 1_001_000
    a, b = np.arange(5.0), np.full(5, 10.0)
    out = np.empty(5)
    op(a, b, out)
    np.testing.assert_array_equal(out, a - b)  # a (lower ranks) on the left
    op(a, b, b)
    np.testing.assert_array_equal(b, a - 10.0)


def test_callable_is_a_non_commutative_user_op():
    def first_plus_twice_second(a, b):
        return a + 2 * b

    op = resolve(first_plus_twice_second)
    assert op.name == "first_plus_twice_second" and not op.commutative
    assert op.check_dtype(np.dtype(np.int64)) is None
    a, b = np.arange(4), np.arange(4) * 10
    out = np.zeros(4, np.int64)
    op(a, b, out)
    np.testing.assert_array_equal(out, a + 2 * b)
    resolve(lambda x, y: x)(a, b, out)  # a lambda is fine too
    np.testing.assert_array_equal(out, a)


def test_callable_may_return_out_itself():
    def into_b(a, b):
        b += a
        return b

    op = create(into_b)
    a, b = np.arange(3.0), np.ones(3)
    op(a, b, b)
    np.testing.assert_array_equal(b, [1.0, 2.0, 3.0])


def test_create_declares_commutativity_and_name():
    op = create(lambda a, b: np.maximum(a, b), commutative=True, name="mymax")
    assert op.name == "mymax" and op.commutative and op.mpi is None
    again = create(lambda a, b: np.maximum(a, b), name="mymax")  # same name and function: same code
    assert again.code == op.code and not again.commutative  # (ranks compare codes, and commutativity apart)
    assert create(lambda a, b: a, name="mymax").code != op.code  # same name, another function: another op
    assert create(lambda a, b: np.maximum(a, b), name="other").code != op.code
    assert create(op) is op
    ufunc_op = create(np.add, commutative=True, name="plus")
    assert ufunc_op.commutative and ufunc_op.name == "plus"
    out = np.empty(3)
    ufunc_op(np.ones(3), np.arange(3.0), out)
    np.testing.assert_array_equal(out, [1.0, 2.0, 3.0])
    assert create(np.hypot).name == "hypot"
    with pytest.raises(TypeError, match="a user op must be callable"):
        create(42)
    with pytest.raises(TypeError, match="needs a binary ufunc"):
        create(np.sqrt)


def test_mpicomm_ops_is_the_module():
    assert mpicomm.ops is ops


# ---------------------------------------------------------------- a user MPI.Op


@pytest.mark.parametrize("commute", [True, False])
def test_user_mpi_op_runs_through_reduce_local(commute):
    def fn(inbuf, inoutbuf, datatype):  # inout = in - 2·inout (order matters)
        a = np.frombuffer(inbuf, np.float64)
        b = np.frombuffer(inoutbuf, np.float64)
        b[...] = a - 2 * b

    mpi_op = MPI.Op.Create(fn, commute=commute)
    try:
        op = resolve(mpi_op)
        assert op.commutative is commute and op.mpi == mpi_op
        assert op.check_dtype(np.dtype(np.float64)) is None
        a, b = np.arange(6.0), np.linspace(1, 2, 6)
        expected = a - 2 * b
        out = np.empty(6)
        op(a, b, out)
        np.testing.assert_allclose(out, expected)
        b2 = b.copy()
        op(a, b2, b2)  # out is b
        np.testing.assert_allclose(b2, expected)
        a2 = a.copy()
        op(a2, b, a2)  # out is a
        np.testing.assert_allclose(a2, expected)
        np.testing.assert_array_equal(b, np.linspace(1, 2, 6))  # inputs untouched
    finally:
        mpi_op.Free()


# ---------------------------------------------------------------- against the library, across ranks


@pytest.mark.mpi
@pytest.mark.parametrize("name", ["maxloc", "minloc"])
@pytest.mark.parametrize("in_place", [False, True], ids=["out-of-place", "in-place"])
def test_allreduce_maxloc_minloc_matches_the_library(comm, name, in_place):
    rank = comm.Get_rank()
    n = 37
    # values collide across ranks (ties), indices differ: the smaller index must win
    values = ((np.arange(n) * 7 + rank * 3) % 5).astype(np.float64)
    send = pairs(values, (rank * 11 + np.arange(n) * 3) % 17)
    expected = np.empty_like(send)
    MPI.COMM_WORLD.Allreduce([send, MPI.DOUBLE_INT], [expected, MPI.DOUBLE_INT], op=getattr(MPI, name.upper()))
    for algorithm in [None, *runnable(comm, "allreduce")]:
        if in_place:
            recv = send.copy()
            comm.Allreduce(MPI.IN_PLACE, recv, op=name, algorithm=algorithm)
        else:
            recv = np.zeros_like(send)
            comm.Allreduce(send, recv, op=getattr(MPI, name.upper()), algorithm=algorithm)
        assert recv.tolist() == expected.tolist(), f"{name} with {algorithm or 'auto'}"
    # the pair datatype spelled out also works (the library runs it if mpicomm does not)
    recv = np.zeros_like(send)
    comm.Allreduce([send, MPI.DOUBLE_INT], [recv, MPI.DOUBLE_INT], getattr(MPI, name.upper()))
    assert recv.tolist() == expected.tolist()
