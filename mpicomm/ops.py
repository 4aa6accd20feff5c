"""Reduction operations: one table of built-in ops, user ops, and how each combines two arrays.

An :class:`Op` combines two contiguous arrays elementwise, ``out = a ⊕ b``, where
*a* holds the contribution of the lower ranks (MPI's order for non-commutative
ops). It works on any array module - NumPy or CuPy - through the arrays' own
ufuncs, so reductions run where the data lives.

Ops are given as strings (``"sum"``, case-insensitive), as ``MPI.Op`` objects
(``MPI.SUM``; a user ``MPI.Op.Create(fn, commute)`` too), as :class:`Op`
objects, as a binary NumPy/CuPy ufunc, or as a Python callable ``fn(a, b) ->
a ⊕ b``. Make a user op with a declared commutativity with :func:`create`::

    matmul = mpicomm.ops.create(lambda a, b: (a.reshape(-1, 2, 2) @ b.reshape(-1, 2, 2)).reshape(-1),
                                commutative=False, name="matmul2x2")

A bare callable or a ufunc that is not a built-in is taken as non-commutative
(the safe assumption: algorithms then keep rank order).

``maxloc``/``minloc`` reduce (value, index) pairs: NumPy structured arrays
with two fields laid out as MPI's pair types (``pair_dtype(np.float64)`` is
``MPI.DOUBLE_INT``); ties keep the smaller index.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeGuard

import numpy as np
from mpi4py import MPI
from mpi4py.util import dtlib

__all__ = ["Op", "BUILTIN", "create", "resolve", "pair_dtype", "is_pair_dtype", "PAIR_TYPES"]

# dtype kinds: b bool, i signed, u unsigned, f float, c complex; "pair" = maxloc/minloc pairs
_NUMERIC = "iufc"
_ORDERED = "iuf"
_LOGICAL = "biuf"
_BITWISE = "biu"


@dataclass(frozen=True, eq=False)
class Op:
    """A reduction ``out = a ⊕ b`` (*a* from lower ranks).

    ``kinds``: the dtype kinds it is defined on (``"pair"`` for maxloc/minloc);
    ``code``: a number identifying it across ranks (validation compares them).
    """

    name: str
    commutative: bool
    combine: Callable[[Any, Any, Any], None] = field(repr=False)
    kinds: str = _NUMERIC + "b"
    mpi: MPI.Op | None = field(default=None, repr=False)
    code: int = 0
    ufunc: str | None = None  #: the array module's ufunc that computes it (``"add"``), for built-in elementwise ops

    def __call__(self, a: Any, b: Any, out: Any) -> None:
        """``out[...] = a ⊕ b`` elementwise (*out* may be *a* or *b*)."""
        self.combine(a, b, out)

    def check_dtype(self, dtype: np.dtype) -> str | None:
        """A message if this op is not defined on *dtype* (None if it is)."""
        if self.kinds == "pair":
            if is_pair_dtype(dtype):
                return None
            return (f"op {self.name} reduces (value, index) pairs, not {dtype}; use a structured array of "
                    f"mpicomm.ops.pair_dtype(value_dtype) (MPI's DOUBLE_INT etc.)")
        if is_pair_dtype(dtype) or dtype.kind not in self.kinds:
            allowed = {"b": "bool", "i": "signed integers", "u": "unsigned integers", "f": "floats", "c": "complex"}
            kinds = ", ".join(allowed[k] for k in self.kinds if k in allowed)
            return f"op {self.name} is not defined on dtype {dtype}; it takes {kinds}"
        return None


def _ufunc_combine(name: str) -> Callable[[Any, Any, Any], None]:
    def combine(a: Any, b: Any, out: Any) -> None:
        xp = _module(out)
        getattr(xp, name)(a, b, out=out)

    combine.__name__ = name
    return combine


def _module(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return np
    import cupy  # an array that is not NumPy's is CuPy's here (checked at the public boundary)

    return cupy


def _loc_combine(better: str) -> Callable[[Any, Any, Any], None]:
    def combine(a: Any, b: Any, out: Any) -> None:
        names = a.dtype.names
        av, ai, bv, bi = a[names[0]], a[names[1]], b[names[0]], b[names[1]]
        take_a = (av > bv if better == "max" else av < bv) | ((av == bv) & (ai < bi))
        out[...] = np.where(take_a, a, b)

    combine.__name__ = better + "loc"
    return combine


def _builtin(name: str, ufunc: str | None, kinds: str, mpi_op: MPI.Op, code: int) -> Op:
    combine = _loc_combine(name[:3]) if ufunc is None else _ufunc_combine(ufunc)
    return Op(name, True, combine, kinds, mpi_op, code, ufunc)


#: The built-in ops by name (MPI's predefined operations, all commutative).
BUILTIN: dict[str, Op] = {
    op.name: op
    for op in (
        _builtin("sum", "add", _NUMERIC, MPI.SUM, 1),
        _builtin("prod", "multiply", _NUMERIC, MPI.PROD, 2),
        _builtin("min", "minimum", _ORDERED, MPI.MIN, 3),
        _builtin("max", "maximum", _ORDERED, MPI.MAX, 4),
        _builtin("land", "logical_and", _LOGICAL, MPI.LAND, 5),
        _builtin("lor", "logical_or", _LOGICAL, MPI.LOR, 6),
        _builtin("lxor", "logical_xor", _LOGICAL, MPI.LXOR, 7),
        _builtin("band", "bitwise_and", _BITWISE, MPI.BAND, 8),
        _builtin("bor", "bitwise_or", _BITWISE, MPI.BOR, 9),
        _builtin("bxor", "bitwise_xor", _BITWISE, MPI.BXOR, 10),
        _builtin("maxloc", None, "pair", MPI.MAXLOC, 11),
        _builtin("minloc", None, "pair", MPI.MINLOC, 12),
    )
}
_BY_UFUNC = {"add": "sum", "multiply": "prod", "minimum": "min", "maximum": "max", "logical_and": "land",
             "logical_or": "lor", "logical_xor": "lxor", "bitwise_and": "band", "bitwise_or": "bor",
             "bitwise_xor": "bxor"}

#: MPI's pair types for maxloc/minloc, by value dtype.
PAIR_TYPES: dict[np.dtype, MPI.Datatype] = {
    np.dtype(np.float32): MPI.FLOAT_INT,
    np.dtype(np.float64): MPI.DOUBLE_INT,
    np.dtype(np.int64): MPI.LONG_INT,
    np.dtype(np.int32): MPI.INT_INT if hasattr(MPI, "INT_INT") else MPI.TWOINT,
    np.dtype(np.int16): MPI.SHORT_INT,
}


def pair_dtype(value_dtype: Any) -> np.dtype:
    """The structured (value, index) dtype maxloc/minloc reduce, laid out like MPI's pair type."""
    vt = np.dtype(value_dtype)
    if vt not in PAIR_TYPES:
        raise TypeError(f"no MPI pair type has value dtype {vt}; use one of {', '.join(map(str, PAIR_TYPES))}")
    return np.dtype([("value", vt), ("index", np.int32)], align=True)


def is_pair_dtype(dtype: np.dtype) -> bool:
    """True for a structured dtype laid out as an MPI pair type: (value at 0, int32 index), MPI's padding."""
    names = dtype.names
    if not names or len(names) != 2:
        return False
    fields = dtype.fields
    assert fields is not None  # (a dtype with field names has fields)
    (vt, v_at), (it, i_at) = fields[names[0]][:2], fields[names[1]][:2]
    if vt not in PAIR_TYPES or it != np.dtype(np.int32):
        return False
    ref = pair_dtype(vt)
    assert ref.fields is not None  # (a structured dtype)
    return v_at == 0 and i_at == ref.fields["index"][1] and dtype.itemsize == ref.itemsize


def _code_of(name: str) -> int:
    return 1000 + zlib.crc32(name.encode()) % 1_000_000  # user ops: same name, same code on every rank


_SIMPLE = (int, float, complex, str, bytes, bool, type(None))


def _value_text(value: Any, depth: int = 0) -> str:
    """A text for *value* that is the same on every rank when the value is (no addresses)."""
    if isinstance(value, _SIMPLE):
        return repr(value)[:200]
    if isinstance(value, (tuple, list, frozenset)) and depth < 3 and len(value) <= 64:
        return type(value).__name__ + "(" + ",".join(_value_text(v, depth + 1) for v in value) + ")"
    if isinstance(value, np.ndarray) and value.size <= 64 and value.dtype.kind in "biufc":
        return f"ndarray({value.dtype.str},{value.shape},{value.tobytes().hex()})"
    if hasattr(value, "__code__") or _is_ufunc(value):
        return _fingerprint(value, depth + 1)
    kind = type(value)
    return f"<{kind.__module__}.{kind.__qualname__}>"  # its value cannot be compared across ranks


def _code_text(code: Any, depth: int) -> str:
    consts = ",".join(_code_text(c, depth + 1) if hasattr(c, "co_code") else _value_text(c, depth + 1)
                      for c in code.co_consts)
    return f"{code.co_qualname if hasattr(code, 'co_qualname') else code.co_name}|{code.co_code.hex()}|" \
           f"{consts}|{','.join(code.co_names)}|{code.co_argcount}"


def _fingerprint(fn: Any, depth: int = 0) -> str:
    """What tells user functions apart across ranks: module, qualname, bytecode, constants, names, and the
    values it closes over or defaults to (two lambdas both named ``<lambda>`` differ here).

    Callables that hold state Python cannot compare across ranks (an object's
    attributes, a closed-over object) are told apart by their type and code
    only: the docstring of :func:`create` says so.
    """
    if depth > 4:
        return "…"
    if _is_ufunc(fn):
        return f"ufunc:{fn.__name__}"
    if isinstance(fn, functools.partial):
        return (f"partial({_fingerprint(fn.func, depth + 1)};{_value_text(fn.args, depth + 1)};"
                f"{_value_text(tuple(sorted((k, _value_text(v, depth + 1)) for k, v in fn.keywords.items())))})")
    func = getattr(fn, "__func__", fn)  # a bound method: its function (and the type it is bound to, below)
    code = getattr(func, "__code__", None)
    if code is None:
        call = getattr(type(fn), "__call__", None)  # noqa: B004 - the method itself, to fingerprint its code
        kind = type(fn)
        inner = _fingerprint(call, depth + 1) if hasattr(call, "__code__") else ""
        return f"{kind.__module__}.{kind.__qualname__}:{inner}"
    parts = [getattr(func, "__module__", "") or "", getattr(func, "__qualname__", ""), _code_text(code, depth)]
    closure = getattr(func, "__closure__", None) or ()
    cells = []
    for cell in closure:
        try:
            cells.append(_value_text(cell.cell_contents, depth + 1))
        except ValueError:  # an empty cell
            cells.append("<empty>")
    parts.append(",".join(cells))
    parts.append(_value_text(getattr(func, "__defaults__", None) or (), depth + 1))
    if func is not fn:
        kind = type(getattr(fn, "__self__", None))
        parts.append(f"bound to {kind.__module__}.{kind.__qualname__}")
    return "|".join(parts)


def create(fn: Callable, commutative: bool = False, name: str | None = None) -> Op:
    """A user op from *fn*: a binary ufunc (``fn(a, b, out=out)``) or a callable returning ``a ⊕ b``.

    *a* holds the lower ranks' contribution. Declare ``commutative=True`` only
    if ``a ⊕ b == b ⊕ a``: algorithms may then reorder operands.

    The op's ``code`` (what validation compares across ranks) covers *name*
    and the function itself: its module, qualified name, bytecode, constants,
    the names it uses, and the values it closes over or defaults to when they
    are plain data (numbers, strings, small arrays). So two different lambdas
    are two ops. What it cannot see - the state of an object the function
    calls, a global's value - is not compared: keep such ops the same on
    every rank.
    """
    if isinstance(fn, Op):
        return fn
    if not callable(fn):
        raise TypeError(f"a user op must be callable (fn(a, b) -> a ⊕ b) or a ufunc, got {fn!r}")
    label = name or getattr(fn, "__name__", None) or type(fn).__name__
    if _is_ufunc(fn):
        if fn.nin != 2 or fn.nout != 1:
            raise TypeError(f"ufunc {fn.__name__} takes {fn.nin} inputs; a reduction op needs a binary ufunc")

        def combine(a: Any, b: Any, out: Any) -> None:
            fn(a, b, out=out)
    else:
        def combine(a: Any, b: Any, out: Any) -> None:
            result = fn(a, b)
            if result is not out:
                out[...] = result

    return Op(label, bool(commutative), combine, _NUMERIC + "b", None, _code_of(label + "\0" + _fingerprint(fn)))


class _Ufunc(Protocol):
    """What a NumPy or CuPy ufunc has that :func:`create` reads."""

    __name__: str
    nin: int
    nout: int

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...


def _is_ufunc(fn: Any) -> TypeGuard[_Ufunc]:
    return type(fn).__name__ == "ufunc" and hasattr(fn, "nin")


def _from_mpi_user(mpi_op: MPI.Op) -> Op:
    def combine(a: Any, b: Any, out: Any) -> None:
        # MPI_Reduce_local runs the op on host memory: device arrays go through the host here.
        on_host = isinstance(out, np.ndarray)
        ha = a if on_host else a.get()
        hout = out if on_host and out is b else (np.array(b) if on_host else b.get())
        datatype = dtlib.from_numpy_dtype(hout.dtype)
        mpi_op.Reduce_local([ha, datatype], [hout, datatype])
        if on_host:
            if hout is not out:
                out[...] = hout
        else:
            out.set(hout)

    return Op("user MPI.Op", mpi_op.Is_commutative(), combine, _NUMERIC + "b", mpi_op, 999)


def resolve(op: Any) -> Op:
    """The :class:`Op` that *op* names (string, ``MPI.Op``, ufunc, callable or Op); clear errors otherwise."""
    if isinstance(op, Op):
        return op
    if isinstance(op, str):
        key = op.strip().lower()
        key = key[4:] if key.startswith("mpi.") else key
        try:
            return BUILTIN[key]
        except KeyError:
            raise ValueError(
                f"unknown op {op!r}; use one of {', '.join(BUILTIN)}, an MPI.Op, or mpicomm.ops.create(fn)"
            ) from None
    if isinstance(op, MPI.Op):
        if op == MPI.OP_NULL:
            raise ValueError("op is MPI.OP_NULL; pass a reduction op such as MPI.SUM or 'sum'")
        for builtin in BUILTIN.values():
            if op == builtin.mpi:
                return builtin
        if op in (MPI.REPLACE, MPI.NO_OP):
            raise ValueError(f"op {op} is for one-sided accumulate only, not for collectives; use e.g. 'sum'")
        return _from_mpi_user(op)
    if _is_ufunc(op) and op.__name__ in _BY_UFUNC:
        return BUILTIN[_BY_UFUNC[op.__name__]]
    if callable(op):
        return create(op)
    raise TypeError(f"op must be a name ('sum'...), an MPI.Op, a ufunc or a callable, got {op!r}")
