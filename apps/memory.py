"""Refusing a run that cannot fit in memory before it allocates, with the numbers and the fix, on every rank.

The applications size their big arrays from the command line (a global batch,
a grid's side, layer widths, a vocabulary). An absurd value used to reach
NumPy and end the job with a ``MemoryError`` traceback from one rank. Instead,
each application estimates what a run needs per rank - the arrays it
allocates that grow with those options: data, the activations its schedule
keeps, parameters, gradients, optimizer state - and calls :func:`check`
before allocating them::

    from apps import memory

    memory.check(comm, lambda v: estimate(batch=v["--batch"], micro=v["--micro"]),
                 [memory.Knob("--batch", cfg.batch), memory.Knob("--micro", cfg.micro, high=cfg.batch)])

The estimate takes the options' values; a :class:`Knob` says which way its
option helps (smaller, like ``--batch``, or larger, like ``--micro``), so the
message can name the nearest value that fits (``python -m apps.pipeline train
--batch 1000000000000`` on 2 ranks)::

    --batch 1000000000000: needs about 4.74 PiB of memory per rank, but this machine has 22.6 GiB
    available for 2 ranks (11.3 GiB each): use --batch <= 2270472, or spread the run over more nodes

:func:`check` is collective over *comm*: every rank reads the memory its node
has available (``MemAvailable`` of ``/proc/meminfo``, else ``os.sysconf``) and
counts the ranks of *comm* on that node (``Split_type(COMM_TYPE_SHARED)``);
the largest need and the smallest per-rank share decide, so every rank raises
the same :class:`MemoryNeedError` (a ``ValueError``: the applications report
it as the user error it is, with exit status 2 and no traceback). Where the
available memory cannot be read, nothing is refused.

An estimate is an approximation of what the run allocates, not a bound: it
refuses what cannot fit and leaves a run that merely comes close to the limit
to the operating system. The estimate functions must not depend on the rank
(take the largest rank's share), so that every rank computes the same advice.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["MemoryNeedError", "Knob", "available", "describe", "check", "largest"]


class MemoryNeedError(ValueError):
    """A run that needs more memory than this machine has available (the message names both and the fix)."""


@dataclass
class Knob:
    """An option that sets how much memory a run needs, and which way it helps.

    Without *high*, smaller values need less (``--batch``, down to *low*);
    with *high*, larger values need less (``--micro``, up to *high*), and
    *candidates* (optional) lists the values allowed there, in increasing order
    (default: doubling). *shown* is how the current value is written (default:
    the number); *template* how a value that fits is advised (default:
    ``{option} <= {value}``, or ``{option} >= {value}`` with *high*).
    """

    option: str
    value: int
    low: int = 1
    high: int | None = None
    candidates: Sequence[int] | None = None
    shown: str | None = None
    template: str | None = None

    def __str__(self) -> str:
        return f"{self.option} {self.shown if self.shown is not None else self.value}"

    @property
    def limit(self) -> int:
        """The value that needs the least memory."""
        return self.low if self.high is None else self.high

    def advice(self, fits: Callable[[int], bool]) -> str | None:
        """``--batch <= N`` / ``--micro >= M``: the value nearest the current one for which *fits*, or None."""
        if self.high is None:
            best = largest(fits, self.low, self.value - 1)
            template = self.template or "{option} <= {value}"
        else:
            choices = self.candidates if self.candidates is not None else _doubling(self.value, self.high)
            best = next((v for v in choices if self.value < v <= self.high and fits(v)), None)
            template = self.template or "{option} >= {value}"
        return None if best is None else template.format(option=self.option, value=best)


def _doubling(value: int, high: int) -> list[int]:
    out, v = [], max(1, value)
    while v < high:
        v = min(2 * v, high)
        out.append(v)
    return out


def available() -> int | None:
    """Bytes of memory this machine can give new allocations now (``MemAvailable``), or None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        pages, size = os.sysconf("SC_AVPHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    return pages * size if pages > 0 and size > 0 else None


def describe(nbytes: float) -> str:
    """``7.3 TiB``, ``22.4 GiB``, ``512 MiB``, ``900 B``: three significant digits, binary units."""
    value, unit = float(nbytes), "B"
    for name in ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"):
        if value < 1024:
            break
        value, unit = value / 1024, name
    if unit == "B":
        return f"{int(nbytes)} B"
    return f"{value:.3g} {unit}" if value < 1000 else f"{value:,.0f} {unit}"


def _node(comm: Any) -> tuple[int, str]:
    """How many ranks of *comm* share this rank's node, and the node's name (collective)."""
    from mpi4py import MPI

    try:
        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    except MPI.Exception:  # no shared-memory split: count this rank alone
        return 1, MPI.Get_processor_name()
    try:
        return node.Get_size(), MPI.Get_processor_name()
    finally:
        node.Free()


def check(comm: Any, need: Callable[[dict[str, int]], int], knobs: Sequence[Knob] = (), *, what: str = "",
          otherwise: str = "", have: int | None = None) -> None:
    """Raise :class:`MemoryNeedError` on every rank of *comm* if the run needs more than a rank's share (collective).

    *comm* None: this process alone, without MPI (a serial command).

    ``need(values)``: the bytes per rank (the busiest rank's: not rank-dependent)
    with the knobs' options at *values* (``{option: value}``, every knob
    given); it is called a few dozen times, so it should be arithmetic.
    *knobs*: the options that set it. The message names those that alone can
    bring the run within its share, with the value that does (``use --batch <=
    14864306 or --micro >= 64``); when none can, the fewest that can together
    (``use smaller --batch and --samples``); then *otherwise* (advice of the
    caller's own, e.g. ``run on more nodes``). *what* names the settings when
    there are no knobs. *have* replaces this node's available bytes (for
    tests). The message is the same on every rank.
    """
    current = {k.option: k.value for k in knobs}
    ranks, host = _node(comm) if comm is not None else (1, "")
    mine = available() if have is None else int(have)
    record = (int(need(current)), mine, ranks, host)
    everyone = comm.allgather(record) if comm is not None else [record]
    most = max(n for n, _, _, _ in everyone)
    known = [(avail // ranks, avail, ranks, host) for _, avail, ranks, host in everyone if avail is not None]
    if not known:
        return
    budget, avail, ranks, host = min(known)
    if most <= budget:
        return

    def fits_with(option: str) -> Callable[[int], bool]:
        return lambda v: need({**current, option: v}) <= budget

    helps = [(knob, advice) for knob in knobs if (advice := knob.advice(fits_with(knob.option)))]
    if helps:
        named = [knob for knob, _ in helps]
        fix = f"use {' or '.join(advice for _, advice in helps)}"
    else:  # no option alone is enough: the fewest that together can be, each at its limit
        named = _together(need, knobs, current, budget)
        smaller = [k.option for k in named if k.high is None]
        larger = [k.option for k in named if k.high is not None]
        fix = " and ".join(f"{word} {' and '.join(options)}" for word, options in (("smaller", smaller),
                                                                                  ("larger", larger)) if options)
        fix = f"use {fix}" if fix else ""
    settings = ", ".join(map(str, named or knobs)) or what
    if otherwise:
        fix = f"{fix}, or {otherwise}" if fix else otherwise
    where = "this machine" if len({h for _, _, _, h in everyone}) == 1 else f"node {host}"
    shared = f" for {ranks} ranks ({describe(budget)} each)" if ranks > 1 else ""
    per = " per rank" if comm is not None else ""
    raise MemoryNeedError(f"{settings + ': ' if settings else ''}needs about {describe(most)} of memory{per}, "
                          f"but {where} has {describe(avail)} available{shared}" + (f": {fix}" if fix else ""))


def _together(need: Callable[[dict[str, int]], int], knobs: Sequence[Knob], current: dict[str, int],
              budget: int) -> list[Knob]:
    """Knobs that, set to their limits one after the other (the largest saving first), bring *need* to *budget*.

    Empty when even all of them at their limits do not.
    """
    values, chosen, left = dict(current), [], list(knobs)
    while left and need(values) > budget:
        best = min(left, key=lambda k: (need({**values, k.option: k.limit}), knobs.index(k)))
        if need({**values, best.option: best.limit}) >= need(values):
            return []
        values[best.option] = best.limit
        chosen.append(best)
        left.remove(best)
    return chosen if need(values) <= budget else []


def largest(fits: Callable[[int], bool], low: int, high: int) -> int | None:
    """The largest n in [low, high] with ``fits(n)``, for a *fits* true up to some n and false beyond.

    None when even *low* does not fit (or *high* < *low*). A binary search.
    """
    if high < low or not fits(low):
        return None
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return low
