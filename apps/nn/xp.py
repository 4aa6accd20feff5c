"""Which array module an array belongs to, without importing CuPy where it is not used.

The layers, losses and optimizers are written once against the NumPy API and
run on whichever module their input comes from (``xp = array_module(x)``), so
the same code trains on the CPU and on a GPU. CuPy is imported only when a CuPy
array is actually seen: a CPU-only process never pays for (or needs) it.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

__all__ = ["array_module", "is_device_array", "to_host"]


def is_device_array(x: Any) -> bool:
    """True for a CuPy array, decided from its type's module (so CuPy need not be importable)."""
    return type(x).__module__.startswith("cupy")


def array_module(x: Any) -> ModuleType:
    """``cupy`` for a CuPy array, ``numpy`` for anything else."""
    if is_device_array(x):
        import cupy

        return cupy
    return np


def to_host(a: Any) -> np.ndarray:
    """*a* as a NumPy array: copied from the device for CuPy, unchanged (no copy) for NumPy."""
    if is_device_array(a):
        return a.get()
    return np.asarray(a)
