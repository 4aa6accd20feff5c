"""What mpicomm keeps per MPI communicator: one :class:`State`, built collectively once, freed with it.

Everything an algorithm, a plan or the dispatcher needs to know about a
communicator lives here, declared in one place: the topology (node-local and
node-leader sub-communicators), the private duplicate collectives run on and
its tag sequence, the typed-message channel, per-communicator algorithm
defaults and remembered choices, the measured selection rules, the fitted
cost model, the shared-memory arena, the two levels of hierarchical
algorithms, and the plans of repeated calls. :meth:`State.free` releases all of it; MPI calls it when the
communicator is freed (``Comm.Free``), through the attribute the state is
kept in, so nothing is left behind.

Algorithms and :class:`~mpicomm.coll.call.Call` take a State, not a
:class:`mpicomm.Comm`: the wrapper stands above everything here, and the
sub-communicators hierarchical algorithms run on (:mod:`mpicomm.coll.hierarchy`)
are States too. :func:`state_of` returns the State of any intracommunicator
(a ``Comm`` or a plain mpi4py one), building it the first time (collective).
"""

from __future__ import annotations

import collections
import sys
import threading
from dataclasses import replace
from typing import Any, cast

import numpy as np
from mpi4py import MPI

from . import config, launcher, model, p2p, registry, rules
from .catalogue import COLLECTIVES
from .engine.executor import ranks_on_node
from .engine.progress import Queue, finish_pending
from .engine.requests import barrier

#: Calls the flight recorder keeps per communicator (the watchdog prints them).
RECENT = 8

__all__ = ["RECENT", "State", "FreedError", "Freed", "state_of", "as_state", "job_local_rank", "world_machine",
           "predict"]


class FreedError(RuntimeError):
    """An mpicomm communicator (or a request on it) was used after ``Comm.Free``."""


class Freed:
    """What a ``Comm`` holds instead of its :class:`State` once freed: reading anything from it raises
    :class:`FreedError` naming the communicator (not a stale value, nor the MPI library's "Invalid
    communicator")."""

    __slots__ = ("what",)

    def __init__(self, what: str):
        self.what = what

    def __getattr__(self, name: str) -> Any:
        raise FreedError(freed_message(self.what))


def freed_message(what: str) -> str:
    return (f"{what} was freed (Comm.Free): collectives, pushes, pulls and topology queries need a live "
            f"communicator; make a new one, e.g. mpicomm.Comm(MPI.COMM_WORLD.Dup())")


class State:
    """One communicator's mpicomm state (see the module docstring). Built by :func:`state_of`."""

    comm: MPI.Intracomm  #: the communicator itself (a plain mpi4py handle)
    rank: int
    size: int
    node_comm: MPI.Intracomm  #: this node's ranks (``Split_type(COMM_TYPE_SHARED)``)
    local_rank: int
    local_size: int
    leader_comm: MPI.Intracomm | None  #: one rank per node (None off the leaders)
    node: int
    nodes: int
    ppn: int  #: the most ranks on any one node
    host: str
    library_comm: MPI.Intracomm  #: private duplicate: every collective's messages
    channel: p2p.Channel  #: typed point-to-point messages (``send_array``...)
    tag_ub: int
    tag_modulus: int
    watch_tag: int  #: tag of the watchdog's roll call on library_comm (no collective uses it)
    recent: collections.deque  #: flight recorder: the last RECENT collective calls (Call objects), for the watchdog
    lock: threading.RLock  #: held by the thread running a collective call on it (concurrent use is refused)
    poisoned: str | None  #: why this communicator refuses every further collective (two threads used it at once)
    collectives: int  #: sequence number of the next collective call (names it in messages and the trace)
    epoch: int  #: how many calls failed on a disagreement (each moves the collectives to fresh tags)
    queue: Queue  #: nonblocking and persistent runs in call order (:mod:`mpicomm.engine.progress`)
    persistent: int  #: persistent collectives created so far (the next one's number, agreed by every rank)
    user_tags: int  #: tags handed out by ``Comm.collective_tag()`` so far
    defaults: dict[str, str]  #: ``comm.set_algorithm`` choices
    choices: dict[tuple, Any]  #: the dispatcher's algorithm choices for facts seen before
    plans: dict[tuple, Any]  #: compiled plans of calls seen before, by signature (:mod:`mpicomm.plan`)
    fast: dict[tuple, Any]  #: the same plans by the identity of plain-array arguments (the front's fast path)
    seen: dict[tuple, tuple]  #: small blocking calls run once on a staged plan (a repeat compiles): the dispatcher's
    machine: Any  #: the fitted cost model (:class:`mpicomm.model.Machine`) or None
    rules: Any  #: the measured selection rules of this layout (:class:`mpicomm.rules.Rules`) or None
    arena: Any  #: the shared-memory arena (:class:`mpicomm.transport.memory.Arena`), made by the first shm call
    levels: tuple[Any, Any] | None  #: the hierarchy's (node, leaders) states (:mod:`mpicomm.coll.hierarchy`), made by the first use
    node_of: tuple[int, ...]  #: every rank's node
    local_of: tuple[int, ...]  #: every rank's local rank
    freed: bool

    def __init__(self, comm: MPI.Intracomm):
        # Every MPICOMM_* setting checked here, before any collective; what each rank found is exchanged, so a
        # setting wrong on one rank only is refused on every rank alike.
        found = config.problems(COLLECTIVES, registry.algorithms, registry.import_modules,
                                writes_trace=MPI.COMM_WORLD.Get_rank() == 0)
        comm = MPI.Intracomm(comm)  # plain mpi4py methods: sub-communicators are MPI.Intracomm
        barrier(comm)  # everyone is here; pending mpicomm transfers to this rank kept moving meanwhile
        every = comm.allgather((found, () if found else config.protocol()))
        # mpi4py's first pickle-based reduction on a communicator (allreduce, reduce, scan, exscan) duplicates it,
        # collectively and holding the GIL, to keep its messages apart: done now, while every rank is here, it
        # never happens later while this rank's pending collectives need the progress thread (which needs the
        # GIL) and a peer waits for them before its own reduction - a legal program that would hang.
        comm.allreduce(0)
        refused = config.refusal([f for f, _ in every]) or config.protocol_mismatch([s for _, s in every])
        if refused:  # the same on every rank: each has every rank's findings and settings
            raise ValueError(refused)
        self.comm = comm
        rank = comm.Get_rank()
        self.rank, self.size = rank, comm.Get_size()
        # (MPI_Comm_split_type and MPI_Comm_split make intracommunicators; mpi4py's stubs say Comm)
        self.node_comm = cast(MPI.Intracomm, comm.Split_type(MPI.COMM_TYPE_SHARED, key=_local_order(comm)))
        self.local_rank = self.node_comm.Get_rank()
        self.local_size = self.node_comm.Get_size()
        ranks_on_node(self.local_size)
        first = self.node_comm.allreduce(rank, op=MPI.MIN)  # nodes are numbered by their lowest rank
        leaders = cast(MPI.Intracomm, comm.Split(0 if self.local_rank == 0 else MPI.UNDEFINED, key=first))
        self.leader_comm = None if leaders == MPI.COMM_NULL else leaders
        where = np.zeros(3, np.int64)
        if self.leader_comm is not None:
            most = self.leader_comm.allreduce(self.local_size, op=MPI.MAX)
            where[:] = self.leader_comm.Get_rank(), self.leader_comm.Get_size(), most
        self.node_comm.Bcast(where, root=0)
        self.node, self.nodes, self.ppn = int(where[0]), int(where[1]), int(where[2])
        placed = np.empty((self.size, 2), np.int64)
        comm.Allgather(np.array([self.node, self.local_rank], np.int64), placed)
        self.node_of = tuple(int(v) for v in placed[:, 0])  # every rank's node
        self.local_of = tuple(int(v) for v in placed[:, 1])  # every rank's local rank
        self.host = MPI.Get_processor_name()
        self.library_comm = p2p.private_dup(comm)
        self.channel = p2p.Channel(comm)
        self.tag_ub = self.channel.tag_ub
        self.tag_modulus = min(self.tag_ub, 1 << 20)  # collectives' tags: 1 … tag_modulus − 1
        self.watch_tag = 0  # the watchdog's roll call (never a collective's tag)
        self.recent = collections.deque(maxlen=RECENT)
        self.lock = threading.RLock()
        self.poisoned = None
        self.collectives = 0
        self.epoch = 0
        self.queue = Queue()
        self.persistent = 0
        self.reproducible = config.reproducible()  # (Comm.reproducible: sum reproducibly by default)
        self.sums: dict[tuple, Any] = {}  # reproducible sums' plans, by shape (mpicomm.front.reproducing)
        self.user_tags = 0
        self.defaults = {}
        self.choices = {}
        self.plans = {}
        self.fast = {}
        self.seen = {}
        self.machine = model.for_comm(self.library_comm, self.host, self.nodes, self.local_size)
        # measured selection rules (python -m mpicomm.tune --collectives), loaded by rank 0 and broadcast
        self.rules = rules.for_comm(self.library_comm, self.host, self.nodes, self.ppn, registry.algorithms)
        self.arena = None
        self.levels = None
        self.freed = False

    def sub_state(self, comm: MPI.Intracomm) -> State:
        """The state of another communicator (collective over it: a hierarchical level's)."""
        return state_of(comm)

    def user_tag(self) -> int:
        """The next tag of the range kept for programs' own messages on library_comm (above every
        collective's: tag_modulus … tag_ub)."""
        n = self.user_tags
        self.user_tags = n + 1
        span = max(1, self.tag_ub - self.tag_modulus)
        return self.tag_modulus + n % span

    def next_seq(self) -> int:
        """The sequence number of the next collective call (advances it)."""
        seq = self.collectives
        self.collectives = seq + 1
        return seq

    def tags(self, epoch: int) -> tuple[int, int]:
        """(data, agreement) tags of an epoch on library_comm: 1, 2; 3, 4; … (the agreement's tag also carries
        data fused with it). A plan reads the epoch once, then its tags from it, so a failure on another
        thread in between cannot give it one epoch's number and another's tags."""
        span = max(2, self.tag_modulus - 1) // 2 * 2
        first = 1 + (2 * epoch) % span
        return first, first + 1

    def new_epoch(self) -> int:
        """Move every later collective to fresh tags and forget the compiled plans (a call failed on a
        disagreement: messages of it may still be in flight, and must never match a later call)."""
        self.epoch += 1
        self.plans.clear()  # (a plan's requests are freed with it; a queued run may still hold one)
        self.fast.clear()
        return self.epoch

    def check_live(self) -> None:
        """Raise :class:`FreedError` if the communicator was freed (through any of its wrappers)."""
        if self.freed:
            raise FreedError(freed_message(f"the communicator of {self.size} ranks (this is rank {self.rank})"))

    def free(self) -> None:
        """Release everything: plans, the shared-memory windows, the levels' communicators, the duplicates.

        Collective (it frees windows and communicators), as ``Comm.Free`` is.
        """
        if self.freed:
            return
        self.freed = True
        finish_pending(self.queue)  # MPI's rule: operations pending at Free complete normally
        for plan in list(self.plans.values()):
            plan.release()
        self.plans.clear()
        self.fast.clear()
        self.choices.clear()
        if self.arena is not None:
            self.arena.free()
            self.arena = None
        if self.levels is not None:
            for level in self.levels:
                if level is not None:
                    level.comm.Free()  # its own State goes with it (the attribute's delete callback)
            self.levels = None
        for c in (self.node_comm, self.leader_comm, self.library_comm):
            if c is not None and c != MPI.COMM_NULL:
                c.Free()
        self.channel.free()

    def __repr__(self) -> str:
        return (f"<mpicomm.State rank {self.rank}/{self.size}, local {self.local_rank}/{self.local_size}, "
                f"node {self.node}/{self.nodes} ({self.host})>")


def _local_order(comm: MPI.Intracomm) -> int:
    """The key that orders ranks within a node: the launcher's local rank where it describes *comm*.

    Launchers number local ranks their own way (Open MPI maps by package, for
    instance), and programs bind GPUs from that number before MPI starts; using
    it here makes ``local_rank`` agree with it. For a sub-communicator, or when
    the environment does not describe this job, ranks keep their order.
    """
    job_local = job_local_rank()
    if job_local is not None and MPI.Comm.Compare(comm, MPI.COMM_WORLD) in (MPI.IDENT, MPI.CONGRUENT):
        return job_local
    return comm.Get_rank()


def job_local_rank() -> int | None:
    """The launcher's local rank of this process, if its environment describes this MPI job."""
    try:
        env = launcher.from_environment()
    except ValueError:  # a malformed variable: not ours to fail on (possibly inside a collective)
        return None
    world = MPI.COMM_WORLD
    if env.local_rank is None or env.size != world.Get_size() or env.rank != world.Get_rank():
        return None
    return env.local_rank


def _delete_state(comm: MPI.Comm, keyval: int, state: State) -> None:
    # MPI calls this when the communicator is freed (Comm.Free); at MPI_Finalize,
    # MPICH does not call it for COMM_WORLD, and the library frees everything itself.
    if not MPI.Is_finalized():
        state.free()


_keyval: list[int] = []


def state_of(comm: MPI.Intracomm) -> State:
    """The :class:`State` of *comm* (any intracommunicator); built collectively the first time."""
    if not _keyval:
        _keyval.append(MPI.Comm.Create_keyval(delete_fn=_delete_state))
    state = cast("State | None", comm.Get_attr(_keyval[0]))  # (our keyval: only a State is ever set on it)
    if state is None:
        state = State(comm)
        comm.Set_attr(_keyval[0], state)
    return state


def as_state(comm: Any) -> State:
    """*comm* if it is a State, else :func:`state_of` it (a ``mpicomm.Comm`` or an mpi4py intracommunicator)."""
    if type(comm) is State:
        return comm
    state = getattr(comm, "_state", None)
    return state if type(state) is State else state_of(comm)


def world_machine() -> model.Machine:
    """The fit of ``MPI.COMM_WORLD``'s State if one exists, else :data:`~mpicomm.model.NOMINAL` in its layout.

    Never starts MPI nor runs a collective: before MPI or any State exists it
    is NOMINAL.
    """
    if "mpi4py.MPI" not in sys.modules or not _keyval:
        return model.NOMINAL
    if not MPI.Is_initialized() or MPI.Is_finalized():
        return model.NOMINAL
    state = cast("State | None", MPI.COMM_WORLD.Get_attr(_keyval[0]))  # (our keyval: only a State is set on it)
    if state is None:
        return model.NOMINAL
    if state.machine is not None:
        return state.machine
    return replace(model.NOMINAL, ppn=state.ppn, nodes=state.nodes, host=state.host)


def predict(collective: str, algorithm: str, nbytes: float, p: int, machine: model.Machine | None = None) -> float:
    """Predicted seconds of one call (:func:`mpicomm.registry.predict`); *machine* None: :func:`world_machine`.

    ``mpicomm.predict``: the model of the machine this job runs on when a
    ``Comm`` over ``MPI.COMM_WORLD`` exists and a fit is saved for its layout,
    else :data:`~mpicomm.model.NOMINAL` (never starts MPI or a collective).
    """
    return registry.predict(collective, algorithm, nbytes, p, machine if machine is not None else world_machine())
