"""Array-first collectives for scientific code: arrays in, new arrays out.

``mpicomm.allreduce(x)`` returns a new array of the same kind as *x* (NumPy in,
NumPy out; CuPy in, CuPy out, on the same device); ``out=`` writes into an
existing array instead (no allocation; it may be *x* itself for the
reductions). Every function takes ``algorithm=`` (a name from
``mpicomm.algorithms(collective)``, or ``"auto"``) and ``comm=`` (an
``mpicomm.Comm``; default: one over ``MPI.COMM_WORLD``), and runs the same
algorithms as ``Comm.Allreduce`` & co. Arrays may have any shape; they must be
C-contiguous. The ``i``-forms return an :class:`mpicomm.Request` whose
``wait()`` returns the result.

Shapes: ``gather``/``allgather`` stack the ranks' arrays on a new first axis;
``scatter``/``alltoall``/``reduce_scatter_block`` split the first axis among
the ranks; the ``v``-forms work on flat element counts.

On a communicator whose ``reproducible`` is set (``MPICOMM_REPRODUCIBLE=1``),
the reductions with ``"sum"`` on float32/64 and complex arrays give a
reproducible sum (:mod:`mpicomm.reproducible`), as ``Comm.Allreduce`` & co. do.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any, Literal, overload

import numpy as np
from mpi4py import MPI

from .coll.patterns import block_partition
from .comm import Comm
from .engine.requests import Request
from .front import reproducing
from .front.dispatch import start
from .ops import resolve
from .plan.args import Args
from .transport.buffers import adopt, array_module, check_array
from .transport.specs import displacements
from .validate import check_peer

__all__ = [
    "world", "barrier", "bcast", "ibcast", "reduce", "allreduce", "iallreduce", "gather", "gatherv", "scatter",
    "scatterv", "allgather", "iallgather", "allgatherv", "alltoall", "ialltoall", "alltoallv", "reduce_scatter",
    "ireduce_scatter", "reduce_scatter_block", "scan", "exscan",
]

_WORLD: list[Comm] = []


def world() -> Comm:
    """The default communicator: an ``mpicomm.Comm`` over ``MPI.COMM_WORLD`` (created once)."""
    if not _WORLD:
        _WORLD.append(Comm(MPI.COMM_WORLD))
    return _WORLD[0]


def _comm(comm: Any) -> Comm:
    if comm is None:
        return world()
    if isinstance(comm, Comm):
        if comm._state.freed:  # (a freed Comm's state raises FreedError on any read)
            comm._state.check_live()
        return comm
    if isinstance(comm, MPI.Intracomm):
        return Comm(comm)
    raise TypeError(f"comm must be an mpicomm.Comm or an MPI.Intracomm, got {type(comm).__qualname__}")


def _flat(x: Any) -> Any:
    return x.reshape(-1)


def _new(x: Any, shape: tuple[int, ...], dtype: Any = None) -> Any:
    xp = array_module(x)
    if xp is np:
        return np.empty(shape, x.dtype if dtype is None else dtype)
    with x.device:
        return xp.empty(shape, x.dtype if dtype is None else dtype)


def _output(args: Args, x: Any, out: Any, shape: tuple[int, ...], name: str = "out") -> Any:
    """*out* checked against the result's shape, dtype and module, or a new array."""
    if out is None:
        return _new(x, shape)
    out = adopt(out, name)
    check_array(out, name, writable=True)
    if array_module(out) is not array_module(x):
        raise TypeError(f"{name} is a {array_module(out).__name__} array but the input is {array_module(x).__name__}")
    if tuple(out.shape) != tuple(shape) or out.dtype != x.dtype:
        raise ValueError(f"{name} has shape {out.shape} and dtype {out.dtype}; this call needs shape {shape}, dtype {x.dtype}")
    return out


def _input(args: Args, x: Any, name: str = "x") -> Any:
    """*x* as an array (any buffer kind, see :func:`mpicomm.transport.buffers.adopt`), checked; its module and dtype go to *args*."""
    x = adopt(x, name)
    xp = check_array(x, name)
    args.xp, args.dtype = xp, x.dtype
    if xp is not np:
        args.device = x.device
    return x


@overload
def _go(comm: Any, args: Args, algorithm: str | None, blocking: Literal[False],
        reproducible: bool | None = None) -> Request: ...


@overload
def _go(comm: Any, args: Args, algorithm: str | None, blocking: bool, reproducible: bool | None = None) -> Any: ...


def _go(comm: Any, args: Args, algorithm: str | None, blocking: bool, reproducible: bool | None = None) -> Any:
    c = _comm(comm)
    if args.collective in reproducing.COLLECTIVES and (args.parts is not None or c._summing(reproducible)):
        return reproducing.start(c._state, args, algorithm, blocking)  # (the call, or Comm.reproducible)
    return start(c, args, algorithm, blocking)


def _stacked(args: Args, x: Any, reproducible: bool | None) -> Any:
    """``stacked=True``: *x*'s rows are this rank's contributions (kept in ``args.parts``); the first, or zeros
    of a row's shape where there are none, stands for them in the call's arguments."""
    if reproducible is False:
        raise TypeError("stacked=True sums this rank's contributions reproducibly; drop reproducible=False")
    if x.ndim < 1:
        raise ValueError("stacked=True: x's first axis lists this rank's contributions, shape (m, ...); got a "
                         "0-d array")
    args.parts = x.reshape(x.shape[0], int(np.prod(x.shape[1:], dtype=np.int64)))
    return x[0] if x.shape[0] else args.xp.zeros(x.shape[1:], x.dtype)  # type: ignore[union-attr]


def _guard(args: Args, fn: Any) -> Args:
    try:
        fn()
    except (TypeError, ValueError) as exc:
        args.fail(exc)
    return args.check_overlap().check_op()


# ---------------------------------------------------------------- barrier, bcast, reductions


def barrier(*, algorithm: str | None = "auto", comm: Any = None) -> None:
    """Block until every rank of *comm* has called it."""
    _go(comm, Args("barrier"), algorithm, True)


def _bcast_args(x: Any, root: int, comm: Comm, out: Any) -> Args:
    args = Args("bcast")

    def read() -> None:
        nonlocal x
        args.root = check_peer(root, "root", comm.Get_size())
        x = _input(args, x)
        is_root = comm.Get_rank() == args.root
        if out is None:
            result = x.copy() if is_root else _new(x, x.shape)
        else:
            result = _output(args, x, out, x.shape)
            if is_root and result is not x:
                result[...] = x
        args.send = args.recv = _flat(result)
        args.count = x.size
        args.result = lambda: result

    return _guard(args, read)


def bcast(x: Any, root: int = 0, *, algorithm: str | None = "auto", comm: Any = None, out: Any = None) -> Any:
    """Root's *x* on every rank. Off the root, *x* gives the shape and dtype (its values are not used)."""
    c = _comm(comm)
    return _go(c, _bcast_args(x, root, c, out), algorithm, True)


def ibcast(x: Any, root: int = 0, *, algorithm: str | None = "auto", comm: Any = None, out: Any = None) -> Request:
    """Nonblocking :func:`bcast`."""
    c = _comm(comm)
    return _go(c, _bcast_args(x, root, c, out), algorithm, False)


def _reduction_args(collective: str, x: Any, op: Any, comm: Comm, out: Any, root: int | None = None,
                    stacked: bool = False, reproducible: bool | None = None) -> Args:
    args = Args(collective)

    def read() -> None:
        nonlocal x
        args.op = resolve(op)
        x = _input(args, x)
        if stacked:
            x = _stacked(args, x, reproducible)
        if root is not None:
            args.root = check_peer(root, "root", comm.Get_size())
        args.count = x.size
        args.send = _flat(x)
        if root is not None and comm.Get_rank() != args.root:
            args.result = lambda: None
            return
        result = _output(args, x, out, x.shape)
        args.in_place = result is x
        args.recv = args.send if args.in_place else _flat(result)
        args.result = lambda: result if collective != "exscan" or comm.Get_rank() > 0 or out is not None else None

    return _guard(args, read)


def reduce(x: Any, op: Any = "sum", root: int = 0, *, algorithm: str | None = "auto", comm: Any = None,
           out: Any = None) -> Any:
    """The reduction of every rank's *x* with *op*, on *root* (None elsewhere)."""
    c = _comm(comm)
    return _go(c, _reduction_args("reduce", x, op, c, out, root), algorithm, True)


def allreduce(x: Any, op: Any = "sum", *, algorithm: str | None = "auto", comm: Any = None, out: Any = None,
              reproducible: bool | None = None, stacked: bool = False) -> Any:
    """The elementwise reduction of every rank's *x* with *op*, on every rank (``out=x`` reduces in place).

    *reproducible*: a reproducible sum (None: the communicator's setting; :mod:`mpicomm.reproducible`).
    *stacked*: *x*'s first axis lists this rank's contributions, any number of them (none too): the result
    is the reproducible sum of every rank's every contribution, shaped as one of them (data-parallel
    training that sums fixed micro-batches, whichever rank computed each)."""
    c = _comm(comm)
    return _go(c, _reduction_args("allreduce", x, op, c, out, None, stacked, reproducible), algorithm, True,
               reproducible)


def iallreduce(x: Any, op: Any = "sum", *, algorithm: str | None = "auto", comm: Any = None,
               out: Any = None, reproducible: bool | None = None, stacked: bool = False) -> Request:
    """Nonblocking :func:`allreduce`; ``request.wait()`` returns the result."""
    c = _comm(comm)
    return _go(c, _reduction_args("allreduce", x, op, c, out, None, stacked, reproducible), algorithm, False,
               reproducible)


def scan(x: Any, op: Any = "sum", *, algorithm: str | None = "auto", comm: Any = None, out: Any = None) -> Any:
    """Inclusive prefix reduction: rank r gets x_0 ⊕ … ⊕ x_r."""
    c = _comm(comm)
    return _go(c, _reduction_args("scan", x, op, c, out), algorithm, True)


def exscan(x: Any, op: Any = "sum", *, algorithm: str | None = "auto", comm: Any = None, out: Any = None) -> Any:
    """Exclusive prefix reduction: rank r > 0 gets x_0 ⊕ … ⊕ x_{r−1}; rank 0 gets None (or *out*, untouched)."""
    c = _comm(comm)
    return _go(c, _reduction_args("exscan", x, op, c, out), algorithm, True)


# ---------------------------------------------------------------- gather, scatter


def gather(x: Any, root: int = 0, *, algorithm: str | None = "auto", comm: Any = None, out: Any = None) -> Any:
    """Every rank's *x* (same shape everywhere) stacked on the root: shape ``(p, *x.shape)``; None elsewhere."""
    c = _comm(comm)
    p, rank = c.Get_size(), c.Get_rank()
    args = Args("gather")

    def read() -> None:
        nonlocal x
        args.root = check_peer(root, "root", p)
        x = _input(args, x)
        args.send, args.count = _flat(x), x.size
        args.recvcounts, args.recvdispls = (x.size,) * p, tuple(i * x.size for i in range(p))
        if rank == args.root:
            result = _output(args, x, out, (p, *x.shape))
            args.recv = _flat(result)
            args.result = lambda: result

    return _go(c, _guard(args, read), algorithm, True)


def gatherv(x: Any, counts: Sequence[int] | None = None, root: int = 0, *, algorithm: str | None = "auto",
            comm: Any = None, out: Any = None) -> Any:
    """Every rank's *x* (any sizes), flattened and concatenated in rank order on the root; None elsewhere.

    *counts* (the root's, optional): elements from each rank; the sizes are gathered either way (one
    small gather), so the ranks' counts are checked against them when validation is on.
    """
    c = _comm(comm)
    p, rank = c.Get_size(), c.Get_rank()
    # Always exchanged (one small gather), so no rank decides alone to make a call the others skip.
    # (the same root as check_peer's below where that is valid - a NumPy integer too - so the root has the sizes)
    gather_root = int(root) if isinstance(root, numbers.Integral) and 0 <= root < p else 0
    sizes = c.library_comm.gather(getattr(x, "size", 0), root=gather_root)
    args = Args("gatherv")

    def read() -> None:
        nonlocal x
        args.root = check_peer(root, "root", p)
        x = _input(args, x)
        args.send = _flat(x)
        if rank == args.root:
            given = sizes if counts is None else counts
            assert given is not None  # the root's gather above returned every rank's size
            cs = tuple(int(n) for n in given)
            if len(cs) != p:
                raise ValueError(f"counts has {len(cs)} entries for {p} ranks")
            result = _output(args, x, out, (sum(cs),))
            args.recv, args.recvcounts = result, cs
            args.recvdispls = displacements(cs)
            args.result = lambda: result

    return _go(c, _guard(args, read), algorithm, True)


def _received_part(c: Comm, root: Any, x: Any, out: Any, shapes: Any) -> Any:
    """Off the root and without *out*: a new array for this rank's part of the root's *x*, else None.

    The root broadcasts x's dtype, module and ``shapes(x)`` (each rank's part);
    every rank takes part whether or not it needs it, so none skips a call the
    others make. A root whose *x* cannot be described sends nothing usable;
    its own checks then report the problem on every rank.
    """
    p, rank = c.Get_size(), c.Get_rank()
    if not isinstance(root, numbers.Integral):  # (check_peer takes a NumPy integer too)
        return None
    root = int(root)
    if not 0 <= root < p:
        return None
    info = None
    if rank == root:
        try:
            info = (x.dtype.str, array_module(x).__name__, [tuple(s) for s in shapes(x)])
        except Exception:  # the root's read() names the problem
            info = None
    info = c.library_comm.bcast(info, root=root)
    if rank == root or out is not None:
        return None
    dtype, module, parts = info or ("u1", "numpy", [(0,)] * p)
    import importlib

    return importlib.import_module(module).empty(parts[rank] if rank < len(parts) else (0,), np.dtype(dtype))


def scatter(x: Any, root: int = 0, *, algorithm: str | None = "auto", comm: Any = None, out: Any = None) -> Any:
    """Block r of the root's *x* (split along its first axis, of length p) on rank r."""
    c = _comm(comm)
    p, rank = c.Get_size(), c.Get_rank()
    args = Args("scatter")
    mine = _received_part(c, root, x, out, lambda a: [a.shape[1:]] * p)

    def read() -> None:
        nonlocal x
        args.root = check_peer(root, "root", p)
        if rank == args.root:
            x = _input(args, x)
            if not x.shape or x.shape[0] != p:
                raise ValueError(f"x has shape {x.shape}; scatter splits the first axis, which must be p = {p}")
            block = x.size // p
            args.send, args.sendcounts = _flat(x), (block,) * p
            args.senddispls = tuple(i * block for i in range(p))
            result = _output(args, x, out, x.shape[1:])
        else:
            result = out if out is not None else mine
            _input(args, result, "out")
            block = result.size
            args.sendcounts, args.senddispls = (block,) * p, tuple(i * block for i in range(p))
        args.recv, args.count = _flat(result), block
        args.result = lambda: result

    return _go(c, _guard(args, read), algorithm, True)


def scatterv(x: Any, counts: Sequence[int] | None = None, root: int = 0, *, algorithm: str | None = "auto",
             comm: Any = None, out: Any = None) -> Any:
    """counts[r] consecutive elements of the root's flat *x* on rank r (the counts are the root's)."""
    c = _comm(comm)
    p, rank = c.Get_size(), c.Get_rank()
    args = Args("scatterv")
    mine = _received_part(c, root, x, out, lambda a: [(int(n),) for n in counts or [0] * p])

    def read() -> None:
        nonlocal x
        args.root = check_peer(root, "root", p)
        if rank == args.root:
            x = _input(args, x)
            if counts is None:
                raise ValueError("scatterv needs counts on the root (elements for each rank)")
            cs = tuple(int(n) for n in counts)
            if len(cs) != p or sum(cs) > x.size:
                raise ValueError(f"counts {list(cs)}: need {p} entries summing to at most x.size = {x.size}")
            args.send, args.sendcounts = _flat(x), cs
            args.senddispls = displacements(cs)
            result = out if out is not None else _new(x, (cs[rank],))
        else:
            result = out if out is not None else mine
            _input(args, result, "out")
        args.recv = _flat(result)
        args.result = lambda: result

    return _go(c, _guard(args, read), algorithm, True)


# ---------------------------------------------------------------- all-to-all family


def _allgather_args(x: Any, comm: Comm, out: Any) -> Args:
    p = comm.Get_size()
    args = Args("allgather")

    def read() -> None:
        nonlocal x
        x = _input(args, x)
        result = _output(args, x, out, (p, *x.shape))
        args.send, args.recv, args.count = _flat(x), _flat(result), x.size
        args.recvcounts, args.recvdispls = (x.size,) * p, tuple(i * x.size for i in range(p))
        args.result = lambda: result

    return _guard(args, read)


def allgather(x: Any, *, algorithm: str | None = "auto", comm: Any = None, out: Any = None) -> Any:
    """Every rank's *x* (same shape everywhere) stacked on every rank: shape ``(p, *x.shape)``."""
    c = _comm(comm)
    return _go(c, _allgather_args(x, c, out), algorithm, True)


def iallgather(x: Any, *, algorithm: str | None = "auto", comm: Any = None, out: Any = None) -> Request:
    """Nonblocking :func:`allgather`."""
    c = _comm(comm)
    return _go(c, _allgather_args(x, c, out), algorithm, False)


def allgatherv(x: Any, counts: Sequence[int] | None = None, *, algorithm: str | None = "auto",
               comm: Any = None, out: Any = None) -> Any:
    """Every rank's *x* (any sizes) flattened and concatenated in rank order, on every rank."""
    c = _comm(comm)
    p = c.Get_size()
    sizes = c.library_comm.allgather(getattr(x, "size", 0))  # always: no rank skips a call the others make
    counts = sizes if counts is None else counts
    args = Args("allgatherv")

    def read() -> None:
        nonlocal x
        x = _input(args, x)
        cs = tuple(int(n) for n in counts)
        if len(cs) != p:
            raise ValueError(f"counts has {len(cs)} entries for {p} ranks")
        result = _output(args, x, out, (sum(cs),))
        args.send, args.recv, args.recvcounts = _flat(x), result, cs
        args.recvdispls = displacements(cs)
        args.result = lambda: result

    return _go(c, _guard(args, read), algorithm, True)


def _alltoall_args(x: Any, comm: Comm, out: Any) -> Args:
    p = comm.Get_size()
    args = Args("alltoall")

    def read() -> None:
        nonlocal x
        x = _input(args, x)
        if not x.shape or x.shape[0] != p:
            raise ValueError(f"x has shape {x.shape}; alltoall splits the first axis, which must be p = {p}")
        result = _output(args, x, out, x.shape)
        block = x.size // p
        layout = (block,) * p, tuple(i * block for i in range(p))
        args.send, args.recv, args.count = _flat(x), _flat(result), block
        args.sendcounts, args.senddispls = layout
        args.recvcounts, args.recvdispls = layout
        args.in_place = result is x
        args.result = lambda: result

    return _guard(args, read)


def alltoall(x: Any, *, algorithm: str | None = "auto", comm: Any = None, out: Any = None) -> Any:
    """Block j of *x* (first axis, length p) goes to rank j; block i of the result came from rank i."""
    c = _comm(comm)
    return _go(c, _alltoall_args(x, c, out), algorithm, True)


def ialltoall(x: Any, *, algorithm: str | None = "auto", comm: Any = None, out: Any = None) -> Request:
    """Nonblocking :func:`alltoall`."""
    c = _comm(comm)
    return _go(c, _alltoall_args(x, c, out), algorithm, False)


def alltoallv(x: Any, sendcounts: Sequence[int], recvcounts: Sequence[int] | None = None, *,
              algorithm: str | None = "auto", comm: Any = None, out: Any = None) -> Any:
    """sendcounts[j] consecutive elements of flat *x* go to rank j; the result concatenates what each rank sent.

    *recvcounts* None exchanges the counts first.
    """
    c = _comm(comm)
    p = c.Get_size()
    exchanged = c.library_comm.alltoall(list(sendcounts) if len(sendcounts) == p else [0] * p)  # always
    recvcounts = exchanged if recvcounts is None else recvcounts
    args = Args("alltoallv")

    def read() -> None:
        nonlocal x
        x = _input(args, x)
        sc, rc = tuple(int(n) for n in sendcounts), tuple(int(n) for n in recvcounts)
        if len(sc) != p or len(rc) != p or sum(sc) > x.size:
            raise ValueError(f"sendcounts {list(sc)} / recvcounts {list(rc)}: need {p} entries each, "
                             f"sendcounts summing to at most x.size = {x.size}")
        result = _output(args, x, out, (sum(rc),))
        args.send, args.recv = _flat(x), result
        args.sendcounts, args.senddispls = sc, displacements(sc)
        args.recvcounts, args.recvdispls = rc, displacements(rc)
        args.result = lambda: result

    return _go(c, _guard(args, read), algorithm, True)


def _reduce_scatter_args(x: Any, counts: Any, op: Any, comm: Comm, out: Any, stacked: bool = False,
                         reproducible: bool | None = None) -> Args:
    p, rank = comm.Get_size(), comm.Get_rank()
    args = Args("reduce_scatter")

    def read() -> None:
        nonlocal x
        args.op = resolve(op)
        x = _input(args, x)
        if stacked:
            x = _stacked(args, x, reproducible)
        cs = tuple(block_partition(x.size, p)[0]) if counts is None else tuple(int(n) for n in counts)
        if len(cs) != p or sum(cs) != x.size:
            raise ValueError(f"counts {list(cs)}: need {p} entries summing to x.size = {x.size}")
        result = _output(args, x, out, (cs[rank],))
        args.send, args.recv, args.recvcounts = _flat(x), result, cs
        args.result = lambda: result

    return _guard(args, read)


def reduce_scatter(x: Any, counts: Sequence[int] | None = None, op: Any = "sum", *,
                   algorithm: str | None = "auto", comm: Any = None, out: Any = None,
                   reproducible: bool | None = None, stacked: bool = False) -> Any:
    """Reduce every rank's flat *x* with *op*; rank r gets its counts[r] elements (None: near-equal blocks).
    *reproducible*, *stacked* (rows of *x*, each a whole flat input): as for :func:`allreduce`."""
    c = _comm(comm)
    return _go(c, _reduce_scatter_args(x, counts, op, c, out, stacked, reproducible), algorithm, True, reproducible)


def ireduce_scatter(x: Any, counts: Sequence[int] | None = None, op: Any = "sum", *,
                    algorithm: str | None = "auto", comm: Any = None, out: Any = None,
                    reproducible: bool | None = None, stacked: bool = False) -> Request:
    """Nonblocking :func:`reduce_scatter`."""
    c = _comm(comm)
    return _go(c, _reduce_scatter_args(x, counts, op, c, out, stacked, reproducible), algorithm, False,
               reproducible)


def reduce_scatter_block(x: Any, op: Any = "sum", *, algorithm: str | None = "auto", comm: Any = None,
                         out: Any = None) -> Any:
    """Reduce every rank's *x* (first axis of length p) with *op*; rank r gets reduced block ``x[r]``."""
    c = _comm(comm)
    p = c.Get_size()
    args = Args("reduce_scatter_block")

    def read() -> None:
        nonlocal x
        args.op = resolve(op)
        x = _input(args, x)
        if not x.shape or x.shape[0] != p:
            raise ValueError(f"x has shape {x.shape}; reduce_scatter_block splits the first axis, which must be p = {p}")
        result = _output(args, x, out, x.shape[1:])
        block = x.size // p
        args.send, args.recv, args.count, args.recvcounts = _flat(x), _flat(result), block, (block,) * p
        args.result = lambda: result

    return _go(c, _guard(args, read), algorithm, True)
