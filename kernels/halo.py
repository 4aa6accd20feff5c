"""Halo packing: copy a box of a field into a contiguous message buffer, and back.

A halo exchange sends a face of a rank's block (a box a few cells thick along
one axis) to a neighbour and receives the neighbour's face into the ghost
layers. Faces normal to the last axis are strided in memory, and MPI is
fastest on contiguous buffers, so the application packs each face into a
1-D buffer before sending and unpacks what it received::

    kernels.pack(u, box, buf)      # buf[:N] = u[box] in C order, N = cells in box
    kernels.unpack(buf, u, box)    # u[box] = buf[:N] reshaped

``buf`` is allocated once per face and reused every step (it may be larger
than N: one buffer can serve faces of different sizes). Packing copies values,
so all paths agree exactly.

:func:`pack_simt` and :func:`unpack_simt` are the same copies as SIMT kernels
(numba-cuda, see kernels/simt.py): one thread per cell of a row of the box,
``threadIdx.x`` along the last axis so that a warp reads (and writes)
consecutive addresses of the field and of the buffer; ``blockIdx.y`` strides
over the box's rows. CI runs them in numba's CUDA simulator; on a GPU they
run on CuPy arrays and are measured against the device-to-device copy of the
same bytes (``python -m kernels.gpubench``).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from . import simt
from .checks import Box, box_shape, box_size, check_box, check_field, slices
from .jit import compiled

__all__ = ["check", "pack_numpy", "unpack_numpy", "pack_compiled", "unpack_compiled", "pack_cupy", "unpack_cupy",
           "pack_simt", "unpack_simt", "PACK", "UNPACK"]

#: numba.cuda, set by simt.Kernel when the first kernel is built (the kernels below name it).
cuda: Any = None


def check(who: str, u: Any, box: Any, buf: Any, xp: ModuleType) -> Box | None:
    """Validate the arguments of ``pack``/``unpack``; return the normalised box (None if empty)."""
    check_field(who, "u", u, xp)
    if not isinstance(buf, xp.ndarray):
        raise TypeError(f"{who}: buf is a {type(buf).__name__}; pass a 1-D {xp.__name__}.ndarray "
                        f"(allocate it once with {xp.__name__}.empty(N, dtype=u.dtype))")
    if buf.ndim != 1 or not buf.flags.c_contiguous:
        raise ValueError(f"{who}: buf (shape {tuple(buf.shape)}) must be a contiguous 1-D array; "
                         f"allocate it with {xp.__name__}.empty(N, dtype=u.dtype)")
    if buf.dtype != u.dtype:
        raise ValueError(f"{who}: buf has dtype {buf.dtype} but u has {u.dtype}; a halo buffer holds the field's "
                         f"dtype: allocate it with {xp.__name__}.empty(N, dtype=u.dtype)")
    norm = check_box(who, box, tuple(u.shape), ghost=0)
    if norm is not None:
        need = box_size(norm)
        if buf.size < need:
            raise ValueError(f"{who}: buf holds {buf.size} elements but box {norm} has {need} cells "
                             f"({' x '.join(map(str, box_shape(norm)))}); allocate at least {need}")
        if xp.may_share_memory(u, buf):
            raise ValueError(f"{who}: buf shares memory with u; use a separate buffer")
    return norm


def _view(buf: Any, box: Box) -> Any:
    """The first N elements of *buf* shaped like the box (a view: writes land in buf)."""
    return buf[:box_size(box)].reshape(box_shape(box))


# ---------------------------------------------------------------- NumPy


def pack_numpy(u: np.ndarray, box: Box, buf: np.ndarray) -> None:
    """One strided copy (NumPy's own loop)."""
    np.copyto(_view(buf, box), u[slices(box)])


def unpack_numpy(buf: np.ndarray, u: np.ndarray, box: Box) -> None:
    """One strided copy (NumPy's own loop)."""
    np.copyto(u[slices(box)], _view(buf, box))


# ---------------------------------------------------------------- compiled (numba)
# One loop pair for 2-D and 3-D: a 2-D field is seen as 3-D with one plane, so a single
# compiled version per dtype serves both. Each row is a contiguous run in both arrays.


def _pack_loop(u, lo0, hi0, lo1, hi1, lo2, hi2, buf):  # pragma: no cover - compiled by numba
    n = hi2 - lo2
    p = 0
    for i in range(lo0, hi0):
        for j in range(lo1, hi1):
            src = u[i, j, lo2:hi2]
            dst = buf[p:p + n]
            for k in range(n):
                dst[k] = src[k]
            p += n


def _unpack_loop(buf, u, lo0, hi0, lo1, hi1, lo2, hi2):  # pragma: no cover - compiled by numba
    n = hi2 - lo2
    p = 0
    for i in range(lo0, hi0):
        for j in range(lo1, hi1):
            src = buf[p:p + n]
            dst = u[i, j, lo2:hi2]
            for k in range(n):
                dst[k] = src[k]
            p += n


_pack = compiled(_pack_loop)
_unpack = compiled(_unpack_loop)


def _as3d(u: np.ndarray, box: Box) -> tuple[np.ndarray, list[int]]:
    if u.ndim == 2:
        u, box = u.reshape((1, *u.shape)), ((0, 1), *box)
    return u, [bound for pair in box for bound in pair]


def pack_compiled(u: np.ndarray, box: Box, buf: np.ndarray) -> None:
    """The numba row-copy loop."""
    u3, flat = _as3d(u, box)
    _pack(u3, *flat, buf)


def unpack_compiled(buf: np.ndarray, u: np.ndarray, box: Box) -> None:
    """The numba row-copy loop."""
    u3, flat = _as3d(u, box)
    _unpack(buf, u3, *flat)


# ---------------------------------------------------------------- CuPy


def pack_cupy(u: Any, box: Box, buf: Any) -> None:
    """CuPy's strided copy kernel, on the current stream."""
    import cupy

    cupy.copyto(_view(buf, box), u[slices(box)])


def unpack_cupy(buf: Any, u: Any, box: Box) -> None:
    """CuPy's strided copy kernel, on the current stream."""
    import cupy

    cupy.copyto(u[slices(box)], _view(buf, box))


# ---------------------------------------------------------------- SIMT (numba-cuda)
# A 2-D field is seen as 3-D with one plane (as in the compiled loops). Row r of the box
# is (i, j) = (lo0 + r // n1, lo1 + r % n1); its cells are contiguous in the field and in
# the buffer, at buffer offset r * n2.

#: Threads per block along a row of the box (a multiple of the warp size).
THREADS = 128
#: CUDA's limit on gridDim.y; the kernels' row loops stride past it.
_MAX_GRID_Y = 65535


@simt.Kernel
def halo_kernels() -> tuple[Any, Any]:
    """The (pack, unpack) kernel pair."""

    @cuda.jit
    def pack(u, lo0, lo1, lo2, n0, n1, n2, buf):  # pragma: no cover - a CUDA kernel
        col = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if col < n2:
            for r in range(cuda.blockIdx.y, n0 * n1, cuda.gridDim.y):
                buf[r * n2 + col] = u[lo0 + r // n1, lo1 + r % n1, lo2 + col]

    @cuda.jit
    def unpack(buf, u, lo0, lo1, lo2, n0, n1, n2):  # pragma: no cover - a CUDA kernel
        col = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if col < n2:
            for r in range(cuda.blockIdx.y, n0 * n1, cuda.gridDim.y):
                u[lo0 + r // n1, lo1 + r % n1, lo2 + col] = buf[r * n2 + col]

    return pack, unpack


def _simt_launch(which: int, who: str, u: Any, box: Any, buf: Any, threads: int) -> None:
    norm = check(who, u, box, buf, simt.xp_of(u))
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 1024:
        raise ValueError(f"{who}: threads = {threads!r}; a block has 1 to 1024 threads")
    if norm is None:
        return
    if u.ndim == 2:
        u, norm = u.reshape((1, *u.shape)), ((0, 1), *norm)
    (lo0, _), (lo1, _), (lo2, _) = norm
    n0, n1, n2 = box_shape(norm)
    grid = (simt.blocks(n2, threads), max(1, min(n0 * n1, _MAX_GRID_Y)))
    kernel = halo_kernels()[which]
    bounds = (lo0, lo1, lo2, n0, n1, n2)
    if which == 0:
        simt.launch(kernel, grid, (threads,), u, *bounds, buf)
    else:
        simt.launch(kernel, grid, (threads,), buf, u, *bounds)


def pack_simt(u: Any, box: Any, buf: Any, threads: int = THREADS) -> None:
    """buf[:N] = u[box] in C order by the SIMT kernel (arguments checked as for :meth:`Kernels.pack`);
    *threads* per block along a row."""
    _simt_launch(0, "pack", u, box, buf, threads)


def unpack_simt(buf: Any, u: Any, box: Any, threads: int = THREADS) -> None:
    """u[box] = buf[:N] by the SIMT kernel (the inverse of :func:`pack_simt`)."""
    _simt_launch(1, "unpack", u, box, buf, threads)


#: Path name -> implementation (arguments already checked by :func:`check`).
PACK = {"numpy": pack_numpy, "compiled": pack_compiled, "cupy": pack_cupy}
UNPACK = {"numpy": unpack_numpy, "compiled": unpack_compiled, "cupy": unpack_cupy}
