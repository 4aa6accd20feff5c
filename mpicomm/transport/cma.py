"""Cross-memory attach: copy straight out of another process's memory on the same node (``process_vm_readv``).

Linux lets a process read the memory of another process of the same user
(where ptrace would be allowed: no Yama restriction, or a permissive one) with
one system call and one copy, no shared mapping needed. MPI libraries use it
for large messages on a node ("CMA"); mpicomm's shared-memory collectives use
it so a rank reads its peers' *ordinary* arrays where they are, instead of each
rank first copying its array into the node's shared scratch and the others
copying it out again (two copies).

Whether it works is found out, not assumed: :func:`works` tries one read of a
peer's memory (the arena does this collectively when it is made, and every
rank uses it only if every rank could). ``MPICOMM_CMA=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Any

import numpy as np

__all__ = ["supported", "read", "works"]


class _IOVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def _load() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.process_vm_readv
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(_IOVec), ctypes.c_ulong, ctypes.POINTER(_IOVec), ctypes.c_ulong,
                   ctypes.c_ulong]
    fn.restype = ctypes.c_ssize_t
    return fn


_readv = _load()


def supported() -> bool:
    """Whether this system has ``process_vm_readv`` at all (Linux)."""
    return _readv is not None


def read(pid: int, address: int, out: np.ndarray) -> None:
    """Copy ``out.nbytes`` bytes at *address* in process *pid* into the contiguous array *out*."""
    nbytes = out.nbytes
    base = out.__array_interface__["data"][0] if nbytes else 0
    at = 0
    while at < nbytes:  # (the kernel may copy less than asked, at a page it cannot cross: go on from there)
        local = _IOVec(base + at, nbytes - at)
        remote = _IOVec(address + at, nbytes - at)
        done = _readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if done <= 0:
            err = ctypes.get_errno() if done < 0 else 0
            raise OSError(err, f"process_vm_readv of {nbytes - at} bytes from process {pid}: "
                               f"{os.strerror(err) if err else 'nothing copied'}")
        at += done


def works(pid: int, address: int, expected: bytes) -> bool:
    """Whether reading ``len(expected)`` bytes at *address* of process *pid* gives *expected* (never raises)."""
    if _readv is None:
        return False
    out = np.zeros(len(expected), np.uint8)
    try:
        read(pid, address, out)
    except OSError:
        return False
    return out.tobytes() == expected
