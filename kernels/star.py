"""The Parallel Research Kernels' 2-D "Stencil": a star of radius r, added into ``out``, with its L1 norm.

For every cell p = (i, j) of the box::

    out[p] += Σ_axis Σ_{k=1..r} ( w(-k) · inp[p - k·e_axis]  +  w(+k) · inp[p + k·e_axis] )
    w(+k) = 1 / (2·k·r),   w(-k) = -1 / (2·k·r),   centre weight 0

The sum is accumulated term by term in one fixed order — axis 0 then axis 1;
within an axis k = 1..r, the -k term then the +k term — starting from the first
term, and added to ``out[p]`` at the end. The weights are computed in float64 and
rounded once to the array's dtype. The return value is PRK's norm before its
division by the number of points: Σ |out[p]| over the box after the update,
accumulated in float64 in a fixed order (a running sum per column, down the
rows; then the columns left to right), so the NumPy and compiled paths agree bit
for bit on it as well. The CuPy path sums in another order (and contracts to
FMAs), so it agrees to rounding.

PRK's check: with ``inp[i, j] = i + j`` (COEFX = COEFY = 1), ``inp += 1`` after
every sweep and ``out`` starting at 0, each sweep adds exactly
Σ_axis Σ_k w(k)·2k = 2 to every updated cell (the constant cancels between -k
and +k); for r = 1, 2 the weights are powers of two and every operation is exact,
so ``out == 2·T`` exactly after T sweeps.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from . import gpu
from .checks import Box, box_shape, check_box, check_field, check_pair, shifted, slices
from .jit import compiled

__all__ = ["check", "weights", "star_numpy", "star_compiled", "star_cupy", "IMPLEMENTATIONS"]


def check(inp: Any, out: Any, r: Any, box: Any, xp: ModuleType) -> tuple[Box | None, int]:
    """Validate the arguments of ``star``; return the normalised box (None if empty) and r."""
    check_field("star", "inp", inp, xp, ndims=(2,))
    check_field("star", "out", out, xp, ndims=(2,))
    check_pair("star", ("inp", "out"), inp, out, xp)
    if isinstance(r, (bool, np.bool_)) or not isinstance(r, (int, np.integer)):
        raise TypeError(f"star: r is {r!r} ({type(r).__name__}); the radius is an integer >= 1")
    if r < 1:
        raise ValueError(f"star: r = {r}; the radius must be >= 1")
    return check_box("star", box, tuple(inp.shape), ghost=int(r)), int(r)


def weights(r: int, dtype: np.dtype) -> np.ndarray:
    """w(+k) for k = 1..r in *dtype* (w(-k) is its negation): 1/(2·k·r), computed in float64 and rounded once."""
    return np.array([1.0 / (2.0 * k * r) for k in range(1, r + 1)], dtype=dtype)


def _terms(r: int) -> list[tuple[int, int, int]]:
    """(axis, offset, index into the weights) in the order the sum is accumulated."""
    return [(axis, sign * k, k - 1) for axis in (0, 1) for k in range(1, r + 1) for sign in (-1, 1)]


# ---------------------------------------------------------------- NumPy (the reference)


def star_numpy(inp: np.ndarray, out: np.ndarray, r: int, box: Box) -> float:
    """The reference: one multiply and one add per term into a box-sized accumulator, in the documented order."""
    wp = weights(r, inp.dtype)
    wm = -wp
    acc = np.empty(box_shape(box), dtype=inp.dtype)
    term = np.empty_like(acc)
    for n, (axis, offset, k) in enumerate(_terms(r)):
        w = wp[k] if offset > 0 else wm[k]
        if n == 0:
            np.multiply(inp[shifted(box, axis, offset)], w, out=acc)
        else:
            np.multiply(inp[shifted(box, axis, offset)], w, out=term)
            np.add(acc, term, out=acc)
    ob = out[slices(box)]
    np.add(ob, acc, out=ob)
    np.abs(ob, out=acc)
    columns = np.zeros(acc.shape[1], dtype=np.float64)
    for row in acc:  # down the rows, one running sum per column (the compiled loop's order)
        np.add(columns, row, out=columns)
    return float(np.add.accumulate(columns)[-1])


# ---------------------------------------------------------------- compiled (numba)
# Per row: the terms are accumulated into a row buffer, one vectorised pass per term
# (the radius is a run-time value, so a loop over it inside the cell loop would stop
# LLVM from vectorising); then out is updated and the column sums advanced.


def _star_loop(inp, out, r, wp, lo0, hi0, lo1, hi1):  # pragma: no cover - compiled by numba
    n = hi1 - lo1
    acc = np.empty_like(inp[0, lo1:hi1])
    columns = np.zeros(n, dtype=np.float64)
    for i in range(lo0, hi0):
        first = inp[i - 1, lo1:hi1]
        w = -wp[0]
        for j in range(n):
            acc[j] = w * first[j]
        for k in range(1, r + 1):
            w = wp[k - 1]
            if k > 1:
                low = inp[i - k, lo1:hi1]
                for j in range(n):
                    acc[j] = acc[j] + (-w) * low[j]
            high = inp[i + k, lo1:hi1]
            for j in range(n):
                acc[j] = acc[j] + w * high[j]
        for k in range(1, r + 1):
            w = wp[k - 1]
            low = inp[i, lo1 - k:hi1 - k]
            for j in range(n):
                acc[j] = acc[j] + (-w) * low[j]
            high = inp[i, lo1 + k:hi1 + k]
            for j in range(n):
                acc[j] = acc[j] + w * high[j]
        row = out[i, lo1:hi1]
        for j in range(n):
            o = row[j] + acc[j]
            row[j] = o
            columns[j] += abs(o)
    total = 0.0
    for j in range(n):
        total += columns[j]
    return total


_star = compiled(_star_loop)


def star_compiled(inp: np.ndarray, out: np.ndarray, r: int, box: Box) -> float:
    """The numba loop (single-threaded; one MPI rank per core)."""
    (lo0, hi0), (lo1, hi1) = box
    return float(_star(inp, out, r, weights(r, inp.dtype), lo0, hi0, lo1, hi1))


# ---------------------------------------------------------------- CuPy (raw CUDA)
# One thread per cell, as in kernels/heat.py; the norm is summed per warp with shuffles
# and added with one double atomicAdd per warp (compute capability >= 6.0).

#: The kernel templates CUDA_SOURCE defines (each compiled for float and double).
CUDA_KERNELS = ("star2d",)

CUDA_SOURCE = r"""
template <typename T>
__global__ void star2d(const T* __restrict__ inp, T* __restrict__ out, long long nx,
                       long long lo0, long long n0, long long lo1, long long n1,
                       int r, const T* __restrict__ wp, double* norm) {
    const long long col = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    double sum = 0.0;
    if (col < n1) {
        for (long long row = blockIdx.y; row < n0; row += gridDim.y) {
            const long long p = (lo0 + row) * nx + lo1 + col;
            T acc = (-wp[0]) * inp[p - nx];
            acc = acc + wp[0] * inp[p + nx];
            for (int k = 2; k <= r; ++k) {
                acc = acc + (-wp[k - 1]) * inp[p - k * nx];
                acc = acc + wp[k - 1] * inp[p + k * nx];
            }
            for (int k = 1; k <= r; ++k) {
                acc = acc + (-wp[k - 1]) * inp[p - k];
                acc = acc + wp[k - 1] * inp[p + k];
            }
            const T o = out[p] + acc;
            out[p] = o;
            sum += fabs((double)o);
        }
    }
    for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, offset);
    if ((threadIdx.x & 31) == 0 && sum != 0.0) atomicAdd(norm, sum);
}
"""

def star_cupy(inp: Any, out: Any, r: int, box: Box) -> float:
    """One CUDA kernel on the current stream; reading the norm back waits for it."""
    import cupy

    (lo0, _), (lo1, _) = box
    n0, n1 = box_shape(box)
    norm = cupy.zeros(1, dtype=cupy.float64)
    wp = cupy.asarray(weights(r, inp.dtype))
    kernel = gpu.function(cupy, CUDA_SOURCE, "star2d", inp.dtype, CUDA_KERNELS)
    kernel(gpu.row_grid((n0, n1)), (gpu.THREADS, 1, 1),
           (inp, out, np.int64(inp.shape[1]), np.int64(lo0), np.int64(n0), np.int64(lo1), np.int64(n1), np.int32(r),
            wp, norm))
    return float(norm.get()[0])


#: Path name -> implementation (arguments already checked by :func:`check`).
IMPLEMENTATIONS = {"numpy": star_numpy, "compiled": star_compiled, "cupy": star_cupy}
