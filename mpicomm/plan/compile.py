"""Plans: an algorithm's schedule bound to one signature, compiled once, run many times.

A :class:`Plan` is everything about one call that does not change between
calls with the same signature (collective, counts, element type, op, root,
algorithm, communicator, buffers): the schedule the algorithm describes for
this rank (:mod:`mpicomm.schedule`), the scratch arrays it needs, one
prepared persistent request (``Send_init``/``Recv_init`` on the
communicator's private duplicate) per message, the reductions and copies as
calls on fixed array views, and the agreement's words
(:mod:`.agreement`). :meth:`Plan.run` makes a :class:`~mpicomm.engine.executor.Run`
of it; running it only starts prepared requests and calls prepared ufuncs.

Host arrays are bound by address (arrays over the same memory that hold no
reference to the caller's arrays), so a plan kept for repeated calls never
keeps a caller's array alive; the caller's cache checks that the arrays it
was made for still exist before it runs the plan again. Device arrays (and
every array under ``MPICOMM_TRANSFER=staged``) post fresh requests each run,
through :mod:`mpicomm.transport.buffers` (stream synchronisation, pinned host staging).
A device plan's own work - copies, combines, staging - runs inside the
array's device binding (:func:`mpicomm.device.binding`: that device and
mpicomm's stream on it, whichever thread drives the run) and is waited for
before the step goes on, so MPI never reads a half-written buffer and a
completed run's results are in memory for any stream (docs/gpus.md).

All messages of a communicator's collectives carry one tag (its runs never
overlap: :mod:`mpicomm.engine.progress`); the agreement's messages, and data
fused with them, another. Both change when a call fails on a disagreement.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from mpi4py import MPI

from .. import device as _device
from .. import trace as _trace
from ..catalogue import family
from ..engine import lane
from ..engine.executor import AgreeStep, Program, Run, Step
from ..ops import BUILTIN
from ..schedule import RECV, SEND, Builder, Combine, Copy, Local, Round, Schedule, View, early
from ..transport import buffers
from . import agreement
from .args import Args, library_request, sending_order

if TYPE_CHECKING:
    from ..state import State

__all__ = ["Plan", "child_run", "build", "agreement_only", "creation_probe", "library_plan", "library_program", "traced", "schedule_of",
           "call_algorithm", "FUSE_BYTES", "describe_call"]

#: Largest data message that carries the agreement's words in front of it (copied into a small buffer);
#: larger ones travel beside a 32-byte message of the agreement's own.
FUSE_BYTES = 4096

_EMPTY = [None, 0, MPI.BYTE]
_UINT8 = np.dtype(np.uint8)
_WORD_BYTES = 8 * agreement.WORDS


def _raw(x: Any) -> Any:
    """A flat array over *x*'s memory that keeps no reference to *x* (host arrays), or *x* itself."""
    if x is None or type(x) is not np.ndarray:
        return x
    if x.size == 0:
        return np.empty(0, x.dtype)
    address = x.__array_interface__["data"][0]
    return np.frombuffer(MPI.buffer.fromaddress(address, x.nbytes), x.dtype)  # type: ignore[call-overload]  # MPI.buffer is a buffer (its stub: Python 3.12+)


def _address(x: Any) -> int:
    if x is None or x.size == 0:
        return 0
    if type(x) is np.ndarray:
        return x.__array_interface__["data"][0]
    data = getattr(x, "data", None)
    return getattr(data, "ptr", 0)


class Plan:
    """One signature's compiled program, and what the callers need to know of it (see the module docstring)."""

    __slots__ = ("program", "state", "collective", "algorithm", "name_", "source", "count", "dtype", "op", "root", "p",
                 "epoch", "persistent", "words", "schedule", "direct", "arrays", "cached", "keep",
                 "stage", "held", "busy", "key", "retell", "__weakref__")

    def __init__(self, state: State, args: Args, algorithm: Any, source: str):
        self.state = state
        self.collective = args.collective
        self.algorithm = algorithm if not isinstance(algorithm, str) else Named(algorithm)  #: what runs (``.name``)
        self.name_ = self.algorithm.name
        self.source = source
        self.count = args.count
        self.dtype = args.dtype
        self.op = args.op
        self.root = args.root
        self.p = state.size
        self.epoch = state.epoch
        self.persistent: int | None = None
        self.words: np.ndarray | None = None
        self.schedule: Schedule | None = None
        self.direct = True
        self.arrays: list[Any] = []
        self.cached = False  # bound by address and kept for later calls
        self.held = 0  # bytes of its own arrays (scratch, staging), once kept
        self.busy = False  # a staged plan of a nonblocking call in flight (its own arrays are in use)
        self.keep: list[Any] = []  # what the prepared requests point into (scratch, staging)
        self.stage: tuple[Any, Any] | None = None  # a staged plan's own send and receive arrays (the front copies)
        self.key: tuple | None = None  # a persistent request's plan: its signature, under which it is reused once freed
        #: rewrites the agreement's words for another call of the same shape (see :meth:`renumber`)
        self.retell: Callable[[Args, np.ndarray | None], bool] | None = None
        self.program: Program = Program([], self, state)

    # ------------------------------------------------------------ labels (built only when shown)

    @property
    def scratch(self) -> list[Any]:
        """The scratch arrays the plan allocated once (every run reuses them)."""
        return list(self.arrays[2:])

    @property
    def runs(self) -> int:
        """How many times this plan has run (started)."""
        return self.program.runs

    @property
    def library(self) -> bool:
        """Whether the MPI library's own collective runs the call (a buffer spec mpicomm does not take)."""
        return self.name_ == "library"

    def name(self, seq: int) -> str:
        """``"allreduce #12 (ring)"``."""
        return f"{self.collective} #{seq} ({self.name_})"

    def details(self, seq: int) -> str:
        """The name and what the call moves (for the watchdog and the flight recorder)."""
        return describe_call(self.name(seq), self.collective, self.count, self.dtype, self.op, self.root)

    def __str__(self) -> str:
        return f"{self.collective} ({self.name_})"

    def run(self, seq: int) -> Run:
        """A new run of this plan (call :meth:`~mpicomm.engine.executor.Run.start`, or queue it)."""
        return Run(self.program, seq)

    def renumber(self, args: Args, persistent: int) -> None:
        """Make a freed persistent request's plan that of a new one (*args*: the same signature on the same
        memory): its words carry the new creation number, and it counts its runs afresh."""
        self.persistent = persistent
        self.program.runs = 0
        if self.retell is not None:
            self.retell(args.detached(_raw(args.send), _raw(args.recv)), None)  # (kept again once freed: no reference)

    def recast(self, args: Args, name: str, persistent: int | None, words: np.ndarray | None = None) -> bool:
        """Make an agreement-only plan check another call's words (*args*, algorithm *name*, *persistent*
        number; *words*, where another plan made them); False, changing nothing, where the new words would need
        other compiled checks (see :func:`creation_probe`)."""
        before = (self.collective, self.algorithm, self.name_, self.count, self.dtype, self.op, self.root,
                  self.persistent)
        self.collective, self.algorithm, self.name_ = args.collective, Named(name), name
        self.count, self.dtype, self.op, self.root, self.persistent = \
            args.count, args.dtype, args.op, args.root, persistent
        if self.retell is not None and self.retell(args, words):
            return True
        (self.collective, self.algorithm, self.name_, self.count, self.dtype, self.op, self.root,
         self.persistent) = before
        return False

    def release(self) -> None:
        """Free the prepared requests (the plan is not run again)."""
        for step in self.program.steps:
            for r in step.reqs or ():
                _free(r)
        for agree in self.program.agree or ():
            for r in agree.reqs:
                _free(r)
        self.program.steps = []
        self.program.agree = None
        self.program.lane = None
        self.keep = []


class Named(NamedTuple):
    """What runs a plan that runs no registered algorithm (the MPI library's collective, or nothing)."""

    name: str


def _free_requests(run: Run) -> None:
    for step in run.program.steps:
        for r in step.reqs or ():
            _free(r)


def _free(r: Any) -> None:
    try:
        if r and r.Test():
            r.Free()
    except MPI.Exception:
        pass


def describe_call(name: str, collective: str, count: int, dtype: Any, op: Any, root: int) -> str:
    what = f"{count} × {dtype}" if count >= 0 else f"per-rank counts of {dtype}"
    if op is not None:
        what += f", op {op.name}"
    if collective in ("bcast", "reduce", "gather", "gatherv", "scatter", "scatterv"):
        what += f", root {root}"
    return f"{name}: {what}"


# ---------------------------------------------------------------- the schedule


def schedule_of(state: State, args: Args, algorithm: Any, blocking: bool, rank: int | None = None,
                p: int | None = None) -> Schedule:
    """The schedule *algorithm* (a registry entry) describes for this rank's call *args*."""
    send, recv = args.send, args.recv
    b = Builder(args.collective, algorithm.name, state.rank if rank is None else rank,
                state.size if p is None else p, args.dtype if args.dtype is not None else _UINT8,
                root=args.root, op=args.op, count=args.count, state=state,
                send_count=0 if send is None else int(send.size), recv_count=0 if recv is None else int(recv.size),
                blocking=blocking)
    call_algorithm(b, algorithm.steps, args)
    return b.schedule()


def call_algorithm(b: Builder, fn: Callable, args: Args) -> None:
    """Call an algorithm with its collective's signature (see :data:`mpicomm.catalogue.SIGNATURES`)."""
    f = family(args.collective)
    send = None if args.send is None else b.input
    recv = None if args.recv is None else b.output
    if f in ("allreduce", "reduce", "scan", "exscan"):
        fn(b, send, recv)
    elif f == "bcast":
        fn(b, recv if recv is not None else send)
    elif f in ("gather", "allgather"):
        fn(b, send, recv, args.recvcounts, args.recvdispls)
    elif f == "scatter":
        fn(b, send, recv, args.sendcounts, args.senddispls)
    elif f == "alltoall":
        fn(b, send, args.sendcounts, args.senddispls, recv, args.recvcounts, args.recvdispls)
    elif f == "reduce_scatter":
        fn(b, send, recv, args.recvcounts)
    elif f == "neighbor":
        destinations, sendcounts, senddispls = sending_order(args)
        fn(b, send, sendcounts, senddispls, recv, args.recvcounts, args.recvdispls, args.sources, destinations)
    else:
        fn(b)


# ---------------------------------------------------------------- building


def build(state: State, args: Args, algorithm: Any, source: str, *, blocking: bool, validate: bool,
          persistent: int | None = None, planner: Callable[..., Plan] | None = None, cached: bool = False) -> Plan:
    """Compile the plan of this rank's call *args* with *algorithm* (a registry entry) on *state*.

    *validate*: carry the agreement (see :mod:`.agreement`); *persistent*: the
    creation number of a persistent request (part of its digest); *planner*:
    makes the plans of nested calls (``planner(state, args, algorithm_name,
    blocking)``); *cached*: the plan is kept for later calls (bind host arrays
    by address, and remember weak references to them).
    """
    plan = Plan(state, args, algorithm, source)
    plan.persistent = persistent
    plan.cached = cached
    xp = args.xp or np
    sched = schedule_of(state, args, algorithm, blocking)
    plan.schedule = sched
    send, recv = args.send, args.recv
    plan.direct = all(x is None or buffers.transfer_path(x) == "direct" for x in (send, recv)) and xp is np
    bind = _raw if (cached and plan.direct) else (lambda x: x)
    arrays: list[Any] = [bind(send), bind(recv)]
    if cached and plan.direct:  # what the plan's closures keep: nothing of the caller's
        args = args.detached(arrays[SEND], arrays[RECV])
    device = _device.binding(args.device)  # (None for host arrays)
    pre: list[Callable[[Run], None]] = []
    if args.in_place and not algorithm.in_place and send is not None:
        own = _empty(xp, device, int(send.size), send.dtype)  # the algorithm may not read what it writes
        source_array = arrays[SEND]
        arrays[SEND] = own
        copyto = xp.copyto

        def copy_in(run: Run, d: Any = own, s: Any = source_array) -> None:
            with _context(device):
                copyto(d, s)
            if device is not None:
                device.synchronize()

        pre.append(lane.with_record(copy_in, lane.copy(own, source_array) if device is None else None))
    for count, dt in sched.buffers[2:]:
        arrays.append(_empty(xp, device, count, dt))
    plan.arrays = arrays
    plan.keep = list(arrays[2:])
    lib = state.library_comm
    tag = state.tags(plan.epoch)[0]  # (the plan's epoch, read once: another thread may fail a call meanwhile)
    steps = [_step(plan, r, arrays, lib, tag, xp, device, args, planner, blocking) for r in sched.rounds]
    shared = _aliases(arrays)
    for k in range(len(steps) - 1):
        steps[k].early = early(sched.rounds[k], sched.rounds[k + 1], shared)
    if pre:
        if not steps:
            steps.append(Step("copy the input aside"))
        steps[0].pre = tuple(pre) + steps[0].pre
    program = plan.program
    program.steps = steps
    program.buffers = arrays
    if sched.then is not None:
        steps.append(_expand(plan, sched, arrays, lib, tag, xp, device, args, planner, blocking))
    if validate and args.collective != "barrier":
        fusable = _fusable(state, args, algorithm, sched, blocking)
        _agreement(plan, args, sched, arrays, lib, state, fusable=fusable)
        program.gated = sched.gated
    for step in program.steps:
        step.finish()
    program.epoch = plan.epoch
    program.lane = lane.of(program) if plan.direct else None

    def renew() -> Program:  # the same plan for the communicator's new tags (a call before this one failed)
        fresh = build(state, args, algorithm, source, blocking=blocking, validate=validate, persistent=persistent,
                      planner=planner, cached=cached)
        return fresh.program

    program.renew = renew
    return plan


def _aliases(arrays: list[Any]) -> dict[int, tuple[int, int]] | None:
    """Buffers over the same memory (an in-place call: the input is the output, or a block of it), as
    ``{buffer: (the buffer it lies in, element offset there)}`` for :func:`mpicomm.schedule.early`; None when
    no two share memory."""
    send, recv = arrays[SEND], arrays[RECV]
    if send is None or recv is None or send.size == 0 or recv.size == 0 or send.dtype != recv.dtype:
        return None
    a, b = _address(send), _address(recv)
    if not (a < b + recv.nbytes and b < a + send.nbytes):
        return None
    offset, rest = divmod(a - b, send.dtype.itemsize)
    return {SEND: (RECV, offset)} if not rest else {SEND: (RECV, 0)}


def _empty(xp: Any, device: Any, count: int, dtype: Any) -> Any:
    if device is None:
        return xp.empty(count, dtype)
    with device:
        return xp.empty(count, dtype)


def _context(device: Any) -> Any:
    return device if device is not None else contextlib.nullcontext()


def _view(arrays: list[Any], v: View) -> Any:
    return arrays[v.buf][v.start : v.stop]


def _step(plan: Plan, r: Round, arrays: list[Any], lib: MPI.Intracomm, tag: int, xp: Any, device: Any,
          args: Args, planner: Callable[..., Plan] | None, blocking: bool) -> Step:
    step = Step()
    step.peers = tuple([("recv", peer) for peer, _ in r.recvs] + [("send", peer) for peer, _ in r.sends])
    step.tag = tag
    if r.recvs or r.sends:
        if plan.direct:
            reqs = []
            for peer, v in r.recvs:
                x = _view(arrays, v)
                reqs.append(lib.Recv_init([x, x.nbytes, MPI.BYTE] if x.size else _EMPTY, peer, tag))
            for peer, v in r.sends:
                x = _view(arrays, v)
                reqs.append(lib.Send_init([x, x.nbytes, MPI.BYTE] if x.size else _EMPTY, peer, tag))
            step.reqs = reqs
        else:
            step.post = _poster(lib, tag, [(peer, _view(arrays, v)) for peer, v in r.recvs],
                                [(peer, _view(arrays, v)) for peer, v in r.sends], device)
    if r.library:
        starts = [x.start for x in r.library]

        def post_library() -> tuple[list[MPI.Request], list[Callable[[], None]]]:
            return [start(lib) for start in starts], []

        step.post = post_library
        step.peers = tuple(("library", -1) for _ in starts)
    step.pre = tuple(op.fn for op in r.pre)
    ops = tuple(_op(op, arrays, xp, device, args) for op in r.ops)
    step.ops = tuple(fn for fn in ops if fn is not None)
    if r.syncs:
        from ..transport.memory import sync_condition

        step.syncs = tuple(sync_condition(plan.state, s) for s in r.syncs)
    if r.nested:
        if planner is None:
            raise RuntimeError(f"{plan}: a nested call needs a planner")
        makers = []
        for n in r.nested:
            made: list[Plan] = []  # the nested plan, built the first time the run reaches it
            plan.keep.append(made)

            def make(run: Run, n: Any = n, made: list[Plan] = made) -> Run:
                if not made:
                    made.append(_nested_plan(planner, n, arrays, args, blocking))
                return child_run(made[0])

            makers.append(make)
        step.nested = tuple(makers)
    return step


def child_run(plan: Plan) -> Run:
    """A started run of *plan* nested in another run (numbered as the communicator's next call)."""
    run = Run(plan.program, plan.state.next_seq())
    if _trace.ON:
        traced(run, plan, _trace.now())
    run.start()
    return run


def traced(run: Run, plan: Plan, began: float) -> None:
    """Record *run* as one trace event from *began* to its end (``MPICOMM_TRACE``), with the peers of its
    messages, and its error if it fails."""

    def done(r: Run) -> None:
        extra = {} if r.error is None else {"error": f"{type(r.error).__name__}: {r.error}"}
        peers = sorted({rank for step in r.program.steps for _, rank in step.peers if rank >= 0})
        _trace.record(plan.collective, "collective", began, _trace.now(), algorithm=plan.name_, source=plan.source,
                      bytes=Args(plan.collective, count=plan.count, dtype=plan.dtype).message_bytes(plan.p),
                      count=plan.count if plan.count >= 0 else None,
                      dtype=str(plan.dtype) if plan.dtype is not None else None, seq=r.seq, root=plan.root,
                      p=plan.p, peers=peers, **extra)

    if run.callbacks is None:
        run.callbacks = []
    run.callbacks.append(done)


def _nested_plan(planner: Callable[..., Plan], n: Any, arrays: list[Any], outer: Args, blocking: bool) -> Plan:
    send = None if n.send is None else _view(arrays, n.send)
    recv = None if n.recv is None else _view(arrays, n.recv)
    comm = n.comm.resolve() if hasattr(n.comm, "resolve") else n.comm
    return planner(comm, n.collective, send=send, recv=recv, op=outer.op, root=n.root, count=n.count,
                   algorithm=n.algorithm, blocking=blocking, recvcounts=n.recvcounts, recvdispls=n.recvdispls,
                   sendcounts=n.sendcounts, senddispls=n.senddispls)


def _same_memory(a: Any, b: Any) -> bool:
    return a.size == b.size and _address(a) == _address(b) and a.dtype == b.dtype


def _op(op: Any, arrays: list[Any], xp: Any, device: Any, args: Args) -> Callable[[Run], None] | None:
    kind = type(op)
    if kind is Copy:
        d, s = _view(arrays, op.dst), _view(arrays, op.src)
        if _same_memory(d, s):
            return None
        copyto = xp.copyto
        if device is None:
            return lane.with_record(lambda run: copyto(d, s), lane.copy(d, s))

        def copy_on_device(run: Run) -> None:
            with device:
                copyto(d, s)
            device.synchronize()

        return copy_on_device
    if kind is Combine:
        a, b, o = _view(arrays, op.a), _view(arrays, op.b), _view(arrays, op.out)
        red = args.op
        assert red is not None  # a Combine is a reducing collective's (readers and nested_args set its op)
        ufunc = getattr(xp, red.ufunc, None) if red is not None and red.ufunc else None
        if device is None:
            if ufunc is not None:
                record = lane.combine(red.code, a, b, o) if BUILTIN.get(red.name) is red else None
                return lane.with_record(lambda run: ufunc(a, b, out=o), record)
            return lambda run: red(a, b, o)

        def combine_on_device(run: Run) -> None:
            with device:
                if ufunc is not None:
                    ufunc(a, b, out=o)
                else:
                    red(a, b, o)
            device.synchronize()

        return combine_on_device
    if kind is Local:
        return op.fn
    raise TypeError(f"unknown schedule op {op!r}")


def _poster(lib: MPI.Intracomm, tag: int, recvs: list[tuple[int, Any]], sends: list[tuple[int, Any]],
            device: _device.Binding | None = None) -> Callable[[], tuple[list[MPI.Request], list[Callable[[], None]]]]:
    """Posting through :mod:`mpicomm.transport.buffers` (device arrays, staged transfers): fresh requests per run.
    Staging copies run inside *device*'s binding (its stream, synchronised by the transfers themselves)."""

    def post() -> tuple[list[MPI.Request], list[Callable[[], None]]]:
        requests, after = [], []
        with _context(device):
            for pairs, move, begin in ((recvs, buffers.recv_buffer, lib.Irecv),
                                       (sends, buffers.send_buffer, lib.Isend)):
                for peer, x in pairs:
                    if x.size:
                        moved = move(x)
                        after.append(moved.finish if device is None else _bound(device, moved.finish))
                        requests.append(begin(moved.buf, peer, tag))
                    else:
                        requests.append(begin(_EMPTY, peer, tag))
        return requests, after

    return post


def _bound(device: _device.Binding, fn: Callable[[], None]) -> Callable[[], None]:
    """*fn* run inside *device*'s binding (a staged receive's copy back, on whichever thread completes it)."""

    def run() -> None:
        with device:
            fn()

    return run


def _expand(plan: Plan, sched: Schedule, arrays: list[Any], lib: MPI.Intracomm, tag: int, xp: Any, device: Any,
            args: Args, planner: Any, blocking: bool) -> Step:
    """A last step that builds the rest of a data-dependent schedule at run time (``Schedule.then``) and runs it
    as a nested program on this communicator."""
    step = Step("then")

    def make(run: Run) -> Run:
        b = Builder(sched.collective, sched.algorithm, sched.rank, sched.p, sched.dtype, root=args.root, op=args.op,
                    count=args.count, state=plan.state)
        b.buffers = list(sched.buffers)
        b.rounds = [Round()]
        sched.then(b)  # type: ignore[misc]
        more = b.schedule()
        if more.then is not None:
            raise RuntimeError(f"{plan}: rounds built at run time set Schedule.then again; one level is supported")
        extra = list(arrays)
        for count, dt in more.buffers[len(extra):]:
            extra.append(_empty(xp, device, count, dt))
        steps = [_step(plan, r, extra, lib, tag, xp, device, args, planner, blocking) for r in more.rounds]
        shared = _aliases(extra)
        for k in range(len(steps) - 1):
            steps[k].early = early(more.rounds[k], more.rounds[k + 1], shared)
        for step in steps:
            step.finish()
        program = Program(steps, plan, plan.state)
        program.buffers = extra
        program.epoch = plan.state.epoch
        child = Run(program, run.seq)
        child.callbacks = [_free_requests]  # built for this run only
        child.start()
        return child

    step.nested = (make,)
    return step.finish()


# ---------------------------------------------------------------- the agreement


def _aligned(sched: Schedule, kinds: list[tuple[str, int]], small: bool = True) -> list[int] | None:
    """The indices of the rounds that can carry the butterfly's words, when the schedule's first
    communicating rounds are exactly the butterfly (same peers, one message each way, of at most
    :data:`FUSE_BYTES` unless *small* is false); else None."""
    rounds = [i for i, r in enumerate(sched.rounds) if r.communicates]
    if len(rounds) < len(kinds):
        return None
    chosen = []
    for i, (sends, recvs) in zip(rounds, agreement.rounds_of(kinds)):
        r = sched.rounds[i]
        if r.syncs or r.nested or r.pre:
            return None
        if [peer for peer, _ in r.sends] != sends or [peer for peer, _ in r.recvs] != recvs:
            return None
        for _, v in r.sends + r.recvs:
            if small and v.size * sched.buffers[v.buf][1].itemsize > FUSE_BYTES:
                return None
        chosen.append(i)
    return chosen


_SYMMETRIC = frozenset({"allreduce", "allgather", "alltoall", "reduce_scatter_block", "scan", "exscan"})
_CHECK_UP_TO = 8  # ranks for which every rank's schedule is built to decide whether the words can be fused


def _fusable(state: State, args: Args, algorithm: Any, sched: Schedule, blocking: bool) -> bool:
    """Whether every rank's first rounds are the agreement's butterfly with small messages - a decision every
    rank must make alike: from the algorithm's declaration, or (small p, equal counts) from every rank's
    schedule, which each rank builds."""
    p = state.size
    if sched.gated or args.xp not in (None, np):
        return False
    kinds = agreement.butterfly(state.rank, p)
    if algorithm.butterfly and _aligned(sched, kinds, small=False) is None:
        _misdeclared(algorithm)
    if _aligned(sched, kinds) is None:
        return False
    if algorithm.butterfly:
        return True
    if args.collective not in _SYMMETRIC or p > _CHECK_UP_TO:
        return False
    for r in range(p):
        if r != state.rank:
            other = schedule_of(state, args, algorithm, blocking, rank=r)
            if _aligned(other, agreement.butterfly(r, p)) is None:
                return False
    return True


def _misdeclared(algorithm: Any) -> None:
    raise RuntimeError(f"{algorithm.collective} algorithm {algorithm.name!r} is registered with butterfly=True, but "
                       f"its first rounds are not the agreement's butterfly; fix the registration")


def _agreement(plan: Plan, args: Args, sched: Schedule, arrays: list[Any], lib: MPI.Intracomm, state: State,
               suspect: bool = False, fusable: bool = False) -> list[Args]:
    """Give the program its agreement: fused into its first rounds where they are the butterfly, else beside.
    *suspect*: this rank only takes part (its arguments have a problem, or it runs no algorithm). Returns the
    one-item list of the call the words describe (``plan.retell`` replaces it)."""
    program = plan.program
    rank, p = state.rank, state.size
    words = agreement.digest(args, plan.name_, p, rank, plan.persistent, suspect=suspect)
    pristine = words.copy()
    plan.words = pristine
    flag = [False]  # the words changed during a run (never in the compiled lane, which hands such a run back)
    kinds = agreement.butterfly(rank, p)
    stagings: list[np.ndarray] = []

    def on_start(run: Run) -> None:
        if flag[0]:
            np.copyto(words, pristine)
            for s in stagings:
                np.copyto(s, pristine)
            flag[0] = False

    quiet = agreement.agrees(pristine)  # this rank's own words already say "agreed": unchanged, they still do
    said = [args]  # the call the words describe (another one after a retell)

    def retell(new: Args, made: np.ndarray | None = None) -> bool:
        # The words of another call of the plan's shape (the plan's fields already say it; *made*: those words,
        # where another plan made them already): written in place, so the compiled records that point at them
        # stay; refused where the words' own verdict would change
        fresh = agreement.digest(new, plan.name_, p, rank, plan.persistent, suspect=suspect) if made is None else made
        if agreement.agrees(fresh) != quiet:
            return False
        said[0] = new
        for target in (pristine, words, *stagings):
            np.copyto(target, fresh)
        flag[0] = False
        return True

    def check(run: Run) -> Program | None:
        if (quiet and not flag[0]) or agreement.agrees(words):
            return None
        traffic = run.abandon()
        state.new_epoch()  # what was in flight can never match a later call
        row = agreement.describe(said[0], plan.name_, p, rank, plan.persistent)
        row["traffic"] = traffic  # (settle receives what nothing matched)
        if agreement.settle(lib, f"{plan.collective} #{run.seq}", row) == "library":
            return library_program(state, said[0], plan)  # some rank's spec only the library takes: all hand it over
        return None

    program.on_start = on_start
    program.check = check
    plan.retell = retell
    if not kinds:  # one rank: the executor judges at the start
        program.agree = None
        program.verdict_at = -1
        return said
    aligned = _aligned(sched, kinds) if fusable and plan.direct and not suspect else None
    agree_tag = state.tags(plan.epoch)[1]
    if aligned is not None:
        aliased = _aliasable(sched, aligned)
        for (kind, _peer), i in zip(kinds, aligned):
            _fuse(plan.program.steps[i], sched.rounds[i], arrays, lib, agree_tag, words, kind, flag, stagings, plan,
                  aliased, args)
        for i in aligned:  # the words a fused step sends are those combined by the step before it
            if i > 0:
                plan.program.steps[i - 1].early = False
        program.verdict_at = aligned[-1]
        return said
    rounds = []
    for kind, peer in kinds:
        got = np.zeros(agreement.WORDS, np.int64)
        plan.keep.append(got)
        reqs = []
        if kind in ("recv", "fold", "both"):
            reqs.append(lib.Recv_init([got, _WORD_BYTES, MPI.BYTE], peer, agree_tag))
        if kind in ("send", "both"):
            reqs.append(lib.Send_init([words, _WORD_BYTES, MPI.BYTE], peer, agree_tag))
        verify = () if kind == "send" else lane.check(got, words, kind) if quiet else None
        rounds.append(AgreeStep(reqs, lane.with_record(agreement.combiner(words, got, kind, flag), verify), peer,
                                receives=kind in ("recv", "fold", "both"), tag=agree_tag))
    program.agree = rounds
    return said


def _aliasable(sched: Schedule, fused: list[int]) -> set[int]:
    """Scratch buffers that can live inside the fused steps' receive buffers: each is received whole by fused
    steps only, and read only by the ops of the step that received it (so no copy out is needed)."""
    targets = None
    for i in fused:
        whole = {v.buf for _, v in sched.rounds[i].recvs
                 if v.buf >= 2 and v.start == 0 and v.stop == sched.buffers[v.buf][0]}
        targets = whole if targets is None else targets & whole
    if not targets:
        return set()
    fused_set = set(fused)
    for i, r in enumerate(sched.rounds):
        used = {v.buf for _, v in r.sends} | _buffers_of(r.ops) | {x.buf for s in r.pre for x in (s.reads or ())}
        if i in fused_set:
            targets -= {v.buf for _, v in r.sends}
        else:
            targets -= used | {v.buf for _, v in r.recvs}
    return targets


def _buffers_of(ops: Sequence[Any]) -> set[int]:
    out: set[int] = set()
    for op in ops:
        if type(op) is Copy:
            out |= {op.dst.buf, op.src.buf}
        elif type(op) is Combine:
            out |= {op.a.buf, op.b.buf, op.out.buf}
        else:
            out |= set(range(2, 1 << 30))  # opaque: anything (never aliased)
    return out


def agreement_only(state: State, args: Args, name: str, persistent: int | None, suspect: bool = True) -> Plan:
    """A plan that runs no algorithm, only the agreement (this rank's words marked suspect, unless not): a rank
    whose arguments have a problem still takes part, so every rank raises the same error."""
    plan = Plan(state, args, name, "?")
    plan.persistent = persistent
    sched = Builder(args.collective, name, state.rank, state.size, args.dtype or _UINT8).schedule()
    plan.program.steps = [Step("nothing: this rank's arguments have a problem" if suspect else "the agreement")]
    plan.program.epoch = plan.epoch
    said = _agreement(plan, args, sched, [None, None], state.library_comm, state, suspect=suspect)
    plan.program.steps[0].finish()
    plan.program.lane = lane.of(plan.program)  # (where the words' checks are records: not for a suspect rank)
    # queued behind a call that fails (a nonblocking one): the communicator's tags change before it starts
    # (with the call it checks then: a kept probe is recast for each creation)
    plan.program.renew = lambda: agreement_only(state, said[0], plan.name_, plan.persistent, suspect).program
    return plan


def creation_probe(state: State, args: Args, plan: Plan, kept: Plan | None) -> Plan:
    """The agreement-only plan that checks a new persistent request's words (*plan*'s) at its creation: *kept*,
    an earlier one of this communicator and epoch, recast for this call where its compiled checks fit, or a
    new one. It keeps no reference to the caller's host arrays."""
    own = args.detached(_raw(args.send), _raw(args.recv))
    if kept is not None and not kept.busy and kept.epoch == state.epoch \
            and kept.recast(own, plan.name_, plan.persistent, plan.words):
        return kept
    return agreement_only(state, own, plan.name_, plan.persistent, suspect=False)


def library_plan(state: State, args: Args, validate: bool, persistent: int | None) -> Plan:
    """A plan that hands the call to the MPI library's own nonblocking collective once the ranks agreed (a
    buffer spec only the library takes: a derived datatype, ``MPI.BOTTOM``)."""
    plan = Plan(state, args, "library", "library")
    plan.persistent = persistent
    plan.program = library_program(state, args, plan)
    if validate:
        sched = Builder(args.collective, "library", state.rank, state.size, args.dtype or _UINT8).schedule()
        _agreement(plan, args, sched, [None, None], state.library_comm, state)
        plan.program.gated = True
    plan.program.renew = lambda: library_plan(state, args, validate, persistent).program  # (as agreement_only)
    return plan


def library_program(state: State, args: Args, label: Any) -> Program:
    """A program whose one step is the MPI library's own nonblocking collective (``args.native``)."""
    step = Step("the MPI library's own collective")
    native = args.native
    if native is None or getattr(native, "__name__", "") == "_kept_away":  # a kept plan: its plain arrays
        def native() -> MPI.Request:
            return library_request(args, state.comm)

    def post() -> tuple[list[MPI.Request], list[Callable[[], None]]]:
        return [native()], []

    step.post = post
    step.peers = (("library", -1),)
    program = Program([step.finish()], label, state)
    program.epoch = state.epoch
    return program


def _fuse(step: Step, r: Round, arrays: list[Any], lib: MPI.Intracomm, tag: int, words: np.ndarray, kind: str,
          flag: list[bool], stagings: list[np.ndarray], plan: Plan, aliased: set[int], args: Args) -> None:
    """Rebuild a step's messages so each carries the agreement's words in front of its data. Each callable
    carries its record for the compiled lane; the words' check only where this rank's own words say "agreed"
    (then words equal to its own, received from every peer, are the verdict)."""
    quiet = agreement.agrees(words)
    reqs = []
    pre: list[Callable[[Run], None]] = list(step.pre)
    copy_out: list[Callable[[Run], None]] = []
    got_words = None
    local = arrays
    for peer, v in r.recvs:
        x = _view(arrays, v)
        staging = np.zeros(_WORD_BYTES + x.nbytes, np.uint8)
        plan.keep.append(staging)
        got_words = staging[:_WORD_BYTES].view(np.int64)
        data = staging[_WORD_BYTES:].view(x.dtype) if x.size else None
        reqs.append(lib.Recv_init([staging, staging.nbytes, MPI.BYTE], peer, tag))
        if data is not None and v.buf in aliased:  # the step's ops read the data where it landed
            local = list(local) if local is arrays else local
            local[v.buf] = data
        elif data is not None:
            def copy_data(run: Run, d: Any = x, s: Any = data) -> None:
                np.copyto(d, s)

            copy_out.append(lane.with_record(copy_data, lane.copy(x, data)))
    if local is not arrays:
        step.ops = tuple(fn for fn in (_op(op, local, np, None, args) for op in r.ops) if fn is not None)
    for peer, v in r.sends:
        x = _view(arrays, v)
        staging = np.zeros(_WORD_BYTES + x.nbytes, np.uint8)
        plan.keep.append(staging)
        head = staging[:_WORD_BYTES].view(np.int64)
        head[:] = words
        stagings.append(head)
        data = staging[_WORD_BYTES:].view(x.dtype) if x.size else None

        def pack(run: Run, head: np.ndarray = head, d: Any = data, s: Any = x) -> None:
            if flag[0]:
                np.copyto(head, words)
            if d is not None:
                np.copyto(d, s)

        # (the lane's runs start with the words as made - on_start restores them - and never change them, so
        # the header already holds them: only the data is copied)
        pre.append(lane.with_record(pack, lane.copy(data, x) if data is not None else ()))
        reqs.append(lib.Send_init([staging, staging.nbytes, MPI.BYTE], peer, tag))
    step.reqs = reqs
    step.post = None
    step.tag = tag  # (the agreement's: its words ride in front)
    step.pre = tuple(pre)
    if got_words is not None:
        check = lane.check(got_words, words, kind) if quiet else None
        step.words = (lane.with_record(agreement.combiner(words, got_words, kind, flag), check),)
    step.ops = tuple(copy_out) + step.ops
    step.early = False


