"""The three paths — NumPy, compiled (numba), CuPy — behind one interface: ``select(path)`` → :class:`Kernels`.

A caller chooses a path once (from a command-line flag, say), asks
:func:`available` whether it can run here, and calls the kernels through the
returned object without any ``if gpu:`` of its own::

    k = kernels.select("compiled")
    res = k.heat(u, v, 0.25, box)      # u, v: k.xp arrays
    k.sync()                           # before reading a clock

* ``numpy``: slicing expressions with ``out=``; the reference every other path
  is tested against. Always available.
* ``compiled``: numba loops, single-threaded (the application runs one MPI rank
  per core), compiled on first use and cached on disk; equal to the NumPy path
  bit for bit. Needs numba (``pip install -e '.[compiled]'``).
* ``cupy``: raw CUDA kernels on CuPy's current stream and device (choose the
  device first, e.g. with ``comm.bind_device()``); equal to the NumPy path up
  to rounding (FMA contraction). Needs CuPy and a GPU of compute capability
  6.0 or newer that the installed NVRTC still compiles for: 6.0 with CUDA 12,
  7.5 with CUDA 13 (NVRTC 13 refuses compute_60; see kernels/gpu.py).

Every method checks its arguments (array kind and dtype, contiguity, box
against shape and ghost width, buffer size) and raises ``ValueError`` or
``TypeError`` naming the value and the fix before any kernel runs.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import numpy as np

from . import gpu, halo, heat, star, stream
from .jit import numba_reason

__all__ = ["PATHS", "available", "select", "Kernels"]

#: The path names, in the order of preference for a CPU-only run after "numpy".
PATHS = ("numpy", "compiled", "cupy")

_CUPY_FIX = "pip install -e '.[cuda12]' or '.[cuda13]'"


def _unknown(path: Any) -> ValueError:
    return ValueError(f"unknown kernel path {path!r}; valid paths: {', '.join(PATHS)}")


def _cupy_reason() -> str | None:
    try:
        cupy = importlib.import_module("cupy")
    except ImportError:
        return f"CuPy is not installed: {_CUPY_FIX}"
    except Exception as exc:  # a CuPy built for a missing CUDA
        return f"CuPy does not import ({type(exc).__name__}: {exc}); install the build for your CUDA: {_CUPY_FIX}"
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # no driver
        return f"CuPy is installed but finds no CUDA driver or device ({type(exc).__name__}: {exc})"
    if count == 0:
        return "CuPy is installed but no CUDA device is visible (check CUDA_VISIBLE_DEVICES)"
    capability = int(cupy.cuda.Device().compute_capability)
    try:
        supported = list(cupy.cuda.nvrtc.getSupportedArchs())
        nvrtc = ".".join(map(str, cupy.cuda.nvrtc.getVersion()))
    except Exception:  # an NVRTC too old to say: the kernels' own limit
        supported, nvrtc = [], "of this CuPy"
    return capability_reason(capability, supported, nvrtc)


def capability_reason(capability: int, supported: list[int], nvrtc: str) -> str | None:
    """Why a GPU of *capability* (10·major + minor) cannot run the CuPy kernels with an NVRTC that compiles for
    *supported*, or None when it can."""
    need = gpu.minimum_capability(supported)
    if capability >= need:
        return None
    if capability < gpu.KERNEL_MINIMUM:
        why, fix = "double-precision atomicAdd", "use a CPU path (kernels.select('compiled'))"
    else:
        why = f"the oldest architecture NVRTC {nvrtc} compiles for"
        fix = "install CUDA 12's CuPy (pip install cupy-cuda12x), whose NVRTC still compiles for it, or use a CPU path"
    return (f"the current GPU has compute capability {capability // 10}.{capability % 10}; the CuPy kernels need "
            f"{need // 10}.{need % 10} or newer ({why}): {fix}")


def available(path: str) -> tuple[bool, str]:
    """Whether *path* can run here, and why not (or a short description when it can)."""
    if path == "numpy":
        return True, "NumPy reference"
    if path == "compiled":
        reason = numba_reason()
        return (False, reason) if reason else (True, "numba, single-threaded, no fastmath")
    if path == "cupy":
        reason = _cupy_reason()
        return (False, reason) if reason else (True, "CuPy raw CUDA kernels on the current stream")
    raise _unknown(path)


def select(path: str) -> Kernels:
    """The kernels of *path*: ValueError for an unknown name, RuntimeError (with the fix) if it cannot run here."""
    if path not in PATHS:
        raise _unknown(path)
    ok, reason = available(path)
    if not ok:
        raise RuntimeError(f"kernel path {path!r} is not available: {reason}")
    xp = importlib.import_module("cupy") if path == "cupy" else np
    return Kernels(path, xp)


class Kernels:
    """One path's kernels. ``name`` is the path, ``xp`` its array module (numpy, or cupy)."""

    def __init__(self, name: str, xp: ModuleType):
        if name not in PATHS:
            raise _unknown(name)
        self.name = name
        self.xp = xp
        self._heat = heat.IMPLEMENTATIONS[name]
        self._star = star.IMPLEMENTATIONS[name]
        self._pack = halo.PACK[name]
        self._unpack = halo.UNPACK[name]
        self._triad = stream.IMPLEMENTATIONS[name]

    def __repr__(self) -> str:
        return f"Kernels({self.name!r}, xp={self.xp.__name__})"

    def heat(self, u: Any, v: Any, c: float, box: Any, residual: bool = True) -> float | None:
        """One heat/Jacobi step on the box: ``v[p] = u[p] + c*(S - 2d*u[p])`` (see kernels/heat.py).

        Returns max |v - u| over the box (0.0 for an empty box) when *residual*,
        else None (without synchronising a GPU).
        """
        box, c = heat.check(u, v, c, box, self.xp)
        if box is None:
            return 0.0 if residual else None
        return self._heat(u, v, c, box, bool(residual))

    def star(self, inp: Any, out: Any, r: int, box: Any) -> float:
        """PRK's 2-D star stencil of radius *r* added into out on the box; returns Σ|out| over the box."""
        box, r = star.check(inp, out, r, box, self.xp)
        if box is None:
            return 0.0
        return self._star(inp, out, r, box)

    def pack(self, u: Any, box: Any, buf: Any) -> None:
        """Copy u[box] in C order into buf[:N] (N = cells in the box)."""
        box = halo.check("pack", u, box, buf, self.xp)
        if box is not None:
            self._pack(u, box, buf)

    def unpack(self, buf: Any, u: Any, box: Any) -> None:
        """Copy buf[:N] into u[box] (the inverse of :meth:`pack`)."""
        box = halo.check("unpack", u, box, buf, self.xp)
        if box is not None:
            self._unpack(buf, u, box)

    def triad(self, a: Any, b: Any, c: Any, s: float) -> None:
        """STREAM triad ``a[:] = b + s*c`` (one pass; two on the NumPy path, see kernels/stream.py)."""
        s = stream.check(a, b, c, s, self.xp)
        self._triad(a, b, c, s)

    def sync(self) -> None:
        """Wait until the kernels queued so far have finished (a no-op on the CPU paths)."""
        if self.name == "cupy":
            gpu.sync(self.xp)
