"""The dispatcher: from one collective call's arguments to a running algorithm.

Every entry point - ``Comm.Allreduce``, ``Comm.Iallreduce``, ``mpicomm.allreduce``
- reads its arguments into an :class:`Args` (flat arrays, counts, op, root,
or the local problem that makes them unusable) and calls :func:`start`, which

1. chooses the algorithm (:func:`mpicomm.registry.choose`: the call, the
   communicator, ``MPICOMM_<COLLECTIVE>_ALGORITHM``, then the fitted model or
   the table; a choice is kept per communicator for facts seen before);
2. unless validation is off (``MPICOMM_VALIDATE=0``), makes the ranks agree
   (:func:`mpicomm.coll.agreement.agreement`): one small allreduce of a digest of what each rank was
   given; only when digests differ or some rank has a problem, a second
   exchange of the full descriptions finds what is wrong. Any local problem or
   disagreement raises the same :class:`ArgumentError` on every rank, before
   any data moves;
3. runs the algorithm's step generator - to completion for a blocking call, or
   as an :class:`mpicomm.Request` for a nonblocking one.

Compositions (an algorithm that runs another collective on a
sub-communicator) call :func:`nested` from their step generator.
With ``MPICOMM_TRACE`` set, every call is one event of the timeline
(:mod:`mpicomm.trace`), from its start to its completion.

The algorithms' signatures, one per collective (arrays are flat, contiguous,
of one dtype; counts and displacements are in elements)::

    barrier(call)
    bcast(call, buf)                                  # root: call.root
    reduce(call, send, recv)                          # recv None off the root
    allreduce(call, send, recv)
    scan(call, send, recv), exscan(call, send, recv)
    gather(call, send, recv, counts, displs)          # gatherv too (its counts/displs are None off the root)
    scatter(call, send, recv, counts, displs)         # scatterv too (its send/counts/displs: None off the root)
    allgather(call, send, recv, counts, displs)       # allgatherv too
    alltoall(call, send, sendcounts, senddispls, recv, recvcounts, recvdispls)   # alltoallv too
    reduce_scatter(call, send, recv, counts)          # reduce_scatter_block: counts all equal

gather and scatter (not the v-forms) pass the equal counts on every rank.
In place: for reductions ``send is recv`` when the caller asked for in place;
for gather/scatter/allgather the own block of the big buffer *is* the small
one. An algorithm registered with ``in_place=False`` never sees an alias: the
dispatcher copies the input first.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

import mpi4py
import numpy as np
from mpi4py import MPI

from .. import config, registry
from .. import trace as _trace
from ..buffers import array_module
from ..catalogue import COLLECTIVES, REDUCING, ROOTED, family
from ..ops import resolve
from ..requests import Request, Step, Steps, run
from ..state import State, as_state
from .agreement import agreement
from .args import Args, ArgumentError, selection_bytes
from .call import Call, _address

__all__ = ["COLLECTIVES", "ROOTED", "REDUCING", "ArgumentError", "Args", "start", "nested", "agreement",
           "selection_bytes"]

log = logging.getLogger("mpicomm")

_ALGORITHM_FAMILY = {c: family(c) for c in COLLECTIVES}
_UINT8 = np.dtype(np.uint8)


# ---------------------------------------------------------------- selection

_CHOICES_KEPT = 512  # per communicator; the cache is emptied when it is full


def _facts(state: State, args: Args, nbytes: int | None, blocking: bool = True, nested: bool = False) -> dict:
    """What the selection may look at: facts every rank of the communicator knows alike."""
    return {
        "p": state.size,
        "bytes": nbytes,
        "count": args.count if args.count >= 0 else None,
        "commutative": args.op is None or args.op.commutative,
        "op": args.op.name if args.op is not None else None,
        "nodes": state.nodes,
        "ppn": state.ppn,
        "device": args.xp is not None and args.xp is not np,
        "machine": state.machine,
        "decisions": state.decisions,
        "blocking": blocking,
        "nested": nested,
    }


def _choose(state: Any, args: Args, algorithm: str | None, blocking: bool = True,
            nested: bool = False) -> tuple[registry.Algorithm, str]:
    """The algorithm for this call and where the choice came from (call, communicator, environment, model, table).

    The choice depends only on the names given, the environment setting and
    the facts, so it is kept per communicator for facts seen before (keyed by
    the table's rules too: assign a new rule list to change them).
    """
    state = as_state(state)
    collective = args.collective
    default = state.defaults.get(collective)
    setting = config.algorithm_setting(collective)
    nbytes = selection_bytes(args, state.size)
    op = args.op
    cacheable = algorithm is None or type(algorithm) is str
    if cacheable:
        key = (collective, algorithm, default, setting, nbytes, args.count, op is None or op.commutative,
               None if op is None else op.name, args.xp is not None and args.xp is not np, blocking, nested,
               id(registry.SELECTION.get(collective)))
        known = state.choices.get(key)
        if known is not None:
            if log.isEnabledFor(logging.DEBUG):  # as the registry logs the choices it makes
                log.debug("%s: algorithm %s (from the %s)", collective, known[0].name, known[1])
            return known
    chosen = registry.choose(collective, algorithm, default, _facts(state, args, nbytes, blocking, nested))
    if cacheable:
        if len(state.choices) >= _CHOICES_KEPT:
            state.choices.clear()
        state.choices[key] = chosen
    return chosen


def _call(state: State, args: Args, chosen: registry.Algorithm | None, source: str) -> Call:
    """The :class:`Call` of *args* (takes the communicator's next sequence number and tag)."""
    call = Call(state, args.collective, args.xp or np, args.dtype if args.dtype is not None else _UINT8, args.op,
                args.root, args.device)
    if chosen is not None:
        call.algorithm = chosen.name
        call.source = source
    return call


# ---------------------------------------------------------------- start


def start(state: Any, args: Args, algorithm: str | None, blocking: bool) -> Any:
    """Run the collective *args* describes on *state*'s communicator (blocking: return its result; else a Request).

    *state*: the communicator's :class:`~mpicomm.state.State` (a ``Comm`` or
    an mpi4py communicator is looked up).
    """
    if type(state) is not State:
        state = as_state(state)
    lock = state.lock
    if not lock.acquire(False):  # another thread is inside a call on this communicator
        raise _concurrent(state)
    try:
        return _start(state, args, algorithm, blocking)
    finally:
        lock.release()


def _start(state: State, args: Args, algorithm: str | None, blocking: bool) -> Any:
    began = _trace.now() if _trace.ON else 0.0
    chosen: registry.Algorithm | None = None
    source = "?"
    if state.poisoned is not None:
        args.fail(RuntimeError(state.poisoned))
    try:
        chosen, source = _choose(state, args, algorithm, blocking)
    except ValueError as exc:
        args.fail(exc)
    call = _call(state, args, chosen, source)
    call.blocking = blocking
    call.count = args.count
    state.recent.append(call)  # the flight recorder (the watchdog prints it)
    if chosen is None:
        call.algorithm = str(algorithm)
    elif blocking:
        call.scratch = _scratch(state, args, chosen)
    validate = config.validate() and args.collective != "barrier"
    if validate:
        steps = _validated(call, args, chosen)
    else:
        if args.problem is not None:
            call.status = "failed"
            raise args.problem
        if args.unsupported is not None:
            return _native_now(call, args, blocking, began)
        steps = _bind(call, args, chosen)  # type: ignore[arg-type]
    if _trace.ON:
        steps = _traced(call, args, steps, began)
    if blocking:
        try:
            run(steps, label=call)
        except BaseException:
            call.status = "failed"
            raise
        if state.poisoned is not None:  # another thread tried to enter meanwhile: this call's pairing is suspect
            call.status = "failed"
            raise RuntimeError(state.poisoned)
        call.status = "done"
        return args.result()
    return Request(_then(steps, args.result, call), call)


def _concurrent(state: State) -> RuntimeError:
    """The error for a second thread entering a collective on *state*; poisons the communicator.

    Two threads calling collectives on one communicator pair up their calls
    differently on each rank (whichever thread comes first takes the next
    sequence number), so results silently mix. This thread's call is refused
    before it takes a sequence number; every later call on the communicator
    fails too (with validation on, the same error on every rank at the next
    call), since a call already paired may belong to the other thread.
    """
    level = {MPI.THREAD_SINGLE: "MPI_THREAD_SINGLE", MPI.THREAD_FUNNELED: "MPI_THREAD_FUNNELED",
             MPI.THREAD_SERIALIZED: "MPI_THREAD_SERIALIZED", MPI.THREAD_MULTIPLE: "MPI_THREAD_MULTIPLE"}
    message = (f"collectives on one communicator from two threads at once (rank {state.rank}: thread "
               f"{threading.current_thread().name!r} entered while another was inside a call): each rank would "
               f"pair the threads' calls differently and results would mix. Use one communicator per thread "
               f"(comm.Dup() for each thread, created in the same order on every rank), or one lock around "
               f"every call. This communicator now refuses further collectives. (mpi4py requested "
               f"{mpi4py.rc.thread_level!r}; the MPI library provides {level.get(MPI.Query_thread(), '?')})")
    if state.poisoned is None:
        state.poisoned = message
    return RuntimeError(message)


_PLANS_KEPT = 32  # blocking-call signatures whose scratch a communicator keeps (emptied when full)


def _scratch(state: State, args: Args, chosen: registry.Algorithm) -> list:
    """The scratch list of the plan of this blocking call's signature (made the first time it is seen).

    The signature is everything that decides what the algorithm allocates:
    collective, algorithm, count, per-rank counts, element type, root, module
    and device. Blocking calls on one communicator never overlap, so one
    list per signature serves every call of it.
    """
    key = (args.collective, chosen.name, args.count, args.dtype, args.root, args.recvcounts, args.sendcounts,
           args.xp, None if args.device is None else getattr(args.device, "id", args.device))
    plans = state.plans
    kept = plans.get(key)
    if kept is None:
        if len(plans) >= _PLANS_KEPT:
            plans.clear()
        kept = plans[key] = []
    return kept


def _then(steps: Steps, result: Callable[[], Any], call: Call) -> Steps:
    try:
        yield from steps
    except BaseException:
        call.status = "failed"
        raise
    call.status = "done"
    return result()


def _native_now(call: Call, args: Args, blocking: bool, began: float) -> Any:
    """Hand the call to the MPI library (validation off); traced when blocking (else it ends in the library)."""
    if args.native is None:
        raise TypeError(f"{args.collective}: {args.unsupported}, and this call has no MPI library form")
    request = args.native()
    args.library = True
    if blocking:
        request.Wait()
        call.status = "done"
        if _trace.ON:
            _event(call, args, began, set())
        return None
    return request


def _validated(call: Call, args: Args, chosen: registry.Algorithm | None) -> Steps:
    """Steps: the agreement, then the library's collective or the algorithm."""
    native = yield from agreement(call, args)
    if native:
        args.library = True
        yield Step([args.native()], peers=[("library", -1)])  # type: ignore[misc]  # every rank has one: agreed
        return None
    if chosen is None:  # the selection failed: recorded as this rank's problem, raised by the agreement above
        raise args.problem or ValueError(f"{call.label}: no algorithm selected")
    return (yield from _bind(call, args, chosen))


def _copy(call: Call, x: Any) -> Any:
    if call._device is None:
        return x.copy()
    with call._device:
        return x.copy()


def _bind(call: Call, args: Args, algorithm: registry.Algorithm) -> Steps:
    """The algorithm's step generator for these arguments (bound to the collective's signature)."""
    family = _ALGORITHM_FAMILY[call.collective]
    send, recv = args.send, args.recv
    if args.in_place and not algorithm.in_place and send is not None:
        send = _copy(call, send)  # the algorithm may not read from what it writes
    fn = algorithm.steps
    if family in ("allreduce", "reduce", "scan", "exscan"):
        return fn(call, send, recv)
    if family == "bcast":
        return fn(call, recv)
    if family in ("gather", "allgather"):
        return fn(call, send, recv, args.recvcounts, args.recvdispls)
    if family == "scatter":
        return fn(call, send, recv, args.sendcounts, args.senddispls)
    if family == "alltoall":
        return fn(call, send, args.sendcounts, args.senddispls, recv, args.recvcounts, args.recvdispls)
    if family == "reduce_scatter":
        return fn(call, send, recv, args.recvcounts)
    return fn(call)  # barrier


# ---------------------------------------------------------------- nested calls


def nested(comm: Any, collective: str, *, send: Any = None, recv: Any = None, op: Any = None, root: int = 0,
           sendcounts: Any = None, senddispls: Any = None, recvcounts: Any = None, recvdispls: Any = None,
           count: int = -1, algorithm: str | None = None, blocking: bool = True) -> Steps:
    """Steps: run *collective* on *comm* from inside another collective's step generator (``yield from`` it).

    For compositions (a hierarchical algorithm runs a reduce on the node's
    communicator, an allreduce among the node leaders...). The arrays are
    flat and already checked, and the ranks of *comm* already agreed on the
    outer call, so there is no validation; the algorithm is chosen as for any
    call on *comm* (*algorithm*, or auto), the call takes *comm*'s next
    sequence number and tag, and a trace event is recorded when tracing is on.

    Arguments follow the algorithm signatures (see the module docstring):
    *send*/*recv* (bcast: either is the buffer), *op* (an :class:`Op`, a
    name, an ``MPI.Op``; default sum), *root*, per-rank counts and
    displacements in elements (displacements default to packed; the non-v
    forms derive equal counts from *count* or from the arrays). *blocking*:
    whether the outer call is blocking (pass the outer ``call.blocking``, so a
    nonblocking call never nests an algorithm that runs blocking calls only).
    *comm* is a communicator's :class:`~mpicomm.state.State` (as the
    hierarchy's levels are) built beforehand: building one is collective,
    never inside a step generator.
    """
    began = _trace.now() if _trace.ON else 0.0
    state = as_state(comm)
    args = _nested_args(state, collective, send, recv, op, root, sendcounts, senddispls, recvcounts, recvdispls, count)
    chosen, source = _choose(state, args, algorithm, blocking, nested=True)
    call = _call(state, args, chosen, source)
    call.blocking = blocking
    steps = _bind(call, args, chosen)
    if _trace.ON:
        steps = _traced(call, args, steps, began)
    return (yield from steps)


def _packed(counts: Any) -> tuple[int, ...]:
    displs, at = [], 0
    for c in counts:
        displs.append(at)
        at += c
    return tuple(displs)


def _overlap(a: Any, b: Any) -> bool:
    """Whether arrays *a* and *b* share memory (the own block of an in-place gather...)."""
    if a is b:
        return True
    if a is None or b is None or a.size == 0 or b.size == 0:
        return False
    pa, pb = _address(a), _address(b)
    return pa < pb + b.nbytes and pb < pa + a.nbytes


def _nested_args(state: State, collective: str, send: Any, recv: Any, op: Any, root: int, sendcounts: Any,
                 senddispls: Any, recvcounts: Any, recvdispls: Any, count: int) -> Args:
    family = _ALGORITHM_FAMILY.get(collective)
    if family is None:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
    p = state.size
    if not 0 <= root < p:
        raise ValueError(f"root {root} is not a rank of the {p}-rank communicator; use 0..{p - 1}")
    if family == "bcast":
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
    args.in_place = family != "bcast" and send is not None and recv is not None and _overlap(send, recv)
    if count < 0 and collective in _EQUAL_BLOCKS:
        if collective == "alltoall":
            args.count = int(send.size) // p if send is not None else 0
        elif collective in ("scatter", "reduce_scatter_block"):  # the block each rank receives
            args.count = int(recv.size) if recv is not None else 0
        else:
            args.count = int(send.size) if send is not None else 0
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


_EQUAL_BLOCKS = frozenset({"bcast", "reduce", "allreduce", "scan", "exscan", "gather", "allgather", "scatter",
                           "alltoall", "reduce_scatter_block"})


# ---------------------------------------------------------------- the trace event


def _traced(call: Call, args: Args, steps: Steps, began: float) -> Steps:
    """*steps*, recorded as one trace event from *began* to their end, with the peers of the steps they ran."""
    peers: set = set()
    try:
        step = next(steps)
        while True:
            if type(step) is Step and getattr(step, "owner", None) is None:
                step.owner = call  # a nested call's steps belong to it, not to the calls around it
                peers.update(step.peers)
            try:
                statuses = yield step
            except GeneratorExit:
                steps.close()
                _event(call, args, began, peers, cancelled=True)
                raise
            step = steps.send(statuses)
    except StopIteration as stop:
        _event(call, args, began, peers)
        return stop.value
    except Exception as exc:
        _event(call, args, began, peers, error=f"{type(exc).__name__}: {exc}")
        raise


def _event(call: Call, args: Args, began: float, peers: set, **extra: Any) -> None:
    _trace.record(
        call.collective, "collective", began, _trace.now(),
        algorithm="library" if args.library else call.algorithm, source=call.source,
        bytes=selection_bytes(args, call.p), count=args.count if args.count >= 0 else None,
        dtype=str(args.dtype) if args.dtype is not None else None, seq=call.seq, root=call.root, p=call.p,
        peers=sorted({rank for _, rank in peers if rank >= 0}), **extra,
    )


