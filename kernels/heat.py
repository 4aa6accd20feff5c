"""The explicit heat step (weighted Jacobi): 5-point in 2-D, 7-point in 3-D, with a fused residual.

For every cell p of the box, with d = u.ndim::

    v[p] = u[p] + c * (S - (2*d) * u[p])
    S    = ((((u[i-1,j] + u[i+1,j]) + u[i,j-1]) + u[i,j+1])      2-D
    S    = ((((((u[i-1,j,k] + u[i+1,j,k]) + u[i,j-1,k]) + u[i,j+1,k]) + u[i,j,k-1]) + u[i,j,k+1])   3-D

(axis 0 low, axis 0 high, axis 1 low, axis 1 high, …, added left to right).
With c = 1/(2d) this is a Jacobi sweep for Laplace's equation; with
c = α·Δt/Δx² an explicit Euler step of the heat equation (stable for
c <= 1/(2d)). The residual is max |v[p] - u[p]| over the box: a maximum,
not a sum, so it does not depend on how the grid is split among ranks (the
application reduces it with ``max``). NaN propagates into it, so a diverging
run is noticed.

Every path performs the same operations in the same order, so the NumPy and
compiled paths agree bit for bit (the compiled loops use no fastmath and no
FMA contraction); CUDA compilers contract ``x + c*(…)`` into an FMA, so the
CuPy path agrees to rounding.

Memory traffic of one update with ordinary stores, float64: 24 bytes per
cell (read u, write-allocate v, write v), the accounting of ``python -m
kernels.bench``. The compiled 2-D loop updates two rows per pass so that
the row between them is loaded once for both, which is what brings it close to
the STREAM bound (see kernels/bench.py).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from . import gpu
from .checks import Box, box_shape, check_box, check_field, check_pair, check_scalar, shifted, slices
from .jit import compiled

__all__ = ["check", "heat_numpy", "heat_compiled", "heat_cupy", "IMPLEMENTATIONS"]


def check(u: Any, v: Any, c: Any, box: Any, xp: ModuleType) -> tuple[Box | None, np.generic]:
    """Validate the arguments of ``heat``; return the normalised box (None if empty) and c in u's dtype."""
    check_field("heat", "u", u, xp)
    check_field("heat", "v", v, xp)
    check_pair("heat", ("u", "v"), u, v, xp)
    c = check_scalar("heat", "c", c, u.dtype)
    return check_box("heat", box, tuple(u.shape), ghost=1), c


# ---------------------------------------------------------------- NumPy (the reference)


def heat_numpy(u: np.ndarray, v: np.ndarray, c: np.generic, box: Box, residual: bool) -> float | None:
    """The reference: one ufunc per operation, in the order of the formula, writing into v[box] (no temporaries
    but one box-sized scratch array for (2d)·u and the residual)."""
    inner = slices(box)
    ub, vb = u[inner], v[inner]
    d = u.ndim
    neighbours = [u[shifted(box, axis, side)] for axis in range(d) for side in (-1, 1)]
    np.add(neighbours[0], neighbours[1], out=vb)
    for neighbour in neighbours[2:]:
        np.add(vb, neighbour, out=vb)
    scratch = np.multiply(ub, u.dtype.type(2 * d))
    np.subtract(vb, scratch, out=vb)
    np.multiply(vb, c, out=vb)
    np.add(ub, vb, out=vb)
    if not residual:
        return None
    np.subtract(vb, ub, out=scratch)
    np.abs(scratch, out=scratch)
    return float(scratch.max())


# ---------------------------------------------------------------- compiled (numba)
# Each loop walks the box row by row over flat (1-D) views of u and v, the innermost
# loop along the last axis. Indices are unsigned (uint64) offsets, so numba emits no
# negative-index handling, and every load comes from one array and every store goes
# to the other: LLVM needs one runtime overlap check per row and vectorises the row.
# The residual keeps one running maximum per column (an elementwise max, which
# vectorises without fastmath, unlike a scalar max reduction) and reduces them at the
# end; ``r > m or r != r`` makes NaN stick.


def _heat2d_loop(u, v, c, two_d, lo0, hi0, lo1, hi1, residual):  # pragma: no cover - compiled by numba
    uf = u.reshape(-1)
    vf = v.reshape(-1)
    nx = np.uint64(u.shape[1])
    one = np.uint64(1)
    n = np.uint64(hi1 - lo1)
    colmax = np.zeros_like(uf[:hi1 - lo1])
    i = lo0
    while i + 1 < hi0:  # two rows per pass: rows i and i+1 share their loads
        base = np.uint64(i) * nx + np.uint64(lo1)
        for j in range(n):
            p = base + j
            q = p + nx
            x = uf[p]
            y = uf[q]
            a = x + c * ((((uf[p - nx] + y) + uf[p - one]) + uf[p + one]) - two_d * x)
            b = y + c * ((((x + uf[q + nx]) + uf[q - one]) + uf[q + one]) - two_d * y)
            vf[p] = a
            vf[q] = b
            if residual:
                ra = abs(a - x)
                rb = abs(b - y)
                m = colmax[j]
                m = ra if (ra > m or ra != ra) else m
                colmax[j] = rb if (rb > m or rb != rb) else m
        i += 2
    if i < hi0:  # an odd row count: the last row alone
        base = np.uint64(i) * nx + np.uint64(lo1)
        for j in range(n):
            p = base + j
            x = uf[p]
            a = x + c * ((((uf[p - nx] + uf[p + nx]) + uf[p - one]) + uf[p + one]) - two_d * x)
            vf[p] = a
            if residual:
                ra = abs(a - x)
                m = colmax[j]
                colmax[j] = ra if (ra > m or ra != ra) else m
    best = colmax[0] - colmax[0]
    if residual:
        for j in range(n):
            r = colmax[j]
            if r > best or r != r:
                best = r
    return best


def _heat3d_loop(u, v, c, two_d, lo0, hi0, lo1, hi1, lo2, hi2, residual):  # pragma: no cover - compiled by numba
    uf = u.reshape(-1)
    vf = v.reshape(-1)
    s1 = np.uint64(u.shape[2])
    s0 = np.uint64(u.shape[1]) * s1
    one = np.uint64(1)
    n = np.uint64(hi2 - lo2)
    colmax = np.zeros_like(uf[:hi2 - lo2])
    for i in range(lo0, hi0):
        for j in range(lo1, hi1):
            base = np.uint64(i) * s0 + np.uint64(j) * s1 + np.uint64(lo2)
            for k in range(n):
                p = base + k
                x = uf[p]
                a = x + c * ((((((uf[p - s0] + uf[p + s0]) + uf[p - s1]) + uf[p + s1]) + uf[p - one]) + uf[p + one])
                             - two_d * x)
                vf[p] = a
                if residual:
                    ra = abs(a - x)
                    m = colmax[k]
                    colmax[k] = ra if (ra > m or ra != ra) else m
    best = colmax[0] - colmax[0]
    if residual:
        for k in range(n):
            r = colmax[k]
            if r > best or r != r:
                best = r
    return best


_heat2d = compiled(_heat2d_loop)
_heat3d = compiled(_heat3d_loop)


def heat_compiled(u: np.ndarray, v: np.ndarray, c: np.generic, box: Box, residual: bool) -> float | None:
    """The numba loops (single-threaded; one MPI rank per core)."""
    two_d = u.dtype.type(2 * u.ndim)
    flat = [bound for pair in box for bound in pair]
    loop = _heat2d if u.ndim == 2 else _heat3d
    best = loop(u, v, c, two_d, *flat, bool(residual))
    return float(best) if residual else None


# ---------------------------------------------------------------- CuPy (raw CUDA)
# One thread per cell of a row (the launch shape of kernels/gpu.py). The residual travels as the bit pattern of |v - u|: for
# non-negative IEEE numbers integer order is value order (and a NaN's pattern is above
# infinity's, so NaN wins), which lets a warp shuffle and one 64-bit atomicMax per warp
# reduce it without a second kernel.

#: The kernel templates CUDA_SOURCE defines (each compiled for float and double).
CUDA_KERNELS = ("heat2d", "heat3d")

CUDA_SOURCE = r"""
template <typename T> __device__ __forceinline__ unsigned long long abs_bits(T x);
template <> __device__ __forceinline__ unsigned long long abs_bits<double>(double x) {
    return (unsigned long long)__double_as_longlong(fabs(x));
}
template <> __device__ __forceinline__ unsigned long long abs_bits<float>(float x) {
    return (unsigned long long)__float_as_uint(fabsf(x));
}

__device__ __forceinline__ void warp_max_to(unsigned long long* out, unsigned long long m) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        unsigned long long other = __shfl_down_sync(0xffffffffu, m, offset);
        m = other > m ? other : m;
    }
    if ((threadIdx.x & 31) == 0 && m != 0ull) atomicMax(out, m);
}

template <typename T>
__global__ void heat2d(const T* __restrict__ u, T* __restrict__ v, long long nx,
                       long long lo0, long long n0, long long lo1, long long n1,
                       T c, T two_d, unsigned long long* res, int residual) {
    const long long col = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long m = 0ull;
    if (col < n1) {
        for (long long row = blockIdx.y; row < n0; row += gridDim.y) {
            const long long p = (lo0 + row) * nx + lo1 + col;
            const T x = u[p];
            const T s = ((u[p - nx] + u[p + nx]) + u[p - 1]) + u[p + 1];
            const T y = x + c * (s - two_d * x);
            v[p] = y;
            if (residual) {
                const unsigned long long b = abs_bits<T>(y - x);
                m = b > m ? b : m;
            }
        }
    }
    if (residual) warp_max_to(res, m);
}

template <typename T>
__global__ void heat3d(const T* __restrict__ u, T* __restrict__ v, long long s0, long long s1,
                       long long lo0, long long n0, long long lo1, long long n1, long long lo2, long long n2,
                       T c, T two_d, unsigned long long* res, int residual) {
    const long long col = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long m = 0ull;
    if (col < n2) {
        for (long long row = blockIdx.y; row < n0 * n1; row += gridDim.y) {
            const long long i = lo0 + row / n1, j = lo1 + row % n1;
            const long long p = i * s0 + j * s1 + lo2 + col;
            const T x = u[p];
            const T s = ((((u[p - s0] + u[p + s0]) + u[p - s1]) + u[p + s1]) + u[p - 1]) + u[p + 1];
            const T y = x + c * (s - two_d * x);
            v[p] = y;
            if (residual) {
                const unsigned long long b = abs_bits<T>(y - x);
                m = b > m ? b : m;
            }
        }
    }
    if (residual) warp_max_to(res, m);
}
"""

_scratch: dict[int, Any] = {}


def bits_to_float(bits: int, dtype: np.dtype) -> float:
    """The float whose IEEE pattern of *dtype* is *bits* (the residual as the kernel leaves it)."""
    if dtype == np.float64:
        return float(np.array([bits], dtype=np.uint64).view(np.float64)[0])
    return float(np.array([bits], dtype=np.uint32).view(np.float32)[0])


def heat_cupy(u: Any, v: Any, c: np.generic, box: Box, residual: bool) -> float | None:
    """One CUDA kernel on the current stream; with residual=False nothing waits for it."""
    import cupy

    shape = box_shape(box)
    if residual:
        result = cupy.zeros(1, dtype=cupy.uint64)
    else:  # the kernel never touches it: one per device, reused
        device = cupy.cuda.Device().id
        if device not in _scratch:
            _scratch[device] = cupy.zeros(1, dtype=cupy.uint64)
        result = _scratch[device]
    two_d = u.dtype.type(2 * u.ndim)
    flag = np.int32(1 if residual else 0)
    lows = [np.int64(lo) for lo, _ in box]
    counts = [np.int64(n) for n in shape]
    if u.ndim == 2:
        name, strides = "heat2d", (np.int64(u.shape[1]),)
    else:
        name, strides = "heat3d", (np.int64(u.shape[1] * u.shape[2]), np.int64(u.shape[2]))
    bounds = [value for pair in zip(lows, counts) for value in pair]
    kernel = gpu.function(cupy, CUDA_SOURCE, name, u.dtype, CUDA_KERNELS)
    kernel(gpu.row_grid(shape), (gpu.THREADS, 1, 1), (u, v, *strides, *bounds, c, two_d, result, flag))
    if not residual:
        return None
    return bits_to_float(int(result.get()[0]), u.dtype)


#: Path name -> implementation (arguments already checked by :func:`check`).
IMPLEMENTATIONS = {"numpy": heat_numpy, "compiled": heat_compiled, "cupy": heat_cupy}
