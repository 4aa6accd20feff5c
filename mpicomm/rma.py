"""Pull, one-sided: expose an array in an MPI RMA window; other ranks ``get`` and ``put`` slices.

Every rank exposes one array (any length, zero included; one dtype across
ranks). Access is passive-target: each ``get``/``put`` locks the target's
window (shared for reads, exclusive for writes), transfers, and unlocks, so the
target takes no part and the data has arrived when the call returns.

Ordering with the owner's own reads and writes is the program's business, as
in MPI: write your array, ``win.publish()``, then a barrier, before peers get;
after peers put, a barrier, then ``win.collect()`` before reading it::

    win = comm.expose(local)          # collective
    right = win.get((comm.rank + 1) % comm.size, offset=10, count=5)
    comm.Barrier()
    win.Free()                        # collective

Device (CuPy) arrays: on a CUDA-aware MPI the window is the device array
itself. Otherwise the window is a pinned host mirror of it: ``publish()``
copies device → mirror (done once at creation) and ``collect()`` copies
mirror → device. With NumPy arrays both are cheap memory fences
(``MPI_Win_sync``), so code written for one runs on the other.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
from mpi4py import MPI

from .buffers import check_array, dtype_code, dtype_from_code, ops_for, recv_buffer, send_buffer, transfer_path
from .validate import agree, check_int, check_peer

if TYPE_CHECKING:
    from .comm import Comm

__all__ = ["Window"]


class Window:
    """An array per rank, exposed for one-sided ``get``/``put`` (create with ``comm.expose(buf)``)."""

    def __init__(self, comm: "Comm", buf: Any):
        lib = comm.library_comm
        problem = None
        try:
            self.xp: ModuleType = check_array(buf, "buf", writable=True)
            layout = (dtype_code(buf.dtype), int(buf.size))
        except (TypeError, ValueError) as exc:
            problem, layout = str(exc), (-1, 0)
        agree(lib, problem, "expose")
        layouts = lib.allgather(layout)
        codes = {code for code, _ in layouts}
        if len(codes) != 1:
            names = ", ".join(f"rank {r}: {dtype_from_code(c)}" for r, (c, _) in enumerate(layouts))
            raise ValueError(f"expose: every rank must expose the same dtype, got {names}; cast with .astype(...)")
        self.comm = comm
        self.local = buf
        self.dtype: np.dtype = buf.dtype
        self.sizes: list[int] = [n for _, n in layouts]
        self.staged = transfer_path(buf) == "staged"
        self._ops = ops_for(self.xp)
        if self.staged:
            self._mirror = np.empty(buf.shape, buf.dtype)
            self._ops.to_host(buf, self._mirror)
            memory = self._mirror
        else:
            self._ops.synchronize()
            memory = buf
        self.win = MPI.Win.Create(memory, disp_unit=max(1, buf.itemsize), comm=comm)

    # ------------------------------------------------------------ checks

    def _span(self, target: int, offset: int, count: int | None) -> tuple[int, int]:
        size = self.sizes[target]
        offset = check_int(offset, "offset")
        count = size - offset if count is None else check_int(count, "count")
        if offset < 0 or count < 0 or offset + count > size:
            raise ValueError(
                f"elements [{offset}, {offset + count}) are outside rank {target}'s window of {size} elements; "
                f"use 0 <= offset and offset + count <= {size}"
            )
        return offset, count

    def _target(self, target: int) -> int:
        return check_peer(target, "target", len(self.sizes))

    # ------------------------------------------------------------ access

    def get(
        self, target: int, offset: int = 0, count: int | None = None, *, out: Any = None, xp: ModuleType | None = None
    ) -> Any:
        """Read *count* elements at element *offset* of rank *target*'s array; return them.

        *out* receives them (dtype and size must match), else a new 1-D array of
        module *xp* (default: the module of this rank's exposed array).
        """
        target = self._target(target)
        if out is not None:
            check_array(out, "out", writable=True)
        if target == MPI.PROC_NULL:
            return out
        offset, count = self._span(target, offset, count)
        if out is None:
            out = (xp or self.xp).empty(count, self.dtype)
        else:
            if out.dtype != self.dtype or out.size != count:
                raise ValueError(
                    f"out is {out.dtype} with {out.size} elements but the window holds {self.dtype} and "
                    f"{count} elements were asked for; pass a matching out or omit it"
                )
        transfer = recv_buffer(out)
        self.win.Lock(target, MPI.LOCK_SHARED)
        try:
            self.win.Get(transfer.buf, target, (offset, out.nbytes, MPI.BYTE))
        finally:
            self.win.Unlock(target)
        transfer.finish()
        return out

    def put(self, x: Any, target: int, offset: int = 0) -> None:
        """Write array *x* into rank *target*'s array at element *offset*."""
        check_array(x, "x")
        target = self._target(target)
        if x.dtype != self.dtype:
            raise TypeError(f"x is {x.dtype} but the window holds {self.dtype}; cast with x.astype(...)")
        if target == MPI.PROC_NULL:
            return
        offset, _ = self._span(target, offset, x.size)
        transfer = send_buffer(x)
        self.win.Lock(target, MPI.LOCK_EXCLUSIVE)
        try:
            self.win.Put(transfer.buf, target, (offset, x.nbytes, MPI.BYTE))
        finally:
            self.win.Unlock(target)
        transfer.finish()

    # ------------------------------------------------------------ the owner's side

    def _own_epoch(self, copy) -> None:
        rank = self.comm.Get_rank()
        self.win.Lock(rank, MPI.LOCK_EXCLUSIVE)
        try:
            if self.staged:
                copy()
            else:
                self._ops.synchronize()
                self.win.Sync()
        finally:
            self.win.Unlock(rank)

    def publish(self) -> None:
        """Make this rank's latest writes to its array visible to peers' ``get``."""
        self._own_epoch(lambda: self._ops.to_host(self.local, self._mirror))

    def collect(self) -> None:
        """Make peers' completed ``put``s visible in this rank's array."""
        self._own_epoch(lambda: self._ops.from_host(self._mirror, self.local))

    def Free(self) -> None:
        """Free the window (collective)."""
        if self.win != MPI.WIN_NULL:
            self.win.Free()

    def __enter__(self) -> "Window":
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:  # freeing is collective: not while this rank alone is unwinding an error
            self.Free()

    def __repr__(self) -> str:
        where = "host mirror" if self.staged else "in place"
        return f"<mpicomm.Window {self.dtype} sizes={self.sizes} ({where})>"

