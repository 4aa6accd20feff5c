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

Every communicator made from a ``Comm`` is an mpicomm one, of the class of its
MPI topology - :class:`Comm`, :class:`CartComm` (also an ``MPI.Cartcomm``:
``Shift``, ``Get_coords``, ``Sub``...), :class:`GraphComm`, :class:`DistGraphComm`
- with its state built as it is made (``Dup``, ``Dup_with_info``, ``Clone``,
``Split``, ``Split_type``, ``Create``, ``Create_group``, ``Create_cart``,
``Create_graph``, ``Create_dist_graph``, ``Create_dist_graph_adjacent``,
``CartComm.Sub``: collective over the new communicator, as the constructor
is). A rank outside the new communicator gets mpi4py's null result, equal to
``MPI.COMM_NULL``, not wrapped. ``Comm(c)`` of a communicator with a topology
is likewise the class of that topology.

``Idup`` and ``Idup_with_info`` return the new communicator (of the same class)
and a :class:`DupRequest`, an ``MPI.Request`` whose completion - ``Wait``, or
the ``Test`` that returns True - also builds the new communicator's state
there, collective over it (every rank completes its request at the same
point of its program). Before that, any mpicomm use of the new communicator
raises RuntimeError. A request completed where mpicomm cannot see it
(``MPI.Request.Waitall([...])``) leaves the state to the new communicator's
first mpicomm use, which must then be made on every rank (a collective is;
``local_rank`` on one rank alone would wait for the others) - or call
``request.Wait()`` again on every rank: it returns at once and builds it.

Copies and pickles follow mpi4py: only a ``Comm`` over a predefined
communicator (``MPI.COMM_WORLD``, ``MPI.COMM_SELF``) can be copied
(``copy.copy``, ``copy.deepcopy``) or pickled; the result is the same
communicator with the same state. Any other raises ValueError (mpi4py's
"cannot serialize"), saying what to do instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar, cast, overload

import numpy as np
from mpi4py import MPI

from . import device as _device
from . import p2p, registry
from .engine.requests import Request, run
from .front import dispatch, persistent, readers, reproducing
from .plan.args import Args
from .state import Freed, State, job_local_rank, state_of
from .transport import specs
from .transport.buffers import adopt, array_module

if TYPE_CHECKING:
    from .rendezvous import Rendezvous
    from .rma import Window

__all__ = ["Comm", "CartComm", "GraphComm", "DistGraphComm", "DupRequest"]


_read, _start = readers.read, dispatch.start


_C = TypeVar("_C", bound="Comm")
_N = TypeVar("_N", bound=MPI.Intracomm)


class Comm(MPI.Intracomm):
    """An ``MPI.Intracomm`` with topology, typed push, one-sided and rendezvous pull, and algorithm choice.

    ``Comm()`` wraps ``MPI.COMM_WORLD``; ``Comm(sub)`` wraps any intracommunicator (one with a Cartesian, graph
    or distributed-graph topology as a :class:`CartComm`, :class:`GraphComm` or :class:`DistGraphComm`).
    Collective over the communicator the first time it is wrapped. Every communicator made from it is an
    mpicomm one too (see the module docstring).

    Unlike mpi4py's, its nonblocking collectives return an ``mpicomm.Request`` and its ``*_init`` forms an
    ``mpicomm.Prequest`` (mpi4py's request interface, not ``MPI.Request`` subclasses), and ``Idup`` returns
    a :class:`DupRequest` (an ``MPI.Request`` whose completion builds the new communicator's state).
    """

    #: The MPI topology of the class's communicators (``MPI.CART``...); None: any (``Comm`` itself).
    _topology: ClassVar[int | None] = None
    #: The name in ``repr`` and in messages.
    _kind: ClassVar[str] = "Comm"
    #: The communicator's :class:`State`; a :class:`Freed` once freed (every read of it raises FreedError), a
    #: :class:`_Unready` while an ``Idup`` is pending. (An annotation only: no class attribute, so reading it
    #: stays a plain instance-attribute read.)
    _state: State | Freed | _Unready

    def __new__(cls, mpi_comm: MPI.Intracomm | None = None) -> Comm:
        if mpi_comm is None:
            if cls._topology is not None:  # mpi4py's own constructors make an empty object, then set its handle
                return MPI.Intracomm.__new__(cls)
            mpi_comm = MPI.COMM_WORLD
        if isinstance(mpi_comm, MPI.Comm) and mpi_comm == MPI.COMM_NULL:
            raise ValueError("mpi_comm is MPI.COMM_NULL; this rank is not in that communicator")
        if not isinstance(mpi_comm, MPI.Intracomm):
            raise TypeError(
                f"mpi_comm must be an mpi4py Intracomm (e.g. MPI.COMM_WORLD), got {type(mpi_comm).__qualname__}"
            )
        topology = mpi_comm.Get_topology()
        if cls is Comm:
            cls = _BY_TOPOLOGY.get(topology, Comm)
        elif cls._topology is not None and topology != cls._topology:
            raise TypeError(f"{cls._kind} wraps a communicator with a {_TOPOLOGY_NAMES[cls._topology]} topology "
                            f"(comm.{_MADE_BY[cls._topology]}(...)); this one has "
                            f"{_TOPOLOGY_NAMES.get(topology, 'no')} topology (wrap it in mpicomm.Comm)")
        # (MPI.Intracomm's __new__, not super()'s: the topology classes' next base is mpi4py's Cartcomm...,
        # whose __new__ Python refuses for a class whose first base is Comm)
        if mpi_comm is MPI.COMM_WORLD or mpi_comm is MPI.COMM_SELF:
            # As mpi4py's constants, one object per process: Comm() is Comm(MPI.COMM_WORLD), and a copy or an
            # unpickled one is that object. (A constructor given any other object makes a new one, as mpi4py's
            # MPI.Intracomm(MPI.COMM_WORLD) does.)
            key = (cls, mpi_comm.handle)
            made = _PREDEFINED.get(key)
            if made is None:
                made = _PREDEFINED[key] = MPI.Intracomm.__new__(cls, mpi_comm)
            return made
        return MPI.Intracomm.__new__(cls, mpi_comm)

    def __init__(self, mpi_comm: MPI.Intracomm | None = None):
        if mpi_comm is None and self._topology is not None:
            raise TypeError(f"{self._kind}() needs a communicator with a {_TOPOLOGY_NAMES[self._topology]} "
                            f"topology, e.g. {self._kind}(comm.{_MADE_BY[self._topology]}(...))")
        self._state = state_of(self)

    def __reduce__(self) -> tuple[Any, ...]:
        """Copies and pickles, as mpi4py's: a predefined communicator only, the same communicator and state."""
        for predefined in (MPI.COMM_WORLD, MPI.COMM_SELF):
            if self == predefined:
                return _rebuild, (type(self), predefined)
        raise ValueError(
            f"cannot serialize '{type(self).__module__}.{type(self).__qualname__}' instance: as in mpi4py, only a "
            f"communicator over MPI.COMM_WORLD or MPI.COMM_SELF can be copied (copy.copy, copy.deepcopy) or "
            f"pickled. Pass this communicator itself where it is needed (a copy would be the same communicator), "
            f"or make a new one with comm.Dup() (collective)")

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
    def reproducible(self) -> bool:
        """Whether the reducing collectives (Allreduce, Reduce, Reduce_scatter(_block), Scan, Exscan; blocking,
        nonblocking and persistent; the array functions too) with ``SUM`` on float32/64 and complex64/128 give a
        reproducible sum when the call does not say (``reproducible=``): the same bits for every algorithm,
        order and rank count (:mod:`mpicomm.reproducible`). Starts as
        ``MPICOMM_REPRODUCIBLE`` says (default off); set it alike on every rank."""
        return self._state.reproducible

    @reproducible.setter
    def reproducible(self, on: bool) -> None:
        if not isinstance(on, (bool, np.bool_)):
            raise TypeError(f"Comm.reproducible takes True or False, got {on!r}")
        self._state.check_live()  # (a freed communicator raises; one from Idup is built first)
        cast(State, self._state).reproducible = bool(on)

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
                    **kwargs: Any) -> Request: ...

    @overload
    def _collective(self, collective: str, blocking: bool, algorithm: str | None, *args: Any, **kwargs: Any) -> Any: ...

    def _collective(self, collective: str, blocking: bool, algorithm: str | None, *args: Any, **kwargs: Any) -> Any:
        return _start(self._state, _read(collective, self, *args, **kwargs), algorithm, blocking)

    # A blocking call repeated on the same arrays runs its kept plan at once (_repeat: dispatch.Fast); anything else
    # (a new array, a changed setting) takes the full path (_first), which reads and checks the arguments and
    # remembers the call for next time. (Two calls rather than one taking *args and **kwargs: packing those costs
    # a third of the library's whole 8-byte allreduce.)

    def _repeat(self, key: tuple[Any, ...], *objects: Any) -> bool:
        """Run the kept plan of a blocking call seen before (*key*: the collective, then the arguments' identities;
        *objects*: the arguments the kept plan checks); False when there is none, or it no longer fits."""
        fast = self._state.fast.get(key)
        return fast is not None and fast.run(*objects)

    def _first(self, key: tuple[Any, ...], objects: tuple[Any, ...], algorithm: str | None, *args: Any,
               **kwargs: Any) -> None:
        """A blocking call by the full path, remembered under *key* for :meth:`_repeat`."""
        _start(self._state, _read(key[0], self, *args, **kwargs), algorithm, True, (key, objects))

    def _summing(self, reproducible: bool | None) -> bool:
        """Whether a reducing call asking *reproducible* (None: the communicator's setting) sums reproducibly."""
        return bool(reproducible) or (reproducible is None and self._state.reproducible)

    def _reproducible(self, collective: str, algorithm: str | None, *args: Any, **kwargs: Any) -> None:
        """A blocking reducing call as a reproducible sum (:mod:`mpicomm.front.reproducing`)."""
        reproducing.start(self._state, _read(collective, self, *args, **kwargs), algorithm, True)

    def _ireproducible(self, collective: str, algorithm: str | None, *args: Any, **kwargs: Any) -> Request:
        """A nonblocking reducing call as a reproducible sum: its request."""
        request: Request = reproducing.start(self._state, _read(collective, self, *args, **kwargs), algorithm, False)
        return request

    def Barrier(self, *, algorithm: str | None = None) -> None:
        """Block until every rank has called it. ``algorithm``: ``"native"``, ``"dissemination"`` or ``"auto"``."""
        _start(self._state, Args("barrier"), algorithm, True)

    def Ibarrier(self, *, algorithm: str | None = None) -> Request:
        """Nonblocking barrier; the request completes once every rank has called it."""
        return _start(self._state, Args("barrier"), algorithm, False)

    def Bcast(self, buf: Any, root: int = 0, *, algorithm: str | None = None) -> None:
        """Broadcast *buf* from *root* to every rank."""
        key = ("bcast", id(buf), root, algorithm)
        if not self._repeat(key, buf):
            self._first(key, (buf,), algorithm, buf, root)

    def Ibcast(self, buf: Any, root: int = 0, *, algorithm: str | None = None) -> Request:
        """Nonblocking :meth:`Bcast`."""
        return self._collective("bcast", False, algorithm, buf, root)

    def Reduce(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, root: int = 0, *,
               algorithm: str | None = None, reproducible: bool | None = None) -> None:
        """Reduce every rank's *sendbuf* with *op* into *recvbuf* on *root* (``MPI.IN_PLACE`` on the root);
        *reproducible*: see :attr:`reproducible` (None: the communicator's setting)."""
        if self._summing(reproducible):
            return self._reproducible("reduce", algorithm, sendbuf, recvbuf, op=op, root=root)
        key = ("reduce", id(sendbuf), id(recvbuf), id(op), root, algorithm)
        if not self._repeat(key, sendbuf, recvbuf, op):
            self._first(key, (sendbuf, recvbuf, op), algorithm, sendbuf, recvbuf, op=op, root=root)

    def Ireduce(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, root: int = 0, *,
                algorithm: str | None = None, reproducible: bool | None = None) -> Request:
        """Nonblocking :meth:`Reduce`."""
        if self._summing(reproducible):
            return self._ireproducible("reduce", algorithm, sendbuf, recvbuf, op=op, root=root)
        return self._collective("reduce", False, algorithm, sendbuf, recvbuf, op=op, root=root)

    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, *, algorithm: str | None = None,
                  reproducible: bool | None = None) -> None:
        """Reduce every rank's *sendbuf* with *op* into every rank's *recvbuf* (``MPI.IN_PLACE``: recvbuf holds the
        input); *reproducible*: see :attr:`reproducible` (None: the communicator's setting)."""
        if self._summing(reproducible):
            return self._reproducible("allreduce", algorithm, sendbuf, recvbuf, op=op)
        key = ("allreduce", id(sendbuf), id(recvbuf), id(op), algorithm)
        if not self._repeat(key, sendbuf, recvbuf, op):
            self._first(key, (sendbuf, recvbuf, op), algorithm, sendbuf, recvbuf, op=op)

    def Iallreduce(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, *, algorithm: str | None = None,
                   reproducible: bool | None = None) -> Request:
        """Nonblocking :meth:`Allreduce`."""
        if self._summing(reproducible):
            return self._ireproducible("allreduce", algorithm, sendbuf, recvbuf, op=op)
        return self._collective("allreduce", False, algorithm, sendbuf, recvbuf, op=op)

    def Gather(self, sendbuf: Any, recvbuf: Any, root: int = 0, *, algorithm: str | None = None) -> None:
        """Gather equal blocks from every rank into *recvbuf* on *root*, in rank order."""
        key = ("gather", id(sendbuf), id(recvbuf), root, algorithm)
        if not self._repeat(key, sendbuf, recvbuf):
            self._first(key, (sendbuf, recvbuf), algorithm, sendbuf, recvbuf, root)

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
        if not self._repeat(key, sendbuf, recvbuf):
            self._first(key, (sendbuf, recvbuf), algorithm, sendbuf, recvbuf, root)

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
        if not self._repeat(key, sendbuf, recvbuf):
            self._first(key, (sendbuf, recvbuf), algorithm, sendbuf, recvbuf)

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
        if not self._repeat(key, sendbuf, recvbuf):
            self._first(key, (sendbuf, recvbuf), algorithm, sendbuf, recvbuf)

    def Ialltoall(self, sendbuf: Any, recvbuf: Any, *, algorithm: str | None = None) -> Request:
        """Nonblocking :meth:`Alltoall`."""
        return self._collective("alltoall", False, algorithm, sendbuf, recvbuf)

    def Alltoallv(self, sendbuf: Any, recvbuf: Any, *, algorithm: str | None = None) -> None:
        """:meth:`Alltoall` with per-rank counts and displacements on both sides."""
        self._collective("alltoallv", True, algorithm, sendbuf, recvbuf)

    def Ialltoallv(self, sendbuf: Any, recvbuf: Any, *, algorithm: str | None = None) -> Request:
        """Nonblocking :meth:`Alltoallv`."""
        return self._collective("alltoallv", False, algorithm, sendbuf, recvbuf)

    def Alltoallw(self, sendbuf: Any, recvbuf: Any, *, algorithm: str | None = None) -> None:
        """:meth:`Alltoallv` with a datatype per block and displacements in bytes (``[buf, (counts, displs),
        datatypes]``): mpicomm's alltoall algorithms move each block's bytes (contiguous datatypes; a derived
        datatype with gaps, or MPI.BOTTOM, goes to the MPI library's own Alltoallw)."""
        self._collective("alltoallw", True, algorithm, sendbuf, recvbuf)

    def Ialltoallw(self, sendbuf: Any, recvbuf: Any, *, algorithm: str | None = None) -> Request:
        """Nonblocking :meth:`Alltoallw`."""
        return self._collective("alltoallw", False, algorithm, sendbuf, recvbuf)

    def Reduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, *,
                             algorithm: str | None = None, reproducible: bool | None = None) -> None:
        """Reduce p equal blocks with *op*; rank r receives reduced block r. *reproducible*: see
        :attr:`reproducible`."""
        if self._summing(reproducible):
            return self._reproducible("reduce_scatter_block", algorithm, sendbuf, recvbuf, op=op)
        key = ("reduce_scatter_block", id(sendbuf), id(recvbuf), id(op), algorithm)
        if not self._repeat(key, sendbuf, recvbuf, op):
            self._first(key, (sendbuf, recvbuf, op), algorithm, sendbuf, recvbuf, op=op)

    def Ireduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, *,
                              algorithm: str | None = None, reproducible: bool | None = None) -> Request:
        """Nonblocking :meth:`Reduce_scatter_block`."""
        if self._summing(reproducible):
            return self._ireproducible("reduce_scatter_block", algorithm, sendbuf, recvbuf, op=op)
        return self._collective("reduce_scatter_block", False, algorithm, sendbuf, recvbuf, op=op)

    def Reduce_scatter(self, sendbuf: Any, recvbuf: Any, recvcounts: Any = None, op: Any = MPI.SUM, *,
                       algorithm: str | None = None, reproducible: bool | None = None) -> None:
        """Reduce with *op*; rank r receives the recvcounts[r] elements of block r (None: gathered from recvbuf
        sizes). *reproducible*: see :attr:`reproducible`."""
        recvcounts = self._reduce_scatter_counts(sendbuf, recvbuf, recvcounts)
        if self._summing(reproducible):
            return self._reproducible("reduce_scatter", algorithm, sendbuf, recvbuf, recvcounts, op=op)
        self._collective("reduce_scatter", True, algorithm, sendbuf, recvbuf, recvcounts, op=op)

    def Ireduce_scatter(self, sendbuf: Any, recvbuf: Any, recvcounts: Any = None, op: Any = MPI.SUM, *,
                        algorithm: str | None = None, reproducible: bool | None = None) -> Request:
        """Nonblocking :meth:`Reduce_scatter`."""
        recvcounts = self._reduce_scatter_counts(sendbuf, recvbuf, recvcounts)
        if self._summing(reproducible):
            return self._ireproducible("reduce_scatter", algorithm, sendbuf, recvbuf, recvcounts, op=op)
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

    def Scan(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, *, algorithm: str | None = None,
             reproducible: bool | None = None) -> None:
        """Inclusive prefix reduction: rank r receives x_0 ⊕ … ⊕ x_r.
        *reproducible*: see :attr:`reproducible` (every contribution cut on the grid of all ranks' exponents)."""
        if self._summing(reproducible):
            return self._reproducible("scan", algorithm, sendbuf, recvbuf, op=op)
        key = ("scan", id(sendbuf), id(recvbuf), id(op), algorithm)
        if not self._repeat(key, sendbuf, recvbuf, op):
            self._first(key, (sendbuf, recvbuf, op), algorithm, sendbuf, recvbuf, op=op)

    def Iscan(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, *, algorithm: str | None = None,
              reproducible: bool | None = None) -> Request:
        """Nonblocking :meth:`Scan`."""
        if self._summing(reproducible):
            return self._ireproducible("scan", algorithm, sendbuf, recvbuf, op=op)
        return self._collective("scan", False, algorithm, sendbuf, recvbuf, op=op)

    def Exscan(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, *, algorithm: str | None = None,
               reproducible: bool | None = None) -> None:
        """Exclusive prefix reduction: rank r > 0 receives x_0 ⊕ … ⊕ x_{r−1}; rank 0's recvbuf is left as it
        was. *reproducible*: see :attr:`reproducible` (every contribution cut on the grid of all ranks' exponents)."""
        if self._summing(reproducible):
            return self._reproducible("exscan", algorithm, sendbuf, recvbuf, op=op)
        key = ("exscan", id(sendbuf), id(recvbuf), id(op), algorithm)
        if not self._repeat(key, sendbuf, recvbuf, op):
            self._first(key, (sendbuf, recvbuf, op), algorithm, sendbuf, recvbuf, op=op)

    def Iexscan(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, *, algorithm: str | None = None,
              reproducible: bool | None = None) -> Request:
        """Nonblocking :meth:`Exscan`."""
        if self._summing(reproducible):
            return self._ireproducible("exscan", algorithm, sendbuf, recvbuf, op=op)
        return self._collective("exscan", False, algorithm, sendbuf, recvbuf, op=op)

    # ------------------------------------------------------------ persistent collectives (MPI-4, mpi4py's signatures)
    #
    # Each returns an mpicomm.Prequest bound to the buffers (see mpicomm.coll.persistent): the
    # arguments are read and agreed and the algorithm chosen now (collective); Start() runs it.

    def _persistent(self, collective: str, algorithm: str | None, info: Any, *args: Any,
                    reproducible: bool | None = False, **kwargs: Any) -> persistent.Prequest:
        read = Args("barrier") if collective == "barrier" else _read(collective, self, *args, **kwargs)
        if self._summing(reproducible):  # (a reducing collective's; the others pass False)
            return reproducing.create(self._state, read, algorithm)
        return persistent.create(self._state, read, algorithm)  # (info: no hint is used)

    def Barrier_init(self, info: MPI.Info | None = None, *, algorithm: str | None = None) -> persistent.Prequest:
        """Persistent :meth:`Barrier`."""
        return self._persistent("barrier", algorithm, info)

    def Bcast_init(self, buf: Any, root: int = 0, info: MPI.Info | None = None, *,
                   algorithm: str | None = None) -> persistent.Prequest:
        """Persistent :meth:`Bcast`: ``req.Start()`` broadcasts what *buf* holds on the root then."""
        return self._persistent("bcast", algorithm, info, buf, root)

    def Reduce_init(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, root: int = 0,
                    info: MPI.Info | None = None, *, algorithm: str | None = None,
                    reproducible: bool | None = None) -> persistent.Prequest:
        """Persistent :meth:`Reduce`; *reproducible*: see :attr:`reproducible`."""
        return self._persistent("reduce", algorithm, info, sendbuf, recvbuf, op=op, root=root,
                                reproducible=reproducible)

    def Allreduce_init(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, info: MPI.Info | None = None, *,
                       algorithm: str | None = None,
                 reproducible: bool | None = None) -> persistent.Prequest:
        """Persistent :meth:`Allreduce`: plan once, ``Start()``/``Wait()`` many times; *reproducible*: see
        :attr:`reproducible`."""
        return self._persistent("allreduce", algorithm, info, sendbuf, recvbuf, op=op,
                                reproducible=reproducible)

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

    def Alltoallw_init(self, sendbuf: Any, recvbuf: Any, info: MPI.Info | None = None, *,
                       algorithm: str | None = None) -> persistent.Prequest:
        """Persistent :meth:`Alltoallw`."""
        return self._persistent("alltoallw", algorithm, info, sendbuf, recvbuf)

    def Reduce_scatter_block_init(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM,
                                  info: MPI.Info | None = None, *,
                                  algorithm: str | None = None,
                 reproducible: bool | None = None) -> persistent.Prequest:
        """Persistent :meth:`Reduce_scatter_block`; *reproducible*: see :attr:`reproducible`."""
        return self._persistent("reduce_scatter_block", algorithm, info, sendbuf, recvbuf, op=op,
                                reproducible=reproducible)

    def Reduce_scatter_init(self, sendbuf: Any, recvbuf: Any, recvcounts: Any = None, op: Any = MPI.SUM,
                            info: MPI.Info | None = None, *,
                            algorithm: str | None = None,
                 reproducible: bool | None = None) -> persistent.Prequest:
        """Persistent :meth:`Reduce_scatter`; *reproducible*: see :attr:`reproducible`."""
        recvcounts = self._reduce_scatter_counts(sendbuf, recvbuf, recvcounts)
        return self._persistent("reduce_scatter", algorithm, info, sendbuf, recvbuf, recvcounts, op=op,
                                reproducible=reproducible)

    def Scan_init(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, info: MPI.Info | None = None, *,
                  algorithm: str | None = None,
                 reproducible: bool | None = None) -> persistent.Prequest:
        """Persistent :meth:`Scan`; *reproducible*: see :attr:`reproducible`."""
        return self._persistent("scan", algorithm, info, sendbuf, recvbuf, op=op,
                                reproducible=reproducible)

    def Exscan_init(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, info: MPI.Info | None = None, *,
                    algorithm: str | None = None,
                 reproducible: bool | None = None) -> persistent.Prequest:
        """Persistent :meth:`Exscan`; *reproducible*: see :attr:`reproducible`."""
        return self._persistent("exscan", algorithm, info, sendbuf, recvbuf, op=op,
                                reproducible=reproducible)

    # ------------------------------------------------------------ communicator constructors
    #
    # Each returns an mpicomm communicator of the class of the new communicator's topology, its state built
    # here (collective over it, as the constructor is: every rank of it calls the constructor at this point),
    # or mpi4py's null result (== MPI.COMM_NULL) on a rank outside it. Each calls mpi4py's method on a plain
    # view of this communicator, so mpi4py never makes an object of this class itself.

    def Dup(self: _C, info: MPI.Info | None = None) -> _C:
        """Duplicate (collective); the copy is of this class, with its own state."""
        return _made(type(self), _plain(self).Dup(info))

    def Dup_with_info(self: _C, info: MPI.Info) -> _C:
        """Duplicate with *info* (collective); the copy is of this class, with its own state."""
        return _made(type(self), _plain(self).Dup_with_info(info))

    def Clone(self: _C) -> _C:
        """Same as :meth:`Dup`."""
        return self.Dup()

    def Idup(self: _C, info: MPI.Info | None = None) -> tuple[_C, DupRequest]:
        """Nonblocking duplicate: the new communicator (of this class) and a :class:`DupRequest`.

        The new communicator is usable once the request completes; the request's ``Wait`` (or the ``Test``
        that returns True) builds its mpicomm state then, collective over it. Until then any mpicomm use of it
        raises RuntimeError. Completed elsewhere (``MPI.Request.Waitall``), the state is built by its first
        mpicomm use, which every rank must then make (or call ``request.Wait()`` again on every rank).
        """
        new, request = _plain(self).Idup(info)
        return _pending(type(self), new, request)

    def Idup_with_info(self: _C, info: MPI.Info) -> tuple[_C, DupRequest]:
        """Nonblocking duplicate with *info*: as :meth:`Idup`."""
        new, request = _plain(self).Idup_with_info(info)
        return _pending(type(self), new, request)

    def Split(self, color: int = 0, key: int = 0) -> Comm | MPI.Intracomm:
        """Split by *color*, ordered by *key* (collective); ``MPI.COMM_NULL`` where color is ``MPI.UNDEFINED``."""
        return _derived(Comm, cast(MPI.Intracomm, _plain(self).Split(color, key)))

    def Split_type(self, split_type: int, key: int = 0, info: MPI.Info = MPI.INFO_NULL) -> Comm | MPI.Intracomm:
        """Split by *split_type* (``MPI.COMM_TYPE_SHARED``...) (collective); ``MPI.COMM_NULL`` for ``MPI.UNDEFINED``."""
        return _derived(Comm, cast(MPI.Intracomm, _plain(self).Split_type(split_type, key, info)))

    def Create(self, group: MPI.Group) -> Comm | MPI.Intracomm:
        """The communicator of *group* (collective over this one); ``MPI.COMM_NULL`` outside the group."""
        return _derived(Comm, cast(MPI.Intracomm, _plain(self).Create(group)))

    def Create_group(self, group: MPI.Group, tag: int = 0) -> Comm | MPI.Intracomm:
        """The communicator of *group* (collective over the group only: its members call it)."""
        return _derived(Comm, _plain(self).Create_group(group, tag))

    def Create_cart(self, dims: Sequence[int], periods: Sequence[bool] | None = None,
                    reorder: bool = False) -> CartComm | MPI.Cartcomm:
        """A :class:`CartComm` over a Cartesian grid of *dims* (collective); ``MPI.COMM_NULL`` off the grid."""
        return _derived(CartComm, _plain(self).Create_cart(dims, periods, reorder))

    def Create_graph(self, index: Sequence[int], edges: Sequence[int],
                     reorder: bool = False) -> GraphComm | MPI.Graphcomm:
        """A :class:`GraphComm` (collective); ``MPI.COMM_NULL`` on ranks beyond the graph's nodes."""
        return _derived(GraphComm, _plain(self).Create_graph(index, edges, reorder))

    def Create_dist_graph(self, sources: Sequence[int], degrees: Sequence[int], destinations: Sequence[int],
                          weights: Sequence[int] | None = None, info: MPI.Info = MPI.INFO_NULL,
                          reorder: bool = False) -> DistGraphComm | MPI.Distgraphcomm:
        """A :class:`DistGraphComm` from edges any rank may give (collective)."""
        return _derived(DistGraphComm,
                        _plain(self).Create_dist_graph(sources, degrees, destinations, weights, info, reorder))

    def Create_dist_graph_adjacent(self, sources: Sequence[int], destinations: Sequence[int],
                                   sourceweights: Sequence[int] | None = None,
                                   destweights: Sequence[int] | None = None, info: MPI.Info = MPI.INFO_NULL,
                                   reorder: bool = False) -> DistGraphComm | MPI.Distgraphcomm:
        """A :class:`DistGraphComm` from each rank's own neighbours (collective)."""
        return _derived(DistGraphComm, _plain(self).Create_dist_graph_adjacent(sources, destinations, sourceweights,
                                                                                destweights, info, reorder))

    def Free(self) -> None:
        """Free the communicator (collective, as ``MPI_Comm_free``) and mpicomm's state with it.

        Operations still pending on it complete first (MPI's rule). Afterwards
        every mpicomm use of this ``Comm`` - a collective, a push, ``local_rank``
        - raises :class:`mpicomm.FreedError` naming it.
        """
        what = self._what()
        MPI.Intracomm.Free(self)
        self._state = Freed(what)

    def free(self) -> None:
        """mpi4py's safe ``free()``: nothing for ``Comm()`` and ``Comm(MPI.COMM_SELF)`` (as for mpi4py's constants);
        any other object is emptied (``bool(comm)`` is False afterwards), its communicator freed unless it is a
        predefined one, and every later mpicomm use of it raises :class:`mpicomm.FreedError`."""
        if any(self is made for made in _PREDEFINED.values()) or not self:
            return
        what = self._what()
        MPI.Intracomm.free(self)
        self._state = Freed(what)

    def _what(self) -> str:
        return f"mpicomm.{self._kind} {self.Get_name() or '(unnamed)'} (rank {self.Get_rank()} of {self.Get_size()})"

    def __repr__(self) -> str:
        s = self._state
        if type(s) is Freed:
            return f"<mpicomm.{self._kind} (freed)>"
        if type(s) is _Unready:
            # (no Get_rank: the communicator may not be usable yet; reading the state could start its collective)
            return f"<mpicomm.{self._kind} (from Idup; state not built yet)>"
        return (
            f"<mpicomm.{self._kind} rank {self.Get_rank()}/{self.Get_size()}, local {s.local_rank}/{s.local_size}, "
            f"node {s.node}/{s.nodes} ({s.host})>"
        )


# ---------------------------------------------------------------- the topology classes


class _Neighborhood(Comm):
    """The neighbourhood collectives of the topology classes, on mpicomm's algorithms (``mpicomm.coll.neighbor``):
    mpi4py's signatures plus ``algorithm=`` (``"direct"``, ``"combined"`` or ``"auto"``). Each rank exchanges
    blocks with its topology's neighbours only (``inedges``/``outedges``, in MPI's order)."""

    def Neighbor_allgather(self, sendbuf: Any, recvbuf: Any, *, algorithm: str | None = None) -> None:
        """Send *sendbuf* to every out-neighbour; receive one block from each in-neighbour, in order."""
        key = ("neighbor_allgather", id(sendbuf), id(recvbuf), algorithm)
        if not self._repeat(key, sendbuf, recvbuf):
            self._first(key, (sendbuf, recvbuf), algorithm, sendbuf, recvbuf)

    def Ineighbor_allgather(self, sendbuf: Any, recvbuf: Any, *, algorithm: str | None = None) -> Request:
        """Nonblocking :meth:`Neighbor_allgather`."""
        return self._collective("neighbor_allgather", False, algorithm, sendbuf, recvbuf)

    def Neighbor_allgatherv(self, sendbuf: Any, recvbuf: Any, *, algorithm: str | None = None) -> None:
        """:meth:`Neighbor_allgather` with per-neighbour receive counts and displacements."""
        self._collective("neighbor_allgatherv", True, algorithm, sendbuf, recvbuf)

    def Ineighbor_allgatherv(self, sendbuf: Any, recvbuf: Any, *, algorithm: str | None = None) -> Request:
        """Nonblocking :meth:`Neighbor_allgatherv`."""
        return self._collective("neighbor_allgatherv", False, algorithm, sendbuf, recvbuf)

    def Neighbor_alltoall(self, sendbuf: Any, recvbuf: Any, *, algorithm: str | None = None) -> None:
        """Send block k of *sendbuf* to out-neighbour k; receive block k of *recvbuf* from in-neighbour k."""
        key = ("neighbor_alltoall", id(sendbuf), id(recvbuf), algorithm)
        if not self._repeat(key, sendbuf, recvbuf):
            self._first(key, (sendbuf, recvbuf), algorithm, sendbuf, recvbuf)

    def Ineighbor_alltoall(self, sendbuf: Any, recvbuf: Any, *, algorithm: str | None = None) -> Request:
        """Nonblocking :meth:`Neighbor_alltoall`."""
        return self._collective("neighbor_alltoall", False, algorithm, sendbuf, recvbuf)

    def Neighbor_alltoallv(self, sendbuf: Any, recvbuf: Any, *, algorithm: str | None = None) -> None:
        """:meth:`Neighbor_alltoall` with per-neighbour counts and displacements on both sides."""
        self._collective("neighbor_alltoallv", True, algorithm, sendbuf, recvbuf)

    def Ineighbor_alltoallv(self, sendbuf: Any, recvbuf: Any, *, algorithm: str | None = None) -> Request:
        """Nonblocking :meth:`Neighbor_alltoallv`."""
        return self._collective("neighbor_alltoallv", False, algorithm, sendbuf, recvbuf)

    def Neighbor_alltoallw(self, sendbuf: Any, recvbuf: Any, *, algorithm: str | None = None) -> None:
        """:meth:`Neighbor_alltoallv` with a datatype per neighbour and displacements in bytes (as
        :meth:`Comm.Alltoallw`)."""
        self._collective("neighbor_alltoallw", True, algorithm, sendbuf, recvbuf)

    def Ineighbor_alltoallw(self, sendbuf: Any, recvbuf: Any, *, algorithm: str | None = None) -> Request:
        """Nonblocking :meth:`Neighbor_alltoallw`."""
        return self._collective("neighbor_alltoallw", False, algorithm, sendbuf, recvbuf)

    def Neighbor_alltoallw_init(self, sendbuf: Any, recvbuf: Any, info: MPI.Info | None = None, *,
                                algorithm: str | None = None) -> persistent.Prequest:
        """Persistent :meth:`Neighbor_alltoallw`."""
        return self._persistent("neighbor_alltoallw", algorithm, info, sendbuf, recvbuf)

    def Neighbor_allgather_init(self, sendbuf: Any, recvbuf: Any, info: MPI.Info | None = None, *,
                                algorithm: str | None = None) -> persistent.Prequest:
        """Persistent :meth:`Neighbor_allgather`."""
        return self._persistent("neighbor_allgather", algorithm, info, sendbuf, recvbuf)

    def Neighbor_allgatherv_init(self, sendbuf: Any, recvbuf: Any, info: MPI.Info | None = None, *,
                                 algorithm: str | None = None) -> persistent.Prequest:
        """Persistent :meth:`Neighbor_allgatherv`."""
        return self._persistent("neighbor_allgatherv", algorithm, info, sendbuf, recvbuf)

    def Neighbor_alltoall_init(self, sendbuf: Any, recvbuf: Any, info: MPI.Info | None = None, *,
                               algorithm: str | None = None) -> persistent.Prequest:
        """Persistent :meth:`Neighbor_alltoall`."""
        return self._persistent("neighbor_alltoall", algorithm, info, sendbuf, recvbuf)

    def Neighbor_alltoallv_init(self, sendbuf: Any, recvbuf: Any, info: MPI.Info | None = None, *,
                                algorithm: str | None = None) -> persistent.Prequest:
        """Persistent :meth:`Neighbor_alltoallv`."""
        return self._persistent("neighbor_alltoallv", algorithm, info, sendbuf, recvbuf)


class CartComm(_Neighborhood, MPI.Cartcomm):  # type: ignore[misc]  # (mpicomm's neighbourhood methods first, as [override] above)
    """A :class:`Comm` over a Cartesian communicator: also an ``MPI.Cartcomm`` (``Shift``, ``Get_coords``,
    ``Get_topo``, ``Get_cart_rank``, ``Sub``, the neighbour collectives...). Made by ``comm.Create_cart(...)``,
    or ``CartComm(cart)`` / ``Comm(cart)`` of an mpi4py one (collective the first time, as ``Comm``)."""

    _topology = MPI.CART
    _kind = "CartComm"

    def Sub(self, remain_dims: Sequence[bool]) -> CartComm:
        """The sub-grid keeping the dimensions where *remain_dims* is true, a :class:`CartComm` (collective)."""
        return _made(CartComm, MPI.Cartcomm.Sub(self, remain_dims))


class GraphComm(_Neighborhood, MPI.Graphcomm):  # type: ignore[misc]  # (as CartComm)
    """A :class:`Comm` over a graph communicator (``comm.Create_graph``): also an ``MPI.Graphcomm``."""

    _topology = MPI.GRAPH
    _kind = "GraphComm"


class DistGraphComm(_Neighborhood, MPI.Distgraphcomm):  # type: ignore[misc]  # (as CartComm)
    """A :class:`Comm` over a distributed-graph communicator (``comm.Create_dist_graph``,
    ``comm.Create_dist_graph_adjacent``): also an ``MPI.Distgraphcomm``."""

    _topology = MPI.DIST_GRAPH
    _kind = "DistGraphComm"


_BY_TOPOLOGY: dict[int, type[Comm]] = {MPI.CART: CartComm, MPI.GRAPH: GraphComm, MPI.DIST_GRAPH: DistGraphComm}
_TOPOLOGY_NAMES = {MPI.CART: "Cartesian", MPI.GRAPH: "graph", MPI.DIST_GRAPH: "distributed-graph"}
_MADE_BY = {MPI.CART: "Create_cart", MPI.GRAPH: "Create_graph", MPI.DIST_GRAPH: "Create_dist_graph"}


def _plain(comm: Comm) -> MPI.Intracomm:
    """*comm*'s handle in a plain mpi4py object: what mpi4py's constructors are called on (they make an object
    of their receiver's class, without our ``__init__``)."""
    return MPI.Intracomm(comm)


#: The one object per class over MPI.COMM_WORLD and MPI.COMM_SELF (see Comm.__new__).
_PREDEFINED: dict[tuple[type, int], Comm] = {}


def _made(cls: type[_C], new: MPI.Comm) -> _C:
    """*new* (a communicator a constructor just made on every rank of it) as a *cls*, its state built here
    (collective over it). As mpi4py's constructors, without calling ``cls.__init__``."""
    comm = cast(_C, cls.__new__(cls, cast(MPI.Intracomm, new)))
    comm._state = state_of(comm)
    return comm


def _derived(cls: type[_C], new: _N) -> _C | _N:
    """A constructor's result: mpi4py's null object (== ``MPI.COMM_NULL``) off the new communicator, else a
    *cls* (``Comm``: the class of its topology), its state built (collective over it)."""
    if new == MPI.COMM_NULL:
        return new
    return _made(cls, new)


def _rebuild(cls: type[_C], predefined: MPI.Intracomm) -> _C:
    """Unpickle (or copy) a communicator over a predefined one: the same communicator; in this process its
    state is the one it already has (no collective), elsewhere it is built as ``Comm()`` builds it."""
    return _made(cls, predefined)


# ---------------------------------------------------------------- Idup


class DupRequest(MPI.Request):
    """The request of :meth:`Comm.Idup` and :meth:`Comm.Idup_with_info`: an ``MPI.Request`` that, when it
    completes through its own ``Wait``/``wait`` or a ``Test``/``test`` that returns True, also builds the new
    communicator's mpicomm state - collective over the new communicator, at the point where each rank
    completes its request. Calling ``Wait`` again once it is complete returns at once (and builds the state if
    the request was completed elsewhere, e.g. by ``MPI.Request.Waitall``)."""

    _comm: Comm

    def Wait(self, status: MPI.Status | None = None) -> Literal[True]:
        MPI.Request.Wait(self, status)
        self._comm_ready()
        return True

    def Test(self, status: MPI.Status | None = None) -> bool:
        if not MPI.Request.Test(self, status):
            return False
        self._comm_ready()
        return True

    def wait(self, status: MPI.Status | None = None) -> Any:
        result = MPI.Request.wait(self, status)
        self._comm_ready()
        return result

    def test(self, status: MPI.Status | None = None) -> tuple[bool, Any]:
        done, result = MPI.Request.test(self, status)
        if done:
            self._comm_ready()
        return done, result

    def _comm_ready(self) -> None:
        comm = self._comm
        if type(comm.__dict__.get("_state")) is _Unready:
            comm._state = state_of(comm)


class _Unready:
    """What a communicator from ``Idup`` holds instead of its :class:`State` until its request completes.

    Before: any read raises RuntimeError (the communicator cannot be used yet). After a completion mpicomm did
    not see (``MPI.Request.Waitall``): the first read builds the state (collective over the communicator) and
    puts it in the communicator's place; reads through this object go on to that state.
    """

    __slots__ = ("comm", "request", "built")

    def __init__(self, comm: Comm, request: DupRequest):
        self.comm, self.request = comm, request
        self.built: State | None = None

    @property
    def _state(self) -> State:
        # (a property named as Comm's attribute: state.as_state and the dispatcher, given this object, find the
        # State through it, as they do through a Comm)
        if self.built is not None:
            return self.built
        comm = self.comm
        if self.request != MPI.REQUEST_NULL:
            raise RuntimeError(
                f"this mpicomm.{comm._kind} comes from Idup and its request has not completed: complete it "
                f"(request.Wait(), or request.Test() until True) on every rank before using the communicator")
        state = self.built = state_of(comm)
        comm._state = state
        return state

    def __getattr__(self, name: str) -> Any:
        return getattr(self._state, name)


def _pending(cls: type[_C], new: MPI.Intracomm, request: MPI.Request) -> tuple[_C, DupRequest]:
    """The (communicator, request) of an Idup: a *cls* holding an :class:`_Unready` until the request completes.

    (No ``cls.__new__``: its checks would query the communicator, which may not be used before completion; a
    duplicate has the topology of its original, whose class *cls* is.)
    """
    comm = MPI.Intracomm.__new__(cls, new)
    wrapped = DupRequest(request)
    wrapped._comm = comm
    comm._state = _Unready(comm, wrapped)
    return comm, wrapped
