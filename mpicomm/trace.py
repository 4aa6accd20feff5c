"""The timeline trace: ``MPICOMM_TRACE=path.json`` writes a Chrome trace of every mpicomm call.

Off by default. With the variable set (when this module is first imported),
every collective, typed point-to-point message (``send_array``/``recv_array``
and their nonblocking forms), rendezvous ``pull`` and one-sided ``get``/``put``
becomes one complete event on its rank's lane, with its arguments: algorithm,
bytes, peers, tag, dtype, sequence number. At exit - or at an explicit
:func:`flush`, which every rank calls - the events of all ranks are gathered to
rank 0, which writes one JSON file that Perfetto (https://ui.perfetto.dev) and
``chrome://tracing`` open: one process per rank, named "rank N (host)" and
sorted by rank. Its ``pid`` is rank + 1: Perfetto takes pid 0 for the idle
process and would not show rank 0 as a process of its own.

Your own annotations: :func:`span` records a ``with`` block as one event on
the rank's lane, so the phases of a program frame the calls inside them::

    from mpicomm import trace

    for step in range(steps):
        with trace.span("halo exchange", step=step) as note:   # category "user"
            exchange(u)
            note["cells"] = u.size                              # args learnt on the way
        with trace.span("update", "compute", step=step):
            update(u)

With ``MPICOMM_TRACE`` unset a span records nothing (it costs the ``with`` alone).
Its events nest on the rank's lane like any other (the calls made inside it
appear below it), carry ``seq`` (the rank's count of spans of that category)
and, if an exception leaves the block, ``error``.

Messages: every typed message whose two ends are both in the file is drawn as
an arrow from its send to its receive (Chrome flow events: ``ph`` "s" on the
sending slice, "f" with ``bp`` "e" on the receiving one, sharing an ``id``;
each has the ``pid``, ``tid``, ``cat`` and ``ts`` of its slice, so Perfetto and
Chrome bind it to that slice). A message is known at both ends by its sender,
its receiver, its tag and ``msg``: the sequence number the sender's channel
gave it towards that receiver, recorded by both (rendezvous answers and their
pulls travel on a channel of their own, and pair among themselves).
``otherData`` counts ``messages_paired`` and ``message_ends_unpaired`` (a
message whose other end was dropped, unfinished at flush, or sent on a
communicator whose ranks are not COMM_WORLD's: ``peer`` is a rank of the
communicator the call was made on, and arrows assume it is the world rank).

Hooks elsewhere are written ``if trace.ON: ...``, so tracing off costs one
module attribute read per call. When on, an event costs a few microseconds of
Python (two clock reads, a dict, an append); at most :data:`MAX_EVENTS` events
are kept per rank and later ones are counted in ``otherData.dropped_events``.

Events:

* ``ts``/``dur`` in microseconds; an operation that runs as steps (a
  nonblocking receive, a collective) starts when it is called and ends when its
  last step completes - which, for a request nobody waits on, is the next time
  the rank waits or tests on any mpicomm request. An operation that fails ends
  there too, with ``error`` in its args; a cancelled receive with ``cancelled``.
  Operations still unfinished at flush are not in the file.
* Chrome's complete events must nest on a thread, but nonblocking operations
  overlap: a rank's events are spread over as few rows as keep each row
  properly nested (``tid`` 0 "calls", then "overlapping calls 1", 2, ...).
* ``seq``: collectives carry their communicator's collective sequence number
  (the same on every rank); point-to-point and one-sided events carry a per-rank
  count of this rank's calls of their category (``p2p``, ``rma``) in call
  order. A typed message also carries ``msg``, its sequence number on its
  channel towards that peer - the same on sender and receiver.

Clocks: events are timed with ``time.perf_counter`` (CLOCK_MONOTONIC on Linux,
one clock for every process of a host). At flush the ranks pass a barrier and
each reads its clock; ranks on rank 0's host need no correction, every other
host is shifted by the difference between its first rank's reading and rank
0's. The residual skew between hosts is the spread of the barrier's exit
(about one network latency: microseconds) plus the hosts' clock drift since
then; within a host it is zero.

If MPI is already finalized (or was never initialized) when the trace is
written, each rank writes its own file, ``path.rank<N>.json`` (``.json``
replaced), with raw clock readings (arrows only for its messages to itself),
and says so on stderr.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Generator, Iterator
from typing import Any, TextIO, TypeVar

__all__ = ["ON", "PATH", "MAX_EVENTS", "now", "record", "next_seq", "steps", "span", "flush", "dropped", "dtype_name"]

#: True when ``MPICOMM_TRACE`` was set (non-empty) when mpicomm was imported.
ON: bool = bool(os.environ.get("MPICOMM_TRACE", "").strip())
#: The file the trace goes to (absolute; a relative value is taken from the working directory at import).
PATH: str | None = os.path.abspath(os.environ["MPICOMM_TRACE"].strip()) if ON else None
#: Events kept per rank; later ones are only counted.
MAX_EVENTS = 1_000_000
_CHUNK = 20_000  # events per message to rank 0 at flush

_events: list[tuple[str, str, float, float, int, dict]] = []
_dropped = 0
_seq: dict[str, int] = {}
_clock = time.perf_counter
_thread_id = threading.get_ident


def now() -> float:
    """The trace clock, in seconds (``time.perf_counter``: one clock for all processes of a host)."""
    return _clock()


def record(name: str, cat: str, start: float, end: float, **args: Any) -> None:
    """Add one complete event from *start* to *end* (:func:`now` readings) to this rank's lane.

    *args* (JSON-able: numbers, strings, lists) are shown with the event. Works
    whether or not tracing is on; callers check :data:`ON` first.
    """
    _add(name, cat, start, end, args)


def _add(name: str, cat: str, start: float, end: float, args: dict) -> None:
    global _dropped
    if len(_events) < MAX_EVENTS:
        _events.append((name, cat, start, end, _thread_id(), args))
    else:
        _dropped += 1


def next_seq(cat: str) -> int:
    """This rank's next call number in category *cat* (0, 1, 2... in call order)."""
    n = _seq.get(cat, 0)
    _seq[cat] = n + 1
    return n


def dtype_name(dtype: Any) -> str:
    """``str(dtype)`` ("float64"), cached: NumPy builds the name anew on every call."""
    name = _dtype_names.get(dtype)
    if name is None:
        name = _dtype_names[dtype] = str(dtype)
    return name


_dtype_names: dict[Any, str] = {}


def dropped() -> int:
    """How many events this rank did not keep (over :data:`MAX_EVENTS`)."""
    return _dropped


def _failure(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


_Yield = TypeVar("_Yield")
_Send = TypeVar("_Send")
_Return = TypeVar("_Return")


def steps(inner: Generator[_Yield, _Send, _Return], name: str, cat: str,
          args: dict) -> Generator[_Yield, _Send, _Return]:
    """Run step generator *inner* and record it as one event *name* of category *cat*.

    The event starts when the generator starts and ends when it returns, raises
    (``error`` added) or is closed unfinished (``cancelled``). *args* is read
    when it ends, so *inner* may fill in what it learns on the way (the source
    of a receive, its size); ``seq`` is set here, from :func:`next_seq`.
    """
    args["seq"] = next_seq(cat)
    start = _clock()
    try:
        result = yield from inner
    except GeneratorExit:
        _add(name, cat, start, _clock(), {**args, "cancelled": True})
        raise
    except BaseException as exc:
        _add(name, cat, start, _clock(), {**args, "error": _failure(exc)})
        raise
    _add(name, cat, start, _clock(), args)
    return result


@contextlib.contextmanager
def span(name: str, cat: str = "user", **args: Any) -> Iterator[dict]:
    """Record the ``with`` block as one event *name* of category *cat* on this rank's lane (see the module docstring).

    The block may add to the yielded args dict (what it learns on the way);
    ``seq`` comes from :func:`next_seq`; an exception leaving the block adds
    ``error``. With tracing off (:data:`ON` false) nothing is recorded and the
    block runs as it is (it still gets a dict).
    """
    if not ON:
        yield args
        return
    args["seq"] = next_seq(cat)
    start = _clock()
    try:
        yield args
    except BaseException as exc:
        _add(name, cat, start, _clock(), {**args, "error": _failure(exc)})
        raise
    _add(name, cat, start, _clock(), args)


# ---------------------------------------------------------------- writing


def _rows(events: list[tuple]) -> tuple[list[int], list[str]]:
    """A row (``tid``) per event such that the events of each row nest properly, and the rows' names.

    Per thread, greedily: an event goes to the first row where it either starts
    after everything open has ended or fits inside the innermost open event.
    """
    main = threading.main_thread().ident
    threads = sorted({e[4] for e in events}, key=lambda t: (t != main, t))
    tids = [0] * len(events)
    names: list[str] = []
    for number, thread in enumerate(threads):
        mine = sorted((i for i, e in enumerate(events) if e[4] == thread), key=lambda i: (events[i][2], -events[i][3]))
        rows: list[list[float]] = []  # per row, the end times of its open events (innermost last)
        first = len(names)
        for i in mine:
            start, end = events[i][2], events[i][3]
            for row, open_ends in enumerate(rows):  # noqa: B007 - the loop's index is the row it stops at
                while open_ends and open_ends[-1] <= start:
                    open_ends.pop()
                if not open_ends or end <= open_ends[-1]:
                    open_ends.append(end)
                    break
            else:
                row = len(rows)
                rows.append([end])
            tids[i] = first + row
        label = "calls" if number == 0 and thread == main else f"thread {number}"
        names += [label if row == 0 else f"{label}, overlapping {row}" for row in range(max(len(rows), 1))]
    return tids, names or ["calls"]


def _prepare(shift: float) -> tuple[list[tuple], list[int], list[str]]:
    """This rank's events with integer-nanosecond times (*shift* seconds added), their rows and the rows' names.

    Integer times make rows, ``ts`` and ``dur`` agree exactly on which events
    nest, and give a flow event the very ``ts`` of the slice it binds to.
    """
    events = []
    for name, cat, start, end, thread, args in list(_events):
        begin = round((start + shift) * 1e9)
        events.append((name, cat, begin, max(round((end + shift) * 1e9), begin), thread, args))
    tids, names = _rows(events)
    return events, tids, names


def _chunks(rank: int, host: str, prepared: tuple[list[tuple], list[int], list[str]]) -> Iterator[str]:
    """This rank's events (:func:`_prepare`'s) as JSON text, in pieces of at most ``_CHUNK`` events.

    Process ``pid`` is rank + 1 (Perfetto treats pid 0 as the idle process),
    named "rank N (host)" and sorted by rank.
    """
    events, tids, names = prepared
    pid = rank + 1
    meta = [
        {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": f"rank {rank} ({host})"}},
        {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": rank}},
    ]
    for tid, label in enumerate(names):
        meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": label}})
        meta.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    yield ",\n".join(json.dumps(m) for m in meta)
    for lo in range(0, len(events), _CHUNK):
        lines = []
        for (name, cat, start, end, _, args), tid in zip(events[lo : lo + _CHUNK], tids[lo : lo + _CHUNK]):
            event = {"name": name, "cat": cat, "ph": "X", "ts": start / 1000, "dur": (end - start) / 1000,
                     "pid": pid, "tid": tid, "args": args}
            lines.append(json.dumps(event, default=str))
        yield ",\n".join(lines)


#: Point-to-point events that send a message, and the receiving event each pairs with (a pair's "family").
_SENDS = {"send_array": "message", "answer": "rendezvous answer"}
_RECEIVES = {"recv_array": "message", "pull": "rendezvous answer"}


def _endpoints(rank: int, events: list[tuple], tids: list[int]) -> list[tuple]:
    """The message ends among this rank's events: ``(family, sender, receiver, tag, msg, is_send, rank, tid, ts)``.

    A message is named by its family (typed message, or rendezvous answer: each
    travels on its own channel, with its own sequence numbers), its sender and
    receiver, its tag and ``msg``, the sequence number the sender gave it on
    the channel towards that receiver - recorded alike by both ends. Ends
    without ``msg`` (``PROC_NULL``, a receive cancelled before a header came)
    name no message.
    """
    found = []
    for (name, cat, start, _, _, args), tid in zip(events, tids):
        if cat != "p2p" or "msg" not in args:
            continue
        peer, tag, msg = args.get("peer"), args.get("tag"), args["msg"]
        if not isinstance(peer, int) or peer < 0:
            continue
        if name in _SENDS:
            found.append((_SENDS[name], rank, peer, tag, msg, True, rank, tid, start))
        elif name in _RECEIVES:
            found.append((_RECEIVES[name], peer, rank, tag, msg, False, rank, tid, start))
    return found


def _flows(ends: list[tuple]) -> tuple[list[dict], int]:
    """Chrome flow events (``ph`` "s" on the send, "f" on its receive) for every message both of whose ends are
    in *ends* (:func:`_endpoints` of every rank), and the number of ends left without a partner.

    Each pair shares an ``id``; each flow event has the ``pid``, ``tid``,
    ``cat`` and ``ts`` of the slice it belongs to, and binds to it as its
    enclosing slice (``bp`` "e" on the end): Chrome's viewers bind a flow event
    to the slice of equal ``ts``, Perfetto to the slice open at its ``ts``
    (at equal ``ts`` it takes complete events first, then the file's order, and
    the flows are written after every slice). Should two messages carry the
    same name (two communicators over the same ranks), their ends pair in the
    order they started.
    """
    sends: dict[tuple, list[tuple]] = {}
    receives: dict[tuple, list[tuple]] = {}
    for end in ends:
        (sends if end[5] else receives).setdefault(end[:5], []).append(end)
    flows: list[dict] = []
    paired = 0
    for key in sorted(set(sends) & set(receives), key=repr):
        for out, into in zip(sorted(sends[key], key=lambda e: e[8]), sorted(receives[key], key=lambda e: e[8])):
            paired += 1
            family, sender, receiver, tag, msg = key
            common = {"name": family, "cat": "p2p", "id": paired}
            flows.append({**common, "ph": "s", "pid": out[6] + 1, "tid": out[7], "ts": out[8] / 1000})
            flows.append({**common, "ph": "f", "bp": "e", "pid": into[6] + 1, "tid": into[7], "ts": into[8] / 1000})
    return flows, len(ends) - 2 * paired


def _flow_chunks(flows: list[dict]) -> Iterator[str]:
    for lo in range(0, len(flows), _CHUNK):
        yield ",\n".join(json.dumps(f) for f in flows[lo : lo + _CHUNK])


class _Writer:
    """The trace file, written to a temporary name and renamed into place; keeps the first error."""

    def __init__(self, path: str):
        self.path = path
        self.temp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.tmp")
        self.error: str | None = None
        self.first = True
        self.file: TextIO | None
        try:
            self.file = open(self.temp, "w", encoding="utf-8")  # noqa: SIM115 - closed in finish()
        except OSError as exc:
            self.file = None
            self.error = f"cannot write the trace to {path}: {exc}"

    def head(self, other: dict) -> None:
        self._put('{"displayTimeUnit": "ms",\n"otherData": ' + json.dumps(other) + ',\n"traceEvents": [\n')

    def events(self, text: str) -> None:
        if text:
            self._put(("" if self.first else ",\n") + text)
            self.first = False

    def _put(self, text: str) -> None:
        if self.file is None:
            return
        try:
            self.file.write(text)
        except OSError as exc:
            self.error = self.error or f"cannot write the trace to {self.path}: {exc}"

    def finish(self) -> None:
        if self.file is None:
            return
        self._put("\n]}\n")
        try:
            self.file.close()
            if self.error is None:
                os.replace(self.temp, self.path)
        except OSError as exc:
            self.error = self.error or f"cannot write the trace to {self.path}: {exc}"
        if self.error is not None:
            with contextlib.suppress(OSError):
                os.remove(self.temp)


def _other(ranks: int, hosts: list[str], counts: list[int], drops: list[int], clock: str, flows: int,
           unpaired: int) -> dict:
    from . import __version__

    return {
        "generator": f"mpicomm {__version__}",
        "ranks": ranks,
        "pid": "rank + 1",
        "hosts": hosts,
        "events_per_rank": counts,
        "dropped_events": sum(drops),
        "dropped_per_rank": drops,
        "max_events_per_rank": MAX_EVENTS,
        "clock": clock,
        "messages_paired": flows,
        "message_ends_unpaired": unpaired,
    }


def flush(path: str | None = None) -> None:
    """Write the trace now: collective over ``MPI.COMM_WORLD`` (every rank calls it).

    Writes every event recorded so far (they are kept: a later flush, such as
    the one at exit, rewrites the file with more) to *path* (default: the
    ``MPICOMM_TRACE`` file). Rank 0 writes, atomically; an error writing it is
    raised on every rank. If MPI is not usable (finalized, or never
    initialized) each rank writes ``<path>.rank<N>.json`` instead.
    """
    target = os.path.abspath(path) if path is not None else PATH
    if target is None:
        raise ValueError("flush(): no path given and MPICOMM_TRACE is not set; pass path= or set MPICOMM_TRACE")
    from mpi4py import MPI

    if not MPI.Is_initialized() or MPI.Is_finalized():
        _flush_alone(target, MPI)
        return
    from .engine.requests import barrier

    barrier(MPI.COMM_WORLD)  # a peer waiting on this rank's progress (a large send) gets it meanwhile
    comm = MPI.COMM_WORLD.Dup()
    try:
        error = _gather_and_write(comm, target, MPI.Get_processor_name())
    finally:
        comm.Free()
    if error is not None:
        raise OSError(error)


def _gather_and_write(comm: Any, target: str, host: str) -> str | None:
    rank, size = comm.Get_rank(), comm.Get_size()
    comm.Barrier()
    reference = _clock()  # all ranks read it as they leave the same barrier
    first = min((e[2] for e in _events), default=None)
    facts = comm.gather((host, reference, first, len(_events), _dropped), root=0)
    shifts = None
    writer = None
    if rank == 0:
        leader: dict[str, float] = {}
        for h, ref, _, _, _ in facts:
            leader.setdefault(h, ref)
        offsets = [0.0 if h == facts[0][0] else facts[0][1] - leader[h] for h, _, _, _, _ in facts]
        starts = [f[2] + off for f, off in zip(facts, offsets) if f[2] is not None]
        origin = min(starts) if starts else facts[0][1]
        shifts = [off - origin for off in offsets]
    shift = comm.scatter(shifts, root=0)
    prepared = _prepare(shift)
    ends = comm.gather(_endpoints(rank, prepared[0], prepared[1]), root=0)
    if rank == 0:
        flows, unpaired = _flows([end for mine in ends for end in mine])
        writer = _Writer(target)
        clock = ("time.perf_counter; ts 0 = the first event; ranks on other hosts than rank 0's shifted by a "
                 "barrier at flush (residual skew: about one network latency, plus clock drift)")
        writer.head(_other(size, [f[0] for f in facts], [f[3] for f in facts], [f[4] for f in facts], clock,
                           len(flows) // 2, unpaired))
        for text in _chunks(rank, host, prepared):
            writer.events(text)
        for source in range(1, size):
            while (text := comm.recv(source=source, tag=1)) is not None:
                writer.events(text)
        for text in _flow_chunks(flows):  # after the slices they bind to
            writer.events(text)
        writer.finish()
    else:
        for text in _chunks(rank, host, prepared):
            comm.send(text, dest=0, tag=1)
        comm.send(None, dest=0, tag=1)
    return comm.bcast(writer.error if writer is not None else None, root=0)


def _flush_alone(target: str, MPI: Any) -> None:
    """This rank's events to its own file (MPI unusable): raw clock readings, no alignment."""
    rank = _world_rank
    stem = target[: -len(".json")] if target.endswith(".json") else target
    path = f"{stem}.rank{rank}.json"
    host = _host
    writer = _Writer(path)
    prepared = _prepare(0.0)
    flows, unpaired = _flows(_endpoints(rank, prepared[0], prepared[1]))  # messages to itself only
    other = _other(1, [host], [len(_events)], [_dropped], "time.perf_counter, raw (no alignment across ranks)",
                   len(flows) // 2, unpaired)
    writer.head({**other, "rank": rank})
    for text in _chunks(rank, host, prepared):
        writer.events(text)
    for text in _flow_chunks(flows):
        writer.events(text)
    writer.finish()
    state = "finalized" if MPI.Is_finalized() else "not initialized"
    if writer.error is not None:
        sys.stderr.write(f"mpicomm trace: rank {rank}: MPI is {state} and {writer.error}\n")
    else:
        sys.stderr.write(f"mpicomm trace: rank {rank}: MPI is already {state}, so each rank wrote its own "
                         f"file; this one is {path}\n")
    sys.stderr.flush()


def _at_exit() -> None:
    try:
        flush()
    except Exception as exc:  # noqa: BLE001 - at exit: say it, do not hide the program's own status
        sys.stderr.write(f"mpicomm trace: rank {_world_rank}: the trace was not written: {exc}\n")
        sys.stderr.flush()


_world_rank = 0
_host = "?"
if ON:
    # mpi4py finalizes MPI at exit in a handler it sets up when mpi4py.MPI is imported; atexit
    # runs handlers last in, first out, so importing it first makes ours run while MPI still works.
    from mpi4py import MPI as _MPI

    if _MPI.Is_initialized() and not _MPI.Is_finalized():
        _world_rank = _MPI.COMM_WORLD.Get_rank()
        _host = _MPI.Get_processor_name()
    else:
        from .launcher import from_environment

        _info = from_environment()
        _world_rank, _host = _info.rank or 0, _info.host
    atexit.register(_at_exit)
