"""Where a benchmark's buffers live: ``--backend numpy`` (host memory) or ``--backend cupy`` (GPU memory).

The measuring loops never branch on the backend: they take the array module
``xp`` from :func:`array_module`, write data with :func:`put` and read
results back with :func:`to_host`. A CuPy buffer is written by a kernel, so
:func:`put` synchronizes the current stream before the buffer reaches MPI
(as mpi4py's CuPy demo does before every MPI call); the timed calls
themselves write nothing but what MPI and mpicomm write.

Nothing here starts MPI: :func:`problem` runs before ``MPI_Init``, on every
rank alike, so a missing CuPy or GPU is one usage error, not a crash. Whether
the MPI library takes device pointers is asked after MPI has started
(:func:`mpi_problem`), because pingpong's native rows hand CuPy buffers to MPI;
the collectives' native rows copy device buffers to host buffers and back
around the library's call when it is not CUDA-aware (measure.py), so they run
on any MPI, the PyPI MPICH included.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

__all__ = ["BACKENDS", "problem", "mpi_problem", "array_module", "put", "to_host"]

#: ``--backend`` choices.
BACKENDS = ("numpy", "cupy")

_INSTALL = ("install CuPy for your CUDA version, e.g. pip install cupy-cuda12x (see "
            "https://docs.cupy.dev/en/stable/install.html), or run with --backend numpy")


def problem(backend: str) -> str | None:
    """Why *backend* cannot run here, with the fix, or None (CuPy: it must import and see a GPU)."""
    if backend == "numpy":
        return None
    if backend != "cupy":
        return f"--backend {backend!r}: unknown; choose one of {', '.join(BACKENDS)}"
    from ..device import cupy_module, visible_devices

    if cupy_module() is None:
        return f"--backend cupy needs CuPy, which is not installed here (or does not import): {_INSTALL}"
    if visible_devices() == 0:
        return ("--backend cupy: CuPy sees no GPU (no CUDA driver or device, or CUDA_VISIBLE_DEVICES hides them); "
                "run on a GPU node (Slurm: --gpus-per-task=1) or run with --backend numpy")
    return None


def mpi_problem(backend: str) -> str | None:
    """Why the MPI library cannot take *backend*'s buffers (the native rows give it device pointers), or None."""
    if backend == "numpy":
        return None
    from ..transport.buffers import cuda_aware

    if cuda_aware():
        return None
    return ("--backend cupy: this MPI library is not CUDA-aware (MPIX_Query_cuda_support says no), so the native "
            "rows cannot hand it GPU buffers; use a CUDA-aware MPI build (MPICH with --with-cuda, Open MPI with "
            "UCX/CUDA), set MPICOMM_CUDA_AWARE=1 if the library is CUDA-aware but does not say so, or run with "
            "--backend numpy")


def array_module(backend: str) -> ModuleType:
    """NumPy or CuPy for *backend* (ValueError naming the fix when CuPy cannot run here)."""
    why = problem(backend)
    if why:
        raise ValueError(why)
    if backend == "numpy":
        return np
    from ..device import cupy_module

    return cupy_module()  # type: ignore[return-value]


def put(dst: Any, values: np.ndarray | float) -> None:
    """``dst[...] = values`` for a NumPy or CuPy *dst*; the stream that wrote it is waited for (the stream
    contract's :func:`~mpicomm.transport.buffers.ready`), so MPI may read *dst*."""
    if isinstance(dst, np.ndarray):
        dst[...] = values
        return
    import cupy

    from ..transport.buffers import ready

    dst[...] = cupy.asarray(values) if isinstance(values, np.ndarray) else values
    ready(dst)


def to_host(x: Any) -> np.ndarray:
    """A host copy of NumPy or CuPy array *x*."""
    if isinstance(x, np.ndarray):
        return x.copy()
    return x.get()  # CuPy: blocking device-to-host copy
