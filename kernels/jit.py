"""Lazy numba compilation for the compiled CPU path.

The loops of the compiled path are plain Python functions at module level
(``_heat2d_loop`` in kernels/heat.py, …). :func:`compiled` wraps one so that
numba is imported and the loop compiled only when it is first called: importing
``kernels`` (or using the NumPy path) never pays for numba, and a machine
without numba can still import everything. ``cache=True`` keeps the machine
code in ``__pycache__`` next to the source, so later processes (every MPI rank
of the next run) load it instead of compiling again.

Compilation settings, the same for every loop, and why:

* no ``fastmath``: the compiled path must agree bit for bit with the NumPy
  reference, so floating-point operations keep their written order and are
  never contracted into FMAs or reassociated;
* no ``parallel``: the application runs one MPI rank per core, and threads
  inside a rank would compete with the other ranks for the same cores;
* ``nogil=True``: a rank may still run a kernel in a thread while its main
  thread drives communication;
* loops are self-contained (no calls to other compiled functions), which
  keeps numba's on-disk cache valid for each one on its own.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from typing import Any

__all__ = ["numba_reason", "compiled"]

_FIX = "pip install -e '.[compiled]' (or pip install numba)"


def numba_reason() -> str | None:
    """Why the compiled path cannot run here, or None when numba imports."""
    if importlib.util.find_spec("numba") is None:
        return f"numba is not installed: {_FIX}"
    try:
        importlib.import_module("numba")
    except Exception as exc:  # a numba built for another NumPy, say
        return f"numba is installed but does not import ({type(exc).__name__}: {exc}); reinstall it: {_FIX}"
    return None


class compiled:
    """*loop* compiled by numba (``njit``, cached, no fastmath) on its first call."""

    def __init__(self, loop: Callable[..., Any]):
        self.loop = loop
        self.__name__ = loop.__name__
        self.__doc__ = loop.__doc__
        self._dispatcher: Callable[..., Any] | None = None

    def __call__(self, *args: Any) -> Any:
        if self._dispatcher is None:
            reason = numba_reason()
            if reason is not None:
                raise RuntimeError(f"the compiled path needs numba: {reason}")
            import numba

            self._dispatcher = numba.njit(cache=True, nogil=True, fastmath=False, boundscheck=False)(self.loop)
        return self._dispatcher(*args)
