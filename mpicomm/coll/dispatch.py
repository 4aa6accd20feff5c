"""The dispatcher: from one collective call's arguments to a running algorithm.

Every entry point - ``Comm.Allreduce``, ``Comm.Iallreduce``, ``mpicomm.allreduce``
- reads its arguments into an :class:`Args` (flat arrays, counts, op, root,
or the local problem that makes them unusable) and calls :func:`start`, which

1. chooses the algorithm (:func:`mpicomm.registry.choose`: the call, the
   communicator, ``MPICOMM_<COLLECTIVE>_ALGORITHM``, then the fitted model or
   the table; a choice is kept per communicator for facts seen before);
2. unless validation is off (``MPICOMM_VALIDATE=0``), makes the ranks agree
   (:func:`agreement`): one small allreduce of a digest of what each rank was
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

import hashlib
import logging
import zlib
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
from mpi4py import MPI

from .. import config, registry
from .. import trace as _trace
from ..buffers import array_module
from ..ops import Op, resolve
from ..requests import Request, Step, Steps, run
from .call import Call, _address

if TYPE_CHECKING:
    from ..comm import Comm

__all__ = ["COLLECTIVES", "ArgumentError", "Args", "start", "nested", "agreement", "selection_bytes"]

log = logging.getLogger("mpicomm")

COLLECTIVES = (
    "barrier", "bcast", "reduce", "allreduce", "gather", "gatherv", "scatter", "scatterv", "allgather",
    "allgatherv", "alltoall", "alltoallv", "reduce_scatter", "reduce_scatter_block", "scan", "exscan",
)
ROOTED = frozenset({"bcast", "reduce", "gather", "gatherv", "scatter", "scatterv"})
REDUCING = frozenset({"reduce", "allreduce", "reduce_scatter", "reduce_scatter_block", "scan", "exscan"})
_FAMILY = {"gatherv": "gather", "scatterv": "scatter", "allgatherv": "allgather", "alltoallv": "alltoall",
           "reduce_scatter_block": "reduce_scatter"}
_ALGORITHM_FAMILY = {c: _FAMILY.get(c, c) for c in COLLECTIVES}
_INDEX = {c: i for i, c in enumerate(COLLECTIVES)}
_UINT8 = np.dtype(np.uint8)


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


_OP_FITS: set[tuple[Op, np.dtype]] = set()  # (op, dtype) pairs already found defined


# ---------------------------------------------------------------- selection


def selection_bytes(args: Args, p: int) -> int | None:
    """The message size the selection table compares (None where ranks cannot know it alike).

    Whole vector for bcast/reduce/allreduce/scan; the block for gather/scatter;
    everything gathered for allgather(v); each rank's whole send for alltoall;
    the whole input for reduce_scatter(_block).
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


_PER_CALL = frozenset({"bcast", "reduce", "allreduce", "scan", "exscan", "gather", "scatter"})
_PER_RANK = frozenset({"allgather", "alltoall", "reduce_scatter_block"})
_CHOICES_KEPT = 512  # per communicator; the cache is emptied when it is full


def _facts(comm: "Comm", args: Args, nbytes: int | None, blocking: bool = True) -> dict:
    """What the selection may look at: facts every rank of *comm* knows alike."""
    state = comm._state
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
    }


def _choose(comm: "Comm", args: Args, algorithm: str | None, blocking: bool = True) -> tuple[registry.Algorithm, str]:
    """The algorithm for this call and where the choice came from (call, communicator, environment, model, table).

    The choice depends only on the names given, the environment setting and
    the facts, so it is kept per communicator for facts seen before (keyed by
    the table's rules too: assign a new rule list to change them).
    """
    state = comm._state
    collective = args.collective
    default = state.defaults.get(collective)
    setting = config.algorithm_setting(collective)
    nbytes = selection_bytes(args, state.size)
    op = args.op
    cacheable = algorithm is None or type(algorithm) is str
    if cacheable:
        key = (collective, algorithm, default, setting, nbytes, args.count, op is None or op.commutative,
               None if op is None else op.name, args.xp is not None and args.xp is not np, blocking,
               id(registry.SELECTION.get(collective)))
        known = state.choices.get(key)
        if known is not None:
            if log.isEnabledFor(logging.DEBUG):  # as the registry logs the choices it makes
                log.debug("%s: algorithm %s (from the %s)", collective, known[0].name, known[1])
            return known
    chosen = registry.choose(collective, algorithm, default, _facts(comm, args, nbytes, blocking))
    if cacheable:
        if len(state.choices) >= _CHOICES_KEPT:
            state.choices.clear()
        state.choices[key] = chosen
    return chosen


def _call(comm: "Comm", args: Args, chosen: registry.Algorithm | None, source: str) -> Call:
    """The :class:`Call` of *args* on *comm* (takes the communicator's next sequence number and tag)."""
    call = Call(comm, args.collective, args.xp or np, args.dtype if args.dtype is not None else _UINT8, args.op,
                args.root, args.device)
    if chosen is not None:
        call.algorithm = chosen.name
        call.source = source
    return call


# ---------------------------------------------------------------- start


def start(comm: "Comm", args: Args, algorithm: str | None, blocking: bool) -> Any:
    """Run the collective *args* describes (blocking: return its result; else return a Request)."""
    began = _trace.now() if _trace.ON else 0.0
    chosen: registry.Algorithm | None = None
    source = "?"
    try:
        chosen, source = _choose(comm, args, algorithm, blocking)
    except ValueError as exc:
        args.fail(exc)
    call = _call(comm, args, chosen, source)
    call.blocking = blocking
    if chosen is None:
        call.algorithm = str(algorithm)
    validate = config.validate() and args.collective != "barrier"
    if validate:
        steps = _validated(call, args, chosen)
    else:
        if args.problem is not None:
            raise args.problem
        if args.unsupported is not None:
            return _native_now(call, args, blocking, began)
        steps = _bind(call, args, chosen)  # type: ignore[arg-type]
    if _trace.ON:
        steps = _traced(call, args, steps, began)
    if blocking:
        run(steps, label=call)
        return args.result()
    return Request(_then(steps, args.result), call)


def _then(steps: Steps, result: Callable[[], Any]) -> Steps:
    yield from steps
    return result()


def _native_now(call: Call, args: Args, blocking: bool, began: float) -> Any:
    """Hand the call to the MPI library (validation off); traced when blocking (else it ends in the library)."""
    if args.native is None:
        raise TypeError(f"{args.collective}: {args.unsupported}, and this call has no MPI library form")
    request = args.native()
    args.library = True
    if blocking:
        request.Wait()
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


def nested(comm: "Comm", collective: str, *, send: Any = None, recv: Any = None, op: Any = None, root: int = 0,
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
    *comm* must be an :class:`mpicomm.Comm` built beforehand (building one is
    collective: never inside a step generator).
    """
    began = _trace.now() if _trace.ON else 0.0
    args = _nested_args(comm, collective, send, recv, op, root, sendcounts, senddispls, recvcounts, recvdispls, count)
    chosen, source = _choose(comm, args, algorithm, blocking)
    call = _call(comm, args, chosen, source)
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


def _nested_args(comm: "Comm", collective: str, send: Any, recv: Any, op: Any, root: int, sendcounts: Any,
                 senddispls: Any, recvcounts: Any, recvdispls: Any, count: int) -> Args:
    family = _ALGORITHM_FAMILY.get(collective)
    if family is None:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
    p = comm._state.size
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


# ---------------------------------------------------------------- agreement (validation mode)

_MAGIC = 0x6D7069636F6D6D  # "mpicomm"
_WORDS = 13
_NAME = 32  # bytes for each of: algorithm name, dtype, op name
_TEXT = 400  # bytes of this rank's problem, if any
_HEAD = 3 * _NAME + _TEXT  # a row: the names and the problem text, then the words (int64)
(_W_MAGIC, _W_COLL, _W_ALG, _W_OP, _W_COMM, _W_DTYPE, _W_ITEM, _W_COUNT, _W_ROOT, _W_PROBLEM, _W_NATIVE, _W_VLEN,
 _W_CAN_NATIVE) = range(_WORDS)
_CROSS = frozenset({"gatherv", "scatterv", "alltoallv"})  # counts checked across ranks: always the full rows
_DIGESTS: dict[tuple, np.ndarray] = {}  # what a rank sends in the first round, by what it describes
_DTYPE_NAMES: dict[np.dtype, str] = {}


def _code(text: str) -> int:
    return zlib.crc32(text.encode())


def _dtype_name(dtype: np.dtype | None) -> str:
    if dtype is None:
        return ""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = dtype.str + str(dtype.descr)
    return name


def _vector(args: Args, p: int, rank: int) -> list[int]:
    """The per-rank counts a v-variant must agree on (see :func:`_check_vectors`)."""
    c = args.collective
    zeros = [0] * p

    def mine(counts: tuple[int, ...] | None) -> list[int]:
        return list(counts) if counts is not None and len(counts) == p else zeros

    if c == "gatherv":
        return [args.send.size if args.send is not None else -1] + (mine(args.recvcounts) if rank == args.root else zeros)
    if c == "scatterv":
        return [args.recv.size if args.recv is not None else -1] + (mine(args.sendcounts) if rank == args.root else zeros)
    if c == "allgatherv":
        return [args.send.size if args.send is not None else -1] + mine(args.recvcounts)
    if c == "alltoallv":
        return mine(args.sendcounts) + mine(args.recvcounts)
    if c == "reduce_scatter":
        return mine(args.recvcounts)
    return []


def _digest(call: Call, args: Args, vector: list[int], suspect: bool) -> np.ndarray:
    """This rank's first-round words: ``[d, ~d, -suspect, ~row bytes]`` (d: a 64-bit digest of the call).

    d covers everything the full comparison looks at that must be equal on
    every rank; what may differ between correct ranks (an allgatherv rank's
    own send size) is checked locally instead, and a failed local check, a
    problem or a cross-rank count check sets *suspect*. The MIN-allreduce of
    the words then says, on every rank alike, whether all digests are equal
    (min d == max d), whether anyone is suspect, and how long the longest row
    of the second round is.
    """
    c = call.collective
    op = args.op
    shared = vector[1:] if c == "allgatherv" else vector  # the own send size is checked locally
    key = (_INDEX[c], call.algorithm, 0 if op is None else op.code, -1 if op is None else int(op.commutative),
           _dtype_name(args.dtype), args.count, args.root, args.unsupported is not None, args.native is not None,
           tuple(shared))
    words = _DIGESTS.get(key)
    if words is None:
        d = int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "little", signed=True)
        words = np.array([d, ~d, 0, ~(_HEAD + 8 * (_WORDS + len(vector)))], np.int64)
        words.flags.writeable = False
        if len(_DIGESTS) >= 1024:
            _DIGESTS.clear()
        _DIGESTS[key] = words
    if suspect:
        words = words.copy()
        words[2] = -1
    return words


def agreement(call: Call, args: Args) -> Steps:
    """Steps: make sure every rank was given the same call; raise :class:`ArgumentError` on all ranks if not.

    Returns True when some rank's buffer spec needs the MPI library (then all
    ranks hand the call to it). Cost: one allreduce of 32 bytes. Only when
    the digests differ, a rank has a problem or the collective's counts must
    be checked across ranks (gatherv, scatterv, alltoallv), a second round
    exchanges every rank's full description (about 560 bytes, + 16·p for the
    v-variants; an allgather by point-to-point messages with this call's tag)
    and compares them to name what is wrong.
    """
    p, rank = call.p, call.rank
    c = call.collective
    vector = _vector(args, p, rank) if c in _VECTORED else []
    suspect = (args.problem is not None or c in _CROSS or (args.unsupported is not None and args.native is None)
               or (c == "allgatherv" and vector[0] != vector[1 + rank]))
    mine = _digest(call, args, vector, suspect)
    every = np.empty(4, np.int64)
    yield Step([call.lib.Iallreduce(mine, every, MPI.MIN)], peers=[("all", -1)])
    low, not_high, unsuspect, not_size = every.tolist()
    if low == ~not_high and unsuspect == 0:
        return args.unsupported is not None  # the same on every rank: it is part of the digest
    rows = yield from _exchange_rows(call, args, vector, ~not_size)
    messages = _disagreements(call, args, rows)
    if messages:
        raise ArgumentError(f"{call.collective} #{call.seq}: " + "; ".join(messages))
    return any(words[_W_NATIVE] for words, _, _ in rows)


_VECTORED = frozenset({"gatherv", "scatterv", "allgatherv", "alltoallv", "reduce_scatter"})


def _pack(call: Call, args: Args, vector: list[int], size: int) -> np.ndarray:
    """This rank's full description: the names and problem text, then the words; *size* bytes."""
    row = np.zeros(size, np.uint8)
    names = [call.algorithm, "" if args.dtype is None else str(args.dtype), "" if args.op is None else args.op.name]
    for i, name in enumerate(names):
        raw = name.encode()[:_NAME]
        row[i * _NAME : i * _NAME + len(raw)] = np.frombuffer(raw, np.uint8)
    if args.problem is not None:
        raw = str(args.problem).encode()[: _TEXT - 4]
        row[3 * _NAME : 3 * _NAME + len(raw)] = np.frombuffer(raw, np.uint8)
    words = row[_HEAD : _HEAD + 8 * (_WORDS + len(vector))].view(np.int64)
    words[_W_MAGIC] = _MAGIC
    words[_W_COLL] = _INDEX[call.collective]
    words[_W_ALG] = _code(call.algorithm)
    words[_W_OP] = 0 if args.op is None else args.op.code
    words[_W_COMM] = -1 if args.op is None else int(args.op.commutative)
    words[_W_DTYPE] = -1 if args.dtype is None else _code(_dtype_name(args.dtype))
    words[_W_ITEM] = -1 if args.dtype is None else args.dtype.itemsize
    words[_W_COUNT] = args.count
    words[_W_ROOT] = args.root
    words[_W_PROBLEM] = args.problem is not None
    words[_W_NATIVE] = args.unsupported is not None
    words[_W_VLEN] = len(vector)
    words[_W_CAN_NATIVE] = args.native is not None
    words[_WORDS:] = vector
    return row


def _unpack(row: np.ndarray) -> tuple[np.ndarray, list[str], str]:
    text = row[:_HEAD].tobytes()
    vlen = int(row[_HEAD + 8 * _W_VLEN : _HEAD + 8 * (_W_VLEN + 1)].view(np.int64)[0])
    words = row[_HEAD : _HEAD + 8 * (_WORDS + vlen)].view(np.int64)
    names = [text[i * _NAME : (i + 1) * _NAME].rstrip(b"\0").decode(errors="replace") for i in range(3)]
    return words, names, text[3 * _NAME :].rstrip(b"\0").decode(errors="replace")


def _exchange_rows(call: Call, args: Args, vector: list[int], size: int) -> Steps:
    """Steps: every rank's full description (padded to *size* bytes), as unpacked rows in rank order.

    Point-to-point messages with the call's own tag (an allgather algorithm
    from the table), so the exchange never has to be ordered with other
    collectives on the communicator: the ranks only know they need it once the
    first round has completed, which happens at different times.
    """
    p = call.p
    mine = _pack(call, args, vector, size)
    every = np.zeros(p * size, np.uint8)
    counts = (size,) * p
    displs = tuple(r * size for r in range(p))
    gather = registry.lookup("allgather", "bruck").steps
    yield from gather(call.for_bytes(), mine, every, counts, displs)
    return [_unpack(every[r * size : (r + 1) * size]) for r in range(p)]


def _differ(rows: list, index: int, what: str, show: Callable[[int, Any], str],
            unknown: int | None = None) -> str | None:
    values = [words[index] for words, _, _ in rows]
    if len({v for v in values if v != unknown}) <= 1:
        return None
    groups: dict[int, list[int]] = {}
    for r, v in enumerate(values):
        if v != unknown:
            groups.setdefault(int(v), []).append(r)
    parts = [f"{show(ranks[0], v)} on rank(s) {_ranks(ranks)}" for v, ranks in groups.items()]
    return f"ranks disagree on {what}: " + ", ".join(parts)


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks)) if len(ranks) <= 8 else f"{', '.join(map(str, ranks[:8]))}, …"


def _disagreements(call: Call, args: Args, rows: list) -> list[str]:
    c = call.collective
    problems = [f"rank {r}: {text}" for r, (words, _, text) in enumerate(rows) if words[_W_PROBLEM]]
    if problems:
        return problems
    out = []
    first = _differ(rows, _W_COLL, "the collective", lambda r, v: COLLECTIVES[v])
    if first:
        return [first + " (every rank must call the same collectives in the same order)"]
    native = any(words[_W_NATIVE] for words, _, _ in rows)
    checks: list[tuple[int, str, Callable[[int, Any], str]]] = [
        (_W_DTYPE, "the element type", lambda r, v: rows[r][1][1]),
    ]
    if not native:  # the library runs it: no algorithm runs, and a rank whose spec it takes may know no dtype
        checks.append((_W_ALG, "the algorithm", lambda r, v: repr(rows[r][1][0])))
    if c in ROOTED:
        checks.append((_W_ROOT, "the root", lambda r, v: f"root {v}"))
    if c in REDUCING:
        checks.append((_W_OP, "the op", lambda r, v: rows[r][1][2]))
        checks.append((_W_COMM, "the op's commutativity", lambda r, v: "commutative" if v else "non-commutative"))
    if native:
        unable = [r for r, (words, _, _) in enumerate(rows) if not words[_W_CAN_NATIVE]]
        needing = [r for r, (words, _, _) in enumerate(rows) if words[_W_NATIVE]]
        if unable:
            out.append(f"rank(s) {_ranks(needing)} passed buffer specs only the MPI library runs, but rank(s) "
                       f"{_ranks(unable)} called an array function, which cannot hand the call to the library; "
                       f"use plain arrays everywhere, or Comm methods everywhere")
    else:
        checks.append((_W_COUNT, "the count", lambda r, v: f"{v} elements"))
    for index, what, show in checks:
        message = _differ(rows, index, what, show, -1 if native and index == _W_DTYPE else None)
        if message:
            out.append(message)
    if not out and not native:
        out.extend(_check_vectors(c, [words[_WORDS:] for words, _, _ in rows], rows[0][0][_W_ROOT]))
    return out


def _check_vectors(c: str, vectors: list[np.ndarray], root: int) -> list[str]:
    p = len(vectors)
    bad: list[str] = []
    if c in ("gatherv", "scatterv"):
        counts = vectors[root][1:]
        side = "receive" if c == "gatherv" else "send"
        mine = "sends" if c == "gatherv" else "receives"
        for r in range(p):
            if vectors[r][0] != counts[r]:
                bad.append(f"rank {r} {mine} {vectors[r][0]} elements but the root's {side} counts say {counts[r]}")
    elif c == "allgatherv":
        for r in range(p):
            if not np.array_equal(vectors[r][1:], vectors[0][1:]):
                bad.append(f"rank {r}'s receive counts {vectors[r][1:].tolist()} differ from rank 0's {vectors[0][1:].tolist()}")
        for r in range(p):
            if vectors[r][0] != vectors[0][1 + r]:
                bad.append(f"rank {r} sends {vectors[r][0]} elements but the receive counts say {vectors[0][1 + r]}")
    elif c == "alltoallv":
        for r in range(p):
            for s in range(p):
                if vectors[r][s] != vectors[s][p + r]:
                    bad.append(f"rank {r} sends {vectors[r][s]} elements to rank {s}, which expects {vectors[s][p + r]}")
    elif c == "reduce_scatter":
        for r in range(p):
            if not np.array_equal(vectors[r], vectors[0]):
                bad.append(f"rank {r}'s receive counts {vectors[r].tolist()} differ from rank 0's {vectors[0].tolist()}")
    if len(bad) > 6:
        bad = bad[:6] + [f"and {len(bad) - 6} more"]
    return bad
