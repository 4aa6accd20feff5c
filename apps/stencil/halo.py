"""The halo exchange as a plan: buffers, face boxes and requests built once, started every iteration.

Faces only (a star stencil reads no corner), all dimensions at once: each rank
packs the ``width``-thick slab of owned cells along every face that borders a
neighbour into one contiguous send buffer, the neighbours' slabs arrive in one
contiguous receive buffer, and are unpacked into the ghost cells. Face ``2k``
is dimension k's lower side, ``2k + 1`` its upper side — the order MPI gives a
Cartesian communicator's neighbours, so the same buffers serve every mode:

* ``blocking`` — persistent ``Send_init``/``Recv_init`` requests, started and
  completed before the update;
* ``overlap`` — the same requests, but the solver updates the cells that read
  no ghost while they are in flight (:meth:`HaloExchange.start` then
  :meth:`HaloExchange.finish`), and the boundary strips after;
* ``neighbor`` — one persistent neighbourhood collective
  (``Neighbor_alltoallv_init``) on mpicomm's view of the Cartesian
  communicator (``mpicomm.Comm(grid.cart)``, a ``CartComm``): mpicomm's own
  neighbourhood algorithms (``MPICOMM_NEIGHBOR_ALLTOALLV_ALGORITHM`` picks
  one), for comparison.

Device arrays: the faces are packed on the device; where MPI is CUDA-aware the
buffers go to MPI directly after a stream synchronization, otherwise through
pinned host mirrors copied before the sends and after the receives (the one
place this is decided is ``mpicomm.transport.buffers.transfer_path``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

import mpicomm
from mpicomm.transport import buffers

from .grid import Box, Grid, cells

__all__ = ["MODES", "HaloExchange", "face_boxes"]

MODES = ("blocking", "overlap", "neighbor")


def face_boxes(grid: Grid) -> list[tuple[Box, Box]]:
    """``(send box, ghost box)`` of face 2k (lower) and 2k+1 (upper) of every dimension k.

    The send box is the ``width`` owned cells next to the face, the ghost box
    the ``width`` ghost cells beyond it; both span the owned cells of the other
    dimensions (no corners).
    """
    w, out = grid.width, []
    for k in range(grid.ndim):
        lo, hi = grid.interior[k]
        for send, ghost in (((lo, lo + w), (lo - w, lo)), ((hi - w, hi), (hi, hi + w))):
            s = list(grid.interior)
            g = list(grid.interior)
            s[k], g[k] = send, ghost
            out.append((tuple(s), tuple(g)))
    return out


class HaloExchange:
    """The exchange of one array's ghost cells, planned once for *grid*, *kernels* and *dtype*."""

    def __init__(self, grid: Grid, kernels: Any, dtype: Any, mode: str = "overlap"):
        if mode not in MODES:
            raise ValueError(f"halo mode {mode!r}: expected one of {', '.join(MODES)}")
        self.grid, self.k, self.mode = grid, kernels, mode
        xp, dtype = kernels.xp, np.dtype(dtype)
        self.faces = face_boxes(grid)
        neighbours = [grid.neighbours[k][side] for k in range(grid.ndim) for side in (0, 1)]
        self.neighbours = neighbours
        counts = [cells(send) if nb != MPI.PROC_NULL else 0 for (send, _), nb in zip(self.faces, neighbours)]
        displs = [sum(counts[:i]) for i in range(len(counts))]
        total = sum(counts)
        self.counts, self.displs = counts, displs
        self.active = [i for i, c in enumerate(counts) if c]
        self.send = xp.zeros(max(total, 1), dtype)
        self.recv = xp.zeros(max(total, 1), dtype)
        self.ops = buffers.ops_for(xp)
        self.staged = buffers.transfer_path(self.send) == "staged"
        if self.staged:
            raw_s = self.ops.alloc_host(self.send.nbytes)
            raw_r = self.ops.alloc_host(self.recv.nbytes)
            self.send_host = raw_s[: self.send.nbytes].view(dtype)
            self.recv_host = raw_r[: self.recv.nbytes].view(dtype)
        else:
            self.send_host, self.recv_host = self.send, self.recv
        mpi_type = buffers.mpi_datatype(dtype)
        cart = grid.cart
        self.requests: list[MPI.Prequest] = []
        self.collective: mpicomm.Prequest | None = None
        if mode == "neighbor":
            sendspec = [self.send_host, (counts, displs), mpi_type]
            recvspec = [self.recv_host, (counts, displs), mpi_type]
            self.collective = mpicomm.Comm(cart).Neighbor_alltoallv_init(sendspec, recvspec)
        else:
            for i in self.active:
                k, side = divmod(i, 2)
                view = slice(displs[i], displs[i] + counts[i])
                # what I send through my lower face lands in the receiver's upper ghosts: tag = receiver's face
                self.requests.append(cart.Recv_init([self.recv_host[view], mpi_type], neighbours[i], tag=i))
                self.requests.append(cart.Send_init([self.send_host[view], mpi_type], neighbours[i], tag=i ^ 1))
        self._in_flight = False

    # ------------------------------------------------------------ one exchange

    def start(self, u: Any) -> None:
        """Pack *u*'s faces and start the transfers (returns at once; :meth:`finish` completes them)."""
        for i in self.active:
            self.k.pack(u, self.faces[i][0], self.send[self.displs[i]:])
        if self.staged:
            self.ops.to_host(self.send, self.send_host)
        else:
            self.ops.synchronize(self.send)
        if self.collective is not None:
            self.collective.Start()
        elif self.requests:
            MPI.Prequest.Startall(self.requests)
        self._in_flight = True

    def finish(self, u: Any) -> None:
        """Wait for the transfers :meth:`start` began and unpack the ghosts into *u*."""
        if not self._in_flight:
            raise RuntimeError("HaloExchange.finish() without start(): call start(u) first")
        if self.collective is not None:
            self.collective.Wait()
        elif self.requests:
            MPI.Prequest.Waitall(self.requests)
        self._in_flight = False
        if self.staged:
            self.ops.from_host(self.recv_host, self.recv)
        for i in self.active:
            self.k.unpack(self.recv[self.displs[i]:], u, self.faces[i][1])

    def progress(self) -> None:
        """Let MPI move the transfers along (a test; the solver calls it between pieces of the interior).

        Many MPI libraries move a message only inside MPI calls; without these
        calls a large face would wait for :meth:`finish`, and ``overlap`` would
        overlap nothing.
        """
        if not self._in_flight:
            return
        if self.collective is not None:
            self.collective.Test()
        elif self.requests:
            MPI.Prequest.Testall(self.requests)

    def exchange(self, u: Any) -> None:
        """Fill *u*'s ghost cells from the neighbours (start, then finish)."""
        self.start(u)
        self.finish(u)

    @property
    def bytes_per_exchange(self) -> int:
        """Bytes this rank sends per exchange."""
        return int(sum(self.counts)) * self.send.dtype.itemsize

    def free(self) -> None:
        """Release the persistent requests."""
        for r in self.requests:
            r.Free()
        self.requests = []
        if self.collective is not None:
            self.collective.Free()
            self.collective = None
