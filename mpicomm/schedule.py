"""Schedules: what one rank does in one collective, as plain data.

An algorithm (``mpicomm/coll/*.py``) is a short function that *describes* a
collective for one rank; it never touches MPI. It is given a :class:`Builder`
and symbolic buffers (:class:`View`), and calls

* :meth:`Builder.exchange` (and ``send``/``recv``/``sendrecv``) - one
  **round**: messages to post at once, each ``(peer, view)``;
* :meth:`Builder.copy` and :meth:`Builder.combine` - local work that runs once
  the current round's messages have completed (``out = a ⊕ b``, *a* from the
  lower ranks);
* :meth:`Builder.empty` - scratch space;
* :meth:`Builder.nested` - a whole collective on another communicator (the
  levels of a hierarchical algorithm);
* :meth:`Builder.sync` and :meth:`Builder.local` - the shared-memory
  algorithms' rounds: wait until counters in node-shared memory reach a
  value, then run a named local step.

What comes out is a :class:`Schedule`: a list of :class:`Round` s, each
``pre`` steps (run when the round is posted), ``sends``, ``recvs``, ``syncs``
(all must complete), then ``ops`` and ``nested`` calls. Nothing in it refers
to MPI, arrays or this process, so a schedule is printed
(:func:`describe`, ``python -m mpicomm algorithms --schedule``), checked
against literal tables in tests, drawn, verified pairwise across ranks
(:func:`check_pairs`), written to a file and read back
(:mod:`mpicomm.schedule_file`), and compiled once into a plan that a single executor
runs for blocking, nonblocking and persistent calls alike.

Buffers are numbered: :data:`SEND` (the input), :data:`RECV` (the output) and
scratch buffers from 2 on; a :class:`View` is ``(buffer, start, stop)`` in
elements of the buffer's element type.

The executor may post round k + 1 before running round k's ops when neither
touches what the other reads or writes (:func:`early`): an algorithm states
only what depends on what, never when to post.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

__all__ = ["SEND", "RECV", "View", "Copy", "Combine", "Local", "Sync", "Nested", "Library", "Round", "Schedule", "Builder",
           "describe", "early", "check_pairs", "message_count", "plain_arguments"]

SEND, RECV = 0, 1  #: buffer numbers of the call's input and output; scratch buffers are numbered from 2


class View(NamedTuple):
    """Elements ``start … stop − 1`` of buffer *buf* (a symbolic array slice: ``view[a:b]`` is a View too)."""

    buf: int
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start

    def __getitem__(self, key: Any) -> View:  # type: ignore[override]
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError(f"a schedule view takes contiguous slices [a:b], got {key!r}")
        a, b, _ = key.indices(self.stop - self.start)
        b = max(a, b)
        return View(self.buf, self.start + a, self.start + b)

    def part(self, start: int | None, stop: int | None = None) -> View:
        """``view[start:stop]``, typed as a View: type checkers take any slice of a NamedTuple for a plain tuple,
        without reading :meth:`__getitem__` (the algorithms slice their views through this)."""
        return self.__getitem__(slice(start, stop))

    def reshape(self, *shape: Any) -> View:
        """Views are flat; ``reshape(-1)`` (as array code writes it) returns the view itself."""
        return self

    def __len__(self) -> int:
        return self.stop - self.start

    def __repr__(self) -> str:
        return f"{_name(self.buf)}[{self.start}:{self.stop}]"


def _name(buf: int) -> str:
    return "send" if buf == SEND else "recv" if buf == RECV else f"t{buf - 2}"


class Copy(NamedTuple):
    """``dst[...] = src`` (same number of elements)."""

    dst: View
    src: View

    def __str__(self) -> str:
        return f"copy {self.src} -> {self.dst}"


class Combine(NamedTuple):
    """``out = a ⊕ b`` with the call's op; *a* holds the lower ranks' contribution."""

    a: View
    b: View
    out: View

    def __str__(self) -> str:
        return f"{self.out} = {self.a} (+) {self.b}"


class Local(NamedTuple):
    """A named local step ``fn(run)`` that the schedule cannot express as copies (shared-memory work).

    *reads*/*writes*: the views it touches, when known (None: anything, so
    the executor never posts the next round before it).
    """

    fn: Callable[[Any], None]
    text: str
    reads: tuple[View, ...] | None = None
    writes: tuple[View, ...] | None = None

    def __str__(self) -> str:
        return self.text


class Sync(NamedTuple):
    """Wait until counter *word* of each of *ranks* in node-shared memory has reached the run's base + *delta*
    (only when ``when(run)`` is true, if *when* is given; *name*: the counter's name for printing)."""

    word: int
    delta: int
    ranks: tuple[int, ...]
    when: Callable[[Any], bool] | None = None
    name: str = ""

    def __str__(self) -> str:
        counter = self.name or f"counter {self.word}"
        return (f"wait until {counter} >= base+{self.delta} on rank(s) {', '.join(map(str, self.ranks))}"
                + (" (if needed)" if self.when is not None else ""))


class Nested(NamedTuple):
    """A whole collective on another communicator (a level of a hierarchical algorithm), run as one step.

    *comm*: that communicator's state; the rest are the nested call's arguments
    as views of this call's buffers (see :meth:`Builder.nested`).
    """

    comm: Any
    collective: str
    send: View | None
    recv: View | None
    root: int
    count: int  # type: ignore[assignment]  # a field named as the call's argument, shadowing tuple.count on purpose
    algorithm: str | None
    recvcounts: tuple[int, ...] | None = None
    recvdispls: tuple[int, ...] | None = None
    sendcounts: tuple[int, ...] | None = None
    senddispls: tuple[int, ...] | None = None

    def __str__(self) -> str:
        where = getattr(self.comm, "size", "?")
        return (f"{self.collective} on a {where}-rank sub-communicator (send {self.send}, recv {self.recv}"
                + (f", root {self.root}" if self.collective in ("bcast", "reduce", "gather", "scatter") else "") + ")")


class Library(NamedTuple):
    """A request of the MPI library's own, started by ``start(comm)`` on the communicator's private duplicate
    (``comm.Ibarrier()``): an algorithm that is the library's."""

    start: Callable[[Any], Any]
    text: str

    def __str__(self) -> str:
        return self.text


@dataclass
class Round:
    """One round: ``pre`` steps, then messages (and counter waits) in flight together, then ``ops``."""

    sends: list[tuple[int, View]] = field(default_factory=list)
    recvs: list[tuple[int, View]] = field(default_factory=list)
    syncs: list[Sync] = field(default_factory=list)
    ops: list[Any] = field(default_factory=list)  # Copy, Combine, Local
    pre: list[Local] = field(default_factory=list)
    nested: list[Nested] = field(default_factory=list)
    library: list[Library] = field(default_factory=list)

    @property
    def communicates(self) -> bool:
        return bool(self.sends or self.recvs or self.syncs or self.nested or self.library)


@dataclass
class Schedule:
    """One rank's part of one collective call (see the module docstring)."""

    collective: str
    algorithm: str
    rank: int
    p: int
    dtype: np.dtype
    buffers: list[tuple[int, np.dtype]]  # count and element type of every buffer: send, recv, scratch…
    rounds: list[Round]
    then: Callable[[Builder], None] | None = None  # builds further rounds at run time (data-dependent sizes)
    gated: bool = False  # run only after the ranks agreed (collective set-up inside, or counters in shared memory)
    ticks: int = 0  # counter values a shared-memory schedule reserves (its Syncs count from base)
    root: int = 0  # the call's root (rooted collectives)
    count: int = -1  # the call's count argument (-1: per-rank counts, a v-form)
    arguments: tuple = ()  # the algorithm's other arguments (counts, displacements, neighbours), where recorded

    def scratch_bytes(self) -> int:
        return sum(count * dtype.itemsize for count, dtype in self.buffers[2:])


class Builder:
    """What an algorithm sees of a call while it describes its schedule (see the module docstring).

    Attributes: ``collective``, ``algorithm``, ``rank``, ``p``, ``root``,
    ``dtype``, ``op`` (an :class:`mpicomm.ops.Op` or None), ``count`` (−1: per-rank
    counts), ``state`` (the communicator's state: shared memory, levels; None
    when the schedule is only printed), ``blocking`` (whether the call is
    blocking: nested calls inherit it).
    """

    def __init__(self, collective: str, algorithm: str, rank: int, p: int, dtype: Any, *, root: int = 0,
                 op: Any = None, count: int = -1, state: Any = None, send_count: int = 0, recv_count: int = 0,
                 blocking: bool = True, send_dtype: Any = None):
        self.collective = collective
        self.algorithm = algorithm
        self.rank = rank
        self.p = p
        self.root = root
        self.dtype = np.dtype(dtype)
        self.op = op
        self.count = count
        self.state = state
        self.blocking = blocking
        self.buffers: list[tuple[int, np.dtype]] = [(send_count, np.dtype(send_dtype or dtype)),
                                                    (recv_count, self.dtype)]
        self.rounds: list[Round] = [Round()]  # round 0: local work before any message
        self.then: Callable[[Builder], None] | None = None
        self.gated = False
        self.ticks = 0

    # ------------------------------------------------------------ the call

    @property
    def input(self) -> View:
        """The whole input buffer (the algorithm's *send*)."""
        return View(SEND, 0, self.buffers[SEND][0])

    @property
    def output(self) -> View:
        """The whole output buffer (the algorithm's *recv*)."""
        return View(RECV, 0, self.buffers[RECV][0])

    @property
    def commutative(self) -> bool:
        """Whether the op lets the algorithm reorder operands."""
        return self.op is None or bool(getattr(self.op, "commutative", True))

    def real_rank(self, vrank: int) -> int:
        """The rank whose relative rank (rank − root mod p) is *vrank*."""
        return (vrank + self.root) % self.p

    @property
    def vrank(self) -> int:
        """This rank relative to the root."""
        return (self.rank - self.root) % self.p

    # ------------------------------------------------------------ buffers

    def empty(self, count: int, dtype: Any = None) -> View:
        """Scratch space for *count* elements (of the call's type, or *dtype*)."""
        self.buffers.append((int(count), np.dtype(dtype) if dtype is not None else self.dtype))
        return View(len(self.buffers) - 1, 0, int(count))

    # ------------------------------------------------------------ rounds

    def exchange(self, sends: Iterable[tuple[int, View]] = (), recvs: Iterable[tuple[int, View]] = ()) -> Round:
        """A new round: post these receives and sends together (receives first). Empty views still send an
        (empty) message, so both sides never have to agree on skipping one."""
        r = Round(sends=[(int(peer), _view(v)) for peer, v in sends],
                  recvs=[(int(peer), _view(v)) for peer, v in recvs])
        self.rounds.append(r)
        return r

    def send(self, dest: int, view: View) -> Round:
        return self.exchange(sends=[(dest, view)])

    def recv(self, source: int, view: View) -> Round:
        return self.exchange(recvs=[(source, view)])

    def sendrecv(self, dest: int, send_view: View, source: int, recv_view: View) -> Round:
        return self.exchange(sends=[(dest, send_view)], recvs=[(source, recv_view)])

    def copy(self, dst: View, src: View) -> None:
        """``dst[...] = src`` once the current round has completed (nothing when they are the same elements)."""
        dst, src = _view(dst), _view(src)
        if dst.size != src.size:
            raise ValueError(f"copy of {src.size} elements into {dst.size}")
        if dst != src and dst.size:
            self.rounds[-1].ops.append(Copy(dst, src))

    def combine(self, a: View, b: View, out: View) -> None:
        """``out = a ⊕ b`` with the call's op once the current round has completed; *a*: the lower ranks."""
        a, b, out = _view(a), _view(b), _view(out)
        if not (a.size == b.size == out.size):
            raise ValueError(f"combine of {a.size}, {b.size} into {out.size} elements")
        if out.size:
            self.rounds[-1].ops.append(Combine(a, b, out))

    def local(self, fn: Callable[[Any], None], text: str, reads: Sequence[View] | None = None,
              writes: Sequence[View] | None = None) -> None:
        """A named local step ``fn(run)`` once the current round has completed."""
        self.rounds[-1].ops.append(Local(fn, text, None if reads is None else tuple(reads),
                                         None if writes is None else tuple(writes)))

    def sync(self, word: int, delta: int, ranks: Iterable[int], when: Callable[[Any], bool] | None = None,
             name: str = "") -> Round:
        """A new round that waits until shared counter *word* of *ranks* reaches base + *delta* (only when
        ``when(run)`` is true, if given)."""
        r = Round(syncs=[Sync(word, delta, tuple(ranks), when, name)])
        self.rounds.append(r)
        return r

    def step(self) -> Round:
        """A new round with nothing to wait for (local steps added after it run in order with the others)."""
        r = Round()
        self.rounds.append(r)
        return r

    def nested(self, comm: Any, collective: str, *, send: View | None = None, recv: View | None = None,
               root: int = 0, count: int = -1, algorithm: str | None = None,
               recvcounts: Sequence[int] | None = None, recvdispls: Sequence[int] | None = None,
               sendcounts: Sequence[int] | None = None, senddispls: Sequence[int] | None = None) -> Round:
        """A new round that runs *collective* on *comm* (another communicator's state) with these views.

        For compositions: the ranks of *comm* already agreed on the outer
        call, so the nested call is not validated; its algorithm is chosen as
        for any call on *comm* (*algorithm*, or auto). *count*: as the
        collective's count argument (−1: from the views).
        """
        r = Round(nested=[Nested(comm, collective, None if send is None else _view(send),
                                 None if recv is None else _view(recv), root, count, algorithm,
                                 _tuple(recvcounts), _tuple(recvdispls), _tuple(sendcounts), _tuple(senddispls))])
        self.rounds.append(r)
        return r

    def library(self, start: Callable[[Any], Any], text: str) -> Round:
        """A new round that waits for a request of the MPI library's own, ``start(comm)`` on the
        communicator's private duplicate (e.g. ``lambda comm: comm.Ibarrier()``)."""
        r = Round(library=[Library(start, text)])
        self.rounds.append(r)
        return r

    def gate(self, ticks: int = 0) -> None:
        """Run this schedule only once every rank agreed on the call (it sets up shared state collectively,
        or waits on shared-memory counters); *ticks*: counter values it reserves."""
        self.gated = True
        self.ticks = ticks

    def schedule(self) -> Schedule:
        rounds = [r for r in self.rounds if r.communicates or r.ops or r.pre]
        return Schedule(self.collective, self.algorithm, self.rank, self.p, self.dtype, list(self.buffers), rounds,
                        self.then, self.gated, self.ticks, self.root, self.count)


def plain_arguments(args: Sequence[Any]) -> tuple:
    """An algorithm's arguments other than its views (counts, displacements, neighbours), as tuples of ints
    (None where not given): what a schedule records of its call beside the buffers (:attr:`Schedule.arguments`)."""
    return tuple(None if a is None else tuple(int(x) for x in a) for a in args if a is None or type(a) is not View)


def _view(v: Any) -> View:
    if type(v) is View:
        return v
    raise TypeError(f"a schedule step takes views of the call's buffers (schedule.View), got {type(v).__qualname__}")


def _tuple(x: Sequence[int] | None) -> tuple[int, ...] | None:
    return None if x is None else tuple(int(v) for v in x)


# ---------------------------------------------------------------- analysis


def _overlaps(a: View, b: View, shared: dict[int, tuple[int, int]] | None = None) -> bool:
    if shared:
        a, b = _placed(a, shared), _placed(b, shared)
    return a.buf == b.buf and a.start < b.stop and b.start < a.stop and a.size > 0 and b.size > 0


def _placed(v: View, shared: dict[int, tuple[int, int]]) -> View:
    """*v* in the buffer whose memory it shares (``shared``: buffer → (that buffer, element offset))."""
    where = shared.get(v.buf)
    return v if where is None else View(where[0], v.start + where[1], v.stop + where[1])


def _touches(ops: Sequence[Any]) -> tuple[list[View], list[View], bool]:
    """(views read, views written, opaque) of a round's ops."""
    reads: list[View] = []
    writes: list[View] = []
    for op in ops:
        t = type(op)
        if t is Copy:
            reads.append(op.src)
            writes.append(op.dst)
        elif t is Combine:
            reads += [op.a, op.b]
            writes.append(op.out)
        elif t is Local:
            if op.reads is None or op.writes is None:
                return reads, writes, True
            reads += op.reads
            writes += op.writes
        else:
            return reads, writes, True
    return reads, writes, False


def early(current: Round, following: Round, shared: dict[int, tuple[int, int]] | None = None) -> bool:
    """Whether *following* may be posted before *current*'s ops run (neither touches what the other writes).

    *shared*: buffers that lie in another's memory (an in-place call: ``{SEND: (RECV, offset)}``), so that
    the input and the output are compared as the memory they are."""
    if not current.ops:
        return False  # nothing to overlap
    if following.pre or following.nested or following.syncs or following.library:
        return False
    reads, writes, opaque = _touches(current.ops)
    if opaque:
        return False
    for _, v in following.sends:  # a send reads v: nothing may write it
        if any(_overlaps(v, w, shared) for w in writes):
            return False
    for _, v in following.recvs:  # a receive writes v: nothing may read or write it
        if any(_overlaps(v, w, shared) for w in writes) or any(_overlaps(v, r, shared) for r in reads):
            return False
    return True


def message_count(s: Schedule) -> tuple[int, int]:
    """(messages sent, rounds that communicate) of a schedule."""
    return sum(len(r.sends) for r in s.rounds), sum(1 for r in s.rounds if r.communicates)


def check_pairs(schedules: Sequence[Schedule]) -> list[str]:
    """Problems with one schedule per rank of one call: every send must meet a receive of the same size.

    For each ordered pair of ranks, the sizes of the messages rank a sends to
    b, in order, must equal the sizes of the receives b posts from a, in order
    (MPI matches them in that order). Returns the mismatches found (empty:
    consistent). Schedules that wait on shared counters or nest calls are
    checked for their messages only.
    """
    p = len(schedules)
    sent: dict[tuple[int, int], list[int]] = {}
    received: dict[tuple[int, int], list[int]] = {}
    for s in schedules:
        for r in s.rounds:
            for peer, v in r.sends:
                sent.setdefault((s.rank, peer), []).append(v.size * s.buffers[v.buf][1].itemsize)
            for peer, v in r.recvs:
                received.setdefault((peer, s.rank), []).append(v.size * s.buffers[v.buf][1].itemsize)
    problems = []
    for a in range(p):
        for b in range(p):
            out, into = sent.get((a, b), []), received.get((a, b), [])
            if len(out) != len(into):
                problems.append(f"rank {a} sends {len(out)} message(s) to rank {b}, which receives {len(into)}")
            elif out != into:
                problems.append(f"rank {a} sends messages of {out} bytes to rank {b}, which receives {into}")
    for s in schedules:
        for r in s.rounds:
            for peer, _ in r.sends + r.recvs:
                if not 0 <= peer < p:
                    problems.append(f"rank {s.rank} talks to rank {peer}, outside 0..{p - 1}")
    return problems


def describe(s: Schedule) -> list[str]:
    """The schedule as text, one line per round (what ``python -m mpicomm algorithms --schedule`` prints)."""
    scratch = ", ".join(f"{_name(i)}: {count} x {dt}" for i, (count, dt) in enumerate(s.buffers) if i >= 2)
    lines = [f"rank {s.rank} of {s.p}: {s.collective} ({s.algorithm}), send {s.buffers[0][0]}, "
             f"recv {s.buffers[1][0]} x {s.dtype}" + (f"; scratch {scratch}" if scratch else "")
             + ("; runs once the ranks agreed" if s.gated else "")]
    for i, r in enumerate(s.rounds):
        parts = [str(x) for x in r.pre]
        parts += [f"recv {v} <- {peer}" for peer, v in r.recvs]
        parts += [f"send {v} -> {peer}" for peer, v in r.sends]
        parts += [str(x) for x in r.syncs]
        parts += [f"nested {x}" for x in r.nested]
        parts += [f"the library's {x}" for x in r.library]
        head = "; ".join(parts) if parts else "local"
        lines.append(f"  {i:3d}  {head}")
        for op in r.ops:
            lines.append(f"         then {op}")
    if s.then is not None:
        lines.append("  ...  then rounds built at run time from the sizes received")
    return lines
