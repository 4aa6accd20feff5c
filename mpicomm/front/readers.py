"""Reading mpi4py-style collective arguments (buffer specs, op, root) into :class:`~mpicomm.plan.args.Args`.

One reader per collective, with mpi4py's semantics: in place is ``MPI.IN_PLACE``
or None; a rooted collective reads the root's buffers only on the root; send
and receive element types and counts must match as MPI requires. A reader
never raises: whatever is wrong is recorded in ``Args.problem`` (raised on
every rank by the agreement), and a spec mpicomm does not run itself is
recorded in ``Args.unsupported`` with the library call that runs it instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from mpi4py import MPI

from ..catalogue import row
from ..ops import BUILTIN, resolve
from ..plan.args import Args
from ..transport import specs
from ..validate import check_peer

if TYPE_CHECKING:
    from ..comm import Comm

__all__ = ["read"]


def block_of(buf: Any, counts: Any, displs: Any, r: int) -> Any:
    """Rank *r*'s block of *buf*: elements ``displs[r] … displs[r] + counts[r] − 1`` (a view)."""
    return buf[displs[r] : displs[r] + counts[r]]



def read(collective: str, comm: Comm, *positional: Any, **keywords: Any) -> Args:
    """Read one call's mpi4py-style arguments; never raises (see the module docstring)."""
    args = Args(collective)
    spec = row(collective)
    method = getattr(MPI.Topocomm if spec.neighbor else MPI.Intracomm, spec.nonblocking)
    args.native = lambda: method(comm, *positional, **_native_keywords(keywords))
    try:
        _READERS[collective](args, comm, *positional, **keywords)
    except specs.Unsupported as exc:
        args.unsupported = str(exc)
    except (TypeError, ValueError) as exc:
        args.fail(exc)
    return args.check_overlap().check_op()


def _native_keywords(keywords: dict) -> dict:
    """The keywords for the library's own collective: an op given as a name or a Python op made an ``MPI.Op``."""
    out = dict(keywords)
    op = out.get("op")
    if op is not None and not isinstance(op, MPI.Op):
        resolved = resolve(op)
        if resolved.mpi is None:
            raise TypeError(f"op {resolved.name} is a Python op; the MPI library path needs an MPI.Op")
        out["op"] = resolved.mpi
    return out


def _root(args: Args, comm: Comm, root: Any) -> bool:
    """Record the root; True on the root."""
    args.root = check_peer(root, "root", comm.Get_size())
    if args.root == MPI.PROC_NULL:
        raise ValueError("root=MPI.PROC_NULL is for intercommunicators; use a rank 0..p-1")
    return comm.Get_rank() == args.root


_B = TypeVar("_B", bound=specs.Buffer)


def _take(args: Args, buffer: _B) -> _B:
    if args.xp is None:
        args.xp, args.dtype = buffer.xp, buffer.dtype
        if buffer.xp.__name__ == "cupy":
            args.device = buffer.array.device
    elif buffer.dtype != args.dtype:
        raise TypeError(f"send and receive element types differ ({args.dtype} and {buffer.dtype}); MPI requires "
                        f"the same type on both sides - convert one with .astype()")
    return buffer


def _same_count(send: int, recv: int, what: str, where: str = "") -> None:
    if send != recv:
        raise ValueError(f"{what}{where}: send count {send} and receive count {recv} differ; they must be equal")


def _op(op: Any) -> Any:
    """:func:`mpicomm.ops.resolve`, with MPI's predefined op objects looked up directly."""
    return _PREDEFINED.get(id(op)) or resolve(op)


_PREDEFINED = {id(builtin.mpi): builtin for builtin in BUILTIN.values()}  # (the table keeps the objects alive)


def _reduction(args: Args, sendbuf: Any, recvbuf: Any, op: Any, in_place_ok: bool = True) -> None:
    args.op = _op(op)
    recv_flat = specs.plain(recvbuf)
    if recv_flat is not None and recvbuf.flags.writeable:  # the common case: plain arrays, read as below would
        send_flat = recv_flat if specs.is_in_place(sendbuf) and in_place_ok else specs.plain(sendbuf)
        if send_flat is not None and send_flat.dtype == recv_flat.dtype and send_flat.size == recv_flat.size:
            args.xp, args.dtype, args.recv, args.send = np, recv_flat.dtype, recv_flat, send_flat
            args.in_place, args.count = send_flat is recv_flat, int(recv_flat.size)
            return
    recv = _take(args, specs.writable(specs.simple(recvbuf, "recvbuf"), "recvbuf"))
    args.recv = recv.array
    if specs.is_in_place(sendbuf) and in_place_ok:
        args.send, args.in_place = args.recv, True
    else:
        send = _take(args, specs.simple(sendbuf, "sendbuf"))
        _same_count(send.count, recv.count, args.collective)
        args.send = send.array
    args.count = recv.count


def _bcast(args: Args, comm: Comm, buf: Any, root: Any = 0) -> None:
    is_root = _root(args, comm, root)
    flat = specs.plain(buf)
    if flat is not None and (is_root or buf.flags.writeable):  # the common case, read as below would
        args.xp, args.dtype, args.send, args.recv, args.count = np, flat.dtype, flat, flat, int(flat.size)
        return
    b = _take(args, specs.simple(buf, "buf"))
    if not is_root:
        specs.writable(b, "buf")
    args.send = args.recv = b.array
    args.count = b.count


def _reduce(args: Args, comm: Comm, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, root: Any = 0) -> None:
    is_root = _root(args, comm, root)
    if is_root:
        _reduction(args, sendbuf, recvbuf, op)
        return
    args.op = _op(op)
    if specs.is_in_place(sendbuf):
        raise ValueError("sendbuf is MPI.IN_PLACE on a rank that is not the root; only the root may reduce in place")
    send = _take(args, specs.simple(sendbuf, "sendbuf"))
    args.send, args.count = send.array, send.count


def _allreduce(args: Args, comm: Comm, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM) -> None:
    _reduction(args, sendbuf, recvbuf, op)


def _equal(block: int, p: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Counts and displacements of p equal blocks of *block* elements, packed."""
    return (block,) * p, tuple(i * block for i in range(p))


def _layout(spec: Any, name: str, p: int, v: bool, receive: bool = False
            ) -> tuple[specs.Buffer, tuple[int, ...], tuple[int, ...]]:
    """A v-spec (per-rank counts and displacements) or a block spec (p equal blocks), read.

    A receive v-spec's blocks must not overlap (block specs are packed).
    """
    if v:
        vbuffer = specs.vector(spec, name, p)
        if receive:
            specs.check_disjoint(vbuffer.counts, vbuffer.displs, name)
        return vbuffer, vbuffer.counts, vbuffer.displs
    buffer, block = specs.block(spec, name, p)
    return (buffer, *_equal(block, p))


def _gather(args: Args, comm: Comm, sendbuf: Any, recvbuf: Any, root: Any = 0, v: bool = False) -> None:
    p, rank = comm.Get_size(), comm.Get_rank()
    is_root = _root(args, comm, root)
    if is_root:
        recv, counts, displs = _layout(recvbuf, "recvbuf", p, v, receive=True)
        _take(args, specs.writable(recv, "recvbuf"))
        args.recv, args.recvcounts, args.recvdispls = recv.array, counts, displs
        if specs.is_in_place(sendbuf):
            args.send = block_of(recv.array, counts, displs, rank)
            args.in_place = True
        else:
            send = _take(args, specs.simple(sendbuf, "sendbuf"))
            _same_count(send.count, counts[rank], args.collective, " on the root")
            args.send = send.array
        args.count = -1 if v else counts[0]
    else:
        if specs.is_in_place(sendbuf):
            raise ValueError("sendbuf is MPI.IN_PLACE on a rank that is not the root; only the root gathers in place")
        send = _take(args, specs.simple(sendbuf, "sendbuf"))
        args.send, args.count = send.array, (-1 if v else send.count)
        if not v:
            args.recvcounts, args.recvdispls = _equal(send.count, p)


def _scatter(args: Args, comm: Comm, sendbuf: Any, recvbuf: Any, root: Any = 0, v: bool = False) -> None:
    p, rank = comm.Get_size(), comm.Get_rank()
    is_root = _root(args, comm, root)
    if is_root:
        send, counts, displs = _layout(sendbuf, "sendbuf", p, v)
        _take(args, send)
        args.send, args.sendcounts, args.senddispls = send.array, counts, displs
        if specs.is_in_place(recvbuf):
            args.recv = block_of(send.array, counts, displs, rank)
            args.in_place = True
        else:
            recv = _take(args, specs.writable(specs.simple(recvbuf, "recvbuf"), "recvbuf"))
            _same_count(counts[rank], recv.count, args.collective, " on the root")
            args.recv = recv.array
        args.count = -1 if v else counts[0]
    else:
        if specs.is_in_place(recvbuf):
            raise ValueError("recvbuf is MPI.IN_PLACE on a rank that is not the root; only the root scatters in place")
        recv = _take(args, specs.writable(specs.simple(recvbuf, "recvbuf"), "recvbuf"))
        args.recv, args.count = recv.array, (-1 if v else recv.count)
        if not v:
            args.sendcounts, args.senddispls = _equal(recv.count, p)


def _allgather(args: Args, comm: Comm, sendbuf: Any, recvbuf: Any, v: bool = False) -> None:
    p, rank = comm.Get_size(), comm.Get_rank()
    recv, counts, displs = _layout(recvbuf, "recvbuf", p, v, receive=True)
    _take(args, specs.writable(recv, "recvbuf"))
    args.recv, args.recvcounts, args.recvdispls = recv.array, counts, displs
    if specs.is_in_place(sendbuf):
        args.send, args.in_place = block_of(recv.array, counts, displs, rank), True
    else:
        send = _take(args, specs.simple(sendbuf, "sendbuf"))
        _same_count(send.count, counts[rank], args.collective)
        args.send = send.array
    args.count = -1 if v else counts[0]


def _alltoall(args: Args, comm: Comm, sendbuf: Any, recvbuf: Any, v: bool = False) -> None:
    p = comm.Get_size()
    recv, rcounts, rdispls = _layout(recvbuf, "recvbuf", p, v, receive=True)
    _take(args, specs.writable(recv, "recvbuf"))
    args.recv, args.recvcounts, args.recvdispls = recv.array, rcounts, rdispls
    if specs.is_in_place(sendbuf):
        args.send, args.sendcounts, args.senddispls, args.in_place = recv.array, rcounts, rdispls, True
    else:
        send, scounts, sdispls = _layout(sendbuf, "sendbuf", p, v)
        _take(args, send)
        if not v:
            _same_count(scounts[0], rcounts[0], args.collective, " (per rank)")
        args.send, args.sendcounts, args.senddispls = send.array, scounts, sdispls
    args.count = -1 if v else rcounts[0]


def _reduce_scatter_block(args: Args, comm: Comm, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM) -> None:
    p = comm.Get_size()
    args.op = _op(op)
    if specs.is_in_place(sendbuf):
        whole, block = specs.block(recvbuf, "recvbuf", p)
        _take(args, specs.writable(whole, "recvbuf"))
        args.send, args.recv, args.in_place = whole.array, whole.array[:block], True
    else:
        recv = _take(args, specs.writable(specs.simple(recvbuf, "recvbuf"), "recvbuf"))
        block = recv.count
        send = _take(args, specs.simple(sendbuf, "sendbuf"))
        if send.count != block * p:
            raise ValueError(f"reduce_scatter_block: sendbuf has {send.count} elements; it needs p × receive count "
                             f"= {p} × {block} = {block * p}")
        args.send, args.recv = send.array, recv.array
    args.count = block
    args.recvcounts = (block,) * p


def _reduce_scatter(args: Args, comm: Comm, sendbuf: Any, recvbuf: Any, recvcounts: Any = None,
                    op: Any = MPI.SUM) -> None:
    p, rank = comm.Get_size(), comm.Get_rank()
    args.op = _op(op)
    if recvcounts is None:
        raise ValueError("reduce_scatter in place needs recvcounts (the receive buffer holds the whole input)")
    counts = tuple(specs._count(c, "recvcounts") for c in recvcounts)
    if len(counts) != p:
        raise ValueError(f"recvcounts has {len(counts)} entries for {p} ranks; give one per rank")
    args.recvcounts = counts
    if specs.is_in_place(sendbuf):
        whole = _take(args, specs.writable(specs.simple(recvbuf, "recvbuf"), "recvbuf"))
        if whole.count < sum(counts):
            raise ValueError(f"reduce_scatter in place: recvbuf has {whole.count} elements, fewer than "
                             f"sum(recvcounts) = {sum(counts)}")
        args.send, args.recv, args.in_place = whole.array[: sum(counts)], whole.array[: counts[rank]], True
    else:
        recv = _take(args, specs.writable(specs.simple(recvbuf, "recvbuf"), "recvbuf"))
        _same_count(counts[rank], recv.count, "reduce_scatter (recvcounts[rank] vs recvbuf)")
        send = _take(args, specs.simple(sendbuf, "sendbuf"))
        if send.count != sum(counts):
            raise ValueError(f"reduce_scatter: sendbuf has {send.count} elements but sum(recvcounts) = {sum(counts)}")
        args.send, args.recv = send.array, recv.array


def _scan(args: Args, comm: Comm, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM) -> None:
    _reduction(args, sendbuf, recvbuf, op)


def _alltoallw(args: Args, comm: Comm, sendbuf: Any, recvbuf: Any) -> None:
    """Alltoallw: a datatype per block, read as bytes (:func:`mpicomm.transport.specs.wvector`)."""
    p = comm.Get_size()
    recv = specs.wvector(recvbuf, "recvbuf", p)
    specs.check_disjoint(recv.counts, recv.displs, "recvbuf")
    _take(args, specs.writable(recv, "recvbuf"))
    args.recv, args.recvcounts, args.recvdispls = recv.array, recv.counts, recv.displs
    if specs.is_in_place(sendbuf):
        args.send, args.sendcounts, args.senddispls, args.in_place = recv.array, recv.counts, recv.displs, True
    else:
        sent = _take(args, specs.wvector(sendbuf, "sendbuf", p))
        args.send, args.sendcounts, args.senddispls = sent.array, sent.counts, sent.displs


def edges(comm: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A topology communicator's (sources, destinations) in MPI's order, read once per communicator object."""
    known = getattr(comm, "_edges", None)
    if known is None:
        known = tuple(comm.inedges), tuple(comm.outedges)
        try:
            comm._edges = known
        except AttributeError:  # (an object that takes no attributes: read each time)
            pass
    return known


def _neighbor(args: Args, comm: Comm, sendbuf: Any, recvbuf: Any, gather: bool, v: bool, w: bool = False) -> None:
    """A neighbourhood collective: *gather* - the same block to every destination (``Neighbor_allgather(v)``),
    else one block per destination (``Neighbor_alltoall(v/w)``); *v*: per-neighbour counts and displacements;
    *w*: and a datatype per neighbour (read as bytes)."""
    sources, destinations = edges(comm)
    args.sources, args.destinations = sources, destinations
    args.cartesian = comm.Get_topology() == MPI.CART
    indegree, outdegree = len(sources), len(destinations)
    if specs.is_in_place(sendbuf) or specs.is_in_place(recvbuf):
        raise ValueError(f"{args.collective} has no in-place form (MPI defines none): give a send and a receive "
                         f"buffer")
    recv: specs.Buffer
    if w:  # a datatype per block: bytes
        received = specs.wvector(recvbuf, "recvbuf", indegree)
        recv, rcounts, rdispls = received, received.counts, received.displs
        specs.check_disjoint(rcounts, rdispls, "recvbuf")
    else:
        recv, rcounts, rdispls = _layout(recvbuf, "recvbuf", indegree, v, receive=True)
    _take(args, specs.writable(recv, "recvbuf"))
    args.recv, args.recvcounts, args.recvdispls = recv.array, rcounts, rdispls
    if w:
        sent = _take(args, specs.wvector(sendbuf, "sendbuf", outdegree))
        args.send, args.sendcounts, args.senddispls = sent.array, sent.counts, sent.displs
    elif gather:
        send = _take(args, specs.simple(sendbuf, "sendbuf"))
        args.send = send.array
        args.sendcounts, args.senddispls = (send.count,) * outdegree, (0,) * outdegree
    else:
        send, scounts, sdispls = _layout(sendbuf, "sendbuf", outdegree, v)
        _take(args, send)
        args.send, args.sendcounts, args.senddispls = send.array, scounts, sdispls


_READERS: dict[str, Callable[..., None]] = {
    "bcast": _bcast,
    "reduce": _reduce,
    "allreduce": _allreduce,
    "gather": _gather,
    "gatherv": lambda a, c, s, r, root=0: _gather(a, c, s, r, root, v=True),
    "scatter": _scatter,
    "scatterv": lambda a, c, s, r, root=0: _scatter(a, c, s, r, root, v=True),
    "allgather": _allgather,
    "allgatherv": lambda a, c, s, r: _allgather(a, c, s, r, v=True),
    "alltoall": _alltoall,
    "alltoallv": lambda a, c, s, r: _alltoall(a, c, s, r, v=True),
    "alltoallw": _alltoallw,
    "reduce_scatter_block": _reduce_scatter_block,
    "reduce_scatter": _reduce_scatter,
    "scan": _scan,
    "exscan": _scan,
    "neighbor_allgather": lambda a, c, s, r: _neighbor(a, c, s, r, gather=True, v=False),
    "neighbor_allgatherv": lambda a, c, s, r: _neighbor(a, c, s, r, gather=True, v=True),
    "neighbor_alltoall": lambda a, c, s, r: _neighbor(a, c, s, r, gather=False, v=False),
    "neighbor_alltoallv": lambda a, c, s, r: _neighbor(a, c, s, r, gather=False, v=True),
    "neighbor_alltoallw": lambda a, c, s, r: _neighbor(a, c, s, r, gather=False, v=True, w=True),
}
