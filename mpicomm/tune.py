"""``mpiexec -n N python -m mpicomm.tune``: fit the α-β-γ cost model on this machine and save it.

    mpiexec -n 2 python -m mpicomm.tune                  # fit, print the fit, save it
    mpiexec -n 2 python -m mpicomm.tune --show           # print the saved fit for this layout
    mpiexec -n 2 python -m mpicomm.tune --collectives    # time every algorithm, save the measured decisions
    mpiexec -n 2 python -m mpicomm.tune --json fit.json  # also the fit (and its samples) as a JSON document

Measures, on the current machine and rank layout (N ≥ 2 ranks):

* α and β per path, from a ping-pong over ``--sizes``: between two ranks of
  one node (intra-node) and, when the job spans nodes, between the leaders of
  nodes 0 and 1 (inter-node; on one node the inter-node link is taken to be
  the intra-node one, and with one rank per node the intra-node link the
  inter-node one: the printed fit and ``--show`` mark such values
  ``[not measured: ...]``, see :func:`unmeasured`). Messages go through the
  machinery the algorithms use (``Call.send``/``Call.recv`` steps run by
  :func:`mpicomm.requests.run`), so α includes the per-message Python cost
  they pay. One-way time = half a round trip, the median of 5 rounds;
* γ, seconds per byte reduced (``np.add(a, b, out=c)`` on float64), and δ,
  seconds per byte copied (``dst[...] = src``), on every rank at once;
* the cache threshold (``Machine.cache_bytes``, the largest message still in
  the cache regime): the last-level cache (the largest level listed under
  ``/sys/devices/system/cpu/cpu0/cache``) shared by the node's ranks, each
  holding an input, an output and one temporary: LLC / (3 · ranks per node).
  Where the cache size cannot be read, the knee of the copy times
  (:func:`fit_knee`);
* the fixed cost of one collective call (an 8-byte ``Allreduce`` on
  ``MPI.COMM_SELF`` with validation off, less the copy it makes) and what
  validation adds to it (8-byte ``Allreduce`` on all ranks, on vs off).

Lines t = α + β·n are fitted by :func:`mpicomm.model.fit_line` (relative
error) to the sizes ≤ cache_bytes (the cache regime); the memory-regime
per-byte costs (β of each link, γ, δ) by :func:`mpicomm.model.fit_memory_slope`
to the sizes ≥ 2·cache_bytes, through the cache line's intercept (none
measured there: the cache values). The default sizes, 8 B to 64 MiB, reach
past the cache. The fit is saved as JSON in the cache directory (``MPICOMM_CACHE_DIR``,
else ``$XDG_CACHE_HOME/mpicomm``, else ``~/.cache/mpicomm``), named by rank
0's host and the layout (ranks, nodes, most ranks per node); every
``mpicomm.Comm`` with that layout on that host then loads it, and
``algorithm="auto"`` picks the algorithm the model predicts fastest.

With ``--collectives``, nothing is fitted: every registered algorithm of
each collective (``--collective``, default all of ``python -m mpicomm.bench``'s)
that can run at this p and layout is timed on plain NumPy float64 arrays over
``--sizes`` (default 8 B to 16 MiB), all of them interleaved in ``--rounds``
rounds per size, each taking its median round (:func:`mpicomm.bench.time_algorithms`).
The fastest at each size becomes a decision, and the decisions are saved as a
hand-editable JSON file of size ranges per collective next to the fit
(:mod:`mpicomm.decisions`); every ``mpicomm.Comm`` of that host and layout
loads it, and ``auto`` follows it before the model for the sizes it covers.

Command-line conventions are :mod:`mpicomm.cli`'s: sizes as ``4096``, ``64K``,
``64KiB``, ``1M`` or ``1e6``; progress lines ``[i/N] ... elapsed ... ETA ...``
on stderr (``--quiet``: none); ``--json FILE`` writes an ``mpicomm-results``
document whose ``results`` are the fit (:func:`fit_json`: the machine, what
was not measured, the fitted lines and every sample), the decisions with
``--collectives``, or the saved fit or decisions with ``--show``. Every
command tune advises (:func:`tune_command`) runs on at least
:data:`MIN_RANKS` ranks.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shlex
import statistics
import sys
import time
from typing import Any, Callable, Sequence

import numpy as np

from . import cli, config, decisions, model

__all__ = ["main", "measure", "Fit", "fit_regimes", "fit_knee", "last_level_cache", "cache_threshold",
           "measure_collectives", "collective_iterations", "auto_closeness", "describe", "unmeasured",
           "tune_command", "fit_json", "MIN_RANKS"]

#: The fewest ranks tune measures with: a message needs a sender and a receiver.
MIN_RANKS = 2

#: The program name in usage lines, advice and JSON documents.
PROG = "python -m mpicomm.tune"

_ROUNDS = 5


class Fit:
    """What one tuning run measured: per-size samples, the fitted lines, and the :class:`~mpicomm.model.Machine`."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.intra: list[float] = []
        self.inter: list[float] | None = None
        self.add_bytes: list[int] = []
        self.add: list[float] = []
        self.copy: list[float] = []
        self.lines: dict[str, tuple[float, float]] = {}  # name: (alpha, beta); "<name>_mem": the memory regime
        self.cache_bytes = 0
        self.cache_source = ""
        self.call_seconds = 0.0
        self.small_copy = 0.0
        self.validated = 0.0
        self.unvalidated = 0.0
        self.machine: model.Machine | None = None
        self.layout = ""
        self.p = 0


def tune_command(p: int, *options: str) -> str:
    """The command line that runs tune on *p* ranks (at least :data:`MIN_RANKS`) with *options*, shell-quoted.

    Every command tune advises is built here, so none asks for fewer ranks than
    tune accepts; the tests parse each one with tune's own parser.
    """
    return " ".join(["mpiexec", "-n", str(max(MIN_RANKS, p)), PROG, *(shlex.quote(o) for o in options)])


def _user_options(argv: Sequence[str] | None) -> list[str]:
    return list(sys.argv[1:] if argv is None else argv)


def _median_of_rounds(fn: Callable[[int], None], iters: int) -> float:
    """Seconds per iteration of ``fn(k)`` (k iterations per call): a warm-up, then the median of 5 rounds."""
    per_round = max(1, iters // _ROUNDS)
    fn(max(1, per_round // 5))
    times = []
    for _ in range(_ROUNDS):
        start = time.perf_counter()
        fn(per_round)
        times.append((time.perf_counter() - start) / per_round)
    return statistics.median(times)


def _pingpong_iters(size: int, requested: int | None) -> int:
    if requested:
        return requested
    return 1000 if size <= 8192 else max(10, min(500, (64 << 20) // size))


def _local_iters(nbytes: int, requested: int | None) -> int:
    if requested:
        return requested
    return max(10, min(2000, (20 << 20) // max(nbytes, 1024)))


def _parse_size(text: str) -> int:
    """``"32768K"`` → 33554432 (the format of the kernel's cache size files)."""
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    digits = text[:-1] if text[-1:] in "KMG" else text
    return int(digits) * scale


def last_level_cache(root: str = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """Bytes of the largest cache level listed under *root* (Linux), or None when none can be read."""
    best: int | None = None
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        return None
    for entry in entries:
        if not entry.startswith("index"):
            continue
        try:
            with open(os.path.join(root, entry, "size")) as f:
                size = _parse_size(f.read())
        except (OSError, ValueError):
            continue
        if size > 0 and (best is None or size > best):
            best = size
    return best


def cache_threshold(llc: int, ppn: int) -> int:
    """The largest message of the cache regime: the *llc* bytes shared by *ppn* ranks, each holding an input, an
    output and one temporary of the message size (at least 1 byte)."""
    if llc < 1 or ppn < 1:
        raise ValueError(f"cache_threshold: llc = {llc}, ppn = {ppn}; both must be ≥ 1")
    return max(1, llc // (3 * ppn))


def fit_regimes(sizes: Sequence[int], seconds: Sequence[float], cache_bytes: int) -> tuple[float, float, float]:
    """``(alpha, beta, beta_mem)``: :func:`mpicomm.model.fit_line` over the sizes ≤ *cache_bytes*, and
    :func:`mpicomm.model.fit_memory_slope` over the sizes ≥ 2·*cache_bytes* (beta_mem = beta when there are none).

    Fewer than two distinct sizes ≤ *cache_bytes*: the line is fitted to all sizes and beta_mem = beta.
    """
    small = [(n, t) for n, t in zip(sizes, seconds) if n <= cache_bytes]
    large = [(n, t) for n, t in zip(sizes, seconds) if n >= 2 * cache_bytes]
    if len({n for n, _ in small}) < 2:
        alpha, beta = model.fit_line(sizes, seconds)
        return alpha, beta, beta
    alpha, beta = model.fit_line([n for n, _ in small], [t for _, t in small])
    if not large:
        return alpha, beta, beta
    return alpha, beta, model.fit_memory_slope([n for n, _ in large], [t for _, t in large], alpha)


def fit_knee(sizes: Sequence[int], seconds: Sequence[float]) -> int:
    """The threshold c among *sizes* whose two-regime fit (:func:`fit_regimes` with the sizes > c as the memory
    regime) has the least squared relative error; the largest size when no split leaves two sizes below it and
    one above."""
    pairs = sorted(zip(sizes, seconds))
    best, best_error = max(sizes), math.inf
    for i in range(1, len(pairs) - 1):
        c = pairs[i][0]
        small = [(n, t) for n, t in pairs if n <= c]
        large = [(n, t) for n, t in pairs if n > c]
        if len({n for n, _ in small}) < 2 or not large:
            continue
        alpha, beta = model.fit_line([n for n, _ in small], [t for _, t in small])
        beta_mem = model.fit_memory_slope([n for n, _ in large], [t for _, t in large], alpha)
        error = sum(((alpha + beta * n - t) / t) ** 2 for n, t in small)
        error += sum(((alpha + beta_mem * n - t) / t) ** 2 for n, t in large)
        if error < best_error - 1e-12:
            best, best_error = c, error
    return best


def _pingpong(comm: Any, pair: tuple[int, int], sizes: Sequence[int], iters: int | None, label: str,
              show: bool = True) -> list[float]:
    """One-way seconds per size between the ranks of *pair* (collective over *comm*: everyone gets the result);
    a progress line per size on the pair's first rank when *show*."""
    from mpi4py import MPI

    from .coll.call import Call
    from .requests import run

    plain = MPI.Intracomm(comm)
    rank = plain.Get_rank()
    call = Call(comm._state, "tune", np, np.dtype(np.uint8))  # every rank: the collective tag sequence stays aligned
    first, second = pair
    times: list[float] = []
    if rank in pair:
        peer = second if rank == first else first
        progress = cli.Progress(len(sizes), f"mpicomm.tune {label} ping-pong", show=show and rank == first)
        for index, size in enumerate([min(sizes)] + list(sizes)):  # the first pass warms up (connections, caches)
            x = np.zeros(size, np.uint8)
            y = np.empty(size, np.uint8)

            def bounce(k: int) -> Any:
                for _ in range(k):
                    if rank == first:
                        yield call.send(peer, x)
                        yield call.recv(peer, y)
                    else:
                        yield call.recv(peer, y)
                        yield call.send(peer, x)

            times.append(_median_of_rounds(lambda k: run(bounce(k), label="tune ping-pong"),
                                           _pingpong_iters(size, iters)) / 2)
            if index:
                progress.step(f"{size} B: {cli.format_time(times[-1])} one way")
        times = times[1:]
    result = np.array(times if rank == first else [0.0] * len(sizes), np.float64)
    _bcast_quietly(plain, result, first)
    return result.tolist()


def _bcast_quietly(plain: Any, values: np.ndarray, root: int) -> None:
    """Broadcast array *values* from *root* in place; a rank that has to wait sleeps between polls, leaving the
    cores to the ranks still measuring (a blocking MPI wait may spin)."""
    request = plain.Ibcast(values, root=root)
    pause = 1e-5
    while not request.Test():
        time.sleep(pause)
        pause = min(2 * pause, 1e-3)


def _pairs(comm: Any) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    """(intra pair, inter pair) of ranks: two ranks of one node, and the leaders of nodes 0 and 1."""
    from mpi4py import MPI

    where = MPI.Intracomm(comm).allgather((comm.node, comm.local_rank))
    place = {w: r for r, w in enumerate(where)}
    intra = None
    for node in range(comm.nodes):
        if (node, 1) in place:
            intra = (place[(node, 0)], place[(node, 1)])
            break
    inter = (place[(0, 0)], place[(1, 0)]) if comm.nodes > 1 else None
    return intra, inter


def _local_work(sizes: Sequence[int], iters: int | None) -> tuple[list[int], list[float], list[float]]:
    """Bytes, and seconds of ``np.add(a, b, out=c)`` and of ``dst[...] = src`` on float64 vectors of those bytes."""
    used, add, copy = [], [], []
    for size in sizes:
        count = max(1, size // 8)
        a = np.arange(count, dtype=np.float64)
        b = np.ones(count, np.float64)
        c = np.empty(count, np.float64)
        k = _local_iters(count * 8, iters)

        def adding(n: int) -> None:
            for _ in range(n):
                np.add(a, b, out=c)

        def copying(n: int) -> None:
            for _ in range(n):
                c[...] = a

        used.append(count * 8)
        add.append(_median_of_rounds(adding, k))
        copy.append(_median_of_rounds(copying, k))
    return used, add, copy


def _with_validation(on: bool, fn: Callable[[], float]) -> float:
    """Run *fn* with ``MPICOMM_VALIDATE`` set to 1 or 0, then restore the environment."""
    before = os.environ.get("MPICOMM_VALIDATE")
    os.environ["MPICOMM_VALIDATE"] = "1" if on else "0"
    try:
        return fn()
    finally:
        if before is None:
            del os.environ["MPICOMM_VALIDATE"]
        else:
            os.environ["MPICOMM_VALIDATE"] = before


def _call_costs(comm: Any, iters: int | None) -> tuple[float, float, float, float]:
    """(8-byte Allreduce on COMM_SELF without validation, 8-byte copy, 8-byte Allreduce on *comm* with and without
    validation), seconds per call on this rank."""
    from mpi4py import MPI

    import mpicomm

    k = iters or 2000
    x = np.ones(1, np.float64)
    y = np.empty(1, np.float64)
    alone = mpicomm.Comm(MPI.COMM_SELF)

    def self_calls(n: int) -> None:
        for _ in range(n):
            alone.Allreduce(x, y)

    def copies(n: int) -> None:
        for _ in range(n):
            y[...] = x

    def world_calls(n: int) -> None:
        for _ in range(n):
            comm.Allreduce(x, y, algorithm="recursive_doubling")

    single = _with_validation(False, lambda: _median_of_rounds(self_calls, k))
    small_copy = _median_of_rounds(copies, k)
    on = off = 0.0
    rounds = 3
    for _ in range(rounds):  # interleaved, so both see the same machine
        on += _with_validation(True, lambda: _median_of_rounds(world_calls, max(_ROUNDS, k // rounds)))
        off += _with_validation(False, lambda: _median_of_rounds(world_calls, max(_ROUNDS, k // rounds)))
    return single, small_copy, on / rounds, off / rounds


def _mean(comm: Any, value: float) -> float:
    from mpi4py import MPI

    plain = MPI.Intracomm(comm)
    return plain.allreduce(value, op=MPI.SUM) / plain.Get_size()


def measure(comm: Any, sizes: Sequence[int], iters: int | None = None, show: bool = True) -> Fit:
    """Measure and fit the model on *comm* (an ``mpicomm.Comm`` of ≥ 2 ranks); COLLECTIVE. Every rank gets the Fit.

    *show*: progress lines on stderr (:class:`mpicomm.cli.Progress`; rank 0, and the ping-pong's first rank).
    """
    from mpi4py import MPI

    plain = MPI.Intracomm(comm)
    rank, p = plain.Get_rank(), plain.Get_size()
    note = cli.Progress(0, "mpicomm.tune", show=show and rank == 0).note
    fit = Fit()
    fit.p = p
    fit.sizes = list(sizes)
    ppn = getattr(comm, "ppn", None) or plain.allreduce(comm.local_size, op=MPI.MAX)
    host = plain.bcast(comm.host, root=0)
    fit.layout = model.layout_key(p, comm.nodes, ppn)
    intra_pair, inter_pair = _pairs(comm)
    if intra_pair is not None:
        fit.intra = _pingpong(comm, intra_pair, sizes, iters, "intra-node", show)
    if inter_pair is not None:
        fit.inter = _pingpong(comm, inter_pair, sizes, iters, "inter-node", show)
    if intra_pair is None:  # one rank per node: no pair shares a node
        fit.intra = list(fit.inter or [])
    note("local reduction and copy")
    used, add, copy = _local_work(sizes, iters)
    fit.add_bytes = used
    fit.add = [_mean(comm, t) for t in add]
    fit.copy = [_mean(comm, t) for t in copy]
    note("call overhead and validation")
    single, small_copy, on, off = _call_costs(comm, iters)
    fit.call_seconds, fit.small_copy = _mean(comm, single), _mean(comm, small_copy)
    fit.validated, fit.unvalidated = _mean(comm, on), _mean(comm, off)

    llc = plain.bcast(last_level_cache() if rank == 0 else None, root=0)
    if llc is not None:
        fit.cache_bytes = cache_threshold(llc, ppn)
        fit.cache_source = f"last-level cache {llc >> 10} KiB / (3 x {ppn} ranks per node)"
    else:
        fit.cache_bytes = fit_knee(fit.add_bytes, fit.copy)
        fit.cache_source = "knee of the copy times (cache size unreadable)"
    fit.machine = machine_from(fit, ppn, comm.nodes, host)
    return fit


def machine_from(fit: Fit, ppn: int, nodes: int, host: str) -> model.Machine:
    """Fit the lines of both regimes to *fit*'s samples (filling ``fit.lines``) and build its Machine."""
    for name, sizes, times in (("intra", fit.sizes, fit.intra), ("inter", fit.sizes, fit.inter),
                               ("gamma", fit.add_bytes, fit.add), ("copy", fit.add_bytes, fit.copy)):
        if times is None:
            continue
        alpha, beta, beta_mem = fit_regimes(sizes, times, fit.cache_bytes)
        fit.lines[name], fit.lines[name + "_mem"] = (alpha, beta), (alpha, beta_mem)
    intra, intra_mem = model.Link(*fit.lines["intra"]), model.Link(*fit.lines["intra_mem"])
    inter, inter_mem = ((model.Link(*fit.lines["inter"]), model.Link(*fit.lines["inter_mem"]))
                        if "inter" in fit.lines else (intra, intra_mem))
    return model.Machine(
        intra=intra, inter=inter, gamma=fit.lines["gamma"][1], copy=fit.lines["copy"][1],
        overhead=max(0.0, fit.call_seconds - fit.small_copy), validation=max(0.0, fit.validated - fit.unvalidated),
        ppn=ppn, nodes=nodes, host=host, created=model.now(), cache_bytes=fit.cache_bytes,
        intra_mem=intra_mem, inter_mem=inter_mem, gamma_mem=fit.lines["gamma_mem"][1],
        copy_mem=fit.lines["copy_mem"][1],
    )


#: The mark :func:`describe` puts after a value tune did not measure.
NOT_MEASURED = "[not measured:"


def unmeasured(machine: model.Machine) -> dict[str, str]:
    """The values of *machine* that were not measured, and what they were taken from: ``{row: reason}``.

    Rows are :func:`describe`'s names (``"inter-node"``, ``"intra mem"``...).
    Read from the machine alone, so a saved fit says it too: on one node the
    inter-node link is a copy of the intra-node link (nothing to measure it
    on); with one rank per node the intra-node link is a copy of the inter-node
    one; a memory-regime value equal to its cache-regime value was not fitted
    separately (no measured size reached 2 × ``cache_bytes``, or too few sizes
    lay below it).
    """
    found: dict[str, str] = {}
    if machine.nodes == 1:
        found["inter-node"] = "one node; the intra-node values"
        found["inter mem"] = "one node; the intra mem values"
    elif machine.ppn == 1:
        found["intra-node"] = "one rank per node; the inter-node values"
        found["intra mem"] = "one rank per node; the inter mem values"
    same = "no size >= 2 x cache; the cache-regime value"
    for row, mem, cached in (("intra mem", machine.intra_mem, machine.intra),
                             ("inter mem", machine.inter_mem, machine.inter),
                             ("gamma mem", machine.gamma_mem, machine.gamma),
                             ("copy mem", machine.copy_mem, machine.copy)):
        if row not in found and (mem is None or mem == cached):
            found[row] = same
    return found


def describe(machine: model.Machine) -> list[str]:
    """The fitted values of *machine* as lines of text; a value tune did not measure ends with
    ``[not measured: what it was taken from]`` (see :func:`unmeasured`)."""
    missing = unmeasured(machine)

    def mark(name: str) -> str:
        return f"  {NOT_MEASURED} {missing[name]}]" if name in missing else ""

    def link(name: str, value: model.Link) -> str:
        bandwidth = f"{1 / value.beta / 1e9:8.2f} GB/s" if value.beta > 0 else "       - GB/s"
        return (f"  {name:<11} alpha {value.alpha * 1e6:8.2f} {cli.US}   beta {value.beta * 1e9:8.4f} ns/B  "
                f"({bandwidth}){mark(name)}")

    def rate(value: float) -> str:
        return f"{1 / value / 1e9:.2f} GB/s" if value > 0 else "-"

    gamma_mem = machine.gamma if machine.gamma_mem is None else machine.gamma_mem
    copy_mem = machine.copy if machine.copy_mem is None else machine.copy_mem
    return [
        link("intra-node", machine.intra),
        link("inter-node", machine.inter),
        f"  gamma       {machine.gamma * 1e9:8.4f} ns/B reduced ({rate(machine.gamma)})",
        f"  copy        {machine.copy * 1e9:8.4f} ns/B copied ({rate(machine.copy)})",
        f"  cache       {machine.cache_bytes} B: messages above it pay the memory regime:",
        link("intra mem", machine.intra_mem or machine.intra),
        link("inter mem", machine.inter_mem or machine.inter),
        f"  gamma mem   {gamma_mem * 1e9:8.4f} ns/B reduced ({rate(gamma_mem)}){mark('gamma mem')}",
        f"  copy mem    {copy_mem * 1e9:8.4f} ns/B copied ({rate(copy_mem)}){mark('copy mem')}",
        f"  overhead    {machine.overhead * 1e6:8.2f} {cli.US} per collective call (validation off)",
        f"  validation  {machine.validation * 1e6:8.2f} {cli.US} more per call with validation on",
        f"  layout      {machine.nodes} node(s), up to {machine.ppn} ranks per node; host {machine.host}; "
        f"fitted {machine.created or '-'}",
    ]


def report(fit: Fit) -> str:
    """The fit and its residuals (measured vs fitted per size) as text."""
    m = fit.machine
    if m is None:
        raise ValueError("report: this Fit has no machine yet; run measure() first")
    lines = [f"mpicomm.tune: {fit.p} ranks on {m.nodes} node(s), up to {m.ppn} per node (layout {fit.layout}), "
             f"host {m.host}"]
    if fit.inter is None:
        lines.append("one node: the inter-node link is taken to be the intra-node link (no second node to measure)")
    lines += ["", "fit:"] + describe(m)
    if fit.cache_source:
        lines.append(f"  (cache threshold from the {fit.cache_source})")

    def line(name: str, size: int) -> tuple[float, float]:
        """The fitted line of *name* that a message of *size* bytes pays (the model's regime switch)."""
        if size > m.cache_bytes and name + "_mem" in fit.lines:
            return fit.lines[name + "_mem"]
        return fit.lines[name]

    def residual(measured: float, fitted: float) -> str:
        return f"{measured * 1e6:12.2f} {fitted * 1e6:12.2f} {100 * (fitted - measured) / measured:+7.1f}%"

    paths = [("intra", fit.intra)] + ([("inter", fit.inter)] if fit.inter is not None else [])
    header = f"{'size (B)':>10}" + "".join(f" {name + f' meas ({cli.US})':>12} {f'fit ({cli.US})':>12} {'error':>8}"
                                           for name, _ in paths)
    lines += ["", "ping-pong, one way (fit: alpha + beta * size, beta of the size's regime):", header]
    for i, size in enumerate(fit.sizes):
        row = f"{size:>10}"
        for name, times in paths:
            alpha, beta = line(name, size)
            row += " " + residual(times[i], alpha + beta * size)
        lines.append(row)
    lines += ["", "local work per call (fit: intercept + slope * bytes; the slopes are gamma and copy):",
              f"{'bytes':>10} {f'add meas ({cli.US})':>12} {f'fit ({cli.US})':>12} {'error':>8} {'copy meas':>12} "
              f"{f'fit ({cli.US})':>12} {'error':>8}"]
    for i, nbytes in enumerate(fit.add_bytes):
        ga, gb = line("gamma", nbytes)
        ca, cb = line("copy", nbytes)
        lines.append(f"{nbytes:>10} {residual(fit.add[i], ga + gb * nbytes)} {residual(fit.copy[i], ca + cb * nbytes)}")
    us = cli.US
    lines += ["", f"call overhead: 8-byte Allreduce on COMM_SELF {fit.call_seconds * 1e6:.2f} {us} - 8-byte copy "
                  f"{fit.small_copy * 1e6:.2f} {us}; on all ranks {fit.validated * 1e6:.2f} {us} validated, "
                  f"{fit.unvalidated * 1e6:.2f} {us} not"]
    return "\n".join(lines)


# ---------------------------------------------------------------- measured decisions (--collectives)


def collective_iterations(nbytes: int, requested: int | None = None) -> int:
    """Calls per algorithm and size when deciding: *requested*, else 200 for small messages down to 10 from 400 KiB
    (about 4 MiB moved per algorithm, so the large sizes do not take minutes on a small machine)."""
    return requested if requested else max(10, min(200, (4 << 20) // max(nbytes, 1)))


def auto_closeness(points: Sequence[dict], tolerance: float = 0.10) -> tuple[int, int]:
    """(points where ``auto`` was within *tolerance* of the fastest algorithm, points with ``auto`` measured).

    *points*: rows of :func:`mpicomm.bench.time_algorithms` (``us`` by name, ``auto`` among them)."""
    close = total = 0
    for pt in points:
        times = {n: t for n, t in pt["us"].items() if n != "auto"}
        if "auto" not in pt["us"] or not times:
            continue
        total += 1
        close += pt["us"]["auto"] <= (1 + tolerance) * min(times.values())
    return close, total


def measure_collectives(comm: Any, collectives: Sequence[str], sizes: Sequence[int], iters: int | None = None,
                        rounds: int = 5, show: bool = True) -> tuple[decisions.Decisions, list[str]]:
    """Time every usable algorithm of each of *collectives* (``python -m mpicomm.bench`` names) at *sizes* and
    decide; COLLECTIVE over *comm* (an ``mpicomm.Comm``). Returns the decisions (the same on every rank) and
    lines of text describing what was measured (on rank 0; empty elsewhere)."""
    from mpi4py import MPI

    from .bench import measure as bench_measure
    from .bench.metrics import COLLECTIVES

    plain = MPI.Intracomm(comm)
    rank, p = plain.Get_rank(), plain.Get_size()
    host = plain.bcast(comm.host, root=0)
    ranges: dict[str, tuple[decisions.Range, ...]] = {}
    measured: dict[str, list[dict]] = {}
    lines: list[str] = []
    close = total = kept = compared = 0
    loaded = getattr(getattr(comm, "_state", None), "decisions", None)  # what this communicator's auto followed
    progress = cli.Progress(len(collectives), "mpicomm.tune --collectives", show=show and rank == 0)
    for name in collectives:
        spec = COLLECTIVES[name]
        names, notes = bench_measure.usable_algorithms(spec, comm)
        progress.note(f"{name}: {', '.join(names)}" + "".join(f"; {n}" for n in notes))
        rows = bench_measure.time_algorithms(
            comm, spec, names + ["auto"], sizes, iters=lambda n: collective_iterations(n, iters), rounds=rounds,
            progress=progress.note if show else None)
        points = [{"bytes": r["bytes"], "us": {n: round(t, 3) for n, t in r["us"].items() if n != "auto"}}
                  for r in rows]
        ranges[spec.registry] = decisions.decide(points)
        measured[spec.registry] = points
        near, count = auto_closeness(rows)
        close, total = close + near, total + count
        if loaded is not None:  # the earlier decisions, judged on this run's times
            near, count = auto_closeness([{"us": {**pt["us"], "auto": pt["us"][pick]}} for pt in points
                                          if (pick := loaded.algorithm_for(spec.registry, pt["bytes"])) in pt["us"]])
            kept, compared = kept + near, compared + count
        if rank == 0:
            lines += _collective_lines(spec.registry, names, rows, ranges[spec.registry], notes)
        progress.step(f"{name} decided")
    if rank == 0 and total:
        lines.append(f"auto as this run chose it (decisions, model or table; its own timed calls): within 10 % of "
                     f"the fastest algorithm at {close} of {total} points")
    if rank == 0 and loaded is not None:
        lines.append(f"the decisions this run loaded (measured {loaded.measured or '?'}): their algorithm within "
                     f"10 % of this run's fastest at {kept} of {compared} points they cover")
    result = decisions.Decisions(p, comm.nodes, comm.ppn, ranges, host, model.now(), measurements=measured)
    return result, lines


def model_corrections(measured: dict[str, list[dict]], machine: model.Machine, p: int,
                      validation: bool) -> tuple[tuple[str, str, float], ...]:
    """Per (collective, algorithm): the median over measured sizes ≥ 64 KiB of measured / predicted communication.

    *measured*: ``{collective: [{"bytes": n, "us": {algorithm: µs per call}}, ...]}`` (what
    :func:`measure_collectives` keeps). The measured communication time is a call's time less the
    machine's per-call overhead (and validation's, when it was on); the prediction is the formula
    without any earlier correction. The median keeps one noisy size from deciding; factors are kept
    within 0.2-20 (beyond that the formula, not its constants, is wrong). Sizes below 64 KiB are left
    out: there the per-call overhead, not the formula, decides.
    """
    from . import registry

    plain = dataclasses.replace(machine, corrections=())
    fixed = machine.overhead + (machine.validation if validation else 0.0)
    out = []
    for collective, points in measured.items():
        by_algorithm: dict[str, list[float]] = {}
        for point in points:
            nbytes = point.get("bytes")
            if nbytes is None or nbytes < 65536:
                continue
            for name, us in point["us"].items():
                try:
                    predicted = registry.communication(collective, name, nbytes, p, plain)
                except ValueError:  # no cost function for it
                    continue
                if predicted > 0:
                    by_algorithm.setdefault(name, []).append(max(us * 1e-6 - fixed, 0.0) / predicted)
        for name, ratios in sorted(by_algorithm.items()):
            out.append((collective, name, round(min(20.0, max(0.2, statistics.median(ratios))), 4)))
    return tuple(out)


def _collective_lines(collective: str, names: list[str], rows: list[dict], ranges: Sequence[decisions.Range],
                      notes: list[str]) -> list[str]:
    """One collective's measurements (median µs per call, mean over ranks) and the ranges decided from them."""
    from .bench.report import markdown_table

    header = ["bytes", *names, "auto", "fastest"]
    cells = []
    for r in rows:
        best = min(names, key=r["us"].__getitem__)
        auto = r.get("auto", {})
        cells.append([str(r["bytes"] if r["bytes"] is not None else "-"), *(f"{r['us'][n]:.1f}" for n in names),
                      f"{r['us']['auto']:.1f} ({auto.get('algorithm', '?')}, {auto.get('source', '?')})", best])
    decided = "; ".join(f"up to {rng.max_bytes} B: {rng.algorithm}" if rng.max_bytes is not None
                        else f"every size: {rng.algorithm}" for rng in ranges)
    return ["", f"{collective} (median {cli.US} per call over rounds, mean over ranks):",
            markdown_table(header, cells), *(f"note: {n}" for n in notes), f"decided: {decided}"]


def _no_saved(what: str, host: str, layout: str, path: str, p: int, nodes: int, *options: str) -> str:
    """The message for ``--show`` without a saved file: why, and a command that writes one (never on 1 rank)."""
    head = f"no {what} saved for host {host} and layout {layout} ({path})"
    if p < MIN_RANKS:
        return (f"{head}; tune needs at least {MIN_RANKS} ranks, so a layout of one rank never has one (one rank "
                f"sends no messages). Tune with the ranks your programs use, e.g. {MIN_RANKS}: "
                f"{tune_command(MIN_RANKS, *options)}; then see it with {tune_command(MIN_RANKS, *options, '--show')}")
    where = "" if nodes == 1 else f" (with the same {nodes} nodes and ranks per node)"
    return f"{head}; run: {tune_command(p, *options)}{where}"


def _collectives_main(args: argparse.Namespace, comm: Any, argv: Sequence[str] | None = None) -> int:
    """``--collectives``: measure, print, save the decisions (or, with ``--show``, print the saved ones)."""
    from mpi4py import MPI

    plain = MPI.Intracomm(comm)
    rank, p = plain.Get_rank(), plain.Get_size()
    layout = model.layout_key(p, comm.nodes, comm.ppn)
    if args.show:
        if rank != 0:
            return plain.bcast(None, root=0)
        path = decisions.path_for(comm.host, layout)
        try:
            saved = decisions.load(path)
            text = saved.to_json()
            status = 0
        except FileNotFoundError:
            print(_no_saved("decisions", comm.host, layout, path, p, comm.nodes, "--collectives"), file=sys.stderr)
            status = 1
        except (OSError, decisions.DecisionsError) as exc:
            print(str(exc), file=sys.stderr)
            status = 1
        else:
            print(f"{path}:\n{text}", end="")
            if args.json:
                cli.write_json(args.json, _command(argv, p), {"decisions": json.loads(text)}, saved=path,
                               layout=layout)
        return plain.bcast(status, root=0)
    if p < MIN_RANKS:
        print(f"mpicomm.tune --collectives needs at least {MIN_RANKS} ranks: "
              f"{tune_command(MIN_RANKS, *_user_options(argv))}", file=sys.stderr)
        return 2
    result, lines = measure_collectives(comm, args.collective, args.sizes, args.iters, args.rounds,
                                        show=not args.quiet)
    status = 0
    if rank == 0:
        print(f"mpicomm.tune --collectives: {p} ranks on {comm.nodes} node(s), up to {comm.ppn} per node "
              f"(layout {layout}), host {result.host}")
        print("\n".join(lines))
        path = None
        try:
            path = decisions.save(result, args.out)
        except OSError as exc:
            print(f"\ncould not save the decisions: {exc}; set MPICOMM_CACHE_DIR to a writable directory or use "
                  f"--out", file=sys.stderr)
            status = 1
        else:
            print(f"\nsaved: {path}")
            if args.out and os.path.abspath(args.out) != decisions.path_for(result.host, layout):
                print(f"(communicators load {decisions.path_for(result.host, layout)}; copy it there to use it)")
        status = max(status, _save_corrections(comm, result, layout, args.out))
        if args.json:
            cli.write_json(args.json, _command(argv, p), {"decisions": json.loads(result.to_json())}, saved=path,
                           layout=layout)
    return plain.bcast(status, root=0)


def _save_corrections(comm: Any, result: "decisions.Decisions", layout: str, out: str | None) -> int:
    """On rank 0: correct the fitted model from the measurements and save it (not with ``--out``); exit status."""
    machine = comm.machine
    if out is not None:
        return 0
    if machine is None:
        print(f"model: no fit saved for this layout, so none corrected; fit it first: {tune_command(comm.Get_size())}; "
              f"then run {tune_command(comm.Get_size(), '--collectives')} again")
        return 0
    factors = model_corrections(result.measurements, machine, comm.Get_size(), config.validate())
    if not factors:
        print("model: no size of 64 KiB or more was measured, so it is not corrected")
        return 0
    try:
        path = model.save(dataclasses.replace(machine, corrections=factors),
                          model.path_for(machine.host, layout))
    except OSError as exc:
        print(f"could not save the corrected model: {exc}", file=sys.stderr)
        return 1
    values = [f for _, _, f in factors]
    print(f"model: corrected {len(factors)} (collective, algorithm) formulas from these measurements (measured / "
          f"predicted {min(values):.2f}-{max(values):.2f}, median of the sizes >= 64 KiB): {path}")
    return 0


def _collective_names(text: str) -> list[str]:
    """``--collective allreduce,bcast`` → those names (``python -m mpicomm.bench`` names or registry names)."""
    from .bench.metrics import COLLECTIVES

    aliases = {spec.registry: name for name, spec in COLLECTIVES.items()}
    if text.strip() == "all":
        return list(COLLECTIVES)
    names = [aliases.get(n.strip(), n.strip()) for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in COLLECTIVES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown collective(s) {', '.join(map(repr, bad)) or '(none)'}; "
                                         f"valid: all, {', '.join(COLLECTIVES)} (comma-separated)")
    return list(dict.fromkeys(names))


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Fit the alpha-beta-gamma cost model on this machine and rank layout and save it "
                    f"(run under mpiexec with at least {MIN_RANKS} ranks; the layout is part of the fit's name, so "
                    "tune with the ranks and nodes your programs use).",
        epilog=f"Example: {tune_command(2)}. Saved in $MPICOMM_CACHE_DIR, else "
               "$XDG_CACHE_HOME/mpicomm, else ~/.cache/mpicomm; every mpicomm.Comm with the same host and layout "
               "loads it, and algorithm='auto' then follows the model.",
    )
    parser.add_argument("--sizes", type=cli.sizes_arg, default=None,
                        help="message sizes in bytes: LOW:HIGH (powers of two) or a list, each as 4096, 64K, "
                             "64KiB, 1M or 1e6 (default 8:64M, past the cache, so both regimes are fitted; with "
                             "--collectives 8:16M, in the benchmark's Size: the vector, or one rank's block for "
                             "allgather, alltoall, gather, scatter)")
    parser.add_argument("--iters", type=int, default=None,
                        help="iterations per size and per measurement (default: 1000 round trips up to 8 KiB, "
                             "fewer above)")
    parser.add_argument("--output", metavar="PATH",
                        help="write the fit to PATH instead of the cache directory (communicators load only "
                             "the cache directory's file)")
    parser.add_argument("--show", action="store_true",
                        help="print the fit (with --collectives: the decisions) saved for this host and layout, "
                             "measure nothing; values that were not measured are marked [not measured: ...]")
    parser.add_argument("--collectives", action="store_true",
                        help="instead of fitting the model, time every registered algorithm of each collective "
                             "and save the fastest per size range as measured decisions, which auto follows "
                             "before the model (decisions-<host>-<layout>.json next to the fit)")
    parser.add_argument("--collective", type=_collective_names, default=None, metavar="all|NAME,...",
                        help="with --collectives: the collectives to decide (default all: allreduce, bcast, "
                             "reduce, allgather, alltoall, reduce_scatter, gather, scatter, scan, barrier)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="with --collectives: interleaved rounds per size; each algorithm's time is its "
                             "median round (default 5)")
    parser.add_argument("--out", metavar="FILE",
                        help="with --collectives: write the decisions to FILE instead of the cache directory "
                             "(communicators load only the cache directory's file)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    cli.add_json(parser, "the fit (with --collectives: the decisions; with --show: what is saved)")
    given = _user_options(argv)
    args = parser.parse_args(given)
    if args.iters is not None and args.iters < 1:
        parser.error(f"--iters {args.iters}: must be >= 1")
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: must be >= 1")
    if not args.collectives:
        for option, value in (("--collective", args.collective), ("--out", args.out)):
            if value:
                parser.error(f"{option} needs --collectives (it chooses what to decide); "
                             f"e.g. {tune_command(2, '--collectives', *given)}")
    if args.collectives:
        args.sizes = args.sizes or cli.parse_sizes("8:16M")
        args.collective = args.collective or _collective_names("all")
        return args
    args.sizes = args.sizes or cli.parse_sizes("8:64M")
    if len(set(args.sizes)) < 2:
        parser.error(f"--sizes: {args.sizes} has fewer than two sizes; a line needs at least two (e.g. 8:64K)")
    return args


def _command(argv: Sequence[str] | None, p: int) -> str:
    """This run's command line, for a JSON document."""
    return f"mpiexec -n {p} " + cli.command_line(PROG, _user_options(argv))


def _machine_json(machine: model.Machine) -> dict[str, Any]:
    """*machine* as the model file holds it, and what was not measured (``not_measured``: row → reason)."""
    body = json.loads(machine.to_json())
    return {"machine": body, "not_measured": unmeasured(machine)}


def fit_json(fit: Fit) -> dict[str, Any]:
    """What a fit measured and fitted, as plain JSON: the ``results`` of ``--json`` (seconds and bytes)."""
    if fit.machine is None:
        raise ValueError("fit_json: this Fit has no machine yet; run measure() first")
    return {
        "layout": fit.layout, "p": fit.p, **_machine_json(fit.machine),
        "lines": {name: {"alpha_s": a, "beta_s_per_byte": b} for name, (a, b) in fit.lines.items()},
        "cache_bytes": fit.cache_bytes, "cache_source": fit.cache_source,
        "pingpong": {"bytes": list(fit.sizes), "intra_s": list(fit.intra),
                     "inter_s": None if fit.inter is None else list(fit.inter)},
        "local": {"bytes": list(fit.add_bytes), "add_s": list(fit.add), "copy_s": list(fit.copy)},
        "call": {"self_allreduce_s": fit.call_seconds, "copy_8_bytes_s": fit.small_copy,
                 "validated_s": fit.validated, "unvalidated_s": fit.unvalidated},
    }


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring); returns the exit status."""
    args = _parse(argv)
    from mpi4py import MPI

    import mpicomm

    comm = mpicomm.Comm()
    plain = MPI.Intracomm(comm)
    rank, p = plain.Get_rank(), plain.Get_size()
    if args.collectives:
        return _collectives_main(args, comm, argv)
    if args.show:
        ppn = getattr(comm, "ppn", None) or plain.allreduce(comm.local_size, op=MPI.MAX)
        if rank != 0:
            return 0
        layout = model.layout_key(p, comm.nodes, ppn)
        path = model.path_for(comm.host, layout)
        machine = model.load(comm.host, layout)
        if machine is None:
            print(_no_saved("fit", comm.host, layout, path, p, comm.nodes), file=sys.stderr)
            return 1
        print("\n".join([f"{path}:"] + describe(machine)))
        if args.json:
            cli.write_json(args.json, _command(argv, p), {"layout": layout, **_machine_json(machine)}, saved=path)
        return 0
    if p < MIN_RANKS:
        print(f"mpicomm.tune needs at least {MIN_RANKS} ranks to measure messages: "
              f"{tune_command(MIN_RANKS, *_user_options(argv))}", file=sys.stderr)
        return 2
    fit = measure(comm, args.sizes, args.iters, show=not args.quiet)
    status = 0
    if rank == 0 and fit.machine is not None:
        print(report(fit))
        path = None
        try:
            path = model.save(fit.machine, args.output or model.path_for(fit.machine.host, fit.layout))
        except OSError as exc:
            print(f"\ncould not save the fit: {exc}; set MPICOMM_CACHE_DIR to a writable directory or use --output",
                  file=sys.stderr)
            status = 1
        else:
            print(f"\nsaved: {path}")
            if args.output:
                print(f"(communicators load {model.path_for(fit.machine.host, fit.layout)}; copy it there to use it)")
        if args.json:
            cli.write_json(args.json, _command(argv, p), fit_json(fit), saved=path)
    return plain.bcast(status, root=0)


if __name__ == "__main__":
    sys.exit(main())
