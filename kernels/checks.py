"""Argument checks shared by every kernel: arrays, boxes, scalars.

The kernels themselves (loops, slicing expressions, CUDA code) trust their
arguments: a compiled loop that indexes past a row reads another row's data
instead of failing. So every public entry point runs these checks first and
raises ``ValueError``/``TypeError`` naming the bad value and the fix; the
implementations then receive a normalised box (a tuple of ``(lo, hi)`` ints)
and scalars already cast to the array's dtype (so float32 arithmetic stays
float32 on every path, as NumPy's does).

Vocabulary: a *field* is a C-contiguous float32/float64 array that includes
its ghost (halo) layers; a *box* is one ``(lo, hi)`` pair per dimension in
array index coordinates (``hi`` exclusive) naming the cells a kernel updates;
a box with some ``hi <= lo`` is *empty* and no kernel touches anything for it.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np

__all__ = ["Box", "FLOATS", "check_field", "check_simt", "check_pair", "check_box", "box_shape", "box_size", "slices",
           "shifted", "check_scalar"]

#: A normalised box: one ``(lo, hi)`` pair of ints per dimension.
Box = tuple[tuple[int, int], ...]

#: The dtypes the kernels accept.
FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _kind(a: Any) -> str:
    cls = type(a)
    return f"{cls.__module__.split('.')[0]}.{cls.__name__}"


def check_field(who: str, name: str, a: Any, xp: ModuleType, ndims: Sequence[int] = (2, 3)) -> None:
    """*a* must be an array of *xp*, C-contiguous, float32/float64, with ndim in *ndims*."""
    if not isinstance(a, xp.ndarray):
        if xp is np:
            fix = ("move it to the host with .get(), or use kernels.select('cupy')" if hasattr(a, "__cuda_array_interface__")
                   else "pass a numpy.ndarray")
        else:
            fix = "move it to the GPU with cupy.asarray(...), or use a CPU path (kernels.select('compiled'))"
        raise TypeError(f"{who}: {name} is a {_kind(a)}, but the {xp.__name__} path takes {xp.__name__}.ndarray; {fix}")
    if a.dtype not in FLOATS:
        raise ValueError(f"{who}: {name} has dtype {a.dtype}; the kernels take float32 or float64 "
                         f"(convert with {name}.astype(numpy.float64))")
    if a.ndim not in ndims:
        allowed = " or ".join(f"{d}-D" for d in ndims)
        raise ValueError(f"{who}: {name} is {a.ndim}-D (shape {tuple(a.shape)}); {who} takes {allowed} arrays")
    if not a.flags.c_contiguous:
        raise ValueError(f"{who}: {name} of shape {tuple(a.shape)} is not C-contiguous (a strided view?); "
                         f"pass the whole array and select the cells with box=, or copy it with "
                         f"{xp.__name__}.ascontiguousarray({name})")


def check_simt(who: str, name: str, a: Any, ndim: int, takes: str = "the kernel takes float32 or float64",
               dtypes: Sequence[np.dtype] = FLOATS, why: str = "") -> None:
    """An argument of a SIMT kernel (:mod:`kernels.simt`): a C-contiguous *ndim*-D NumPy (simulator) or CuPy (GPU)
    array of one of *dtypes* (*takes* says which, after the dtype found); *why* says why contiguity matters."""
    if not hasattr(a, "dtype") or getattr(a, "ndim", -1) != ndim:
        raise TypeError(f"{who}: {name} is a {type(a).__name__} (shape {getattr(a, 'shape', None)}); pass a {ndim}-D "
                        f"NumPy (simulator) or CuPy (GPU) array")
    if a.dtype not in dtypes:
        raise ValueError(f"{who}: {name} has dtype {a.dtype}; {takes}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{who}: {name} of shape {tuple(a.shape)} is not C-contiguous{why}: pass "
                         f"ascontiguousarray({name})")


def check_pair(who: str, names: tuple[str, str], a: Any, b: Any, xp: ModuleType) -> None:
    """Two fields of the same shape and dtype that do not share memory (input and output of a sweep)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"{who}: {names[0]} ({a.dtype}, shape {tuple(a.shape)}) and {names[1]} ({b.dtype}, shape "
                         f"{tuple(b.shape)}) must have the same shape and dtype")
    if xp.may_share_memory(a, b):
        raise ValueError(f"{who}: {names[0]} and {names[1]} share memory; the update reads every neighbour of a cell "
                         f"before writing it, so it needs a separate output array (swap the two after each step)")


def _bound(who: str, value: Any, what: str) -> int:
    if type(value) is int:
        return value
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{who}: box {what} {value!r} is a {type(value).__name__}; box bounds are integers") from None


def check_box(who: str, box: Any, shape: tuple[int, ...], ghost: int) -> Box | None:
    """*box* normalised to a tuple of int pairs, or None when it is empty (some ``hi <= lo``).

    A non-empty box must leave *ghost* cells on every side: ``ghost <= lo`` and
    ``hi <= shape - ghost`` on every axis (``ghost = 0``: inside the array).
    """
    try:
        pairs = [tuple(pair) for pair in box]
    except TypeError:
        raise TypeError(f"{who}: box {box!r} is not a sequence of (lo, hi) pairs, one per dimension, "
                        f"e.g. ((1, {shape[0] - 1}), (1, {shape[1] - 1}))") from None
    if len(pairs) != len(shape) or any(len(pair) != 2 for pair in pairs):
        raise ValueError(f"{who}: box {box!r} must hold one (lo, hi) pair for each of the {len(shape)} dimensions "
                         f"of the array (shape {tuple(shape)})")
    norm = tuple([(_bound(who, lo, "lo"), _bound(who, hi, "hi")) for lo, hi in pairs])
    empty = False
    for lo, hi in norm:
        empty = empty or hi <= lo
    if empty:
        return None
    for axis, ((lo, hi), n) in enumerate(zip(norm, shape)):
        if lo < ghost or hi > n - ghost:
            if ghost:
                need = f"leave {ghost} ghost cell{'s' if ghost > 1 else ''} on each side"
            else:
                need = "lie inside the array"
            raise ValueError(f"{who}: box {norm} does not fit an array of shape {tuple(shape)}: on axis {axis} it "
                             f"must {need} ({ghost} <= lo and hi <= {n - ghost}), but it is ({lo}, {hi}); shrink "
                             f"the box or allocate more ghost layers")
    return norm


def box_shape(box: Box) -> tuple[int, ...]:
    """The number of cells along each axis of a non-empty box."""
    return tuple(hi - lo for lo, hi in box)


def box_size(box: Box) -> int:
    """The number of cells in a non-empty box."""
    return math.prod(hi - lo for lo, hi in box)


def slices(box: Box) -> tuple[slice, ...]:
    """The box as an index: ``u[slices(box)]`` is its cells."""
    return tuple(slice(lo, hi) for lo, hi in box)


def shifted(box: Box, axis: int, offset: int) -> tuple[slice, ...]:
    """The box moved by *offset* cells along *axis*, as an index: the neighbours at that offset."""
    return tuple(slice(lo + offset, hi + offset) if a == axis else slice(lo, hi) for a, (lo, hi) in enumerate(box))


def check_scalar(who: str, name: str, value: Any, dtype: np.dtype) -> np.generic:
    """A real number, cast to *dtype* (the arithmetic of every path happens in the array's dtype)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{who}: {name} is {value!r} ({type(value).__name__}); pass a real number")
    return dtype.type(value)
