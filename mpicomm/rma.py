"""Pull, one-sided: expose an array in an MPI RMA window; other ranks ``get`` and ``put`` slices.

Every rank exposes one array (any length, zero included; one dtype across
ranks). Access is passive-target: the window stays in one shared
``MPI_Win_lock_all`` epoch for its life, and each ``get``/``put`` is the RMA
call plus ``MPI_Win_flush`` of the target, so the data has arrived (or landed)
when the call returns and the target takes no part. Concurrent puts to the same
elements from different ranks are undefined, as in MPI.

The owner's own reads and writes are ordered with peers' access by the program,
as in MPI: write your array, ``win.publish()``, then a barrier, before peers
get; after peers put, a barrier, then ``win.collect()`` before reading it::

    win = comm.expose(local)          # collective
    right = win.get((comm.rank + 1) % comm.size, offset=10, count=5)
    comm.Barrier()
    win.Free()                        # collective

Where the window memory is:

* NumPy arrays, and CuPy arrays when ``MPICOMM_CUDA_AWARE_RMA=1`` on a
  CUDA-aware MPI: the array itself. ``publish``/``collect`` are then memory
  fences (``MPI_Win_sync``).
* otherwise (CuPy): a pinned host **mirror** of the array. Peers read and
  write the mirror; ``publish(offset, count)`` copies that range of the array
  to the mirror (done for all of it at creation) and ``collect(offset, count)``
  copies the mirror's range back into the array. Publish only what you wrote
  and collect only what peers put: each overwrites the other side's range.

Passive targets progress when the target process is inside MPI: with MPICH,
a ``get`` from a rank busy computing outside MPI waits until it next calls
MPI, unless ``MPIR_CVAR_ASYNC_PROGRESS=1`` gives MPICH a progress thread.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
from mpi4py import MPI

from . import config, trace
from .engine.requests import Request, RequestStep, Steps, barrier
from .transport.buffers import (
    adopt,
    check_array,
    dtype_code,
    dtype_from_code,
    ops_for,
    recv_buffer,
    send_buffer,
    transfer_path,
)
from .validate import check_int, check_peer, check_span

if TYPE_CHECKING:
    from .comm import Comm

__all__ = ["Window"]


class Window:
    """An array per rank, exposed for one-sided ``get``/``put`` (create with ``comm.expose(buf)``)."""

    def __init__(self, comm: Comm, buf: Any):
        problem, layout = None, (-1, 0)
        memory = None
        try:
            buf = adopt(buf, "buf")
            self.xp: ModuleType = check_array(buf, "buf", writable=True)
            layout = (dtype_code(buf.dtype), int(buf.size))
            self._ops = ops_for(self.xp)
            self.staged = transfer_path(buf) == "staged" or (self._ops.on_device and not config.cuda_aware_rma())
            if self.staged:
                raw = self._ops.alloc_host(max(buf.nbytes, 1))
                self._mirror = raw[: buf.nbytes].view(buf.dtype).reshape(buf.shape)
                self._ops.to_host(buf, self._mirror)
                memory = self._mirror
            else:
                self._ops.synchronize(buf)
                memory = buf
        except Exception as exc:  # noqa: BLE001 - every rank learns of it below
            problem = str(exc)
        layouts = agree(comm.library_comm, problem, "expose", layout)
        if len({code for code, _ in layouts}) != 1:
            names = ", ".join(f"rank {r}: {dtype_from_code(c)}" for r, (c, _) in enumerate(layouts))
            raise ValueError(f"expose: every rank must expose the same dtype, got {names}; cast with .astype(...)")
        self.comm = comm
        self.local = buf
        self.dtype: np.dtype = buf.dtype
        self.sizes: list[int] = [n for _, n in layouts]
        self.win = MPI.Win.Create(memory, disp_unit=max(1, buf.itemsize), comm=comm)
        self.win.Lock_all(MPI.MODE_NOCHECK)

    # ------------------------------------------------------------ checks

    def _span(self, target: int, offset: int, count: int | None) -> tuple[int, int]:
        size = self.sizes[target]
        offset = check_int(offset, "offset")
        count = size - offset if count is None else check_int(count, "count")
        check_span(offset, count, size, f"rank {target}'s window")
        return offset, count

    def _target(self, target: int) -> int:
        return check_peer(target, "target", len(self.sizes))

    def _out(self, target: int, offset: int, count: int | None, out: Any, xp: ModuleType | None) -> Any:
        """The array a get of *count* elements at *offset* of *target* lands in: *out*, checked, or a new one
        (None for MPI.PROC_NULL without *out*)."""
        if out is not None:
            out = adopt(out, "out")
            check_array(out, "out", writable=True)
        if target == MPI.PROC_NULL:
            return out
        offset, count = self._span(target, offset, count)
        if out is None:
            return (xp or self.xp).empty(count, self.dtype)
        if out.dtype != self.dtype or out.size != count:
            raise ValueError(
                f"out is {out.dtype} with {out.size} elements but the window holds {self.dtype} and "
                f"{count} elements were asked for; pass a matching out or omit it"
            )
        return out

    # ------------------------------------------------------------ access

    def get(
        self, target: int, offset: int = 0, count: int | None = None, *, out: Any = None, xp: ModuleType | None = None
    ) -> Any:
        """Read *count* elements at element *offset* of rank *target*'s array; return them.

        *out* receives them (dtype and size must match), else a new 1-D array of
        module *xp* (default: the module of this rank's exposed array).
        """
        if trace.ON:
            with trace.span("get", "rma", peer=target, offset=offset, count=count) as note:
                return self._get(target, offset, count, out, xp, note)
        return self._get(target, offset, count, out, xp, None)

    def _get(
        self, target: int, offset: int, count: int | None, out: Any, xp: ModuleType | None, note: dict | None
    ) -> Any:
        target = self._target(target)
        out = self._out(target, offset, count, out, xp)
        if target == MPI.PROC_NULL:
            return out
        offset, count = self._span(target, offset, count)
        if note is not None:
            nbytes = count * self.dtype.itemsize
            note.update(peer=target, offset=offset, count=count, bytes=nbytes, dtype=trace.dtype_name(self.dtype))
        transfer = recv_buffer(out)
        try:
            self.win.Get(transfer.buf, target, (offset, out.nbytes, MPI.BYTE))
            self.win.Flush(target)
        except BaseException:
            transfer.abandon()
            raise
        transfer.finish()
        return out

    def rget(self, target: int, offset: int = 0, count: int | None = None, *, out: Any = None,
             xp: ModuleType | None = None) -> Request:
        """Start reading *count* elements at *offset* of rank *target*'s array; an mpicomm :class:`Request`
        whose completion means they have arrived (``wait()`` returns the array: *out*, or a new one as
        :meth:`get` makes). The read overlaps whatever this rank does until it waits - a passive target
        answers when it next enters MPI, so starting early hides that wait (MPI's ``MPI_Rget``)."""
        target = self._target(target)
        out = self._out(target, offset, count, out, xp)
        if target == MPI.PROC_NULL:
            return Request(_done(out), f"rget from {target}")
        transfer = recv_buffer(out)
        try:
            request = self.win.Rget(transfer.buf, target, (self._span(target, offset, out.size)[0], out.nbytes,
                                                           MPI.BYTE))
        except BaseException:
            transfer.abandon()
            raise
        return Request(_after_get(request, transfer, out, target), f"rget of {out.size} elements from rank {target}")

    def put(self, x: Any, target: int, offset: int = 0) -> None:
        """Write array *x* into rank *target*'s array at element *offset*; it has landed on return."""
        if trace.ON:
            with trace.span("put", "rma", peer=target, offset=offset) as note:
                return self._put(x, target, offset, note)
        return self._put(x, target, offset, None)

    def _put(self, x: Any, target: int, offset: int, note: dict | None) -> None:
        x = adopt(x, "x")
        check_array(x, "x")
        target = self._target(target)
        if x.dtype != self.dtype:
            raise TypeError(f"x is {x.dtype} but the window holds {self.dtype}; cast with x.astype(...)")
        if target == MPI.PROC_NULL:
            return
        offset, _ = self._span(target, offset, x.size)
        if note is not None:
            nbytes = int(x.nbytes)
            note.update(peer=target, offset=offset, count=int(x.size), bytes=nbytes, dtype=trace.dtype_name(x.dtype))
        transfer = send_buffer(x)
        try:
            self.win.Put(transfer.buf, target, (offset, x.nbytes, MPI.BYTE))
            self.win.Flush(target)
        finally:
            transfer.finish()

    # ------------------------------------------------------------ the owner's side

    def _local_range(self, offset: int, count: int | None) -> tuple[Any, Any]:
        offset, count = self._span(self.comm.Get_rank(), offset, count)
        flat_local = self.local.reshape(-1)[offset : offset + count]
        flat_mirror = self._mirror.reshape(-1)[offset : offset + count] if self.staged else None
        return flat_local, flat_mirror

    def publish(self, offset: int = 0, count: int | None = None) -> None:
        """Make this rank's writes to elements [offset, offset+count) of its array visible to peers' ``get``."""
        local, mirror = self._local_range(offset, count)
        if self.staged:
            self._ops.to_host(local, mirror)
        else:
            self._ops.synchronize(self.local)
        self.win.Sync()

    def collect(self, offset: int = 0, count: int | None = None) -> None:
        """Make the peers' completed puts to elements [offset, offset+count) visible in this rank's array."""
        local, mirror = self._local_range(offset, count)
        self.win.Sync()
        if self.staged:
            self._ops.from_host(mirror, local)

    def Free(self) -> None:
        """Free the window (collective)."""
        if self.win != MPI.WIN_NULL:
            self.win.Unlock_all()
            barrier(self.comm.library_comm)  # peers' pending mpicomm transfers keep moving meanwhile
            self.win.Free()

    def __enter__(self) -> Window:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:  # freeing is collective: not while this rank alone is unwinding an error
            self.Free()

    def __repr__(self) -> str:
        where = "host mirror" if self.staged else "in place"
        return f"<mpicomm.Window {self.dtype} sizes={self.sizes} ({where})>"


def _done(value: Any) -> Steps:
    """A request's steps that are already over: its result is *value*."""
    return value
    yield  # (a generator)


def _after_get(request: MPI.Request, transfer: Any, out: Any, target: int) -> Steps:
    """An ``rget``'s one step: the library's request; then the staged copy to the device, if any."""
    try:
        yield RequestStep([request], peers=[("recv", target)])
    except BaseException:
        transfer.abandon()
        raise
    transfer.finish()
    return out


def agree(comm: MPI.Intracomm, problem: str | None, what: str, payload: object = None) -> list:
    """Collective: share each rank's local problem (None when fine) and *payload*.

    If any rank has a problem, raise the same ValueError, naming every bad
    rank, on every rank; else return every rank's payload. Used before a
    collective operation that a local error would otherwise leave half-entered.
    """
    barrier(comm)  # everyone has arrived, this rank's pending requests served meanwhile
    shared = comm.allgather((problem, payload))
    bad = [(r, p) for r, (p, _) in enumerate(shared) if p is not None]
    if bad:
        raise ValueError(f"{what}: " + "; ".join(f"rank {r}: {p}" for r, p in bad))
    return [payload for _, payload in shared]
