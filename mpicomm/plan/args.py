"""``Args``: one rank's arguments to one collective, read and checked locally; ``ArgumentError``.

Every entry point (``Comm.Allreduce``, ``mpicomm.allreduce``...) reads its
arguments into an :class:`Args` (:mod:`.arguments` for mpi4py's buffer
specs), which the agreement (:mod:`.agreement`) compares across ranks and the
dispatcher (:mod:`.dispatch`) binds to an algorithm.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any, cast

import numpy as np
from mpi4py import MPI

from ..catalogue import CATALOGUE
from ..ops import Op
from ..transport.buffers import overlap

__all__ = ["ArgumentError", "Args", "sending_order"]


class ArgumentError(ValueError, TypeError):
    """Bad or mismatched collective arguments, raised with the same message on every rank.

    It is both a ValueError and a TypeError, so code catching either (as for
    a local argument error) catches it.
    """


def _nothing() -> None:
    return None


def _kept_away() -> Any:
    raise RuntimeError("a kept plan's arguments no longer hold the caller's buffer specs")


def library_request(args: Args, comm: MPI.Intracomm) -> MPI.Request:
    """Start the MPI library's own nonblocking collective on *args*' arrays (plain arrays: what a kept plan
    has), on *comm* (the user's communicator) - for when another rank's buffer spec only the library takes."""
    c = args.collective
    send, recv = args.send, args.recv
    place = MPI.IN_PLACE
    op = args.op.mpi if args.op is not None else None
    if op is None and args.op is not None:
        raise TypeError(f"op {args.op.name} is a Python op; the MPI library path needs an MPI.Op")
    if c == "bcast":
        return comm.Ibcast(recv if recv is not None else send, args.root)
    if c == "reduce":
        assert op is not None  # (a reducing collective's arguments have an op: read with them)
        root = comm.Get_rank() == args.root
        return comm.Ireduce(place if root and args.in_place else send, recv if root else None, op, args.root)
    if c in ("allreduce", "scan", "exscan"):
        assert op is not None  # (as above)
        reduction = {"allreduce": comm.Iallreduce, "scan": comm.Iscan, "exscan": comm.Iexscan}[c]
        return reduction(place if args.in_place else send, recv, op)
    v = c.endswith("v")
    if c in ("gather", "gatherv"):
        root = comm.Get_rank() == args.root
        spec = ([recv, (args.recvcounts, args.recvdispls)] if v else recv) if root else None
        gather = comm.Igatherv if v else comm.Igather
        return gather(place if root and args.in_place else send, spec, args.root)
    if c in ("scatter", "scatterv"):
        root = comm.Get_rank() == args.root
        spec = ([send, (args.sendcounts, args.senddispls)] if v else send) if root else None
        scatter = comm.Iscatterv if v else comm.Iscatter
        return scatter(spec, place if root and args.in_place else recv, args.root)
    if c in ("allgather", "allgatherv"):
        spec = [recv, (args.recvcounts, args.recvdispls)] if v else recv
        return (comm.Iallgatherv if v else comm.Iallgather)(place if args.in_place else send, spec)
    if c in ("alltoall", "alltoallv", "alltoallw"):  # (alltoallw: bytes, so Alltoallv of them is the same call)
        if c == "alltoall":
            return comm.Ialltoall(place if args.in_place else send, recv)
        source = place if args.in_place else [send, (args.sendcounts, args.senddispls)]
        return comm.Ialltoallv(source, [recv, (args.recvcounts, args.recvdispls)])
    if c == "reduce_scatter_block":
        assert op is not None  # (as above)
        return comm.Ireduce_scatter_block(place if args.in_place else send, recv, op)
    if c == "reduce_scatter":
        assert op is not None  # (as above)
        return comm.Ireduce_scatter(place if args.in_place else send, recv, list(args.recvcounts or ()), op)
    if c == "barrier":
        return comm.Ibarrier()
    if c.startswith("neighbor_"):  # (mpi4py's methods of the topology class: ours would take the call back)
        topo = cast(MPI.Topocomm, comm)
        sendspec = [send, (args.sendcounts, args.senddispls)]
        recvspec = [recv, (args.recvcounts, args.recvdispls)]
        if c == "neighbor_allgather":
            return MPI.Topocomm.Ineighbor_allgather(topo, send, recv)  # (the reader cut recv to its blocks)
        if c == "neighbor_allgatherv":
            return MPI.Topocomm.Ineighbor_allgatherv(topo, send, recvspec)
        return MPI.Topocomm.Ineighbor_alltoallv(topo, sendspec, recvspec)  # (neighbor_alltoallw: of bytes)
    raise ValueError(f"no library form for collective {c!r}")


class Args:
    """One rank's arguments to one collective, read and checked locally.

    Every field but the collective has a default (read from the class until
    set, so building one per call costs little); ``Args("bcast", root=2)``
    sets fields by keyword.
    """

    xp: ModuleType | None = None
    dtype: np.dtype | None = None
    send: Any = None
    recv: Any = None
    count: int = -1  # the count all ranks must give alike (-1: none, as for v-variants)
    root: int = 0
    op: Op | None = None
    in_place: bool = False
    sendcounts: tuple[int, ...] | None = None
    senddispls: tuple[int, ...] | None = None
    recvcounts: tuple[int, ...] | None = None
    recvdispls: tuple[int, ...] | None = None
    sources: tuple[int, ...] = ()  # a neighbourhood collective's in-edges (the topology's order; PROC_NULL kept)
    destinations: tuple[int, ...] = ()  # and its out-edges
    cartesian: bool = False  # the topology is Cartesian (see sending_order)
    problem: BaseException | None = None  # what is wrong with this rank's arguments
    unsupported: str | None = None  # why the MPI library must run this call instead
    native: Callable[[], MPI.Request] | None = None  # start the library's own collective
    result: Callable[[], Any] = staticmethod(_nothing)  # what the call returns
    device: Any = None
    library: bool = False  # set once the ranks agreed to hand the call to the MPI library
    parts: Any = None  # a reproducible sum's contributions of this rank, as rows (send: the first); see front.reproducing

    def __init__(self, collective: str, **fields: Any):
        self.collective = collective
        for name, value in fields.items():
            if not hasattr(Args, name):
                raise TypeError(f"Args has no field {name!r}")
            setattr(self, name, value)

    def __repr__(self) -> str:
        return f"Args({self.collective!r}, {', '.join(f'{k}={v!r}' for k, v in vars(self).items() if k != 'collective')})"

    def detached(self, send: Any, recv: Any) -> Args:
        """A copy for a plan kept for later calls: *send*/*recv* instead of the caller's arrays (views over the
        same memory that hold no reference to them), and no closure over the caller's objects (the library
        call is replaced by a marker: a kept plan never runs it)."""
        other = Args(self.collective)
        other.__dict__.update(self.__dict__)
        other.send, other.recv = send, recv
        if self.native is not None:
            other.native = _kept_away
        other.result = _nothing
        return other

    def message_bytes(self, p: int) -> int | None:
        """n for this call on *p* ranks, by the catalogue's size rule (:meth:`mpicomm.catalogue.Collective.nbytes`;
        None where the ranks cannot know it alike, or without an element type)."""
        if self.dtype is None:
            return None
        return CATALOGUE[self.collective].nbytes(self.count, self.dtype.itemsize, p, self.recvcounts)

    def fail(self, problem: BaseException) -> Args:
        """Record *problem* (the first one wins); returns self."""
        if self.problem is None:
            self.problem = problem
        return self

    def check_op(self) -> Args:
        """Record a problem if the op is not defined on the element type."""
        op, dtype = self.op, self.dtype
        if self.problem is None and op is not None and dtype is not None and (op, dtype) not in _OP_FITS:
            message = op.check_dtype(dtype)
            if message:
                self.fail(TypeError(message))
            else:
                if len(_OP_FITS) > 1024:
                    _OP_FITS.clear()
                _OP_FITS.add((op, dtype))
        return self


    def check_overlap(self) -> Args:
        """Record a problem if the send and receive buffers partly overlap (not in place, not the same bytes).

        MPI calls aliased send and receive buffers erroneous (``MPI.IN_PLACE``
        says in place); mpicomm's algorithms read the input while they write
        the output, so a partial overlap silently gives wrong results.
        Buffers over exactly the same bytes stay accepted, as before: the call
        is then in place, as with ``MPI.IN_PLACE`` (the algorithms copy or
        combine in place).
        """
        if self.problem is None and not self.in_place and self.collective not in _NO_SEND:
            send, recv = self.send, self.recv
            shared = overlap(send, recv) if send is not None and recv is not None else None
            if shared == "same":
                self.in_place = True
            elif shared == "partial":
                self.fail(ValueError(
                    f"{self.collective}: the send buffer ({send.nbytes} bytes) and the receive buffer "
                    f"({recv.nbytes} bytes) partly overlap in memory; MPI forbids aliased buffers: use "
                    f"separate arrays, or MPI.IN_PLACE for an in-place call"))
        return self


_NO_SEND = frozenset({"bcast", "barrier"})  # one buffer only
_OP_FITS: set[tuple[Op, np.dtype]] = set()  # (op, dtype) pairs already found defined



def sending_order(args: Args) -> tuple[tuple[int, ...], tuple[int, ...] | None, tuple[int, ...] | None]:
    """A neighbourhood collective's out-edges in the order their blocks leave: ``(destinations, sendcounts,
    senddispls)``. A receiver takes the k-th block a peer sends it into its k-th block from that peer, so the
    order decides where a block lands when a peer is a neighbour twice. On a graph it is the topology's order. On
    a Cartesian communicator each dimension's pair goes out as (above, below): the block sent up lands in the
    receiver's block from below, also where both neighbours are one rank (a periodic dimension of size 2 or 1) -
    what MPI specifies and MPICH does."""
    order = list(range(len(args.destinations)))
    if args.cartesian:
        for i in range(0, len(order) - 1, 2):
            order[i], order[i + 1] = order[i + 1], order[i]

    def taken(values: tuple[int, ...] | None) -> tuple[int, ...] | None:
        return None if values is None or len(values) != len(order) else tuple(values[i] for i in order)

    return tuple(args.destinations[i] for i in order), taken(args.sendcounts), taken(args.senddispls)
