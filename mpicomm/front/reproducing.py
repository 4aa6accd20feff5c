"""Running a blocking reducing collective as a reproducible sum (:mod:`mpicomm.reproducible`).

Two rounds on the communicator, each an ordinary mpicomm collective (chosen,
compiled, validated and run as any): an allreduce (MAX) of the contributions'
exponents, as int16, then the call itself (SUM) on their digits, as int64,
with the algorithm the caller chose. Then each rank that holds a result
rounds its digit sums into its receive buffer.

The call's own arguments are read and checked first; one that has a problem,
or that asks a reproducible sum of what has none (another op on floats), runs
the ordinary call with that problem, so every rank raises the same
:class:`~mpicomm.plan.args.ArgumentError`. Ops and element types whose
reduction is exact already (integers, MAX, MIN...) run the ordinary call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .. import reproducible
from ..ops import resolve
from ..plan.args import Args
from . import dispatch

if TYPE_CHECKING:
    from ..state import State

__all__ = ["COLLECTIVES", "run"]

#: The collectives a reproducible sum runs for (blocking).
COLLECTIVES = ("allreduce", "reduce", "reduce_scatter_block", "reduce_scatter")

_MAX, _SUM = resolve("max"), resolve("sum")
_E, _D = np.dtype(np.int16), np.dtype(np.int64)


def run(state: State | Any, args: Args, algorithm: str | None) -> None:
    """Run the blocking call *args* (one of :data:`COLLECTIVES`) as a reproducible sum, where it has one (*state*:
    the communicator's :class:`~mpicomm.state.State`, or what a freed ``Comm`` holds instead, which raises)."""
    if args.problem is None and args.unsupported is None:
        try:
            exact = reproducible.supported(args.dtype, args.op.name if args.op is not None else "")
        except ValueError as exc:
            args.fail(exc)  # (every rank raises it: the ordinary call's agreement carries it)
        else:
            if exact is None:
                _two_rounds(state, args, algorithm)
                return
    dispatch.start(state, args, algorithm, True)


def _two_rounds(state: State, args: Args, algorithm: str | None) -> None:
    xp = args.xp or np
    c, rank = args.collective, state.rank
    x = reproducible.real_view(args.send)
    per = 2 if x.dtype != args.send.dtype else 1  # real elements per element (complex: two)
    e, d = _work(state, x, xp)
    xp.copyto(e, reproducible.exponents(x, xp))
    dispatch.start(state, Args("allreduce", xp=xp, dtype=_E, send=e, recv=e, in_place=True, op=_MAX, count=int(e.size),
                      device=args.device), None, True)
    reproducible.digits(x, e, xp, out=d)
    k = d.shape[1]
    flat = d.reshape(-1)
    if c == "allreduce":
        dispatch.start(state, Args(c, xp=xp, dtype=_D, send=flat, recv=flat, in_place=True, op=_SUM, count=int(flat.size),
                          device=args.device), algorithm, True)
        _write(args.recv, reproducible.finish(d, e, x.dtype, xp))
    elif c == "reduce":
        root = rank == args.root
        dispatch.start(state, Args(c, xp=xp, dtype=_D, send=flat, recv=flat if root else None, in_place=root, op=_SUM,
                          root=args.root, count=int(flat.size), device=args.device), algorithm, True)
        if root:
            _write(args.recv, reproducible.finish(d, e, x.dtype, xp))
    else:  # reduce_scatter_block, reduce_scatter: this rank's block of the elements
        counts = tuple(args.recvcounts or ())
        start = sum(counts[:rank]) * per
        mine = counts[rank] * per
        out = xp.empty(mine * k, _D)
        dispatch.start(state, Args(c, xp=xp, dtype=_D, send=flat, recv=out, op=_SUM,
                          count=int(mine * k) if c == "reduce_scatter_block" else -1,
                          recvcounts=tuple(n * per * k for n in counts), device=args.device), algorithm, True)
        _write(args.recv, reproducible.finish(out.reshape(mine, k), e[start:start + mine], x.dtype, xp))


#: shapes whose exponents and digits arrays a communicator keeps (the oldest are dropped)
KEPT = 8


def _work(state: State, x: Any, xp: Any) -> tuple[Any, Any]:
    """The exponents and digits arrays for contributions of *x*'s size and element type, kept per communicator
    so that a repeated call's two rounds run their kept plans (:mod:`mpicomm.front.dispatch`)."""
    key = (x.size, x.dtype, xp.__name__, id(x.device) if xp is not np else None)
    kept = state.sums.get(key)
    if kept is None:
        if len(state.sums) >= KEPT:
            del state.sums[next(iter(state.sums))]
        kept = state.sums[key] = (xp.empty(x.size, _E), xp.empty((x.size, reproducible.DIGITS[x.dtype]), _D))
    return kept


def _write(recv: Any, values: Any) -> None:
    """The rounded sums into the receive buffer (flat; a complex one through its real view)."""
    target = reproducible.real_view(recv)
    target[...] = values
