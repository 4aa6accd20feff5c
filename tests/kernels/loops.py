"""The kernels written as plain loops over NumPy scalars, one cell at a time, in the documented order.

An independent statement of the semantics for small arrays: NumPy scalars keep
the array's dtype (float32 stays float32), so these loops round exactly where
the formula says, and the NumPy path must agree with them bit for bit.
"""

from __future__ import annotations

import itertools

import numpy as np


def cells(box):
    """Every cell of a box, in C order."""
    return itertools.product(*(range(lo, hi) for lo, hi in box))


def heat(u: np.ndarray, v: np.ndarray, c: float, box) -> float:
    """v[p] = u[p] + c*(S - 2d*u[p]) with S summed axis by axis, low then high; returns max |v - u|."""
    t = u.dtype.type
    c, two_d = t(c), t(2 * u.ndim)
    worst = 0.0
    for p in cells(box):
        s = None
        for axis in range(u.ndim):
            for offset in (-1, 1):
                q = list(p)
                q[axis] += offset
                s = u[tuple(q)] if s is None else s + u[tuple(q)]
        x = u[p]
        v[p] = x + c * (s - two_d * x)
        worst = max(worst, float(abs(v[p] - x)))
    return worst


def star(inp: np.ndarray, out: np.ndarray, r: int, box) -> float:
    """out[p] += Σ w·inp over axis 0 then axis 1, k = 1..r, -k then +k; returns Σ|out| (float64)."""
    t = inp.dtype.type
    total = 0.0
    for p in cells(box):
        acc = None
        for axis in (0, 1):
            for k in range(1, r + 1):
                w = t(1.0 / (2.0 * k * r))
                for sign in (-1, 1):
                    q = list(p)
                    q[axis] += sign * k
                    term = (w if sign > 0 else -w) * inp[tuple(q)]
                    acc = term if acc is None else acc + term
        out[p] = out[p] + acc
        total += abs(float(out[p]))
    return total
