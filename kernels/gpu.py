"""What the CuPy path's raw CUDA kernels share: the launch shape, dtype names, compiled modules.

Every raw kernel here maps one thread to one cell of a row: ``blockIdx.x`` and
``threadIdx.x`` run along the last axis (so a warp reads consecutive addresses)
and ``blockIdx.y`` strides over the rows (all other axes flattened), which keeps
the grid within CUDA's limits for any box. Kernels are written as C++ templates
over the element type and compiled with NVRTC by ``cupy.RawModule`` on first use,
once per device (CuPy also caches the binaries on disk). Launches go to CuPy's
current stream.

Every module that holds CUDA C names it ``CUDA_SOURCE`` and lists its kernel
templates in ``CUDA_KERNELS``; :func:`compile_source` compiles one for a given
architecture with NVRTC alone, which needs no GPU and no driver (``pip install
cupy-cuda12x nvidia-cuda-nvrtc-cu12``), so CI compiles every source for the
GPUs of :data:`ARCHITECTURES`. (``cupy.RawModule`` asks the driver which GPU it
compiles for, so it cannot do this on a machine without one.)

The oldest GPU the raw kernels run on is the newer of two limits: 6.0 for the
double-precision ``atomicAdd`` of kernels/star.py, and the oldest
architecture the installed NVRTC still compiles for (:func:`minimum_capability`;
NVRTC 12 goes back to 5.0, NVRTC 13 to 7.5 and refuses compute_60).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

__all__ = ["THREADS", "ARCHITECTURES", "KERNEL_MINIMUM", "row_grid", "cuda_type", "function", "sync",
           "compile_source", "minimum_capability"]

#: Threads per block along the last axis: a multiple of the warp size, since the fused
#: reductions shuffle within full warps.
THREADS = 256
#: CUDA's limit on gridDim.y; the kernels' row loops stride past it.
MAX_GRID_Y = 65535

#: The GPU architectures CI compiles every CUDA C source for: A100 (sm_80) and H100/H200 (sm_90).
ARCHITECTURES = ("sm_80", "sm_90")
#: The compute capability the kernels' own instructions need (double-precision atomicAdd), as 10·major + minor.
KERNEL_MINIMUM = 60

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


def _instantiations(kernels: tuple[str, ...]) -> list[str]:
    return [f"{name}<{t}>" for name in kernels for t in ("float", "double")]


def compile_source(source: str, kernels: tuple[str, ...], arch: str) -> bytes:
    """The cubin of *source* with every ``kernel<float>``/``kernel<double>`` of *kernels*, for *arch* ("sm_90").

    NVRTC only: no driver or GPU needed. RuntimeError with NVRTC's log (file
    name, line and message of each error) when it does not compile.
    """
    from cupy_backends.cuda.libs import nvrtc

    program = nvrtc.createProgram(source, "kernels.cu", [], [])
    try:
        names = _instantiations(kernels)
        for name in names:
            nvrtc.addNameExpression(program, name)
        try:
            nvrtc.compileProgram(program, ["--std=c++14", f"--gpu-architecture={arch}"])
        except nvrtc.NVRTCError as exc:
            log = nvrtc.getProgramLog(program).strip()
            raise RuntimeError(f"NVRTC {'.'.join(map(str, nvrtc.getVersion()))} cannot compile the kernels "
                               f"{', '.join(kernels)} for {arch}: {exc}\n{log}") from None
        for name in names:  # each instantiation exists under its mangled name
            nvrtc.getLoweredName(program, name)
        return bytes(nvrtc.getCUBIN(program))
    finally:
        nvrtc.destroyProgram(program)


def minimum_capability(supported: list[int] | tuple[int, ...]) -> int:
    """The oldest compute capability (10·major + minor) the raw kernels run on, given the architectures the
    installed NVRTC compiles for (``cupy.cuda.nvrtc.getSupportedArchs()``)."""
    return max(KERNEL_MINIMUM, min(supported)) if supported else KERNEL_MINIMUM
