"""Tiled matrix multiply ``c = a @ b``: shared-memory tiles, coalesced loads (SIMT, numba-cuda).

A block of TILE × TILE threads computes one TILE × TILE tile of c. It walks
along k in steps of TILE; at each step every thread loads one element of a's
tile and one of b's into shared memory, the block waits (``syncthreads``),
each thread adds the TILE products of its row of a's tile and its column of
b's tile, and the block waits again before the tiles are overwritten::

          k →                          n →
        ┌────┬────┬────┐            ┌────┬────┐
    m   │ A0 │ A1 │ A2 │  ×    k    │ B0 │    │      c[tile] = Σ_t  A_t @ B_t
    ↓   ├────┼────┼────┤       ↓    ├────┤    │
        │    │    │    │            │ B1 │    │      every element of a and b is read
        └────┴────┴────┘            ├────┤    │      from memory m/TILE (resp. n/TILE)
                                    │ B2 │    │      times instead of m (resp. n)
                                    └────┴────┘

Coalescing: ``threadIdx.x`` runs along the last (contiguous) axis of every
array: a warp loads consecutive addresses of a's row, of b's row and stores
consecutive elements of c. In shared memory a thread reads ``sa[ty, j]`` (the
same address across the warp: a broadcast) and ``sb[j, tx]`` (consecutive
words: no bank conflicts). Edges: tiles past the matrix are padded with zeros,
so any m, n, k works.

The products are accumulated in the arrays' dtype, in order j = 0..k-1, so the
result equals NumPy's to rounding (BLAS sums in another order): within
``k · eps · Σ|a||b|``. Cost per tile step: 2·TILE² loads from memory, 2·TILE³
flops; FP32 runs on the CUDA cores (no tensor cores), so cuBLAS's SGEMM (or its
TF32 mode) is the bound it is measured against (``python -m kernels.gpubench``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import simt
from .checks import check_simt

__all__ = ["TILE", "check", "matmul_numpy", "matmul", "tiled_kernel"]

#: The default tile side: 16 × 16 = 256 threads per block, 2 · 16² · 8 = 4 KiB of shared memory in float64.
TILE = 16

#: numba.cuda, set by simt.Kernel when the first kernel is built (the kernels below name it).
cuda: Any = None


def check(a: Any, b: Any, c: Any, tile: Any) -> int:
    """Validate the arguments of :func:`matmul`; return the tile side."""
    for name, x in (("a", a), ("b", b), ("c", c)):
        check_simt("matmul", name, x, 2, f"the kernel takes float32 or float64 (convert with {name}.astype(numpy.float32))",
                   why=" (the loads are coalesced along its last axis)")
    if not (a.dtype == b.dtype == c.dtype):
        raise ValueError(f"matmul: a, b and c have dtypes {a.dtype}, {b.dtype}, {c.dtype}; they must agree")
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2 or tuple(c.shape) != (m, n):
        raise ValueError(f"matmul: shapes a {tuple(a.shape)} @ b {tuple(b.shape)} -> c {tuple(c.shape)} do not "
                         f"fit; a is (m, k), b (k, n) and c (m, n)")
    xp = simt.xp_of(c)
    if xp.may_share_memory(c, a) or xp.may_share_memory(c, b):
        raise ValueError("matmul: c shares memory with a or b; the kernel reads a and b while writing c: "
                         "pass a separate output")
    if isinstance(tile, (bool, np.bool_)) or not isinstance(tile, (int, np.integer)) or not 1 <= tile <= 32:
        raise ValueError(f"matmul: tile = {tile!r}; the tile side is an integer from 1 to 32 (a block has "
                         f"tile² <= 1024 threads)")
    return int(tile)


def matmul_numpy(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> None:
    """The reference: NumPy's (BLAS's) product into c."""
    np.matmul(a, b, out=c)


@simt.Kernel
def tiled_kernel(tile: int, dtype: np.dtype) -> Any:
    """The tiled kernel for a tile side and dtype (shared arrays are sized and typed at compile time)."""
    t = simt.numba_type(dtype)

    @cuda.jit
    def tiled(a, b, c):  # pragma: no cover - a CUDA kernel: runs on a GPU or in numba's simulator
        tx = cuda.threadIdx.x  # along n (c's columns) and along k for a's loads: the contiguous axes
        ty = cuda.threadIdx.y
        sa = cuda.shared.array((tile, tile), t)
        sb = cuda.shared.array((tile, tile), t)
        row = cuda.blockIdx.y * tile + ty
        col = cuda.blockIdx.x * tile + tx
        m = a.shape[0]
        k = a.shape[1]
        n = b.shape[1]
        acc = t(0)
        for step in range((k + tile - 1) // tile):
            ka = step * tile + tx
            sa[ty, tx] = a[row, ka] if row < m and ka < k else t(0)
            kb = step * tile + ty
            sb[ty, tx] = b[kb, col] if kb < k and col < n else t(0)
            cuda.syncthreads()
            for j in range(tile):
                acc += sa[ty, j] * sb[j, tx]
            cuda.syncthreads()
        if row < m and col < n:
            c[row, col] = acc

    return tiled


def matmul(a: Any, b: Any, c: Any, tile: int = TILE) -> None:
    """``c[:] = a @ b`` by the tiled kernel: CuPy arrays on a GPU (current stream), NumPy arrays in the simulator."""
    tile = check(a, b, c, tile)
    m, n = c.shape
    grid = (simt.blocks(n, tile), simt.blocks(m, tile))
    simt.launch(tiled_kernel(tile, np.dtype(c.dtype)), grid, (tile, tile), a, b, c)
