"""What the SIMT kernels share: numba-cuda, its CUDA simulator, launch shapes and the array module.

The kernels of matmul.py, spmv.py, gelu.py and the SIMT halo pack of halo.py are
written once, in Python, for numba-cuda (``@cuda.jit``): one function body is
one CUDA thread, with ``cuda.threadIdx``, ``cuda.syncthreads()`` and
``cuda.shared.array`` as in CUDA C. The same source runs in two places:

* on a GPU, on CuPy arrays (numba takes them through
  ``__cuda_array_interface__``), launched on CuPy's current stream, so the
  kernels order with the CuPy work around them as the stream contract asks;
* in numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``), on NumPy arrays, on
  the CPU: every thread of a block is a Python thread, barriers and shared
  memory included. CI runs every kernel's logic there against a NumPy
  reference, at sizes of a few tiles (the simulator runs about a thousand
  threads a second).

The simulator has no warp shuffles (``shfl_down_sync``) and no ``syncwarp``,
so a warp's partial sums are reduced through shared memory with block
barriers; each ``cuda.shared.array(...)`` sits on a line of its own, because
the simulator tells shared arrays apart by the line that makes them.

The simulator has to be chosen before ``numba.cuda`` is first imported:
:func:`use_simulator` does that (``python -m kernels.gpubench --simulator``
and the tests call it when no GPU is visible).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

__all__ = ["SIMULATOR_ENV", "WARP", "reason", "use_simulator", "simulated", "cuda", "blocks", "xp_of", "launch",
           "sync", "Kernel", "numba_type"]

#: The environment variable that makes numba.cuda the CPU simulator.
SIMULATOR_ENV = "NUMBA_ENABLE_CUDASIM"
#: Threads per warp (the simulator keeps CUDA's 32).
WARP = 32

_FIX = "pip install numba (numba-cuda on a GPU machine: pip install numba-cuda)"


def reason() -> str | None:
    """Why the SIMT kernels cannot run here, or None: they need numba, and a GPU or the simulator."""
    if importlib.util.find_spec("numba") is None:
        return f"numba is not installed: {_FIX}"
    if simulated():
        return None
    from mpicomm.device import visible_devices

    if visible_devices() == 0:
        return (f"no CUDA device is visible and numba's CUDA simulator is off; set {SIMULATOR_ENV}=1 (before "
                f"numba.cuda is imported) or call kernels.simt.use_simulator() to run the kernels on the CPU")
    return None


def simulated() -> bool:
    """Whether numba.cuda is (or will be, once imported) the CPU simulator."""
    module = sys.modules.get("numba.cuda")
    if module is not None:
        return ".simulator" in getattr(module.jit, "__module__", "")
    return os.environ.get(SIMULATOR_ENV) == "1"


def use_simulator() -> None:
    """Make numba.cuda the CPU simulator. RuntimeError if the real numba.cuda is already imported."""
    if "numba.cuda" in sys.modules and not simulated():
        raise RuntimeError(f"numba.cuda is already imported without the simulator; set {SIMULATOR_ENV}=1 before "
                           f"the first import of numba.cuda (at the top of the program, or in the environment)")
    os.environ[SIMULATOR_ENV] = "1"
    if "numba" in sys.modules:  # numba read its settings at import: read them again
        importlib.import_module("numba.core.config").reload_config()


def cuda() -> ModuleType:
    """``numba.cuda`` (the simulator where chosen); RuntimeError naming the fix when it cannot run here."""
    why = reason()
    if why is not None:
        raise RuntimeError(f"the SIMT kernels cannot run here: {why}")
    return importlib.import_module("numba.cuda")


def blocks(n: int, threads: int) -> int:
    """Blocks of *threads* that cover *n* items (at least one)."""
    return max(1, -(-n // threads))


def xp_of(a: Any) -> ModuleType:
    """The array module of *a*: NumPy for host arrays (the simulator's), CuPy for device arrays."""
    if isinstance(a, np.ndarray):
        return np
    return importlib.import_module("cupy")


def _stream(cuda_module: ModuleType, args: tuple[Any, ...]) -> Any:
    """CuPy's current stream as a numba stream when the arguments live on a GPU, else numba's default (0)."""
    if simulated() or all(isinstance(a, (np.ndarray, np.generic, int, float)) for a in args):
        return 0
    cupy = importlib.import_module("cupy")
    ptr = cupy.cuda.get_current_stream().ptr
    return cuda_module.external_stream(ptr) if ptr else 0  # 0: the default stream, numba's and CuPy's alike


def launch(kernel: Any, grid: tuple[int, ...], block: tuple[int, ...], *args: Any) -> None:
    """``kernel[grid, block, stream](*args)`` on CuPy's current stream (GPU) or in the simulator."""
    stream = _stream(cuda(), args)
    kernel[grid, block, stream](*args)


def sync(xp: ModuleType) -> None:
    """Wait for the kernels queued so far (CuPy's current stream); a no-op for the simulator's NumPy arrays."""
    if xp is not np:
        xp.cuda.get_current_stream().synchronize()


class Kernel:
    """A kernel made by ``make(*key)`` (a function returning a ``@cuda.jit`` kernel), built once per key.

    Compile-time constants (tile sizes, block sizes, dtypes for shared arrays)
    are the key: numba fixes a shared array's shape and type when it compiles.
    Nothing is imported or compiled until the first call. The kernel bodies
    name ``cuda``, a global of their own module (``cuda: Any = None`` there),
    which the first build sets to ``numba.cuda``: numba's simulator finds the
    module among a kernel's globals and swaps in its fake one while the kernel
    runs (a closure variable would escape the swap).
    """

    def __init__(self, make: Callable[..., Any]):
        self.make = make
        self.__name__ = make.__name__
        self.__doc__ = make.__doc__
        self._built: dict[tuple[Any, ...], Any] = {}

    def __call__(self, *key: Any) -> Any:
        if key not in self._built:
            self.make.__globals__["cuda"] = cuda()
            self._built[key] = self.make(*key)
        return self._built[key]


def numba_type(dtype: np.dtype) -> Any:
    """numba's scalar type for *dtype* (shared arrays and typed zeros need it)."""
    numba = importlib.import_module("numba")
    return numba.from_dtype(np.dtype(dtype))
