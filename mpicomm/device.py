"""GPU binding: which CUDA device each rank uses.

The rule is ``local_rank % visible GPUs``: ranks of one node spread over its
GPUs, and a launcher that hides all but one GPU per task (Slurm's
``--gpus-per-task=1`` sets ``CUDA_VISIBLE_DEVICES``) gives device 0 to each.
``MPICOMM_DEVICE`` or the ``device=`` argument overrides it. Nothing here
imports MPI, so :func:`bind` may run before ``MPI_Init`` (CUDA-aware MPI
libraries expect the device to be chosen first).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from . import config

__all__ = ["cupy_module", "visible_devices", "device_for", "bind"]

_cupy_probe: list[ModuleType | None] = []


def cupy_module() -> ModuleType | None:
    """CuPy if it is installed and imports, else None (probed once)."""
    if not _cupy_probe:
        try:
            _cupy_probe.append(importlib.import_module("cupy"))
        except Exception:  # ImportError, or a CuPy built for a missing CUDA
            _cupy_probe.append(None)
    return _cupy_probe[0]


def visible_devices() -> int:
    """Number of CUDA devices this process sees (0 without CuPy or a driver)."""
    cupy = cupy_module()
    if cupy is None:
        return 0
    try:
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # no driver, or no device
        return 0


def device_for(local_rank: int, ndevices: int, override: int | None = None) -> int | None:
    """The device ordinal for *local_rank* on a node with *ndevices* visible GPUs.

    Returns None when there is no GPU. *override* (or ``MPICOMM_DEVICE``) forces
    an ordinal, which must exist.
    """
    if local_rank < 0:
        raise ValueError(f"local_rank={local_rank} is negative; it counts ranks on a node from 0")
    if override is None:
        override = config.device_override()
    if ndevices == 0:
        return None
    if override is not None:
        if not 0 <= override < ndevices:
            raise ValueError(
                f"device override {override} is not a visible GPU (this process sees "
                f"{ndevices}: 0..{ndevices - 1}); check MPICOMM_DEVICE / CUDA_VISIBLE_DEVICES"
            )
        return override
    return local_rank % ndevices


def bind(local_rank: int | None = None, device: int | None = None) -> int | None:
    """Make this process use its GPU (CuPy's current device); return the ordinal or None.

    *local_rank* defaults to the launcher's (read from the environment, no MPI
    needed); *device* forces an ordinal.
    """
    if local_rank is None:
        from .launcher import from_environment

        local_rank = from_environment().local_rank or 0
    ordinal = device_for(local_rank, visible_devices(), device)
    if ordinal is not None:
        cupy_module().cuda.Device(ordinal).use()  # type: ignore[union-attr]
    return ordinal
