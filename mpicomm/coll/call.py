"""``Call``: one collective call as its algorithm sees it.

An algorithm is a step generator ``algorithm(call, ...)``; ``call`` gives it
the communicator's private duplicate, this call's tag, the element type, the
op and the root, and the few operations it needs, written once for NumPy and
CuPy buffers alike:

* :meth:`Call.exchange` posts sends and receives of array views and returns
  the :class:`~mpicomm.requests.Step` to yield. Every buffer reaches MPI
  through :mod:`mpicomm.buffers` - device memory directly when the library is
  CUDA-aware, else through pinned host buffers (copied back by the step's
  ``after`` hook, before the generator resumes);
* :meth:`Call.combine` reduces ``out = a ⊕ b`` (*a* from lower ranks) with the
  op, on the arrays' device;
* :meth:`Call.empty` allocates scratch space like the buffers.

Messages of one call all carry its tag, so calls in flight at once never
match each other's messages; within a call, two messages between the same
pair of ranks match in the order they are posted (MPI's non-overtaking rule).
"""

from __future__ import annotations

import contextlib
from types import ModuleType
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import numpy as np
from mpi4py import MPI

from ..buffers import recv_buffer, send_buffer, transfer_path
from ..catalogue import ROOTED as _ROOTED
from ..ops import Op
from ..requests import Step

if TYPE_CHECKING:
    from ..state import State

__all__ = ["Call", "block"]

_EMPTY = [None, 0, MPI.BYTE]
_BYTE = MPI.BYTE


def block(buf: Any, counts: Sequence[int], displs: Sequence[int], r: int) -> Any:
    """Rank *r*'s block of *buf*: elements ``displs[r] … displs[r] + counts[r] − 1`` (a view)."""
    return buf[displs[r] : displs[r] + counts[r]]


def _root(x: Any) -> Any:
    """The object that owns *x*'s memory (*x* itself, or the base its views share)."""
    base = x.base
    return x if base is None else base


def _address(x: Any) -> int:
    """Where array *x*'s first element lives (host or device)."""
    if type(x) is np.ndarray:
        return x.__array_interface__["data"][0]
    data = x.data
    return data.ptr if hasattr(data, "ptr") else x.__array_interface__["data"][0]


class Call:
    """One collective call: who, with what, and how to move and reduce its arrays."""

    __slots__ = ("state", "lib", "rank", "p", "tag", "seq", "collective", "algorithm", "source", "blocking", "xp",
                 "dtype", "op", "root", "_device", "_direct", "scratch", "_scratch_next", "count", "status")

    def __init__(self, state: "State", collective: str, xp: ModuleType, dtype: np.dtype,
                 op: Op | None = None, root: int = 0, device: Any = None):
        self.state = state  # the communicator's State (see mpicomm.state)
        self.lib: MPI.Intracomm = state.library_comm
        self.rank = state.rank
        self.p = state.size
        self.seq = seq = state.collectives  # as State.next_tag(), inline: this runs on every call
        state.collectives = seq + 1
        self.tag = seq % state.tag_modulus
        self.collective = collective
        self.algorithm = "?"
        self.source = "?"  # where the algorithm choice came from: call, communicator, environment, model, table
        self.blocking = True  # False for the nonblocking forms (Iallreduce...)
        self.xp = xp
        self.dtype = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
        self.op = op
        self.root = root
        self._device = device  # CuPy device of the buffers (None on the host)
        self._direct: bool | None = None  # NumPy views go to MPI as they are (decided at the first one)
        self.scratch: list | None = None  # a plan's scratch arrays, reused by every run of it (see empty())
        self._scratch_next = 0
        self.count = -1  # the call's count, for reports (-1: per-rank counts)
        self.status = "entered"  # for the flight recorder: entered, done or failed

    def for_bytes(self) -> "Call":
        """A copy of this call that moves host bytes (same communicator, tag and sequence number).

        For the dispatcher's own exchanges within a call (the argument
        agreement's second round), run with an algorithm from the table.
        """
        other = Call.__new__(Call)
        for name in Call.__slots__:
            setattr(other, name, getattr(self, name))
        other.xp, other.dtype, other.op, other._device, other._direct = np, np.dtype(np.uint8), None, None, None
        other.scratch, other._scratch_next = None, 0
        return other

    def real_rank(self, vrank: int) -> int:
        """The rank whose relative rank (rank − root mod p) is *vrank*."""
        return (vrank + self.root) % self.p

    @property
    def label(self) -> str:
        """``"allreduce #12 (ring)"``: the collective, its sequence number on the communicator, the algorithm."""
        return f"{self.collective} #{self.seq} ({self.algorithm})"

    def __str__(self) -> str:
        return self.label

    @property
    def details(self) -> str:
        """``"allreduce #12 (ring): 1000 × float64, op sum"``: the label and what was moved (for the watchdog)."""
        what = f"{self.count} × {self.dtype}" if self.count >= 0 else f"per-rank counts of {self.dtype}"
        if self.op is not None:
            what += f", op {self.op.name}"
        if self.collective in _ROOTED:
            what += f", root {self.root}"
        return f"{self.label}: {what}"

    # ------------------------------------------------------------ messages

    def exchange(self, sends: Iterable[tuple[int, Any]] = (), recvs: Iterable[tuple[int, Any]] = ()) -> Step:
        """Post a receive into each ``(source, view)`` and a send of each ``(dest, view)``; yield the result.

        Receives are posted first. Empty views still send an (empty) message,
        so both sides of an exchange never need to agree on skipping it.
        """
        requests: list = []
        after: list = []
        peers: list = []
        post = self.lib.Irecv
        for peer, view in recvs:
            requests.append(post(self._spec(view, recv_buffer, after), peer, self.tag))
            peers.append(("recv", peer))
        post = self.lib.Isend
        for peer, view in sends:
            requests.append(post(self._spec(view, send_buffer, after), peer, self.tag))
            peers.append(("send", peer))
        return Step(requests, after, peers)

    def _spec(self, view: Any, transfer: Any, after: list) -> Any:
        """The buffer spec MPI gets for *view* (see :mod:`mpicomm.buffers`); adds what must run after to *after*."""
        if view is None or view.size == 0:
            return _EMPTY
        if type(view) is np.ndarray:
            direct = self._direct
            if direct is None:
                direct = self._direct = transfer_path(view) == "direct"  # the same for every NumPy view of the call
            if direct:
                return [view, view.nbytes, _BYTE]  # what buffers.send_buffer/recv_buffer give a direct NumPy array
        moved = transfer(view)
        after.append(moved.finish)
        return moved.buf

    def send(self, dest: int, view: Any) -> Step:
        """A step that sends *view* to *dest*."""
        return self.exchange(sends=[(dest, view)])

    def recv(self, source: int, view: Any) -> Step:
        """A step that receives into *view* from *source*."""
        return self.exchange(recvs=[(source, view)])

    def sendrecv(self, dest: int, send_view: Any, source: int, recv_view: Any) -> Step:
        """A step that sends *send_view* to *dest* while receiving *recv_view* from *source*."""
        return self.exchange(sends=[(dest, send_view)], recvs=[(source, recv_view)])

    # ------------------------------------------------------------ local work

    def on_device(self) -> contextlib.AbstractContextManager:
        """Context in which array work runs on the buffers' device (nothing on the host)."""
        return self._device if self._device is not None else contextlib.nullcontext()

    def empty(self, count: int, dtype: Any = None) -> Any:
        """Scratch space for *count* elements, in the buffers' module and device.

        Under a plan (:attr:`scratch` set: a persistent request, or a blocking
        call whose signature was seen before) the k-th array an algorithm asks
        for is the k-th of the plan's previous run when it has the same size
        and type: an algorithm allocates the same sequence every run, so a
        repeated call touches memory that is already mapped and warm.
        """
        dtype = self.dtype if dtype is None else dtype
        kept = self.scratch
        if kept is not None:
            k = self._scratch_next
            self._scratch_next = k + 1
            if k < len(kept):
                x = kept[k]
                if x.size == count and x.dtype == dtype:
                    return x
        if self._device is None:
            x = self.xp.empty(count, dtype)
        else:
            with self._device:
                x = self.xp.empty(count, dtype)
        if kept is not None:
            if k < len(kept):
                kept[k] = x
            else:
                kept.append(x)
        return x

    def copy(self, dst: Any, src: Any) -> None:
        """``dst[...] = src`` (nothing when they are the same memory, as in place)."""
        if dst is src or dst.size == 0 or (dst.size == src.size and _root(dst) is _root(src)
                                           and _address(dst) == _address(src)):
            return  # (arrays over different memory owners are copied: at worst a copy onto itself)
        if self._device is None:
            dst[...] = src
            return
        with self._device:
            dst[...] = src

    def combine(self, a: Any, b: Any, out: Any) -> None:
        """``out = a ⊕ b`` with the call's op; *a* holds the lower ranks' contribution."""
        if out.size == 0:
            return
        if self._device is None:
            self.op(a, b, out)  # type: ignore[misc]
            return
        with self._device:
            self.op(a, b, out)  # type: ignore[misc]

    @property
    def commutative(self) -> bool:
        """Whether the op lets the algorithm reorder operands."""
        return self.op is None or self.op.commutative
