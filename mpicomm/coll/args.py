"""``Args``: one rank's arguments to one collective, read and checked locally; ``ArgumentError``.

Every entry point (``Comm.Allreduce``, ``mpicomm.allreduce``...) reads its
arguments into an :class:`Args` (:mod:`.arguments` for mpi4py's buffer
specs), which the agreement (:mod:`.agreement`) compares across ranks and the
dispatcher (:mod:`.dispatch`) binds to an algorithm. :func:`selection_bytes`
is the message size n of the catalogue's size rule for one call.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from ..buffers import overlap
from ..catalogue import CATALOGUE
from ..ops import Op

__all__ = ["ArgumentError", "Args", "selection_bytes"]


class ArgumentError(ValueError, TypeError):
    """Bad or mismatched collective arguments, raised with the same message on every rank.

    It is both a ValueError and a TypeError, so code catching either (as for
    a local argument error) catches it.
    """


def _nothing() -> None:
    return None


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
    problem: BaseException | None = None  # what is wrong with this rank's arguments
    unsupported: str | None = None  # why the MPI library must run this call instead
    native: Callable[[], MPI.Request] | None = None  # start the library's own collective
    result: Callable[[], Any] = staticmethod(_nothing)  # what the call returns
    device: Any = None
    library: bool = False  # set once the ranks agreed to hand the call to the MPI library

    def __init__(self, collective: str, **fields: Any):
        self.collective = collective
        for name, value in fields.items():
            if not hasattr(Args, name):
                raise TypeError(f"Args has no field {name!r}")
            setattr(self, name, value)

    def __repr__(self) -> str:
        return f"Args({self.collective!r}, {', '.join(f'{k}={v!r}' for k, v in vars(self).items() if k != 'collective')})"

    def fail(self, problem: BaseException) -> "Args":
        """Record *problem* (the first one wins); returns self."""
        if self.problem is None:
            self.problem = problem
        return self

    def check_op(self) -> "Args":
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


    def check_overlap(self) -> "Args":
        """Record a problem if the send and receive buffers partly overlap (not in place, not the same bytes).

        MPI calls aliased send and receive buffers erroneous (``MPI.IN_PLACE``
        says in place); mpicomm's algorithms read the input while they write
        the output, so a partial overlap silently gives wrong results.
        Buffers over exactly the same bytes stay accepted, as before (the
        algorithms copy or combine in place then).
        """
        if self.problem is None and not self.in_place and self.collective not in _NO_SEND:
            send, recv = self.send, self.recv
            if send is not None and recv is not None and send is not recv and overlap(send, recv) == "partial":
                self.fail(ValueError(
                    f"{self.collective}: the send buffer ({send.nbytes} bytes) and the receive buffer "
                    f"({recv.nbytes} bytes) partly overlap in memory; MPI forbids aliased buffers: use "
                    f"separate arrays, or MPI.IN_PLACE for an in-place call"))
        return self


_NO_SEND = frozenset({"bcast", "barrier"})  # one buffer only
_OP_FITS: set[tuple[Op, np.dtype]] = set()  # (op, dtype) pairs already found defined



def selection_bytes(args: Args, p: int) -> int | None:
    """n for this call, by the catalogue's size rule (None where ranks cannot know it alike).

    ``vector``: the whole vector (bcast, reduce, allreduce, scan, exscan);
    ``block``: one rank's block (gather, scatter; None for the v-forms);
    ``gathered``: all p blocks (allgather, allgatherv); ``send``: each
    rank's whole send (alltoall; None for alltoallv); ``input``: the whole
    input (reduce_scatter, reduce_scatter_block).
    """
    if args.dtype is None:
        return None
    item = args.dtype.itemsize
    c = args.collective
    if c in _PER_CALL:
        return args.count * item if args.count >= 0 else None  # (no count: a spec the library runs)
    if c in _PER_RANK:
        return args.count * item * p if args.count >= 0 else None
    if c in ("allgatherv", "reduce_scatter") and args.recvcounts is not None:
        return sum(args.recvcounts) * item
    return None


#: Equal-count collectives whose n is the count itself (vector, block) or p counts (gathered, send, input).
_PER_CALL = frozenset(c.name for c in CATALOGUE.values() if c.equal_blocks and c.size in ("vector", "block")
                      and c.name != "barrier")
_PER_RANK = frozenset(c.name for c in CATALOGUE.values() if c.equal_blocks and c.size in ("gathered", "send", "input"))
