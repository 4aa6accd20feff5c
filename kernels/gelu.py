"""Fused bias + GELU, ``out[i, j] = gelu(x[i, j] + bias[j])``: one pass instead of two (SIMT, numba-cuda).

A transformer's MLP adds a bias to a matrix product's output and applies GELU;
done as two kernels, the activation makes two round trips through memory
(read x, write x + b, read it again, write the GELU). Fused, each element is
read once and written once: 2 · itemsize bytes per element (plus the bias,
read once per row and cached), so its bound is the device-to-device copy of
x (``python -m kernels.gpubench``).

GELU in its tanh form (Hendrycks and Gimpel 2016; GPT-2's, and PyTorch's
``gelu(approximate="tanh")``)::

    gelu(v) = 0.5 · v · (1 + tanh(√(2/π) · (v + 0.044715 · v³)))

computed in the arrays' dtype, the constants rounded to it once. One thread per
element; ``threadIdx.x`` runs along the rows' contiguous axis (coalesced loads
and stores, and the warp reads consecutive bias entries), ``blockIdx.y``
strides over the rows. The result equals the NumPy reference to rounding
(``tanh`` comes from another math library).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import simt
from .checks import check_simt

__all__ = ["THREADS", "check", "bias_gelu_numpy", "bias_gelu", "bias_gelu_kernel"]

#: Threads per block along a row.
THREADS = 128
_K0 = math.sqrt(2.0 / math.pi)
_K1 = 0.044715
#: CUDA's limit on gridDim.y; the row loop strides past it.
_MAX_GRID_Y = 65535

#: numba.cuda, set by simt.Kernel when the first kernel is built (the kernels below name it).
cuda: Any = None


def check(x: Any, bias: Any, out: Any) -> None:
    """Validate the arguments of :func:`bias_gelu`."""
    for name, a, ndim in (("x", x, 2), ("bias", bias, 1), ("out", out, 2)):
        check_simt("bias_gelu", name, a, ndim)
    if not (x.dtype == bias.dtype == out.dtype):
        raise ValueError(f"bias_gelu: x, bias and out have dtypes {x.dtype}, {bias.dtype}, {out.dtype}; they must "
                         f"agree")
    if out.shape != x.shape or bias.shape[0] != x.shape[1]:
        raise ValueError(f"bias_gelu: x {tuple(x.shape)}, bias {tuple(bias.shape)}, out {tuple(out.shape)}: out has "
                         f"x's shape and bias one entry per column of x ({x.shape[1]})")
    xp = simt.xp_of(out)
    if xp.may_share_memory(out, bias):
        raise ValueError("bias_gelu: out shares memory with bias; out may be x itself, not the bias")
    if out is not x and xp.may_share_memory(out, x):
        raise ValueError("bias_gelu: out overlaps x without being x; pass x itself (in place) or a separate array")


def bias_gelu_numpy(x: np.ndarray, bias: np.ndarray, out: np.ndarray) -> None:
    """The reference, in the arrays' dtype, step by step as the formula reads."""
    t = x.dtype.type
    v = x + bias
    inner = t(_K0) * (v + t(_K1) * (v * v * v))
    np.multiply(t(0.5) * v, t(1) + np.tanh(inner), out=out)


@simt.Kernel
def bias_gelu_kernel(dtype: np.dtype) -> Any:
    """One thread per element; the constants in the arrays' dtype."""
    t = simt.numba_type(dtype)
    k0, k1, half, one = t(_K0), t(_K1), t(0.5), t(1.0)

    @cuda.jit
    def bias_gelu(x, bias, out):  # pragma: no cover - a CUDA kernel
        col = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if col < x.shape[1]:
            b = bias[col]
            for row in range(cuda.blockIdx.y, x.shape[0], cuda.gridDim.y):
                v = x[row, col] + b
                out[row, col] = half * v * (one + math.tanh(k0 * (v + k1 * (v * v * v))))

    return bias_gelu


def bias_gelu(x: Any, bias: Any, out: Any, threads: int = THREADS) -> None:
    """``out[:] = gelu(x + bias)`` (bias along the last axis) in one pass; out may be x (in place)."""
    check(x, bias, out)
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 1024:
        raise ValueError(f"bias_gelu: threads = {threads!r}; a block has 1 to 1024 threads")
    m, n = x.shape
    if m == 0 or n == 0:
        return
    grid = (simt.blocks(n, threads), max(1, min(m, _MAX_GRID_Y)))
    simt.launch(bias_gelu_kernel(np.dtype(x.dtype)), grid, (threads,), x, bias, out)
