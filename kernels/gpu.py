"""What the CuPy path's raw CUDA kernels share: the launch shape, dtype names, compiled modules.

Every raw kernel here maps one thread to one cell of a row: ``blockIdx.x`` and
``threadIdx.x`` run along the last axis (so a warp reads consecutive addresses)
and ``blockIdx.y`` strides over the rows (all other axes flattened), which keeps
the grid within CUDA's limits for any box. Kernels are written as C++ templates
over the element type and compiled with NVRTC by ``cupy.RawModule`` on first use,
once per device (CuPy also caches the binaries on disk). Launches go to CuPy's
current stream.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

__all__ = ["THREADS", "row_grid", "cuda_type", "function", "sync"]

#: Threads per block along the last axis: a multiple of the warp size, since the fused
#: reductions shuffle within full warps.
THREADS = 256
#: CUDA's limit on gridDim.y; the kernels' row loops stride past it.
MAX_GRID_Y = 65535

_modules: dict[tuple[str, int], Any] = {}


def row_grid(shape: tuple[int, ...]) -> tuple[int, int, int]:
    """The grid for a box of *shape*: blocks along the last axis × rows (capped; the kernel strides)."""
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    return (-(-shape[-1] // THREADS), max(1, min(rows, MAX_GRID_Y)), 1)


def cuda_type(dtype: np.dtype) -> str:
    """The CUDA C name of a kernel dtype (float32 → float, float64 → double)."""
    return "double" if np.dtype(dtype) == np.float64 else "float"


def function(cupy: ModuleType, source: str, kernel: str, dtype: np.dtype, kernels: tuple[str, ...]) -> Any:
    """``kernel<T>`` for *dtype* from *source* (which defines the templates *kernels*), on the current device."""
    key = (source, cupy.cuda.Device().id)
    if key not in _modules:
        names = [f"{name}<{t}>" for name in kernels for t in ("float", "double")]
        _modules[key] = cupy.RawModule(code=source, options=("--std=c++14",), name_expressions=names)
    return _modules[key].get_function(f"{kernel}<{cuda_type(dtype)}>")


def sync(cupy: ModuleType) -> None:
    """Wait for everything queued on the current stream."""
    cupy.cuda.get_current_stream().synchronize()
