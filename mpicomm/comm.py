"""``mpicomm.Comm``: an mpi4py ``Intracomm`` that also knows its topology, and speaks push/pull.

``Comm(mpi_comm)`` wraps the *same* MPI communicator (no copy): every mpi4py
method keeps working and talks to the same peers. What mpicomm adds is built
once per MPI communicator, collectively, and cached on it as an MPI attribute,
so wrapping the same communicator twice costs nothing and both wrappers share
one state:

* topology - ``local_rank``, ``local_size``, ``node``, ``nodes``, ``host``, and
  the node-local and node-leader sub-communicators, derived from
  ``Split_type(COMM_TYPE_SHARED)``;
* a private duplicate for collectives (``library_comm``) and a typed-message
  :class:`~mpicomm.p2p.Channel`, so library traffic never matches user messages;
* per-communicator algorithm defaults and the collective sequence number;
* the fitted cost model of the machine for this rank layout (``machine``,
  loaded by rank 0 and broadcast), which ``algorithm="auto"`` consults.

Constructing a ``Comm`` is therefore collective over ``mpi_comm`` the first time.
All topology values are computed then, never lazily, so reading
``comm.local_rank`` on one rank only cannot hang.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, overload

import numpy as np
from mpi4py import MPI

from . import device as _device
from . import p2p, registry
from .engine.requests import Request, run
from .front import dispatch, persistent, readers
from .plan.args import Args
from .state import Freed, State, job_local_rank, state_of
from .transport import specs
from .transport.buffers import adopt, array_module

if TYPE_CHECKING:
    from .rendezvous import Rendezvous
    from .rma import Window

__all__ = ["Comm"]


_read, _start = readers.read, dispatch.start


class Comm(MPI.Intracomm):
    """An ``MPI.Intracomm`` with topology, typed push, one-sided and rendezvous pull, and algorithm choice.

    ``Comm()`` wraps ``MPI.COMM_WORLD``; ``Comm(sub)`` wraps any intracommunicator.
    Collective over the communicator the first time it is wrapped.

    Unlike mpi4py's, its nonblocking collectives return an ``mpicomm.Request`` and its ``*_init`` forms an
    ``mpicomm.Prequest`` (mpi4py's request interface, not ``MPI.Request`` subclasses), and ``Idup`` returns
    a plain ``MPI.Intracomm``.
    """

    def __new__(cls, mpi_comm: MPI.Intracomm | None = None) -> Comm:
        base = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
        if isinstance(base, MPI.Comm) and base == MPI.COMM_NULL:
            raise ValueError("mpi_comm is MPI.COMM_NULL; this rank is not in that communicator")
        if not isinstance(base, MPI.Intracomm):
            raise TypeError(
                f"mpi_comm must be an mpi4py Intracomm (e.g. MPI.COMM_WORLD), got {type(base).__qualname__}"
            )
        return super().__new__(cls, base)

    def __init__(self, mpi_comm: MPI.Intracomm | None = None):
        self._state: State | Freed = state_of(self)  # a Freed once freed: every read of it raises FreedError

    # ------------------------------------------------------------ topology

    @property
    def world_size(self) -> int:
        """Ranks in this communicator (``Get_size()``): the "world" of whoever works on it."""
        return self.Get_size()

    @property
    def local_rank(self) -> int:
        """This rank's index among the ranks of its node (0 … local_size−1).

        The launcher's local rank when the communicator is the whole job (so it
        agrees with what a program read before MPI started), else rank order.
        """
        return self._state.local_rank

    @property
    def local_size(self) -> int:
        """Ranks of this communicator on this node."""
        return self._state.local_size

    @property
    def node(self) -> int:
        """This node's index (0 … nodes−1), nodes numbered by their lowest rank."""
        return self._state.node

    @property
    def nodes(self) -> int:
        """Nodes this communicator spans."""
        return self._state.nodes

    @property
    def ppn(self) -> int:
        """The most ranks of this communicator on any one node (the same on every rank; selection uses it)."""
        return self._state.ppn

    @property
    def machine(self) -> Any:
        """The fitted cost model of the machine (a ``mpicomm.model.Machine``), or None when none was fitted."""
        return self._state.machine

    @property
    def host(self) -> str:
        """This process's host name (``MPI_Get_processor_name``)."""
        return self._state.host

    @property
    def is_leader(self) -> bool:
        """True on each node's lowest rank (local_rank 0)."""
        return self._state.local_rank == 0

    @property
    def node_comm(self) -> MPI.Intracomm:
        """The ranks of this node (``Split_type(COMM_TYPE_SHARED)``), ordered by rank."""
        return self._state.node_comm

    @property
    def leader_comm(self) -> MPI.Intracomm | None:
        """One rank per node (the leaders), ordered by node; None on non-leaders."""
        return self._state.leader_comm

    @property
    def library_comm(self) -> MPI.Intracomm:
        """mpicomm's private duplicate for collectives; user messages never match it."""
        return self._state.library_comm

    @property
    def device(self) -> int | None:
        """The GPU this process uses: its node-local rank in the job % visible GPUs (``MPICOMM_DEVICE``
        overrides); None without GPUs. A property of the process, the same whichever communicator asks."""
        return _device.device_for(self._process_local_rank(), _device.visible_devices())

    def bind_device(self, device: int | None = None) -> int | None:
        """Make :attr:`device` (or *device*) CuPy's current device; return the ordinal."""
        return _device.bind(self._process_local_rank(), device)

    def _process_local_rank(self) -> int:
        job_local = job_local_rank()
        return self._state.local_rank if job_local is None else job_local  # no launcher information: ours

    def collective_tag(self) -> int:
        """A fresh tag for a program's own messages on :attr:`library_comm` (each call gives the next one).

        The tags come from a range mpicomm's collectives never use, so messages
        sent with them never match a collective's; calling it changes nothing
        about the collectives (a rank may call it any number of times). Ranks
        that call it the same number of times get the same tags.
        """
        return self._state.user_tag()

    # ------------------------------------------------------------ push: typed point-to-point

    def _limits(self) -> tuple[int, int]:
        """(size, tag upper bound), to check a push's peer and tag; :class:`FreedError` once freed."""
        s = self._state
        if s.freed:
            s.check_live()
        return s.size, s.tag_ub

    def isend_array(self, x: Any, dest: int, tag: int = 0) -> Request:
        """Start sending array *x* to rank *dest*; the request completes when *x* may be reused."""
        x = adopt(x, "x")
        p2p.check_send(x, dest, tag, *self._limits())
        return Request(p2p.send_steps(self._state.channel, x, dest, tag), "isend_array")

    def send_array(self, x: Any, dest: int, tag: int = 0) -> None:
        """Send array *x* (NumPy or CuPy, C-contiguous) to rank *dest*; the receiver learns dtype and shape.

        *x* may be anything a buffer spec may be (a DLPack or ``__cuda_array_interface__`` exporter, a
        ``bytearray``...): it is read where it lies.
        """
        x = adopt(x, "x")
        p2p.check_send(x, dest, tag, *self._limits())
        if not p2p.send_now(self._state.channel, x, dest, tag):
            run(p2p.send_steps(self._state.channel, x, dest, tag))

    def irecv_array(
        self, buf: Any = None, source: int = MPI.ANY_SOURCE, tag: int = MPI.ANY_TAG, *, xp: ModuleType = np
    ) -> Request:
        """Start receiving an array; ``request.wait()`` returns it (see :meth:`recv_array`)."""
        buf = None if buf is None else adopt(buf, "buf")
        p2p.check_recv(buf, source, tag, *self._limits(), xp)
        return Request(p2p.recv_steps(self._state.channel, buf, source, tag, xp, "irecv_array"), "irecv_array")

    def recv_array(
        self,
        buf: Any = None,
        source: int = MPI.ANY_SOURCE,
        tag: int = MPI.ANY_TAG,
        *,
        status: MPI.Status | None = None,
        xp: ModuleType = np,
    ) -> Any:
        """Receive an array sent with :meth:`send_array` and return it.

        With *buf*, the message must match its dtype and element count (else
        ValueError on this rank; the sender is not left waiting); without, a new
        array of the sender's dtype and shape is allocated with module *xp*
        (NumPy by default; pass ``xp=cupy`` for device memory). *status* gets
        the source, tag and element count. *buf* may be any object a buffer
        spec may be; the data lands in its memory.
        """
        buf = None if buf is None else adopt(buf, "buf")
        p2p.check_recv(buf, source, tag, *self._limits(), xp)
        done, received = p2p.recv_now(self._state.channel, buf, source, tag, xp, status)
        if done:
            return received
        return run(p2p.recv_steps(self._state.channel, buf, source, tag, xp), status)

    def sendrecv_array(
        self,
        x: Any,
        dest: int,
        source: int = MPI.ANY_SOURCE,
        buf: Any = None,
        sendtag: int = 0,
        recvtag: int = MPI.ANY_TAG,
        *,
        status: MPI.Status | None = None,
        xp: ModuleType | None = None,
    ) -> Any:
        """Send *x* to *dest* and receive from *source* at once (no deadlock in rings); return the received array.

        Without *buf* the received array uses *x*'s array module unless *xp* says otherwise.
        """
        size, tag_ub = self._limits()
        x = adopt(x, "x")
        buf = None if buf is None else adopt(buf, "buf")
        p2p.check_send(x, dest, sendtag, size, tag_ub)
        module = xp if xp is not None else array_module(x)
        p2p.check_recv(buf, source, recvtag, size, tag_ub, module)
        channel = self._state.channel
        receive = Request(p2p.recv_steps(channel, buf, source, recvtag, module, "sendrecv_array"), "sendrecv_array")
        send = Request(p2p.send_steps(channel, x, dest, sendtag), "sendrecv_array")
        Request.Waitall([receive, send])
        return receive.wait(status)

    # ------------------------------------------------------------ pull

    def expose(self, buf: Any) -> Window:
        """Expose array *buf* in an RMA window that other ranks ``get`` from and ``put`` to (collective).

        Returns a :class:`mpicomm.Window`; free it with ``win.Free()`` or a ``with`` block.
        """
        from .rma import Window

        return Window(self, buf)

    def rendezvous(self) -> Rendezvous:
        """A :class:`mpicomm.Rendezvous` over this communicator: owners publish, pullers ask (collective)."""
        from .rendezvous import Rendezvous

        return Rendezvous(self)

    # ------------------------------------------------------------ barrier and algorithm choice

    def set_algorithm(self, collective: str, name: str | None) -> None:
        """This communicator's default algorithm for *collective* (None or ``"auto"`` clears it)."""
        self._state.fast.clear()  # calls remembered with the old default
        if name is None or name == "auto":
            self._state.defaults.pop(collective, None)
            return
        registry.lookup(collective, name)  # raises, listing the names, if unknown
        self._state.defaults[collective] = name

    def get_algorithm(self, collective: str) -> str | None:
        """This communicator's default algorithm for *collective*, or None."""
        return self._state.defaults.get(collective)

    # ------------------------------------------------------------ collectives (mpi4py's signatures + algorithm=)
    #
    # Each reads mpi4py's buffer specs and runs the selected algorithm (the op
    # always travels as a keyword, so the library path can convert it); specs
    # mpicomm does not run itself (derived datatypes, MPI.BOTTOM) go to the MPI
    # library's own collective. The I-forms return an mpicomm.Request.

    @overload
    def _collective(self, collective: str, blocking: Literal[False], algorithm: str | None, *args: Any,
                    _fast: None = None, **kwargs: Any) -> Request: ...

    @overload
    def _collective(self, collective: str, blocking: bool, algorithm: str | None, *args: Any,
                    _fast: tuple[tuple[Any, ...], tuple[Any, ...]] | None = None, **kwargs: Any) -> Any: ...

    def _collective(self, collective: str, blocking: bool, algorithm: str | None, *args: Any,
                    _fast: tuple[tuple[Any, ...], tuple[Any, ...]] | None = None, **kwargs: Any) -> Any:
        return _start(self._state, _read(collective, self, *args, **kwargs), algorithm, blocking, _fast)

    # A blocking call repeated on the same arrays runs its kept plan at once (dispatch.Fast): the key is the
    # collective and the arguments' identities; anything else (a new array, a changed setting) takes the full
    # path, which reads and checks the arguments, and remembers the call for next time.

    def Barrier(self, *, algorithm: str | None = None) -> None:
        """Block until every rank has called it. ``algorithm``: ``"native"``, ``"dissemination"`` or ``"auto"``."""
        _start(self._state, Args("barrier"), algorithm, True)

    def Ibarrier(self, *, algorithm: str | None = None) -> Request:
        """Nonblocking barrier; the request completes once every rank has called it."""
        return _start(self._state, Args("barrier"), algorithm, False)

    def Bcast(self, buf: Any, root: int = 0, *, algorithm: str | None = None) -> None:
        """Broadcast *buf* from *root* to every rank."""
        key = ("bcast", id(buf), root, algorithm)
        fast = self._state.fast.get(key)
        if fast is None or not fast.run(buf):
            self._collective("bcast", True, algorithm, buf, root, _fast=(key, (buf,)))

    def Ibcast(self, buf: Any, root: int = 0, *, algorithm: str | None = None) -> Request:
        """Nonblocking :meth:`Bcast`."""
        return self._collective("bcast", False, algorithm, buf, root)

    def Reduce(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, root: int = 0, *,
               algorithm: str | None = None) -> None:
        """Reduce every rank's *sendbuf* with *op* into *recvbuf* on *root* (``MPI.IN_PLACE`` on the root)."""
        key = ("reduce", id(sendbuf), id(recvbuf), id(op), root, algorithm)
        fast = self._state.fast.get(key)
        if fast is None or not fast.run(sendbuf, recvbuf, op):
            self._collective("reduce", True, algorithm, sendbuf, recvbuf, op=op, root=root,
                             _fast=(key, (sendbuf, recvbuf, op)))

    def Ireduce(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, root: int = 0, *,
                algorithm: str | None = None) -> Request:
        """Nonblocking :meth:`Reduce`."""
        return self._collective("reduce", False, algorithm, sendbuf, recvbuf, op=op, root=root)

    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, *, algorithm: str | None = None) -> None:
        """Reduce every rank's *sendbuf* with *op* into every rank's *recvbuf* (``MPI.IN_PLACE``: recvbuf holds the input)."""
        key = ("allreduce", id(sendbuf), id(recvbuf), id(op), algorithm)
        fast = self._state.fast.get(key)
        if fast is None or not fast.run(sendbuf, recvbuf, op):
            self._collective("allreduce", True, algorithm, sendbuf, recvbuf, op=op, _fast=(key, (sendbuf, recvbuf, op)))

    def Iallreduce(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, *, algorithm: str | None = None) -> Request:
        """Nonblocking :meth:`Allreduce`."""
        return self._collective("allreduce", False, algorithm, sendbuf, recvbuf, op=op)

    def Gather(self, sendbuf: Any, recvbuf: Any, root: int = 0, *, algorithm: str | None = None) -> None:
        """Gather equal blocks from every rank into *recvbuf* on *root*, in rank order."""
        key = ("gather", id(sendbuf), id(recvbuf), root, algorithm)
        fast = self._state.fast.get(key)
        if fast is None or not fast.run(sendbuf, recvbuf):
            self._collective("gather", True, algorithm, sendbuf, recvbuf, root, _fast=(key, (sendbuf, recvbuf)))

    def Igather(self, sendbuf: Any, recvbuf: Any, root: int = 0, *, algorithm: str | None = None) -> Request:
        """Nonblocking :meth:`Gather`."""
        return self._collective("gather", False, algorithm, sendbuf, recvbuf, root)

    def Gatherv(self, sendbuf: Any, recvbuf: Any, root: int = 0, *, algorithm: str | None = None) -> None:
        """Gather blocks of per-rank counts into *recvbuf* ``[buf, counts, displs, datatype]`` on *root*."""
        self._collective("gatherv", True, algorithm, sendbuf, recvbuf, root)

    def Igatherv(self, sendbuf: Any, recvbuf: Any, root: int = 0, *, algorithm: str | None = None) -> Request:
        """Nonblocking :meth:`Gatherv`."""
        return self._collective("gatherv", False, algorithm, sendbuf, recvbuf, root)

    def Scatter(self, sendbuf: Any, recvbuf: Any, root: int = 0, *, algorithm: str | None = None) -> None:
        """Send block r of *sendbuf* on *root* to rank r's *recvbuf*."""
        key = ("scatter", id(sendbuf), id(recvbuf), root, algorithm)
        fast = self._state.fast.get(key)
        if fast is None or not fast.run(sendbuf, recvbuf):
            self._collective("scatter", True, algorithm, sendbuf, recvbuf, root, _fast=(key, (sendbuf, recvbuf)))

    def Iscatter(self, sendbuf: Any, recvbuf: Any, root: int = 0, *, algorithm: str | None = None) -> Request:
        """Nonblocking :meth:`Scatter`."""
        return self._collective("scatter", False, algorithm, sendbuf, recvbuf, root)

    def Scatterv(self, sendbuf: Any, recvbuf: Any, root: int = 0, *, algorithm: str | None = None) -> None:
        """Scatter blocks of per-rank counts from *sendbuf* ``[buf, counts, displs, datatype]`` on *root*."""
        self._collective("scatterv", True, algorithm, sendbuf, recvbuf, root)

    def Iscatterv(self, sendbuf: Any, recvbuf: Any, root: int = 0, *, algorithm: str | None = None) -> Request:
        """Nonblocking :meth:`Scatterv`."""
        return self._collective("scatterv", False, algorithm, sendbuf, recvbuf, root)

    def Allgather(self, sendbuf: Any, recvbuf: Any, *, algorithm: str | None = None) -> None:
        """Gather every rank's equal block into every rank's *recvbuf*, in rank order."""
        key = ("allgather", id(sendbuf), id(recvbuf), algorithm)
        fast = self._state.fast.get(key)
        if fast is None or not fast.run(sendbuf, recvbuf):
            self._collective("allgather", True, algorithm, sendbuf, recvbuf, _fast=(key, (sendbuf, recvbuf)))

    def Iallgather(self, sendbuf: Any, recvbuf: Any, *, algorithm: str | None = None) -> Request:
        """Nonblocking :meth:`Allgather`."""
        return self._collective("allgather", False, algorithm, sendbuf, recvbuf)

    def Allgatherv(self, sendbuf: Any, recvbuf: Any, *, algorithm: str | None = None) -> None:
        """Gather blocks of per-rank counts into every rank's *recvbuf* ``[buf, counts, displs, datatype]``."""
        self._collective("allgatherv", True, algorithm, sendbuf, recvbuf)

    def Iallgatherv(self, sendbuf: Any, recvbuf: Any, *, algorithm: str | None = None) -> Request:
        """Nonblocking :meth:`Allgatherv`."""
        return self._collective("allgatherv", False, algorithm, sendbuf, recvbuf)

    def Alltoall(self, sendbuf: Any, recvbuf: Any, *, algorithm: str | None = None) -> None:
        """Send block j of *sendbuf* to rank j; receive block i of *recvbuf* from rank i."""
        key = ("alltoall", id(sendbuf), id(recvbuf), algorithm)
        fast = self._state.fast.get(key)
        if fast is None or not fast.run(sendbuf, recvbuf):
            self._collective("alltoall", True, algorithm, sendbuf, recvbuf, _fast=(key, (sendbuf, recvbuf)))

    def Ialltoall(self, sendbuf: Any, recvbuf: Any, *, algorithm: str | None = None) -> Request:
        """Nonblocking :meth:`Alltoall`."""
        return self._collective("alltoall", False, algorithm, sendbuf, recvbuf)

    def Alltoallv(self, sendbuf: Any, recvbuf: Any, *, algorithm: str | None = None) -> None:
        """:meth:`Alltoall` with per-rank counts and displacements on both sides."""
        self._collective("alltoallv", True, algorithm, sendbuf, recvbuf)

    def Ialltoallv(self, sendbuf: Any, recvbuf: Any, *, algorithm: str | None = None) -> Request:
        """Nonblocking :meth:`Alltoallv`."""
        return self._collective("alltoallv", False, algorithm, sendbuf, recvbuf)

    def Reduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, *,
                             algorithm: str | None = None) -> None:
        """Reduce p equal blocks with *op*; rank r receives reduced block r."""
        key = ("reduce_scatter_block", id(sendbuf), id(recvbuf), id(op), algorithm)
        fast = self._state.fast.get(key)
        if fast is None or not fast.run(sendbuf, recvbuf, op):
            self._collective("reduce_scatter_block", True, algorithm, sendbuf, recvbuf, op=op,
                             _fast=(key, (sendbuf, recvbuf, op)))

    def Ireduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, *,
                              algorithm: str | None = None) -> Request:
        """Nonblocking :meth:`Reduce_scatter_block`."""
        return self._collective("reduce_scatter_block", False, algorithm, sendbuf, recvbuf, op=op)

    def Reduce_scatter(self, sendbuf: Any, recvbuf: Any, recvcounts: Any = None, op: Any = MPI.SUM, *,
                       algorithm: str | None = None) -> None:
        """Reduce with *op*; rank r receives the recvcounts[r] elements of block r (None: gathered from recvbuf sizes)."""
        recvcounts = self._reduce_scatter_counts(sendbuf, recvbuf, recvcounts)
        self._collective("reduce_scatter", True, algorithm, sendbuf, recvbuf, recvcounts, op=op)

    def Ireduce_scatter(self, sendbuf: Any, recvbuf: Any, recvcounts: Any = None, op: Any = MPI.SUM, *,
                        algorithm: str | None = None) -> Request:
        """Nonblocking :meth:`Reduce_scatter`."""
        recvcounts = self._reduce_scatter_counts(sendbuf, recvbuf, recvcounts)
        return self._collective("reduce_scatter", False, algorithm, sendbuf, recvbuf, recvcounts, op=op)

    def _reduce_scatter_counts(self, sendbuf: Any, recvbuf: Any, recvcounts: Any) -> Any:
        """mpi4py's rule: without recvcounts (and not in place), each rank's receive count is gathered."""
        if recvcounts is not None or sendbuf is None or sendbuf is MPI.IN_PLACE:
            return recvcounts
        try:
            mine = specs.simple(recvbuf, "recvbuf").count
        except Exception:  # the reader reports it, on every rank
            mine = 0
        return self.library_comm.allgather(mine)

    def Scan(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, *, algorithm: str | None = None) -> None:
        """Inclusive prefix reduction: rank r receives x_0 ⊕ … ⊕ x_r."""
        key = ("scan", id(sendbuf), id(recvbuf), id(op), algorithm)
        fast = self._state.fast.get(key)
        if fast is None or not fast.run(sendbuf, recvbuf, op):
            self._collective("scan", True, algorithm, sendbuf, recvbuf, op=op, _fast=(key, (sendbuf, recvbuf, op)))

    def Iscan(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, *, algorithm: str | None = None) -> Request:
        """Nonblocking :meth:`Scan`."""
        return self._collective("scan", False, algorithm, sendbuf, recvbuf, op=op)

    def Exscan(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, *, algorithm: str | None = None) -> None:
        """Exclusive prefix reduction: rank r > 0 receives x_0 ⊕ … ⊕ x_{r−1}; rank 0's recvbuf is left as it was."""
        key = ("exscan", id(sendbuf), id(recvbuf), id(op), algorithm)
        fast = self._state.fast.get(key)
        if fast is None or not fast.run(sendbuf, recvbuf, op):
            self._collective("exscan", True, algorithm, sendbuf, recvbuf, op=op, _fast=(key, (sendbuf, recvbuf, op)))

    def Iexscan(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, *, algorithm: str | None = None) -> Request:
        """Nonblocking :meth:`Exscan`."""
        return self._collective("exscan", False, algorithm, sendbuf, recvbuf, op=op)

    # ------------------------------------------------------------ persistent collectives (MPI-4, mpi4py's signatures)
    #
    # Each returns an mpicomm.Prequest bound to the buffers (see mpicomm.coll.persistent): the
    # arguments are read and agreed and the algorithm chosen now (collective); Start() runs it.

    def _persistent(self, collective: str, algorithm: str | None, info: Any, *args: Any,
                    **kwargs: Any) -> persistent.Prequest:
        read = Args("barrier") if collective == "barrier" else _read(collective, self, *args, **kwargs)
        return persistent.create(self._state, read, algorithm)  # (info: no hint is used)

    def Barrier_init(self, info: MPI.Info | None = None, *, algorithm: str | None = None) -> persistent.Prequest:
        """Persistent :meth:`Barrier`."""
        return self._persistent("barrier", algorithm, info)

    def Bcast_init(self, buf: Any, root: int = 0, info: MPI.Info | None = None, *,
                   algorithm: str | None = None) -> persistent.Prequest:
        """Persistent :meth:`Bcast`: ``req.Start()`` broadcasts what *buf* holds on the root then."""
        return self._persistent("bcast", algorithm, info, buf, root)

    def Reduce_init(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, root: int = 0,
                    info: MPI.Info | None = None, *, algorithm: str | None = None) -> persistent.Prequest:
        """Persistent :meth:`Reduce`."""
        return self._persistent("reduce", algorithm, info, sendbuf, recvbuf, op=op, root=root)

    def Allreduce_init(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, info: MPI.Info | None = None, *,
                       algorithm: str | None = None) -> persistent.Prequest:
        """Persistent :meth:`Allreduce`: plan once, ``Start()``/``Wait()`` many times."""
        return self._persistent("allreduce", algorithm, info, sendbuf, recvbuf, op=op)

    def Gather_init(self, sendbuf: Any, recvbuf: Any, root: int = 0, info: MPI.Info | None = None, *,
                    algorithm: str | None = None) -> persistent.Prequest:
        """Persistent :meth:`Gather`."""
        return self._persistent("gather", algorithm, info, sendbuf, recvbuf, root)

    def Gatherv_init(self, sendbuf: Any, recvbuf: Any, root: int = 0, info: MPI.Info | None = None, *,
                     algorithm: str | None = None) -> persistent.Prequest:
        """Persistent :meth:`Gatherv`."""
        return self._persistent("gatherv", algorithm, info, sendbuf, recvbuf, root)

    def Scatter_init(self, sendbuf: Any, recvbuf: Any, root: int = 0, info: MPI.Info | None = None, *,
                     algorithm: str | None = None) -> persistent.Prequest:
        """Persistent :meth:`Scatter`."""
        return self._persistent("scatter", algorithm, info, sendbuf, recvbuf, root)

    def Scatterv_init(self, sendbuf: Any, recvbuf: Any, root: int = 0, info: MPI.Info | None = None, *,
                      algorithm: str | None = None) -> persistent.Prequest:
        """Persistent :meth:`Scatterv`."""
        return self._persistent("scatterv", algorithm, info, sendbuf, recvbuf, root)

    def Allgather_init(self, sendbuf: Any, recvbuf: Any, info: MPI.Info | None = None, *,
                       algorithm: str | None = None) -> persistent.Prequest:
        """Persistent :meth:`Allgather`."""
        return self._persistent("allgather", algorithm, info, sendbuf, recvbuf)

    def Allgatherv_init(self, sendbuf: Any, recvbuf: Any, info: MPI.Info | None = None, *,
                        algorithm: str | None = None) -> persistent.Prequest:
        """Persistent :meth:`Allgatherv`."""
        return self._persistent("allgatherv", algorithm, info, sendbuf, recvbuf)

    def Alltoall_init(self, sendbuf: Any, recvbuf: Any, info: MPI.Info | None = None, *,
                      algorithm: str | None = None) -> persistent.Prequest:
        """Persistent :meth:`Alltoall`."""
        return self._persistent("alltoall", algorithm, info, sendbuf, recvbuf)

    def Alltoallv_init(self, sendbuf: Any, recvbuf: Any, info: MPI.Info | None = None, *,
                       algorithm: str | None = None) -> persistent.Prequest:
        """Persistent :meth:`Alltoallv`."""
        return self._persistent("alltoallv", algorithm, info, sendbuf, recvbuf)

    def Reduce_scatter_block_init(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM,
                                  info: MPI.Info | None = None, *,
                                  algorithm: str | None = None) -> persistent.Prequest:
        """Persistent :meth:`Reduce_scatter_block`."""
        return self._persistent("reduce_scatter_block", algorithm, info, sendbuf, recvbuf, op=op)

    def Reduce_scatter_init(self, sendbuf: Any, recvbuf: Any, recvcounts: Any = None, op: Any = MPI.SUM,
                            info: MPI.Info | None = None, *,
                            algorithm: str | None = None) -> persistent.Prequest:
        """Persistent :meth:`Reduce_scatter`."""
        recvcounts = self._reduce_scatter_counts(sendbuf, recvbuf, recvcounts)
        return self._persistent("reduce_scatter", algorithm, info, sendbuf, recvbuf, recvcounts, op=op)

    def Scan_init(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, info: MPI.Info | None = None, *,
                  algorithm: str | None = None) -> persistent.Prequest:
        """Persistent :meth:`Scan`."""
        return self._persistent("scan", algorithm, info, sendbuf, recvbuf, op=op)

    def Exscan_init(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, info: MPI.Info | None = None, *,
                    algorithm: str | None = None) -> persistent.Prequest:
        """Persistent :meth:`Exscan`."""
        return self._persistent("exscan", algorithm, info, sendbuf, recvbuf, op=op)

    # ------------------------------------------------------------ communicator constructors

    def Dup(self, info: MPI.Info | None = None) -> Comm:
        """Duplicate (collective); the copy is a ``Comm`` with its own private state."""
        return Comm(MPI.Intracomm.Dup(self, info))

    def Dup_with_info(self, info: MPI.Info) -> Comm:
        """Duplicate with *info* (collective); the copy is a ``Comm``."""
        return Comm(MPI.Intracomm.Dup_with_info(self, info))

    def Clone(self) -> Comm:
        """Same as :meth:`Dup`."""
        return self.Dup()

    def Idup(self, info: MPI.Info | None = None) -> tuple[MPI.Intracomm, MPI.Request]:
        """Nonblocking duplicate: returns a plain ``MPI.Intracomm``; wrap it in ``Comm`` after the request completes."""
        new, request = MPI.Intracomm.Idup(self, info)
        return MPI.Intracomm(new), request

    def Free(self) -> None:
        """Free the communicator (collective, as ``MPI_Comm_free``) and mpicomm's state with it.

        Operations still pending on it complete first (MPI's rule). Afterwards
        every mpicomm use of this ``Comm`` - a collective, a push, ``local_rank``
        - raises :class:`mpicomm.FreedError` naming it.
        """
        what = f"mpicomm.Comm {self.Get_name() or '(unnamed)'} (rank {self.Get_rank()} of {self.Get_size()})"
        MPI.Intracomm.Free(self)
        self._state = Freed(what)

    def __repr__(self) -> str:
        s = self._state
        if type(s) is Freed:
            return "<mpicomm.Comm (freed)>"
        return (
            f"<mpicomm.Comm rank {self.Get_rank()}/{self.Get_size()}, local {s.local_rank}/{s.local_size}, "
            f"node {s.node}/{s.nodes} ({s.host})>"
        )
