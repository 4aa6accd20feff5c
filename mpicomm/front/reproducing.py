"""Running a reducing collective as a reproducible sum (:mod:`mpicomm.reproducible`): blocking, nonblocking or
persistent.

The call runs as one plan (:class:`Sum`) of two steps on the communicator,
each a whole mpicomm collective run as a nested run (chosen, compiled and
validated as any, kept with the plan):

1. the contributions' exponents (int16, cut when the step is posted) under an
   allreduce (MAX); the digits of the contributions on that grid are cut once
   it has completed;
2. the call itself (SUM) on the digits (int64), with the algorithm the caller
   chose; then each rank that holds a result rounds its digit sums into its
   receive buffer.

So a nonblocking or persistent call runs in the communicator's queue as any
other (in call order, completed by the progress thread), and the three local
steps run when the run reaches them, on whichever thread drives it, on the
arrays of the call the run is for (:attr:`~mpicomm.engine.executor.Run.keep`):
a plan serves every call of its shape. The exponents and digits arrays are
the plan's own, which its runs share (runs on one communicator never overlap).

The call's own arguments are read and checked first; one that has a problem,
or that asks a reproducible sum of what has none (another op on floats), runs
the ordinary call with that problem, so every rank raises the same
:class:`~mpicomm.plan.args.ArgumentError`. Ops and element types whose
reduction is exact already (integers, MAX, MIN...) run the ordinary call.

Scan and exscan cut every contribution on the grid of all ranks'
exponents (the same first step): rank r's result is then the rounded exact
sum of the contributions of ranks 0..r (0..r−1) on that grid, the same bits
for every algorithm and order, but not for another set of ranks (the grid
depends on every contribution).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext as _nowhere
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import config, reproducible
from .. import trace as _trace
from ..coll.patterns import block_partition
from ..engine.executor import Program, Run, Step
from ..ops import resolve
from ..plan.args import Args
from ..plan.compile import Plan, child_run
from ..state import State, as_state
from . import dispatch, persistent

if TYPE_CHECKING:
    from .persistent import Prequest

__all__ = ["COLLECTIVES", "start", "create", "Sum"]

#: The collectives a reproducible sum runs for.
COLLECTIVES = ("allreduce", "reduce", "reduce_scatter_block", "reduce_scatter", "scan", "exscan")

_MAX, _SUM = resolve("max"), resolve("sum")
_E, _D = np.dtype(np.int16), np.dtype(np.int64)

#: plans of reproducible sums a communicator keeps, by shape (the oldest are dropped)
KEPT = 16


def _applies(args: Args) -> bool:
    """Whether *args* (read, checked) gets a reproducible sum; records a refusal (another op on floats) as the
    call's problem, which the ordinary call then raises on every rank."""
    if args.problem is not None or args.unsupported is not None or args.collective not in COLLECTIVES:
        return False
    op = args.op
    try:  # (a sum under another name - the torch backend's AVG and PREMUL_SUM - is a sum)
        exact = reproducible.supported(args.dtype, "" if op is None else "sum" if op.ufunc == "add" else op.name)
    except ValueError as exc:
        args.fail(exc)  # (every rank raises it: the ordinary call's agreement carries it)
        return False
    return exact is None


def start(state: State | Any, args: Args, algorithm: str | None, blocking: bool) -> Any:
    """Run the call *args* as a reproducible sum where it has one, else as the ordinary call: blocking, return
    its result; else return its request (*state*: the communicator's :class:`~mpicomm.state.State`, or what a
    freed ``Comm`` holds instead, which raises)."""
    if not _applies(args):
        if args.parts is not None and args.problem is None:  # (the ordinary call would sum the first row only)
            args.fail(ValueError(f"stacked contributions need a reproducible sum: op SUM on float32, float64, "
                                 f"complex64 or complex128; got op {args.op.name.upper() if args.op else '?'} "
                                 f"on {args.dtype}"))
        return dispatch.start(state, args, algorithm, blocking)
    if type(state) is not State:
        state = as_state(state)
    state.check_live()
    locked = dispatch.enter(state)
    try:
        began = _trace.now() if _trace.ON else 0.0
        plan = _plan(state, args, algorithm, blocking)
        return dispatch.execute(state, plan, args.result, blocking, began, keep=args)
    finally:
        if locked:
            state.lock.release()


def create(state: State | Any, args: Args, algorithm: str | None) -> Prequest:
    """A persistent request for the call *args* (collective), as a reproducible sum where it has one: each
    start runs both steps; the nested collectives are persistent plans of the request's number, so starts in
    different orders on different ranks raise the same error on every rank."""
    if not _applies(args):
        return persistent.create(state, args, algorithm)
    if type(state) is not State:
        state = as_state(state)

    def make(number: int) -> Plan:
        return Sum(state, args, algorithm, False, number)

    return persistent.create(state, args, algorithm, make)


def _plan(state: State, args: Args, algorithm: str | None, blocking: bool) -> Sum:
    """The kept plan of this call's shape (its nested plans of the communicator's current tags), or a new one."""
    x = args.send
    key = (args.collective, algorithm, blocking, x.size, x.dtype, args.root, args.in_place, args.recvcounts,
           (args.xp or np).__name__, getattr(args.device, "id", None), config.validate())
    sums = state.sums
    plan = sums.get(key)
    if plan is None or plan.epoch != state.epoch:
        if len(sums) >= KEPT:
            del sums[next(iter(sums))]  # (a queued run may still hold it: dropped, not released)
        plan = sums[key] = Sum(state, args, algorithm, blocking)
    return plan


class Sum(Plan):
    """The plan of a reproducible sum of one shape: two steps, each a nested mpicomm collective (see the module
    docstring), and the local steps around them, which read the call's arrays from the run."""

    __slots__ = ("rounds",)

    def __init__(self, state: State, args: Args, algorithm: str | None, blocking: bool,
                 number: int | None = None):
        xp = args.xp or np
        c, rank, device = args.collective, state.rank, args.device
        x = reproducible.real_view(args.send)
        per = 2 if x.dtype != args.send.dtype else 1  # real elements per element (complex: two)
        k = reproducible.DIGITS[x.dtype]
        with device if device is not None else _nowhere():  # (device arrays: on the call's device)
            e, d = xp.empty(x.size, _E), xp.empty((x.size, k), _D)
        flat = d.reshape(-1)
        n = int(flat.size)
        own = Args("allreduce", xp=xp, dtype=_E, send=e, recv=e, in_place=True, op=_MAX, count=int(e.size),
                   device=device)
        result: Any = d  # the digit sums this rank rounds (None: it holds no result)
        start, width = 0, x.size  # which of the exponents they are on
        gathered: Any = None  # split: the rounded results, each rank's block all-gathered in place
        split = c == "allreduce" and algorithm in (None, "auto") and x.size * x.itemsize >= SPLIT_BYTES \
            and state.size > 1
        if split:  # reduce-scatter the digits, round this rank's block, all-gather the results
            counts = tuple(block_partition(x.size // per, state.size)[0])
            start, width = sum(counts[:rank]) * per, counts[rank] * per
            with device if device is not None else _nowhere():
                out = xp.empty(width * k, _D)
                gathered = xp.empty(x.size, x.dtype)
            call = Args("reduce_scatter", xp=xp, dtype=_D, send=flat, recv=out, op=_SUM,
                        recvcounts=tuple(m * per * k for m in counts), device=device)
            result = out.reshape(width, k)
            share = dispatch.nested_args(state, "allgatherv", gathered[start:start + width], gathered, None, 0,
                                         None, None, tuple(m * per for m in counts), None, -1)
        elif c == "allreduce":
            call = Args(c, xp=xp, dtype=_D, send=flat, recv=flat, in_place=True, op=_SUM, count=n, device=device)
        elif c == "reduce":
            root = rank == args.root
            call = Args(c, xp=xp, dtype=_D, send=flat, recv=flat if root else None, in_place=root, op=_SUM,
                        root=args.root, count=n, device=device)
            result = d if root else None
        elif c in ("scan", "exscan"):
            with device if device is not None else _nowhere():
                out = xp.empty(n, _D)
            call = Args(c, xp=xp, dtype=_D, send=flat, recv=out, op=_SUM, count=n, device=device)
            result = out.reshape(x.size, k) if c == "scan" or rank > 0 else None
        else:  # reduce_scatter_block, reduce_scatter: this rank's block of the elements
            counts = tuple(args.recvcounts or ())
            start, width = sum(counts[:rank]) * per, counts[rank] * per
            with device if device is not None else _nowhere():
                out = xp.empty(width * k, _D)
            call = Args(c, xp=xp, dtype=_D, send=flat, recv=out, op=_SUM,
                        count=width * k if c == "reduce_scatter_block" else -1,
                        recvcounts=tuple(m * per * k for m in counts), device=device)
            result = out.reshape(width, k)
        calls = [(own, None), (call, algorithm)] + ([(share, None)] if split else [])
        if number is None:
            rounds = tuple(dispatch.plan_for(state, a, how, blocking, again=True) for a, how in calls)
        else:
            rounds = tuple(dispatch.plan_for(state, a, how, False, persistent=number) for a, how in calls)
        name = ", ".join(f"{r.collective} {r.name_}" for r in rounds[1:]) if split else rounds[1].name_
        super().__init__(state, args, f"reproducible: {name}", "reproducible")
        self.persistent = number
        self.rounds = rounds
        self.keep = [e, d, call.recv, gathered]
        grid = e[start:start + width]
        dtype = x.dtype
        mine = None if gathered is None else gathered[start:start + width]

        def cut_exponents(run: Run) -> None:
            reproducible.grid(_contributions(run.keep), e, xp)

        def cut_digits(run: Run) -> None:
            reproducible.digit_sums(_contributions(run.keep), e, d, xp)

        def round_into(run: Run) -> None:
            if result is not None:
                reproducible.finish(result, grid, dtype, xp, out=reproducible.real_view(run.keep.recv))

        def round_mine(run: Run) -> None:
            reproducible.finish(result, grid, dtype, xp, out=mine)

        def copy_out(run: Run) -> None:
            xp.copyto(reproducible.real_view(run.keep.recv), gathered)

        first = Step("reproducible sum: exponents (allreduce, max)")
        first.pre = (_on(device, cut_exponents),)
        first.nested = (self._nested(0),)
        first.ops = (_on(device, cut_digits),)
        second = Step(f"reproducible sum: digits ({call.collective}, sum)")
        second.nested = (self._nested(1),)
        second.ops = (_on(device, round_mine if split else round_into),)
        steps = [first.finish(), second.finish()]
        if split:
            third = Step("reproducible sum: the rounded blocks (allgatherv)")
            third.nested = (self._nested(2),)
            third.ops = (_on(device, copy_out),)
            steps.append(third.finish())
        self.program = Program(steps, self, state)
        self.program.epoch = self.epoch

    def _nested(self, i: int) -> Callable[[Run], Run]:
        def make(run: Run) -> Run:
            return child_run(self.rounds[i])

        return make

    def release(self) -> None:
        """Free the nested plans' prepared requests where nothing else keeps them (persistent ones)."""
        for plan in self.rounds:
            if plan.persistent is not None:
                plan.release()
        self.program.steps = []


#: An allreduce of at least this many bytes whose algorithm the selection chooses reduce-scatters the digits,
#: rounds each rank's block and all-gathers the results (1.5 times the bytes of the digits' allreduce less, and
#: a p-th of the rounding); a smaller one all-reduces the digits (two rounds, not three).
SPLIT_BYTES = 32 * 1024


def _contributions(args: Args) -> list[Any]:
    """This rank's contributions to the call *args* (flat, real): its send buffer, or its rows of
    :attr:`Args.parts <mpicomm.plan.args.Args.parts>` (several, or none)."""
    if args.parts is None:
        return [reproducible.real_view(args.send)]
    return [reproducible.real_view(row) for row in args.parts]


def _on(device: Any, fn: Callable[[Run], None]) -> Callable[[Run], None]:
    """*fn*, run in *device*'s binding and finished there before the run goes on (device arrays), or as is."""
    if device is None:
        return fn

    def on_device(run: Run) -> None:
        with device:
            fn(run)
        device.synchronize()

    return on_device
