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

from ..buffers import ops_for, recv_buffer, send_buffer
from ..ops import Op
from ..requests import Step

if TYPE_CHECKING:
    from ..comm import Comm

__all__ = ["Call", "block"]

_EMPTY = [None, 0, MPI.BYTE]


def block(buf: Any, counts: Sequence[int], displs: Sequence[int], r: int) -> Any:
    """Rank *r*'s block of *buf*: elements ``displs[r] … displs[r] + counts[r] − 1`` (a view)."""
    return buf[displs[r] : displs[r] + counts[r]]


def _address(x: Any) -> int:
    """Where array *x*'s first element lives (host or device)."""
    data = x.data
    return data.ptr if hasattr(data, "ptr") else x.__array_interface__["data"][0]


class Call:
    """One collective call: who, with what, and how to move and reduce its arrays."""

    __slots__ = ("comm", "lib", "rank", "p", "tag", "seq", "collective", "algorithm", "xp", "dtype", "op", "root",
                 "_ops", "_device")

    def __init__(self, comm: "Comm", collective: str, xp: ModuleType, dtype: np.dtype,
                 op: Op | None = None, root: int = 0, device: Any = None):
        self.comm = comm
        self.lib: MPI.Intracomm = comm.library_comm
        self.rank = self.lib.Get_rank()
        self.p = self.lib.Get_size()
        self.seq = comm._state.collectives
        self.tag = comm.collective_tag()
        self.collective = collective
        self.algorithm = "?"
        self.xp = xp
        self.dtype = np.dtype(dtype)
        self.op = op
        self.root = root
        self._ops = ops_for(xp)
        self._device = device  # CuPy device of the buffers (None on the host)

    def real_rank(self, vrank: int) -> int:
        """The rank whose relative rank (rank − root mod p) is *vrank*."""
        return (vrank + self.root) % self.p

    @property
    def label(self) -> str:
        """``"allreduce #12 (ring)"``: the collective, its sequence number on the communicator, the algorithm."""
        return f"{self.collective} #{self.seq} ({self.algorithm})"

    # ------------------------------------------------------------ messages

    def exchange(self, sends: Iterable[tuple[int, Any]] = (), recvs: Iterable[tuple[int, Any]] = ()) -> Step:
        """Post a receive into each ``(source, view)`` and a send of each ``(dest, view)``; yield the result.

        Receives are posted first. Empty views still send an (empty) message,
        so both sides of an exchange never need to agree on skipping it.
        """
        step = Step()
        for peer, view in recvs:
            self._post(step, "recv", peer, view)
        for peer, view in sends:
            self._post(step, "send", peer, view)
        return step

    def _post(self, step: Step, kind: str, peer: int, view: Any) -> None:
        empty = view is None or view.size == 0
        transfer = None if empty else (recv_buffer(view) if kind == "recv" else send_buffer(view))
        spec = _EMPTY if transfer is None else transfer.buf
        post = self.lib.Irecv if kind == "recv" else self.lib.Isend
        step.append(post(spec, peer, self.tag))
        step.peers.append((kind, peer))
        if transfer is not None:
            step.after.append(transfer.finish)

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
        """Scratch space for *count* elements, in the buffers' module and device."""
        with self.on_device():
            return self.xp.empty(count, self.dtype if dtype is None else dtype)

    def copy(self, dst: Any, src: Any) -> None:
        """``dst[...] = src`` (nothing when they are the same memory, as in place)."""
        if dst is src or dst.size == 0 or (_address(dst) == _address(src) and dst.size == src.size):
            return
        with self.on_device():
            dst[...] = src

    def combine(self, a: Any, b: Any, out: Any) -> None:
        """``out = a ⊕ b`` with the call's op; *a* holds the lower ranks' contribution."""
        if out.size == 0:
            return
        with self.on_device():
            self.op(a, b, out)  # type: ignore[misc]

    @property
    def commutative(self) -> bool:
        """Whether the op lets the algorithm reorder operands."""
        return self.op is None or self.op.commutative
