"""Reproducible sums: the same bits whatever the algorithm, the order of the contributions or the rank count.

A floating-point sum depends on its order, and every reduction algorithm sums
in its own order: with the ordinary ``MPI.SUM`` the same program gives other
bits when a message crosses a size threshold of the selection, when the
algorithm changes, or on another number of ranks. A reproducible sum gives
bits that depend only on the set of contributions.

How: every contribution ``x`` is cut, elementwise, into integer *digits* on a
grid fixed by ``E``, the largest binary exponent of that element over all
contributions (``|x| < 2**E``; a maximum, so itself independent of order):

    x ≈ d_1·2**(E − B) + d_2·2**(E − 2B) + … + d_K·2**(E − KB),   |d_k| < 2**B,

with ``B = 40`` bits per digit and ``K = 2`` digits for float64 (an 80-bit
window below ``2**E``: the largest contribution's 53 bits and 27 more), ``K =
1`` for float32 (40 bits: its 24 and 16 more). Each digit is exact (a power-of-
two scaling and a truncation); the digits' sums are int64 sums, exact and
associative as long as fewer than :data:`MOST` contributions meet (each sum
stays below ``2**63``), so any algorithm, grouping and order gives the same
digit sums, and one rounding - the same function of the same integers - gives
the result. Complex numbers are summed as their real and imaginary parts.

A collective takes two rounds of the algorithm it rides on: an allreduce
(MAX) of the exponents as int16 (a quarter of float64's bytes), then the
collective itself (SUM) on the digits, as int64 (``K`` times float64's bytes,
twice float32's). The algorithm chosen (``algorithm=``, or the selection)
runs the digits' round.

**Error bound.** With ``n`` contributions, the result ``r`` of the exact sum
``s`` satisfies ``|r − s| ≤ ½·ulp(r) + n·2**(E − K·B)``: each contribution
loses less than one unit of its last digit, and the digits' sum is rounded
once (correctly, for float64 and float32, while ``r`` is a normal number).
The ordinary sum's bound is ``(n − 1)·u·Σ|x|`` with ``u = 2**−53`` (float64):
already for two contributions as large as the largest, ``2**(E − 53)``, which
is ``2**27`` times this one's second term.

Special values: an element where any contribution is NaN, or +inf meets −inf,
is NaN; else one with an infinity is that infinity. A sum of zeros is +0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

try:  # the host kernels (mpicomm/engine/_lane.c): the same operations as the array-module code below
    from .engine import _lane as _kernels  # type: ignore[attr-defined]
except ImportError:  # (not built: the array-module code runs host arrays too)
    _kernels = None

__all__ = ["BITS", "MOST", "DIGITS", "supported", "real_view", "exponents", "digits", "grid", "digit_sums", "finish", "sum_of",
           "bound"]

BITS = 40  #: bits per digit (B)
MOST = 1 << 21  #: fewer contributions than this meet in one sum (the digits' sums stay exact, specials countable)
DIGITS = {np.dtype(np.float64): 2, np.dtype(np.float32): 1}  #: digits per element (K), per real element type
_ZERO = -32768  # the exponent of an element that is 0 in every contribution
_SPECIAL = 32767  # the exponent of an element where some contribution is inf or NaN
_NEG, _NAN = 1 << 21, 1 << 42  # specials counted in the first digit: +inf by 1, −inf by 2**21, NaN by 2**42


def supported(dtype: Any, op_name: str) -> str | None:
    """Whether a reproducible sum applies: None where it does (SUM on float32/64, complex64/128), ``"exact"``
    where the ordinary reduction is reproducible already (integers, bool, MAX/MIN and the like); raises
    ValueError naming what is supported otherwise."""
    dt = np.dtype(dtype)
    if dt.kind in "biu" or op_name in ("max", "min", "maxloc", "minloc", "replace", "no_op"):
        return "exact"
    if op_name != "sum" or _real(dt) not in DIGITS:
        raise ValueError(f"a reproducible reduction is op SUM on float32, float64, complex64 or complex128 (other "
                         f"ops and element types that are not exact already are not supported); got op "
                         f"{op_name.upper()} on {dt}: call it with reproducible=False")
    return None


def _real(dt: np.dtype) -> np.dtype:
    return np.dtype(f"f{dt.itemsize // 2}") if dt.kind == "c" else dt


def real_view(x: Any) -> Any:
    """*x* (flat) as its real elements: a complex array as its real and imaginary parts, interleaved."""
    return x.view(_real(x.dtype)) if x.dtype.kind == "c" else x


def _host(*arrays: Any) -> bool:
    """Whether the host kernels take these arrays (NumPy, C-contiguous)."""
    return _kernels is not None and all(type(a) is np.ndarray and a.flags.c_contiguous for a in arrays)


def exponents(x: Any, xp: Any = np, out: Any = None) -> Any:
    """Each element's binary exponent as int16 (``|x| < 2**e``): -32768 for 0, 32767 for inf and NaN (written
    into *out* when given)."""
    if out is None:
        out = xp.empty(x.size, np.int16)
    if _host(x, out):
        _kernels.repro(0, int(x.dtype == np.float32), DIGITS[x.dtype], x.size, x, out, out)
        return out
    with np.errstate(invalid="ignore"):
        _, e = xp.frexp(x)
    out[...] = e
    out[x == 0] = _ZERO
    out[~xp.isfinite(x)] = _SPECIAL
    return out


def _power(k: Any, xp: Any) -> Any:
    """2.0**k as float64, elementwise, for integer arrays k with -1022 <= k <= 1023 (built from the bits)."""
    return ((k.astype(np.int64) + 1023) << 52).view(np.float64)


def _scale(x: Any, k: Any, xp: Any) -> Any:
    """x · 2**k (float64), by two exact power-of-two factors (k from -2200 to 2200: each factor a normal number;
    the product rounds only where it leaves the normal range)."""
    half = k >> 1
    return x * _power(half, xp) * _power(k - half, xp)


def digits(x: Any, e: Any, xp: Any = np, out: Any = None) -> Any:
    """The digits of contribution *x* (flat, real) on the grid of exponents *e* (the maximum of every
    contribution's :func:`exponents`): int64, shape ``(x.size, K)`` (written into *out* when given)."""
    k = DIGITS[x.dtype]
    if out is None:
        out = xp.empty((x.size, k), np.int64)
    if _host(x, e, out):
        _kernels.repro(1, int(x.dtype == np.float32), k, x.size, x, e, out)
        return out
    ordinary = (e != _ZERO) & (e != _SPECIAL)
    shift = xp.where(ordinary, BITS - e.astype(np.int32), 0)
    with np.errstate(invalid="ignore", over="ignore"):
        t = _scale(xp.where(ordinary, x, 0).astype(np.float64), shift, xp)  # |t| < 2**B, exact (or below the grid)
        for j in range(k):
            d = xp.trunc(t)
            out[:, j] = d
            if j + 1 < k:
                t -= d  # (exact)
                t *= float(1 << BITS)
    special = e == _SPECIAL
    if bool(special.any()):
        nan = xp.isnan(x)
        out[:, 0] = xp.where(special, xp.where(nan, _NAN, xp.where(x == np.inf, 1, xp.where(x == -np.inf, _NEG, 0))),
                             out[:, 0])
    return out


def finish(sums: Any, e: Any, dtype: Any, xp: Any = np, out: Any = None) -> Any:
    """The rounded result of digit sums *sums* (shape ``(n, K)``, int64) on the grid *e*, as *dtype* (real;
    written into *out*, flat, when given)."""
    dt = np.dtype(dtype)
    k = DIGITS[dt]
    if out is not None and not _host(sums, e, out):
        out[...] = finish(sums, e, dt, xp)
        return out
    if _host(sums, e):
        result = np.empty(e.size, dt) if out is None else out
        _kernels.repro(2, int(dt == np.float32), k, e.size, sums, e, result)
        return result
    ordinary = (e != _ZERO) & (e != _SPECIAL)
    scale = xp.where(ordinary, e.astype(np.int32) - k * BITS, 0)
    with np.errstate(over="ignore", invalid="ignore"):
        if k == 1:
            v = sums[:, 0].astype(np.float32)  # (int64 → float32: one rounding)
            half = scale >> 1  # (two exact float32 power-of-two factors while the result is normal)
            out = v * _power(half, xp).astype(np.float32) * _power(scale - half, xp).astype(np.float32)
        else:
            hi, lo = sums[:, 0].copy(), sums[:, 1].copy()
            carry = lo >> BITS  # normalise: 0 ≤ lo < 2**B
            lo -= carry << BITS
            hi += carry
            a = hi.astype(np.float64)  # |hi| < 2**62: a may round; what it dropped is small and exact
            b = ((hi - a.astype(np.int64)) << BITS) + lo  # |b| < 2**51: exact as float64
            out = _scale(a * float(1 << BITS) + b, scale, xp)  # one rounding (while normal)
    out[e == _ZERO] = 0
    special = e == _SPECIAL
    if bool(special.any()):
        first = sums[:, 0]
        pos, neg, nan = first & (_NEG - 1), (first >> 21) & (_NEG - 1), first >> 42
        value = xp.where((nan > 0) | ((pos > 0) & (neg > 0)), np.nan, xp.where(pos > 0, np.inf, -np.inf))
        out[special] = value[special].astype(dt)
    return out


def grid(parts: Sequence[Any], out: Any, xp: Any = np) -> Any:
    """Each element's largest :func:`exponents` over the contributions *parts* (flat, real, of *out*'s size; any
    number of them, none too), into *out* (int16)."""
    if not len(parts):
        out.fill(_ZERO)
        return out
    exponents(parts[0], xp, out=out)
    for x in parts[1:]:
        xp.maximum(out, exponents(x, xp), out=out)
    return out


def digit_sums(parts: Sequence[Any], e: Any, out: Any, xp: Any = np) -> Any:
    """The sums of the contributions' *parts* :func:`digits` on the grid *e*, into *out* (int64, ``(n, K)``)."""
    if not len(parts):
        out.fill(0)
        return out
    digits(parts[0], e, xp, out=out)
    for x in parts[1:]:
        out += digits(x, e, xp)
    return out


def sum_of(contributions: Iterable[Any], grid: Iterable[Any] | None = None) -> np.ndarray:
    """The reproducible sum of NumPy arrays of one shape and element type (float32/64, complex64/128), in one
    process: the bits a reproducible collective gives for the same contributions, in any order. *grid*: the
    contributions whose exponents set the grid (default: these; a scan's rank r sums its prefix on the grid of
    every rank's contribution)."""
    xs = [np.ascontiguousarray(x) for x in contributions]
    if not xs:
        raise ValueError("sum_of needs at least one contribution")
    shape, dt = xs[0].shape, xs[0].dtype
    on = xs if grid is None else [np.ascontiguousarray(x) for x in grid]
    if any(x.shape != shape or x.dtype != dt for x in xs + on):
        raise ValueError("sum_of: every contribution must have the same shape and element type")
    if len(xs) >= MOST:
        raise ValueError(f"sum_of: at most {MOST - 1} contributions meet in one reproducible sum, got {len(xs)}")
    supported(dt, "sum")
    flats = [real_view(x.reshape(-1)) for x in xs]
    e = _grid([real_view(x.reshape(-1)) for x in on], np.empty(flats[0].size, np.int16))
    total = digit_sums(flats, e, np.empty((e.size, DIGITS[flats[0].dtype]), np.int64))
    return finish(total, e, flats[0].dtype).view(dt).reshape(shape)


_grid = grid  # (sum_of's parameter of that name hides it there)


def bound(contributions: Iterable[float], result: float, dtype: Any) -> float:
    """The error bound of one element's reproducible sum, ``½·ulp(result) + n·2**(E − K·B)`` (see the module
    docstring): *contributions* as Python floats, *result* the sum's value, *dtype* float32 or float64."""
    dt = np.dtype(dtype)
    xs = [float(x) for x in contributions]
    top = max((math.frexp(x)[1] for x in xs if x != 0 and math.isfinite(x)), default=None)
    if top is None:
        return 0.0
    ulp = float(np.spacing(dt.type(abs(result))))
    return 0.5 * ulp + len(xs) * math.ldexp(1.0, top - DIGITS[dt] * BITS)
