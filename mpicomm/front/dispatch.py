"""The dispatcher: from one call's arguments to a run of its plan.

Every entry point - ``Comm.Allreduce``, ``Comm.Iallreduce``, ``Comm.Allreduce_init``,
``mpicomm.allreduce``, the torch backend - reads its arguments into an
:class:`~mpicomm.plan.args.Args` (:mod:`.readers`) and calls :func:`start`
(or :func:`persistent`), which walks down once:

1. **selection** - the algorithm (:func:`mpicomm.selection.choose_for`: the call, the
   communicator, ``MPICOMM_<COLLECTIVE>_ALGORITHM``, the measured rules, the default rules),
   kept per communicator for facts seen before;
2. **plan** - the compiled plan of this signature (:mod:`mpicomm.plan.compile`),
   kept per communicator (at most :data:`PLANS_KEPT` holding :data:`KEPT_BYTES`,
   by collective, algorithm, counts, element type, op, root and the buffers'
   addresses); built the first time a signature is seen, never collectively -
   except that a small blocking call on arrays not seen before runs the staged
   plan of its shape (:data:`STAGE_MOST`);
3. **executor** - a run of the plan: on this thread to its end for a blocking
   call (or behind the communicator's queued runs), queued for a nonblocking
   or persistent one (:mod:`mpicomm.engine.progress`).

Validation (``MPICOMM_VALIDATE``, on by default) travels inside the plan's
messages (:mod:`mpicomm.plan.agreement`): a rank whose arguments have a problem
still runs the agreement's part of the call, so every rank raises the same
:class:`ArgumentError`. With it off a local problem raises at once, on the
rank that has it.

:func:`planner` builds the plans of nested calls (a hierarchical algorithm's
levels) the same way, without validation.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any, Literal, overload

import mpi4py
import numpy as np
from mpi4py import MPI

from .. import config, registry
from .. import trace as _trace
from ..catalogue import COLLECTIVES, REDUCING, family
from ..engine import progress
from ..engine.executor import Run, complete, in_callback
from ..engine.requests import CollectiveRequest, pending_elsewhere
from ..engine.watchdog import Watchdog
from ..ops import Op, resolve
from ..plan import agreement
from ..plan.args import Args, ArgumentError
from ..plan.compile import Plan, agreement_only, build, creation_probe, library_plan, traced
from ..selection import choose_for
from ..state import State, as_state
from ..transport.buffers import array_module

__all__ = ["start", "persistent_plan", "planner", "execute", "ArgumentError", "Args", "PLANS_KEPT"]

log = logging.getLogger("mpicomm")

PLANS_KEPT = 64  #: compiled plans a communicator keeps (the oldest is dropped first)
#: The most bytes of their own arrays (scratch, staging) the kept plans of a communicator hold: a plan for a
#: large call, whose compile costs little beside its transfer, does not keep gigabytes alive after the call.
KEPT_BYTES = 256 << 20
#: A blocking call on host arrays of at most this many bytes (send and receive together), whose arrays have no
#: kept plan, runs the kept plan of its shape on that plan's own arrays, copied in and out (a few hundred
#: nanoseconds), instead of compiling a plan bound to its arrays (tens to hundreds of microseconds: prepared
#: requests, scratch, the agreement). The second call on the same arrays compiles theirs, which the fast path
#: then runs with no copies. So a loop that makes new arrays every call pays neither.
STAGE_MOST = 64 * 1024
#: Staged plans of one shape for nonblocking calls in flight at once (each call holds its plan's own arrays until
#: it completes, when its result is copied out); a call beyond them compiles a plan for its arrays.
STAGED_IN_FLIGHT = 4
SEEN_KEPT = 256  #: signatures of staged calls remembered (the oldest is forgotten first)
_UINT8 = np.dtype(np.uint8)


# ---------------------------------------------------------------- plans


def _address(x: Any) -> int:
    if x is None or x.size == 0:
        return 0
    if type(x) is np.ndarray:
        return x.__array_interface__["data"][0]
    return -1  # not a host array: not kept


def _signature(args: Args, chosen: registry.Algorithm, validate: bool, blocking: bool) -> tuple | None:
    """The key a plan is kept under, or None when it is not kept (device buffers, staged transfers)."""
    send, recv = args.send, args.recv
    a, b = _address(send), _address(recv)
    if a < 0 or b < 0 or config.transfer_mode() == "staged":
        return None
    op = args.op
    return (args.collective, chosen.name, chosen.tunables(), validate, blocking, args.count, args.dtype,
            None if op is None else id(op),
            args.root, args.in_place, args.recvcounts, args.recvdispls, args.sendcounts, args.senddispls,
            a, 0 if send is None else send.nbytes, b, 0 if recv is None else recv.nbytes)


def _keep(state: State, key: tuple, plan: Plan) -> None:
    """Keep *plan* under *key*: the oldest kept plans are dropped while there are more than :data:`PLANS_KEPT`
    or their own arrays (scratch, staging) take more than :data:`KEPT_BYTES` (the newest plan is always kept),
    with the fast path's entries that run them."""
    plans = state.plans
    plans[key] = plan
    plan.held = sum(getattr(a, "nbytes", 0) for a in plan.keep) + sum(getattr(a, "nbytes", 0) for a in plan.stage or ())
    total = sum(kept.held for kept in plans.values())
    dropped = []
    for k in list(plans):
        if len(plans) <= PLANS_KEPT and total <= KEPT_BYTES or k == key:
            break
        total -= plans[k].held
        dropped.append(plans.pop(k))
    if dropped:
        fast = state.fast
        for k in [k for k, entry in fast.items() if any(entry.plan is d for d in dropped)]:
            del fast[k]


def plan_for(state: State, args: Args, algorithm: str | None, blocking: bool, *, validate: bool | None = None,
             persistent: int | None = None, again: bool | None = None) -> Plan:
    """The plan of this rank's call (kept for later calls with the same signature, where it can be).

    A rank whose arguments have a problem (or whose selection failed) gets a
    plan that only takes part in the agreement, so that every rank raises
    the same error; with validation off the problem raises here. *again*: a
    blocking call on plain arrays, seen before (compile a plan for them) or
    not (a staged plan may run); None: seen before if the arrays' addresses were.
    """
    collective = args.collective
    if validate is None:
        validate = config.validate() and collective != "barrier"
    if state.poisoned is not None:
        args.fail(RuntimeError(state.poisoned))
    chosen: registry.Algorithm | None = None
    source = "?"
    try:
        chosen, source = choose_for(state, args, algorithm, blocking)
    except ValueError as exc:
        args.fail(exc)
    if args.problem is not None or chosen is None or (args.unsupported is not None and args.native is None):
        if not validate:
            if args.problem is not None:
                raise args.problem
            raise TypeError(f"{collective}: {args.unsupported}, and this call has no MPI library form")
        return agreement_only(state, args, chosen.name if chosen is not None else str(algorithm), persistent)
    if args.unsupported is not None:
        return library_plan(state, args, validate, persistent)
    key = _signature(args, chosen, validate, blocking)
    if key is not None and persistent is None:
        plan = state.plans.get(key)
        if plan is not None and plan.epoch == state.epoch:  # (kept by a thread that raced a failure: rebuilt)
            return plan
    try:
        if key is not None and persistent is None and not (key in state.seen if again is None else again):
            staged = _staged(state, args, chosen, source, key, validate, again is None, blocking)
            if staged is not None:
                return staged
        plan = build(state, args, chosen, source, blocking=blocking, validate=validate, persistent=persistent,
                     planner=planner, cached=key is not None)
    except (ValueError, TypeError) as exc:  # the algorithm cannot describe this call: a problem of this rank's
        if not validate:
            raise
        args.fail(exc)
        return agreement_only(state, args, chosen.name, persistent)
    if key is not None and persistent is None:
        _keep(state, key, plan)
    elif key is not None:
        plan.key = key  # (a persistent request's: kept under it once freed, see retire)
    return plan


def _seen_again(state: State, key: tuple, objects: tuple) -> bool:
    """Whether a call on these very objects (*key*: the fast path's) ran staged before."""
    checks = state.seen.get(key)
    return checks is not None and _same(checks, objects)


def _saw(state: State, key: tuple, checks: tuple) -> None:
    """Remember that a call ran staged: by its arrays' identities (*checks*: :func:`_identities`), or by their
    addresses (*key*: the plan's signature, *checks* empty)."""
    seen = state.seen
    if len(seen) >= SEEN_KEPT:
        del seen[next(iter(seen))]
    seen[key] = checks


def _staged(state: State, args: Args, chosen: registry.Algorithm, source: str, key: tuple,
            validate: bool, by_address: bool, blocking: bool = True) -> Plan | None:
    """The kept plan of this call's shape on its own arrays (see :data:`STAGE_MOST`), or None: the call's arrays
    are larger, overlap in part, the algorithm uses node-shared memory, their shape's plan does not run in the
    compiled lane, or (nonblocking) :data:`STAGED_IN_FLIGHT` calls of the shape are in flight (then, or once they
    are seen again, a plan is compiled for them)."""
    if chosen.single_node or chosen.composite or chosen.blocking_only:
        return None  # (shared memory and levels: building a plan reserves node-shared state)
    send, recv = args.send, args.recv
    size = (0 if send is None else send.nbytes) + (0 if recv is None else recv.nbytes)
    if not 0 < size <= STAGE_MOST:
        return None
    alias = send is recv
    if not alias and send is not None and recv is not None and _overlap(send, recv):
        return None
    if by_address:  # (a call on plain arrays is remembered by its arrays' identities once it ran)
        _saw(state, key, ())
    shape = key[:-4] + ("staged", key[-3], key[-1], alias)  # (the signature without the arrays' addresses)
    for slot in range(1 if blocking else STAGED_IN_FLIGHT):
        name = shape + (slot,)
        plan = state.plans.get(name)
        if plan is not None and plan.epoch == state.epoch:
            if plan.busy:
                continue  # (a nonblocking call of this shape in flight holds it)
            break
        own_send = None if send is None else np.empty_like(send)
        own_recv = own_send if alias else None if recv is None else np.empty_like(recv)
        plan = build(state, args.detached(own_send, own_recv), chosen, source, blocking=blocking,
                     validate=validate, planner=planner, cached=True)
        plan.stage = (own_send, own_recv)
        _keep(state, name, plan)
        break
    else:
        return None
    return plan if plan.program.lane is not None else None


def planner(state: State, collective: str, *, send: Any = None, recv: Any = None, op: Any = None, root: int = 0,
            count: int = -1, algorithm: str | None = None, blocking: bool = True, recvcounts: Any = None,
            recvdispls: Any = None, sendcounts: Any = None, senddispls: Any = None) -> Plan:
    """The plan of a nested call: *collective* on *state*'s communicator with arrays *send*/*recv* (views of the
    outer call's buffers), chosen as any call there but never validated (the outer call was)."""
    args = nested_args(state, collective, send, recv, op, root, sendcounts, senddispls, recvcounts, recvdispls, count)
    chosen, source = choose_for(state, args, algorithm, blocking, nested=True)
    return build(state, args, chosen, source, blocking=blocking, validate=False, planner=planner)


def _packed(counts: Any) -> tuple[int, ...]:
    displs, at = [], 0
    for c in counts:
        displs.append(at)
        at += c
    return tuple(displs)


_EQUAL_BLOCKS = frozenset({"bcast", "reduce", "allreduce", "scan", "exscan", "gather", "allgather", "scatter",
                           "alltoall", "reduce_scatter_block"})


def _overlap(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if a is None or b is None or a.size == 0 or b.size == 0:
        return False
    from ..transport.buffers import overlap

    return overlap(a, b) is not None


def nested_args(state: State, collective: str, send: Any, recv: Any, op: Any, root: int, sendcounts: Any,
                senddispls: Any, recvcounts: Any, recvdispls: Any, count: int) -> Args:
    """The :class:`Args` of a nested call (flat arrays already checked; counts in elements)."""
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
    fam = family(collective)
    p = state.size
    if not 0 <= root < p:
        raise ValueError(f"root {root} is not a rank of the {p}-rank communicator; use 0..{p - 1}")
    if fam == "bcast":
        send = recv = recv if recv is not None else send
    args = Args(collective)
    args.send, args.recv, args.root, args.count = send, recv, root, count
    array = send if send is not None else recv
    if array is not None:
        args.xp = array_module(array)
        args.dtype = array.dtype
        if args.xp is not np:
            args.device = array.device
    if collective in REDUCING:
        args.op = resolve("sum" if op is None else op)
    args.in_place = fam != "bcast" and send is not None and recv is not None and _overlap(send, recv)
    if count < 0 and collective in _EQUAL_BLOCKS:
        if collective == "alltoall":
            args.count = int(send.size) // p if send is not None else 0
        elif collective in ("scatter", "reduce_scatter_block"):
            args.count = int(recv.size) if recv is not None else 0
        else:
            args.count = int(send.size) if send is not None else int(recv.size) if recv is not None else 0
    n = args.count
    if collective in ("gather", "allgather", "alltoall"):
        recvcounts, recvdispls = (n,) * p, tuple(i * n for i in range(p))
    if collective in ("scatter", "alltoall"):
        sendcounts, senddispls = (n,) * p, tuple(i * n for i in range(p))
    if collective == "reduce_scatter_block":
        recvcounts = (n,) * p
    if sendcounts is not None:
        args.sendcounts = tuple(sendcounts)
        args.senddispls = _packed(args.sendcounts) if senddispls is None else tuple(senddispls)
    if recvcounts is not None:
        args.recvcounts = tuple(recvcounts)
        args.recvdispls = _packed(args.recvcounts) if recvdispls is None else tuple(recvdispls)
    return args


# ---------------------------------------------------------------- running


def _concurrent(state: State) -> RuntimeError:
    """The error for a second thread entering a collective on *state*; poisons the communicator.

    Two threads calling collectives on one communicator pair up their calls
    differently on each rank, so results would mix. The call is refused before
    it runs; every later call on the communicator fails too (with validation
    on, the same error on every rank at the next call).
    """
    level = {MPI.THREAD_SINGLE: "MPI_THREAD_SINGLE", MPI.THREAD_FUNNELED: "MPI_THREAD_FUNNELED",
             MPI.THREAD_SERIALIZED: "MPI_THREAD_SERIALIZED", MPI.THREAD_MULTIPLE: "MPI_THREAD_MULTIPLE"}
    message = (f"collectives on one communicator from two threads at once (rank {state.rank}: thread "
               f"{threading.current_thread().name!r} entered while another was inside a call or had a "
               f"nonblocking or persistent collective pending on it): each rank would pair the threads' calls "
               f"differently and results would mix. Use one communicator per thread (comm.Dup() for each "
               f"thread, created in the same order on every rank), or one lock around every call and wait. "
               f"This communicator now refuses further collectives. (mpi4py requested "
               f"{mpi4py.rc.thread_level!r}; the MPI library provides {level.get(MPI.Query_thread(), '?')})")
    if state.poisoned is None:
        state.poisoned = message
    return RuntimeError(message)


def enter(state: State) -> bool:
    """Take *state*'s call lock for this thread (RuntimeError, poisoning it, when another thread holds it or has
    collectives queued on it); True when taken (release it with ``state.lock.release()``).

    A call made by a completion callback (a future's callback chaining the next collective, as DDP's
    PowerSGD hook does) takes no lock: it runs on whichever thread finished the earlier collective, and is
    queued behind everything already called on the communicator (nonblocking only: see :func:`execute`).
    """
    if in_callback():
        return False
    if not state.lock.acquire(False):
        raise _concurrent(state)
    q = state.queue
    if q.runs and q.owner != threading.get_ident():
        state.lock.release()
        raise _concurrent(state)
    return True


@overload
def start(state: State | Any, args: Args, algorithm: str | None, blocking: Literal[False],
          fast: None = None) -> CollectiveRequest: ...


@overload
def start(state: State | Any, args: Args, algorithm: str | None, blocking: bool, fast: tuple | None = None) -> Any: ...


def start(state: State | Any, args: Args, algorithm: str | None, blocking: bool, fast: tuple | None = None) -> Any:
    """Run the collective *args* describes on *state*'s communicator: blocking, return its result; else return
    a request (see the module docstring).

    *fast*: ``(key, objects)`` of a blocking call whose arguments are plain
    arrays (and ops): when its plan is kept, the call is remembered in
    ``state.fast`` under *key* (the objects' identities), so the next call
    with the same objects runs the plan without reading its arguments again
    (:class:`Fast`). *state*: the communicator's state (or a ``Comm``).
    """
    if type(state) is not State:
        state = as_state(state)
    if state.freed:  # (through another wrapper of the same communicator: this one holds a Freed)
        state.check_live()
    locked = enter(state)
    try:
        began = _trace.now() if _trace.ON else 0.0
        # a call on plain arrays: compile a plan for them when these very arrays were seen before (a repeat), else
        # the staged plan of their shape may run (see STAGE_MOST)
        again = _seen_again(state, *fast) if fast is not None else None
        if not locked:
            again = True  # (a completion callback's call: never staged, its copies would need the call lock)
        try:
            plan = plan_for(state, args, algorithm, blocking, again=again)
        except BaseException as exc:
            if _trace.ON:
                _event(state, args, began, state.collectives, error=f"{type(exc).__name__}: {exc}")
            raise
        stage = plan.stage
        if stage is None or not locked:  # (not locked: a completion callback's call, which execute refuses)
            result = execute(state, plan, args.result, blocking, began, None if blocking else args)
            if fast is not None and plan.cached and args.problem is None and stage is None:
                _remember(state, plan, *fast)
            return result
        own_send, own_recv = stage  # a staged plan: the call's arrays copied in, the result out
        if own_send is not None:
            np.copyto(own_send, args.send)
        if own_recv is not None and own_recv is not own_send:
            np.copyto(own_recv, args.recv)
        if not blocking:  # (its result is copied out by whichever thread ends the run, before it is seen done)
            plan.busy = True
            try:
                return execute(state, plan, args.result, False, began, args, _copied_out(plan, own_recv, args.recv))
            except BaseException:
                plan.busy = False  # (no run was queued)
                raise
        result = execute(state, plan, args.result, blocking, began)
        if own_recv is not None:
            np.copyto(args.recv, own_recv)
        if fast is not None:
            _saw(state, fast[0], _identities(fast[1]))
        return result
    finally:
        if locked:
            state.lock.release()


def _copied_out(plan: Plan, own: Any, recv: Any) -> Callable[[Run, bool], None]:
    """The end of a staged nonblocking call's run: the result copied from the plan's array *own* into the call's
    *recv* (when the run succeeded), and the plan free for the next call of its shape."""

    def end(run: Run, ok: bool) -> None:
        try:
            if ok and own is not None:
                np.copyto(recv, own)
        finally:
            plan.busy = False

    return end


# ---------------------------------------------------------------- the fast path: a repeated call on the same arrays


class Fast:
    """A blocking call seen before, by the identity of its arguments: run its plan at once.

    Valid while every array it was made for is alive and unchanged in type and
    size (weak references: it never keeps an array alive), and the settings
    that decide the plan (``MPICOMM_VALIDATE``, ``MPICOMM_<COLLECTIVE>_ALGORITHM``,
    ``MPICOMM_TIMEOUT``, ``MPICOMM_TRANSFER``, the communicator's defaults, the
    tags) have not changed; else :meth:`run` returns False and the caller takes
    the full path.
    """

    __slots__ = ("state", "plan", "program", "checks", "env", "watch", "epoch")

    def __init__(self, state: State, plan: Plan, objects: tuple, env: tuple):
        self.state = state
        self.plan = plan
        self.program = plan.program
        self.checks = _identities(objects)
        self.env = env
        self.watch = config.timeout() is not None
        self.epoch = state.epoch

    def run(self, *objects: Any) -> bool:
        """Run the plan if this entry is still valid for *objects*; False when the full path must run."""
        if not _same(self.checks, objects):
            return False
        if _environment(self.plan.collective) != self.env:
            return False
        state = self.state
        if not state.lock.acquire(False):
            return False
        try:
            if state.queue.runs or state.poisoned is not None or _trace.ON or state.epoch != self.epoch:
                return False
            seq = state.collectives
            state.collectives = seq + 1
            run = Run(self.program, seq)
            state.recent.append(run)
            if not run.launch(not self.watch):  # (a compiled lane waits inside, without the GIL)
                complete(run, Watchdog.start() if self.watch else None)
            if run.error is not None:
                raise run.error
            return True
        finally:
            state.lock.release()


def _identities(objects: tuple) -> tuple:
    """What :func:`_same` checks: a weak reference to each array with its type and size, or the object itself
    (``MPI.IN_PLACE``, an op: kept)."""
    return tuple((weakref.ref(x), x.dtype, x.size) if type(x) is np.ndarray else (None, x, None) for x in objects)


def _same(checks: tuple, objects: tuple) -> bool:
    """Whether *objects* are the very objects *checks* were made of (:func:`_identities`), arrays unchanged in type
    and size."""
    for (ref, kind, size), x in zip(checks, objects):
        if ref is None:
            if x is not kind:
                return False
        elif ref() is not x or x.dtype is not kind or x.size != size:
            return False
    return True


_ENV = getattr(config, "_DATA", None)
_ENV_KEYS: dict[str, Any] = {}


def _environment(collective: str = "") -> tuple:
    """The raw values of the settings a kept plan depends on (cheap: compared by identity)."""
    if _ENV is None:
        return (object(),)  # no fast look-up of the environment here: never equal, so never fast
    get = _ENV.get
    keys = _ENV_KEYS.get(collective)
    if keys is None:
        names = ["MPICOMM_VALIDATE", "MPICOMM_TIMEOUT", "MPICOMM_TRANSFER"]
        if collective:
            names.append(f"MPICOMM_{collective.upper()}_ALGORITHM")
        encode = config._ENCODE
        assert encode is not None  # os.environ has encodekey wherever it has _data (os._Environ)
        keys = _ENV_KEYS[collective] = tuple(encode(n) for n in names)
    return tuple(map(get, keys))


def _remember(state: State, plan: Plan, key: tuple, objects: tuple) -> None:
    """Keep a :class:`Fast` entry for a call whose arguments are all plain arrays, ``MPI.IN_PLACE`` or ops."""
    for x in objects:
        if type(x) is not np.ndarray and x is not MPI.IN_PLACE and not isinstance(x, (MPI.Op, str, Op)):
            return
    fast = state.fast
    if len(fast) >= PLANS_KEPT:
        del fast[next(iter(fast))]
    fast[key] = Fast(state, plan, objects, _environment(plan.collective))


def execute(state: State, plan: Plan, result: Callable[[], Any], blocking: bool, began: float = 0.0,
            keep: Any = None, on_end: Callable[[Run, bool], None] | None = None) -> Any:
    """Run *plan* once (the call lock held): to its end for a blocking call, else queued (returns a request);
    *keep*: what the run must keep alive until it ends (a nonblocking call's arrays: a kept plan holds none), and
    its steps may read (:attr:`Run.keep <mpicomm.engine.executor.Run.keep>`);
    *on_end*: the run's :attr:`~mpicomm.engine.executor.Run.on_end`."""
    seq = state.collectives
    state.collectives = seq + 1
    run = Run(plan.program, seq)
    run.on_end = on_end
    run.keep = keep
    state.recent.append(run)
    q = state.queue
    if _trace.ON:
        traced(run, plan, began)
    if blocking:
        if in_callback():
            raise RuntimeError(f"{plan.name(seq)}: a blocking collective inside a completion callback would wait "
                               f"for the collectives queued behind the one that just finished; start it "
                               f"nonblocking (Iallreduce, async_op=True) and chain on its request")
        others = pending_elsewhere(q)
        if not q.runs and others is None:
            watchdog = Watchdog.start()
            if not run.launch(watchdog is None):
                complete(run, watchdog)
        else:
            progress.submit(q, run)
            progress.wait(run, q, Watchdog.start(), others)
        if run.error is not None:
            raise run.error
        if state.poisoned is not None:
            raise RuntimeError(state.poisoned)
        return result()
    if not in_callback():
        q.owner = threading.get_ident()
    progress.submit(q, run)
    return CollectiveRequest(run, q, result)


def persistent_plan(state: State, args: Args, algorithm: str | None,
                    make: Callable[[int], Plan] | None = None) -> Plan:
    """The plan of a persistent request (collective over the communicator: the ranks agree on it now, and it
    takes the communicator's next persistent number, part of every start's agreement); *make*: builds it from
    that number instead of the ordinary compile (a reproducible sum's)."""
    state.check_live()
    locked = enter(state)
    try:
        number = state.persistent
        state.persistent += 1
        validate = config.validate() and args.collective != "barrier"
        plan = make(number) if make is not None else _freed_plan(state, args, algorithm, validate, number)
        if plan is None:
            plan = plan_for(state, args, algorithm, False, validate=validate, persistent=number)
        if validate:
            _creation_agreement(state, args, plan)
        return plan
    finally:
        if locked:
            state.lock.release()


def _freed_plan(state: State, args: Args, algorithm: str | None, validate: bool, number: int) -> Plan | None:
    """The plan a freed persistent request of this call's signature left (:func:`retire`), renumbered as
    request *number*; None where there is none (a compile makes one)."""
    if state.poisoned is not None or args.problem is not None or args.unsupported is not None:
        return None
    try:
        chosen, _ = choose_for(state, args, algorithm, False)
    except ValueError:
        return None
    key = _signature(args, chosen, validate, False)
    plan = None if key is None else state.plans.pop(("freed",) + key, None)
    if plan is None or plan.epoch != state.epoch:
        return None
    plan.renumber(args, number)
    return plan


def retire(plan: Plan) -> None:
    """A freed persistent request's *plan*: kept for the next request of its signature on the same memory (its
    arrays are bound by address), or released where it cannot be (device arrays, an older epoch, a
    communicator in use by another thread)."""
    state = plan.state
    if plan.key is None or plan.epoch != state.epoch or state.freed or not state.lock.acquire(False):
        plan.release()
        return
    try:
        old = state.plans.get(("freed",) + plan.key)
        if old is not None:
            old.release()
        _keep(state, ("freed",) + plan.key, plan)
    finally:
        state.lock.release()


def _creation_agreement(state: State, args: Args, plan: Plan) -> None:
    """One agreement on the persistent request's words before any start, no data: a bad argument or a
    mismatch raises the same error on every rank at creation. Its plan is kept, and recast for the next
    creation on the communicator."""
    if args.problem is not None or plan.words is None:
        probe = agreement_only(state, args, plan.name_, plan.persistent, suspect=args.problem is not None)
        key = None
    else:
        key = ("creation agreement", agreement.agrees(plan.words))
        probe = creation_probe(state, args, plan, state.plans.get(key))
    run = Run(probe.program, state.collectives)
    probe.busy = True  # (a creation from a callback while this one runs makes its own)
    try:
        run.start()
        if not run.poll():
            complete(run, Watchdog.start())
    finally:
        probe.busy = False
    if key is not None and probe.epoch == state.epoch:
        _keep(state, key, probe)
    if run.error is not None:
        raise run.error


# ---------------------------------------------------------------- the trace event of a failed call


def _event(state: State, args: Args, began: float, seq: int, **extra: Any) -> None:
    """The trace event of a call that failed before it ran (its plan could not be made)."""
    _trace.record(args.collective, "collective", began, _trace.now(), algorithm="?", source="?",
                  bytes=args.message_bytes(state.size), count=args.count if args.count >= 0 else None,
                  dtype=str(args.dtype) if args.dtype is not None else None, seq=seq, root=args.root, p=state.size,
                  peers=[], **extra)
