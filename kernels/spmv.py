"""CSR sparse matrix-vector product ``y = A @ x``: the scalar form and one warp per row (SIMT, numba-cuda).

CSR stores an m × n matrix as three arrays: ``indptr`` (m + 1 offsets), and
for row i the column numbers ``indices[indptr[i]:indptr[i+1]]`` and values
``data[indptr[i]:indptr[i+1]]`` (SciPy's and cuSPARSE's layout)::

    y[i] = Σ_{j = indptr[i]}^{indptr[i+1]-1} data[j] · x[indices[j]]

* **scalar** (one thread per row): simple, but neighbouring threads of a warp
  walk different rows, so their loads of ``data``/``indices`` are scattered
  (one memory transaction per thread); good for rows of a few entries.
* **warp** (one warp per row): the 32 lanes of a warp read consecutive entries
  of the same row (lane l takes j = indptr[i] + l, + l + 32, …), so the loads
  of ``data`` and ``indices`` are coalesced; the 32 partial sums are then
  added in a tree (16, 8, 4, 2, 1 apart) through shared memory with a block
  barrier between levels (numba's simulator has no warp shuffles; on a GPU a
  shuffle would save the barriers). Good for rows of tens of entries or more.

Both sum in the arrays' dtype; the scalar form in the order of j, the warp form
in the tree's order, so each equals the NumPy reference to rounding. Memory
traffic per product (the bound it is measured against is the device-to-device
copy of the same bytes, and cuSPARSE's own product): nnz·(itemsize + index
size) for the matrix + (m + 1)·index size + the reads of x + m·itemsize for y.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import simt
from .checks import check_simt

__all__ = ["FORMS", "WARPS_PER_BLOCK", "check", "spmv_numpy", "spmv", "nbytes", "scalar_kernel", "warp_kernel"]

#: The kernel forms, by name.
FORMS = ("scalar", "warp")
#: Warps (rows) per block of the warp form; the scalar form runs WARPS_PER_BLOCK · 32 rows per block.
WARPS_PER_BLOCK = 4
_INDEX = (np.dtype(np.int32), np.dtype(np.int64))

#: numba.cuda, set by simt.Kernel when the first kernel is built (the kernels below name it).
cuda: Any = None


def check(indptr: Any, indices: Any, data: Any, x: Any, y: Any, form: Any, validate: bool = True) -> None:
    """Validate a CSR product's arguments (with *validate*, also indptr's order and the column range, which
    reads the arrays: a corrupt matrix would make the kernel read outside x)."""
    if form not in FORMS:
        raise ValueError(f"spmv: form {form!r} is unknown; choose one of {', '.join(FORMS)}")
    check_simt("spmv", "indptr", indptr, 1, "it must be int32 or int64", _INDEX)
    check_simt("spmv", "indices", indices, 1, f"it must be indptr's dtype ({indptr.dtype})", (indptr.dtype,))
    for name, v in (("data", data), ("x", x), ("y", y)):
        check_simt("spmv", name, v, 1, "it must be float32 or float64")
    if not (data.dtype == x.dtype == y.dtype):
        raise ValueError(f"spmv: data, x and y have dtypes {data.dtype}, {x.dtype}, {y.dtype}; they must agree")
    m = indptr.shape[0] - 1
    if m < 0 or y.shape[0] != m:
        raise ValueError(f"spmv: indptr has {indptr.shape[0]} entries and y {y.shape[0]}; a CSR matrix of m rows "
                         f"has m + 1 offsets and y has m elements")
    if indices.shape[0] != data.shape[0]:
        raise ValueError(f"spmv: indices has {indices.shape[0]} entries and data {data.shape[0]}; one column number "
                         f"per stored value")
    xp = simt.xp_of(y)
    if xp.may_share_memory(y, x) or xp.may_share_memory(y, data):
        raise ValueError("spmv: y shares memory with x or data; pass a separate output")
    if validate and m > 0:
        first, last = int(indptr[0]), int(indptr[-1])
        if first != 0 or last != data.shape[0] or bool((xp.diff(indptr) < 0).any()):
            raise ValueError(f"spmv: indptr must start at 0, never decrease and end at nnz = {data.shape[0]}; it "
                             f"starts at {first} and ends at {last}")
        if indices.shape[0] and (int(indices.min()) < 0 or int(indices.max()) >= x.shape[0]):
            raise ValueError(f"spmv: column numbers run from {int(indices.min())} to {int(indices.max())} but x has "
                             f"{x.shape[0]} elements; every column must lie in [0, {x.shape[0]})")


def spmv_numpy(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
    """The reference: every product data[j]·x[indices[j]], summed per row (empty rows give 0)."""
    rows = np.repeat(np.arange(y.shape[0]), np.diff(indptr))
    y[:] = 0
    np.add.at(y, rows, data * x[indices])


def nbytes(m: int, nnz: int, dtype: np.dtype, index: np.dtype) -> int:
    """Bytes one product moves at least: the matrix, x read once per stored value (a lower estimate when x
    stays in cache), y written."""
    item, idx = np.dtype(dtype).itemsize, np.dtype(index).itemsize
    return nnz * (2 * item + idx) + (m + 1) * idx + m * item


@simt.Kernel
def scalar_kernel(dtype: np.dtype) -> Any:
    """One thread per row."""
    t = simt.numba_type(dtype)

    @cuda.jit
    def scalar(indptr, indices, data, x, y):  # pragma: no cover - a CUDA kernel
        row = cuda.grid(1)
        if row < y.shape[0]:
            acc = t(0)
            for j in range(indptr[row], indptr[row + 1]):
                acc += data[j] * x[indices[j]]
            y[row] = acc

    return scalar


@simt.Kernel
def warp_kernel(warps: int, dtype: np.dtype) -> Any:
    """One warp per row; *warps* rows per block; the partial sums meet in shared memory."""
    t = simt.numba_type(dtype)
    lanes = simt.WARP
    threads = warps * lanes

    @cuda.jit
    def warp(indptr, indices, data, x, y):  # pragma: no cover - a CUDA kernel
        partial = cuda.shared.array(threads, t)
        tid = cuda.threadIdx.x
        lane = tid % lanes
        row = cuda.blockIdx.x * warps + tid // lanes
        acc = t(0)
        if row < y.shape[0]:
            for j in range(indptr[row] + lane, indptr[row + 1], lanes):
                acc += data[j] * x[indices[j]]
        partial[tid] = acc
        cuda.syncthreads()
        offset = lanes // 2
        while offset > 0:  # every thread of the block reaches every barrier
            if lane < offset:
                partial[tid] += partial[tid + offset]
            cuda.syncthreads()
            offset //= 2
        if lane == 0 and row < y.shape[0]:
            y[row] = partial[tid]

    return warp


def spmv(indptr: Any, indices: Any, data: Any, x: Any, y: Any, form: str = "warp", validate: bool = True) -> None:
    """``y[:] = A @ x`` for the CSR matrix (indptr, indices, data) by the *form* kernel ("scalar" or "warp").

    CuPy arrays on a GPU (current stream), NumPy arrays in the simulator. *validate* reads the matrix's offsets
    and columns first (a device synchronisation on a GPU); pass False in a timed loop over a checked matrix.
    """
    check(indptr, indices, data, x, y, form, validate)
    m = y.shape[0]
    if m == 0:
        return
    if form == "scalar":
        threads = WARPS_PER_BLOCK * simt.WARP
        simt.launch(scalar_kernel(np.dtype(y.dtype)), (simt.blocks(m, threads),), (threads,), indptr, indices, data, x, y)
    else:
        kernel = warp_kernel(WARPS_PER_BLOCK, np.dtype(y.dtype))
        simt.launch(kernel, (simt.blocks(m, WARPS_PER_BLOCK),), (WARPS_PER_BLOCK * simt.WARP,),
                    indptr, indices, data, x, y)
