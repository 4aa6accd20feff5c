"""GPU binding: which CUDA device each rank uses.

The rule is ``local_rank % visible GPUs``: ranks of one node spread over its
GPUs, and a launcher that hides all but one GPU per task (Slurm's
``--gpus-per-task=1`` sets ``CUDA_VISIBLE_DEVICES``) gives device 0 to each.
``MPICOMM_DEVICE`` or the ``device=`` argument overrides it. Nothing here
imports MPI, so :func:`bind` may run before ``MPI_Init`` (CUDA-aware MPI
libraries expect the device to be chosen first).

CUDA's current device (and CuPy's current stream) belong to a *thread*: a
progress thread that has never bound one works on device 0's null stream. So
mpicomm's own device work - a plan's copies and combines, staging copies to
and from pinned host memory - runs inside :func:`binding` of the array's
device, which makes that device current on whichever thread enters it, with a
stream mpicomm owns there (non-blocking: it neither waits for the caller's
unrelated kernels on the legacy null stream, nor makes them wait). What
orders that stream after the caller's work, and the caller's later work after
it, is the stream contract of :mod:`mpicomm.transport.buffers` (docs/gpus.md).
"""

from __future__ import annotations

import importlib
import threading
from contextlib import ExitStack
from types import ModuleType
from typing import Any

from . import config

__all__ = ["cupy_module", "visible_devices", "device_for", "bind", "Binding", "binding"]

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


class Binding:
    """One device and mpicomm's own stream on it, made current by ``with binding:`` on any thread.

    Entering pushes the device and the stream (CuPy's ``with Device``/``with
    Stream``, so re-entrant and per thread); leaving restores the thread's
    previous ones. The stream is created on first use, non-blocking.
    :meth:`synchronize` waits on the host for the work queued on it.
    """

    __slots__ = ("ordinal", "_stream", "_lock", "_entered")

    def __init__(self, ordinal: int):
        self.ordinal = ordinal
        self._stream: Any = None
        self._lock = threading.Lock()
        self._entered = threading.local()  # this thread's open contexts (a stack: entries may nest)

    def __repr__(self) -> str:
        return f"<mpicomm device binding: GPU {self.ordinal}>"

    @property
    def stream(self) -> Any:
        """mpicomm's stream on this device (a ``cupy.cuda.Stream``)."""
        if self._stream is None:
            with self._lock:
                if self._stream is None:
                    cupy = cupy_module()
                    assert cupy is not None  # (a binding is only made for a CuPy device)
                    with cupy.cuda.Device(self.ordinal):
                        self._stream = cupy.cuda.Stream(non_blocking=True)
        return self._stream

    def __enter__(self) -> Binding:
        cupy = cupy_module()
        assert cupy is not None
        stack = ExitStack()
        stack.enter_context(cupy.cuda.Device(self.ordinal))
        stack.enter_context(self.stream)
        entered = getattr(self._entered, "stack", None)
        if entered is None:
            entered = self._entered.stack = []
        entered.append(stack)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._entered.stack.pop().close()

    def synchronize(self) -> None:
        """Wait until the work queued on mpicomm's stream of this device is done."""
        self.stream.synchronize()


_BINDINGS: dict[int, Binding] = {}
_BINDINGS_LOCK = threading.Lock()


def binding(device: Any) -> Binding | None:
    """The :class:`Binding` of *device* (a ``cupy.cuda.Device`` or an ordinal), one per device per process;
    None for None (host memory)."""
    if device is None:
        return None
    ordinal = device if isinstance(device, int) else int(device.id)
    found = _BINDINGS.get(ordinal)
    if found is None:
        with _BINDINGS_LOCK:
            found = _BINDINGS.setdefault(ordinal, Binding(ordinal))
    return found
