"""Push: typed point-to-point messages of NumPy/CuPy arrays.

A message is two MPI messages on a :class:`Channel` (two private duplicates of
the user's communicator, so they never match the user's own messages):

* a small **header** on ``channel.header`` with the caller's tag: kind, dtype,
  shape and a per-destination sequence number;
* the **payload** on ``channel.payload``, tagged with that sequence number
  (omitted for empty arrays).

The receiver matches headers exactly as MPI would match the payloads (same
source/tag rules, same order), then fetches the payload by sequence number, so
concurrent nonblocking receives never swap payloads. Because the receiver
knows dtype and shape first it can allocate the array itself
(``recv_array()``) or refuse a mismatched buffer with a clear error, after
draining the payload so the sender is never left waiting.

Cost: one extra message of ``HEADER_BYTES`` per transfer, i.e. about α more
than a bare ``MPI_Send`` (measured by the benchmarks); use mpi4py's
``Send``/``Recv`` on the same communicator when every microsecond matters.
"""

from __future__ import annotations

import math
from collections import defaultdict
from types import ModuleType
from typing import Any

import numpy as np
from mpi4py import MPI

from .buffers import check_array, dtype_code, dtype_from_code, mpi_datatype, recv_buffer, send_buffer
from .requests import Envelope, Steps
from .validate import check_peer, check_tag

__all__ = ["Channel", "RemoteError", "HEADER_LEN", "MAX_NDIM", "ARRAY", "ERROR", "send_steps", "recv_steps", "check_send", "check_recv", "private_dup"]

MAGIC = 0x6D70636F6D6D  # "mpcomm"
MAX_NDIM = 32
HEADER_LEN = 6 + MAX_NDIM  # magic, kind, dtype code, sequence, ndim, reserved, shape...
HEADER_BYTES = HEADER_LEN * 8
ARRAY, ERROR = 0, 1


class RemoteError(RuntimeError):
    """An error the sending rank reported instead of data (e.g. a rendezvous key it never published)."""


def private_dup(comm: MPI.Intracomm) -> MPI.Intracomm:
    """``MPI_Comm_dup`` of *comm* as a plain ``MPI.Intracomm`` (collective).

    mpi4py's ``Dup`` returns an object of the caller's class; library-internal
    communicators must not be ``mpicomm.Comm`` objects (no state, no overrides).
    """
    return MPI.Intracomm.Dup(MPI.Intracomm(comm))


class Channel:
    """A private pair of communicators (header, payload) for typed messages, plus send sequence numbers.

    Creating one is collective over *comm* (two ``MPI_Comm_dup``).
    """

    def __init__(self, comm: MPI.Intracomm):
        self.header = private_dup(comm)
        self.payload = private_dup(comm)
        self.size = comm.Get_size()
        self.tag_ub = int(MPI.COMM_WORLD.Get_attr(MPI.TAG_UB))  # MPI attaches TAG_UB to COMM_WORLD only
        self.seq_modulus = min(self.tag_ub + 1, 1 << 24)
        self._next_seq: defaultdict[int, int] = defaultdict(int)

    def next_seq(self, dest: int) -> int:
        seq = self._next_seq[dest]
        self._next_seq[dest] = (seq + 1) % self.seq_modulus
        return seq

    def free(self) -> None:
        for c in (self.header, self.payload):
            if c != MPI.COMM_NULL:
                c.Free()


def make_header(kind: int, dtype: Any, shape: tuple[int, ...], seq: int) -> np.ndarray:
    """The header of one message (shape has at most MAX_NDIM dimensions: checked by check_send)."""
    values = [MAGIC, kind, dtype_code(dtype), seq, len(shape), 0, *shape]
    return np.array(values + [0] * (HEADER_LEN - len(values)), np.int64)


def parse_header(header: np.ndarray, source: int) -> tuple[int, np.dtype, tuple[int, ...], int]:
    values = header.tolist()
    if values[0] != MAGIC:
        raise ValueError(f"message from rank {source} is not an mpicomm header; was it sent with send_array?")
    kind, code, seq, ndim = values[1:5]
    return kind, dtype_from_code(code), tuple(values[6 : 6 + ndim]), seq


def send_steps(channel: Channel, x: Any, dest: int, tag: int, kind: int = ARRAY) -> Steps:
    """Send array *x* (already checked) to *dest*: header, then payload."""
    if dest == MPI.PROC_NULL:
        return None
    seq = channel.next_seq(dest)
    header = make_header(kind, x.dtype, x.shape, seq)
    reqs = [channel.header.Isend(header, dest, tag)]
    transfer = None
    if x.nbytes:
        transfer = send_buffer(x)
        reqs.append(channel.payload.Isend(transfer.buf, dest, seq))
    try:
        yield reqs
    finally:
        if transfer is not None:
            transfer.finish()


def _describe(dtype: np.dtype, shape: tuple[int, ...]) -> str:
    return f"{dtype} of shape {shape}"


def recv_steps(channel: Channel, buf: Any, source: int, tag: int, xp: ModuleType, what: str = "recv_array") -> Steps:
    """Receive one array from *source*/*tag* into *buf* (checked) or a new array of module *xp*."""
    if source == MPI.PROC_NULL:
        return Envelope(buf, MPI.PROC_NULL, MPI.ANY_TAG, 0)
    header = np.empty(HEADER_LEN, np.int64)
    (status,) = yield [channel.header.Irecv(header, source, tag)]
    src, utag = status.Get_source(), status.Get_tag()
    kind, dtype, shape, seq = parse_header(header, src)
    count = math.prod(shape)
    nbytes = count * dtype.itemsize

    if kind == ERROR:
        message = np.empty(nbytes, np.uint8)
        if nbytes:
            yield [channel.payload.Irecv(message, src, seq)]
        raise RemoteError(f"rank {src} answered with an error: {message.tobytes().decode('utf-8', 'replace')}")

    if buf is None:
        out = xp.empty(shape, dtype)
    else:
        out = buf
        if buf.dtype != dtype or buf.size != count:
            if nbytes:  # drain the payload so the sender completes, then report
                yield [channel.payload.Irecv(np.empty(nbytes, np.uint8), src, seq)]
            raise ValueError(
                f"{what}: the message from rank {src} (tag {utag}) holds {_describe(dtype, shape)} "
                f"({count} elements) but buf is {_describe(buf.dtype, buf.shape)} ({buf.size} elements); "
                f"pass a {dtype} buffer of {count} elements, or omit buf to receive a new array"
            )
    if nbytes:
        transfer = recv_buffer(out)
        try:
            yield [channel.payload.Irecv(transfer.buf, src, seq)]
        finally:
            transfer.finish()
    return Envelope(out, src, utag, count, mpi_datatype(dtype))


def check_send(x: Any, dest: int, tag: int, size: int, tag_ub: int) -> None:
    """All checks a send makes before anything is sent."""
    check_array(x, "x")
    check_peer(dest, "dest", size)
    check_tag(tag, "tag", tag_ub)
    if x.ndim > MAX_NDIM:
        raise ValueError(f"x has {x.ndim} dimensions; mpicomm messages carry at most {MAX_NDIM}; reshape it")


def check_recv(buf: Any, source: int, tag: int, size: int, tag_ub: int) -> None:
    """All checks a receive makes before anything is posted."""
    if buf is not None:
        check_array(buf, "buf", writable=True)
    check_peer(source, "source", size, any_source=True)
    check_tag(tag, "tag", tag_ub, any_tag=True)
