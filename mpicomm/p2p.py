"""Push: typed point-to-point messages of NumPy/CuPy arrays.

Messages travel on a :class:`Channel` (two private duplicates of the user's
communicator, so they never match the user's own messages). Every message
starts with a **header** - kind, dtype, shape, a per-destination sequence
number - sent on ``channel.header`` with the caller's tag:

* **inline** (payload ≤ ``INLINE_BYTES``, 16 KiB): the payload follows the
  header in the same message. One message, one α; the receiver's buffer for it
  is posted when the receive starts, so it completes with MPI's own progress.
* **two-part** (larger): the payload follows as a second message on
  ``channel.payload``, tagged with the sequence number, straight from (or into)
  the array. The receiver posts the payload receive once the header has told
  it size and source, i.e. the next time this rank waits or tests on any
  mpicomm request (see :mod:`mpicomm.requests`).

The receiver matches headers exactly as MPI would match the payloads (same
source/tag rules, same order), and fetches a two-part payload by its sequence
number, so concurrent nonblocking receives never swap payloads. Knowing dtype
and shape first, it can allocate the array itself (``recv_array()``) or refuse
a mismatched buffer with a clear error - after draining the payload, so the
sender is never left waiting.
"""

from __future__ import annotations

import math
import struct
from collections import defaultdict
from types import ModuleType
from typing import Any

import numpy as np
from mpi4py import MPI

from . import config, trace
from .device import cupy_module
from .engine.requests import Envelope, Steps, _active, run
from .transport.buffers import (
    array_module,
    check_array,
    dtype_code,
    dtype_from_code,
    mpi_datatype,
    ops_for,
    recv_buffer,
    send_buffer,
)
from .validate import check_peer, check_tag

__all__ = [
    "Channel", "RemoteError", "MAX_NDIM", "INLINE_BYTES", "ARRAY", "ERROR",
    "send_steps", "recv_steps", "check_send", "check_recv", "private_dup",
]

MAGIC = 0x6D70636F6D6D  # "mpcomm"
MAX_NDIM = 32
FIXED_WORDS = 6  # magic, kind, dtype code, sequence, ndim, flags; then ndim shape words
INLINE_BYTES = 16384
RECEIVE_BYTES = (FIXED_WORDS + MAX_NDIM) * 8 + INLINE_BYTES  # the largest inline message
ARRAY, ERROR = 0, 1
INLINE = 1  # flag: the payload follows the header in the same message


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
        tag_ub = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)  # MPI attaches TAG_UB to COMM_WORLD only
        assert tag_ub is not None  # (a predefined attribute: always there)
        self.tag_ub = int(tag_ub)
        self.seq_modulus = self.tag_ub + 1  # payload tags: sequence numbers modulo this
        self._next_seq: defaultdict[int, int] = defaultdict(int)
        self.spare: list[np.ndarray] = []  # receive buffers of finished inline receives, for the next ones

    def next_seq(self, dest: int) -> int:
        seq = self._next_seq[dest]
        self._next_seq[dest] = (seq + 1) % self.seq_modulus
        return seq

    def free(self) -> None:
        for c in (self.header, self.payload):
            if c != MPI.COMM_NULL:
                c.Free()


def make_header(kind: int, dtype: Any, shape: tuple[int, ...], seq: int, flags: int) -> np.ndarray:
    """The header words of one message (at most MAX_NDIM dimensions: checked by check_send)."""
    return np.array([MAGIC, kind, dtype_code(dtype), seq, len(shape), flags, *shape], np.int64)


_HEADERS: dict[tuple, tuple[bytes, bytes]] = {}  # (kind, dtype, shape, flags) → header bytes around the sequence number
_SEQ = struct.Struct("=q")  # the sequence number: word 3 of the header


def _header_parts(kind: int, dtype: np.dtype, shape: tuple[int, ...], flags: int) -> tuple[bytes, bytes]:
    """The header of a message as the bytes before and after its sequence number (cached: a loop sends the same
    kind of array)."""
    key = (kind, dtype, shape, flags)
    found = _HEADERS.get(key)
    if found is None:
        if len(_HEADERS) >= 256:
            _HEADERS.clear()
        whole = make_header(kind, dtype, shape, 0, flags).tobytes()
        found = _HEADERS[key] = (whole[:24], whole[32:])
    return found


def _inline_message(kind: int, x: Any, seq: int) -> bytearray:
    """Header and payload of a small message in one host buffer (a bytearray: cheaper than NumPy at this size)."""
    before, after = _header_parts(kind, x.dtype, x.shape, INLINE)
    message = bytearray(before)
    message += _SEQ.pack(seq)
    message += after
    if x.nbytes:
        if type(x) is np.ndarray:
            message += x.data.cast("B")  # contiguous (checked by check_send)
        else:
            at = len(message)
            message += bytes(x.nbytes)
            ops = ops_for(array_module(x))
            ops.to_host(ops.bytes_of(x), np.frombuffer(message, np.uint8)[at:])
    return message


_FIXED = struct.Struct(f"={FIXED_WORDS}q")


def parse_header(message: Any, nbytes: int, source: int) -> tuple[int, np.dtype, tuple[int, ...], int, int, int]:
    """(kind, dtype, shape, seq, flags, header bytes) of a received message of *nbytes*."""
    if nbytes < _FIXED.size:
        raise ValueError(f"a message from rank {source} is not an mpicomm header; was it sent with send_array?")
    magic, kind, code, seq, ndim, flags = _FIXED.unpack_from(message)
    at = (FIXED_WORDS + ndim) * 8 if 0 <= ndim <= MAX_NDIM else -1
    if magic != MAGIC or at < 0 or nbytes < at:
        raise ValueError(f"a message from rank {source} is not an mpicomm header; was it sent with send_array?")
    shape = struct.unpack_from(f"={ndim}q", message, _FIXED.size) if ndim else ()
    return kind, dtype_from_code(code), shape, seq, flags, at


def send_steps(
    channel: Channel,
    x: Any,
    dest: int,
    tag: int,
    kind: int = ARRAY,
    event: str | None = "send_array",
    note: dict | None = None,
) -> Steps:
    """Send array *x* (already checked) to *dest*: inline, or header then payload.

    With the trace on (:mod:`mpicomm.trace`), the send is one event named
    *event* (None: not recorded) with peer, bytes, tag, dtype, shape and the
    message's sequence number ``msg``, added to the args in *note* if given.
    """
    if trace.ON and event:
        note = {} if note is None else note
        note.update(peer=dest, tag=tag, bytes=int(x.nbytes), dtype=trace.dtype_name(x.dtype), shape=list(x.shape))
        return trace.steps(_send_steps(channel, x, dest, tag, kind, note), event, "p2p", note)
    return _send_steps(channel, x, dest, tag, kind, None)


def _send_steps(channel: Channel, x: Any, dest: int, tag: int, kind: int, note: dict | None) -> Steps:
    if dest == MPI.PROC_NULL:
        return None
    seq = channel.next_seq(dest)
    if note is not None:
        note["msg"] = seq
    if x.nbytes <= INLINE_BYTES:
        yield [channel.header.Isend(_inline_message(kind, x, seq), dest, tag)]
        return None
    transfer = send_buffer(x)  # first: if staging fails, nothing has been sent
    header = make_header(kind, x.dtype, x.shape, seq, 0)
    try:
        yield [channel.header.Isend(header, dest, tag), channel.payload.Isend(transfer.buf, dest, seq)]
    finally:
        transfer.finish()
    return None


def _describe(dtype: np.dtype, shape: tuple[int, ...]) -> str:
    return f"{dtype} of shape {shape}"


def _destination(buf: Any, xp: ModuleType, dtype: np.dtype, shape: tuple[int, ...], what: str, src: int, tag: int) -> Any:
    """*buf* if it matches the message, else a ValueError; a new array of module *xp* without *buf*."""
    count = math.prod(shape)
    if buf is None:
        return xp.empty(shape, dtype)
    if buf.dtype != dtype or buf.size != count:
        raise ValueError(
            f"{what}: the message from rank {src} (tag {tag}) holds {_describe(dtype, shape)} "
            f"({count} elements) but buf is {_describe(buf.dtype, buf.shape)} ({buf.size} elements); "
            f"pass a {dtype} buffer of {count} elements, or omit buf to receive a new array"
        )
    return buf


def recv_steps(
    channel: Channel,
    buf: Any,
    source: int,
    tag: int,
    xp: ModuleType,
    what: str = "recv_array",
    event: str | None = "recv_array",
    note: dict | None = None,
) -> Steps:
    """Receive one array from *source*/*tag* into *buf* (checked) or a new array of module *xp*.

    *what* names the call in error messages. With the trace on, the receive is
    one event named *event* (None: not recorded) with the source it came from
    (``peer``), tag, bytes, dtype, shape, the message's sequence number ``msg``
    and ``call`` (*what*). *note*, a dict, receives those same facts as they
    become known (a caller that records the event itself passes one).
    """
    if trace.ON and event:
        note = {"peer": source, "tag": tag, "call": what} if note is None else note
        return trace.steps(_recv_steps(channel, buf, source, tag, xp, what, note), event, "p2p", note)
    return _recv_steps(channel, buf, source, tag, xp, what, note)


def _recv_steps(
    channel: Channel, buf: Any, source: int, tag: int, xp: ModuleType, what: str, note: dict | None,
    header: tuple[np.ndarray, MPI.Status] | None = None,
) -> Steps:
    """The receive's steps; *header*: the header message and its status, already received (blocking)."""
    if source == MPI.PROC_NULL:
        if note is not None:
            note.update(peer=source, bytes=0)
        return Envelope(buf, MPI.PROC_NULL, MPI.ANY_TAG, 0, MPI.BYTE)
    spare = channel.spare
    if header is None:
        message = spare.pop() if spare else np.empty(RECEIVE_BYTES, np.uint8)
        (status,) = yield [channel.header.Irecv(message, source, tag)]
    else:
        message, status = header
    src, utag, received = status.Get_source(), status.Get_tag(), status.Get_count(MPI.BYTE)
    kind, dtype, shape, seq, flags, at = parse_header(message, received, src)
    count = math.prod(shape)
    nbytes = count * dtype.itemsize
    if note is not None:
        note.update(peer=src, tag=utag, bytes=nbytes, dtype=trace.dtype_name(dtype), shape=list(shape), msg=seq)

    if flags & INLINE:
        if received != at + nbytes:
            raise ValueError(f"{what}: a message from rank {src} (tag {utag}) is {received} bytes, expected {at + nbytes}")
        data = message[at : at + nbytes]
        if kind == ERROR:
            raise RemoteError(f"rank {src} answered with an error: {data.tobytes().decode('utf-8', 'replace')}")
        out = _destination(buf, xp, dtype, shape, what, src, utag)
        if nbytes:
            if type(out) is np.ndarray:
                out.reshape(-1).view(np.uint8)[...] = data
            else:
                ops = ops_for(array_module(out))
                ops.from_host(data, ops.bytes_of(out))
        if len(spare) < 4:
            spare.append(message)  # copied out: the next receive may post it
        return Envelope(out, src, utag, count, mpi_datatype(dtype))

    try:  # the sender waits for this payload: whatever fails here, drain it before raising
        out = _destination(buf, xp, dtype, shape, what, src, utag)
        transfer = recv_buffer(out)
    except BaseException:
        yield [channel.payload.Irecv(np.empty(nbytes, np.uint8), src, seq)]
        raise
    try:
        (payload,) = yield [channel.payload.Irecv(transfer.buf, src, seq)]
    except BaseException:
        transfer.abandon()
        raise
    if payload.Get_count(MPI.BYTE) != nbytes:
        transfer.abandon()
        raise ValueError(
            f"{what}: the payload from rank {src} (sequence {seq}) is {payload.Get_count(MPI.BYTE)} bytes, "
            f"its header announced {nbytes}; more than {channel.seq_modulus} messages to this rank "
            f"were left unreceived in between"
        )
    transfer.finish()
    return Envelope(out, src, utag, count, mpi_datatype(dtype))


def send_now(channel: Channel, x: Any, dest: int, tag: int) -> bool:
    """Send *x* with one blocking ``MPI_Send`` when that is all a blocking send needs; False when it is not.

    A small message (inline) to a real rank, with no trace and no watchdog to
    serve and no mpicomm request waiting for progress: the same message as
    :func:`send_steps` sends, without the step machinery.
    """
    if x.nbytes > INLINE_BYTES or dest == MPI.PROC_NULL or trace.ON or _active or config.timeout() is not None:
        return False
    channel.header.Send(_inline_message(ARRAY, x, channel.next_seq(dest)), dest, tag)
    return True


def recv_now(channel: Channel, buf: Any, source: int, tag: int, xp: ModuleType,
             status: MPI.Status | None) -> tuple[bool, Any]:
    """``(True, array)`` after a blocking receive of the header (``MPI_Recv``), where nothing else needs serving.

    As :func:`send_now`: no trace, no watchdog, no mpicomm request waiting; a
    two-part message's payload then follows as in :func:`recv_steps`.
    ``(False, None)`` when the step machinery must run the receive.
    """
    if source == MPI.PROC_NULL or trace.ON or _active or config.timeout() is not None:
        return False, None
    spare = channel.spare
    message = spare.pop() if spare else np.empty(RECEIVE_BYTES, np.uint8)
    received = MPI.Status()
    channel.header.Recv(message, source, tag, received)
    return True, run(_recv_steps(channel, buf, source, tag, xp, "recv_array", None, (message, received)), status)


def check_send(x: Any, dest: int, tag: int, size: int, tag_ub: int) -> None:
    """All checks a send makes before anything is sent."""
    check_array(x, "x")
    check_peer(dest, "dest", size)
    check_tag(tag, "tag", tag_ub)
    if x.ndim > MAX_NDIM:
        raise ValueError(f"x has {x.ndim} dimensions; mpicomm messages carry at most {MAX_NDIM}; reshape it")


def check_recv(buf: Any, source: int, tag: int, size: int, tag_ub: int, xp: Any = np) -> None:
    """All checks a receive makes before anything is posted."""
    if buf is not None:
        check_array(buf, "buf", writable=True)
    if xp is not np and (xp is None or xp is not cupy_module()):
        raise TypeError(f"xp={xp!r}: pass the numpy or cupy module (the array module to allocate with)")
    check_peer(source, "source", size, any_source=True)
    check_tag(tag, "tag", tag_ub, any_tag=True)
