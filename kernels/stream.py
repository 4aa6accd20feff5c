"""The STREAM triad, ``a[:] = b + s*c``: the memory bandwidth the stencil kernels are measured against.

A stencil sweep moves a fixed number of bytes per cell and does little
arithmetic, so its best possible rate is set by memory bandwidth; STREAM's
triad measures what a single pass over arrays achieves on the same machine,
in the same process. Bytes per element, counted as ``python -m kernels.bench``
does: read b, read c, write-allocate a, write a = 4 × itemsize (32 B for
float64).

* compiled: one loop, one pass;
* cupy: one elementwise kernel, one pass;
* numpy: ``np.multiply(c, s, out=a); np.add(a, b, out=a)`` — **two passes**
  (NumPy has no fused multiply-add ufunc without a temporary), so it moves
  more bytes than it is credited with; use it as a lower estimate only.

``a`` must not share memory with ``b`` or ``c`` (STREAM's three arrays; the
two-pass NumPy form would otherwise read what it already overwrote).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from .checks import check_field, check_scalar
from .jit import compiled

__all__ = ["check", "BYTES_PER_ELEMENT", "triad_numpy", "triad_compiled", "triad_cupy", "IMPLEMENTATIONS"]

#: Memory traffic of one triad element in units of the itemsize: read b, read c, write-allocate a, write a.
BYTES_PER_ELEMENT = 4


def check(a: Any, b: Any, c: Any, s: Any, xp: ModuleType) -> np.generic:
    """Validate the arguments of ``triad``; return s in the arrays' dtype."""
    any_rank = tuple(range(1, 33))
    for name, x in (("a", a), ("b", b), ("c", c)):
        check_field("triad", name, x, xp, ndims=any_rank)
    for name, x in (("b", b), ("c", c)):
        if x.shape != a.shape or x.dtype != a.dtype:
            raise ValueError(f"triad: {name} ({x.dtype}, shape {tuple(x.shape)}) must have a's shape and dtype "
                             f"({a.dtype}, {tuple(a.shape)})")
        if xp.may_share_memory(a, x):
            raise ValueError(f"triad: a shares memory with {name}; STREAM's triad writes a third array")
    return check_scalar("triad", "s", s, a.dtype)


def triad_numpy(a: np.ndarray, b: np.ndarray, c: np.ndarray, s: np.generic) -> None:
    """Two passes over a (NumPy has no fused form): a = s*c, then a += b."""
    np.multiply(c, s, out=a)
    np.add(a, b, out=a)


def _triad_loop(a, b, c, s):  # pragma: no cover - compiled by numba
    for i in range(a.shape[0]):
        a[i] = b[i] + s * c[i]


_triad = compiled(_triad_loop)


def triad_compiled(a: np.ndarray, b: np.ndarray, c: np.ndarray, s: np.generic) -> None:
    """One pass: the numba loop over the flattened arrays."""
    _triad(a.reshape(-1), b.reshape(-1), c.reshape(-1), s)


_elementwise: list[Any] = []


def triad_cupy(a: Any, b: Any, c: Any, s: np.generic) -> None:
    """One pass: a CuPy elementwise kernel, on the current stream."""
    import cupy

    if not _elementwise:
        _elementwise.append(cupy.ElementwiseKernel("T b, T c, T s", "T a", "a = b + s * c", "kernels_triad"))
    _elementwise[0](b, c, s, a)


#: Path name -> implementation (arguments already checked by :func:`check`).
IMPLEMENTATIONS = {"numpy": triad_numpy, "compiled": triad_compiled, "cupy": triad_cupy}
