"""Fitting the α-β-γ machine model: measure messages, reductions, copies and call costs on this machine, fit lines.

``mpiexec -n N python -m mpicomm.tune`` (:mod:`mpicomm.tune.command`) runs
:func:`measure` and saves the :class:`~mpicomm.model.Machine` it returns. On
the current machine and rank layout (N ≥ 2 ranks) it measures:

* α and β per path, from a ping-pong over the sizes: between two ranks of
  one node (intra-node) and, when the job spans nodes, between the leaders of
  nodes 0 and 1 (inter-node; on one node the inter-node link is taken to be
  the intra-node one, and with one rank per node the intra-node link the
  inter-node one: the printed fit and ``--show`` mark such values
  ``[not measured: ...]``, see :func:`mpicomm.tune.reports.unmeasured`).
  Messages go through the machinery the algorithms use: persistent requests
  on the communicator's private duplicate, started and completed by the
  executor (:mod:`mpicomm.engine.executor`), so α includes the per-message
  Python cost they pay. One-way time = half a round trip, the median of 5 rounds;
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
measured there: the cache values).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import cli, model

__all__ = ["Fit", "measure", "machine_from", "fit_regimes", "fit_knee", "last_level_cache", "cache_threshold"]


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


def _bouncer(lib: Any, tag: int, peer: int, first: bool, x: np.ndarray, y: np.ndarray
             ) -> tuple[Callable[[int], None], tuple[Any, ...]]:
    """``(fn, requests)``: ``fn(k)`` makes k round trips with *peer* on *lib* as a compiled collective moves its
    messages - persistent requests, started and completed step by step by the executor (one step sends, the
    next receives); *requests* are to be freed after."""
    from ..engine.executor import Program, Run, Step, complete

    send, recv = lib.Send_init(x, peer, tag), lib.Recv_init(y, peer, tag)
    programs: dict[int, Program] = {}

    def step(request: Any, kind: str) -> Step:
        s = Step(f"tune ping-pong {kind} {peer}")
        s.reqs = [request]
        s.peers = ((kind, peer),)
        return s.finish()

    def bounce(k: int) -> None:
        program = programs.get(k)
        if program is None:
            pair = [step(send, "send"), step(recv, "recv")] if first else [step(recv, "recv"), step(send, "send")]
            program = programs[k] = Program(pair * k, label="tune ping-pong")
        run = Run(program)
        run.start()
        if not run.poll():
            complete(run)
        run.raise_error()

    return bounce, (send, recv)


def _pingpong(comm: Any, pair: tuple[int, int], sizes: Sequence[int], iters: int | None, label: str,
              show: bool = True) -> list[float]:
    """One-way seconds per size between the ranks of *pair* (collective over *comm*: everyone gets the result);
    a progress line per size on the pair's first rank when *show*."""
    from mpi4py import MPI

    plain = MPI.Intracomm(comm)
    rank = plain.Get_rank()
    state = comm._state
    tag = state.user_tag()  # every rank takes it, so the communicator's tags stay aligned
    first, second = pair
    times: list[float] = []
    if rank in pair:
        peer = second if rank == first else first
        progress = cli.Progress(len(sizes), f"mpicomm.tune {label} ping-pong", show=show and rank == first)
        for index, size in enumerate([min(sizes)] + list(sizes)):  # the first pass warms up (connections, caches)
            x = np.zeros(size, np.uint8)
            y = np.empty(size, np.uint8)
            bounce, requests = _bouncer(state.library_comm, tag, peer, rank == first, x, y)
            try:
                times.append(_median_of_rounds(bounce, _pingpong_iters(size, iters)) / 2)
            finally:
                for request in requests:
                    request.Free()
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

        def adding(n: int, a: np.ndarray = a, b: np.ndarray = b, c: np.ndarray = c) -> None:
            for _ in range(n):
                np.add(a, b, out=c)

        def copying(n: int, a: np.ndarray = a, c: np.ndarray = c) -> None:
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
