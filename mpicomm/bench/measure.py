"""The timing loops: every variant of a size (native MPI, each mpicomm algorithm, ``auto``), interleaved.

One measurement of a size times ``--iters`` calls of every variant, the
variants taking turns in :data:`ROUNDS` rounds of ``iters / ROUNDS`` calls
each, so all of them see the same machine noise; a variant's time on a rank
is its mean per call over the measurement (OSU's Avg). ``--repeat N`` runs
the whole measurement N times and reports the median of the N means. Before
its timed calls each variant runs untimed warm-up calls, once per size
(``--warmup``, default OSU's skip count, see
:func:`~mpicomm.bench.metrics.warmup_iterations`).
:func:`time_algorithms` (which ``python -m mpicomm.tune --collectives``
decides from) spreads its calls over its rounds and takes the median round.
What is measured goes back as plain rows; tables and files are
:mod:`mpicomm.bench.report`'s business.

``--inplace`` adds an in-place pass, as nccl-tests does: every variant runs
again with ``MPI.IN_PLACE``, in the same interleaved rounds, on buffers laid
out as MPI's in-place form wants them (:func:`_call_buffers`)::

    allreduce, scan      recvbuf holds the input          Allreduce(IN_PLACE, buf)
    reduce               the root's recvbuf holds it      Reduce(IN_PLACE, buf)    (other ranks: as out of place)
    allgather            block `rank` of recvbuf          Allgather(IN_PLACE, buf)
    alltoall             recvbuf holds all p blocks       Alltoall(IN_PLACE, buf)
    reduce_scatter       recvbuf holds all p blocks,      Reduce_scatter_block(IN_PLACE, buf)
                         the result is its first block
    gather               block `root` of the root's buf   Gather(IN_PLACE, buf)    (other ranks: as out of place)
    scatter              the root keeps its block         Scatter(sendbuf, IN_PLACE) (other ranks: as out of place)

bcast (in place by nature) and barrier have no in-place form. The in-place
buffers are not refilled between timed calls (nccl-tests does not either):
reductions in place grow their data, which costs nothing in time.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..cli import Progress, error_line, format_time
from ..transport.buffers import cuda_aware
from .backend import array_module, put, to_host
from .metrics import (
    WINDOW,
    MeasuredCollective,
    _iterations,
    bandwidth_iterations,
    bandwidth_warmup,
    bandwidths,
    latency_iterations,
    layout,
    mismatch,
    model_bytes,
    rank_values,
    redop_name,
    root_of,
    type_name,
    warmup_iterations,
    wrong_elements,
)

__all__ = ["pingpong_rows", "CollectiveRun", "collective_run", "time_algorithms", "requested_algorithms",
           "usable_algorithms", "auto_choice", "IN_PLACE", "ROUNDS"]

#: What an in-place variant's key adds to its name (``ring (in-place)``): its times and verdicts in one run.
IN_PLACE = " (in-place)"

#: The interleaved rounds of one measurement: every variant in turn, ``iters / ROUNDS`` calls each, ROUNDS times.
ROUNDS = 5


# ---------------------------------------------------------------- pingpong


def _time_each(fn: Callable[[], Any], calls: int, stats: list[float]) -> float:
    """Run *fn* *calls* times, timing each call; update *stats* = [min s, max s, calls]; return the total seconds."""
    clock = time.perf_counter
    total = 0.0
    for _ in range(calls):
        start = clock()
        fn()
        took = clock() - start
        total += took
        stats[0] = min(stats[0], took)
        stats[1] = max(stats[1], took)
        stats[2] += 1
    return total


def pingpong_rows(args: argparse.Namespace) -> list[dict]:
    """Ranks 0 and 1, per size: osu_latency (a round trip per iteration, half of it reported) and osu_bw.

    Latency: the mean round trip of a measurement, halved (one way; with
    ``--repeat N`` the median of N measurements' means); Min and Max of single
    round trips, halved. Bandwidth (osu_bw): rank 0 starts a window of
    ``--window`` non-blocking sends, rank 1 as many receives, then rank 1
    answers with a one-byte acknowledgement; MB/s = size · window · windows /
    time / 10⁶ (the median over the repeats). Native MPI (Send/Recv,
    Isend/Irecv) and mpicomm (send_array/recv_array, isend_array/irecv_array)
    take turns in :data:`ROUNDS` rounds per measurement, after their warm-up. Iteration and warm-up counts
    default to OSU's (:func:`~mpicomm.bench.metrics.latency_iterations`,
    :func:`~mpicomm.bench.metrics.bandwidth_iterations`). Rank 0's numbers go
    to every rank. Needs at least 2 ranks (ValueError otherwise); ranks beyond
    the first two wait.
    """
    from mpi4py import MPI

    import mpicomm

    comm = mpicomm.Comm()
    if comm.size < 2:
        raise ValueError(f"pingpong needs at least 2 ranks, got {comm.size}: "
                         "mpiexec -n 2 python -m mpicomm.bench pingpong")
    xp = array_module(getattr(args, "backend", "numpy"))
    if xp is not np:
        comm.bind_device()
    rank = comm.rank
    peer = 1 - rank if rank < 2 else -1  # ranks beyond the first two only wait
    window = getattr(args, "window", WINDOW)
    progress = Progress(len(args.sizes), "pingpong", show=rank == 0 and not args.quiet)
    ack = np.zeros(1, np.uint8)  # host memory whatever the backend (OSU acknowledges from its buffers: 4 bytes)
    rows = []
    for size in args.sizes:
        iters = latency_iterations(size, args.iters)
        warm = warmup_iterations(size, iters, args.warmup)
        windows = bandwidth_iterations(size, args.iters)
        warm_windows = bandwidth_warmup(size, windows, args.warmup)
        x = xp.zeros(size, xp.uint8)
        y = xp.zeros(size, xp.uint8)

        def bounce(send: Callable, recv: Callable, x: Any, y: Any) -> Callable[[], Any]:
            """One round trip: rank 0 sends then receives, rank 1 the other way round."""
            if rank == 0:
                return lambda: (send(x, peer), recv(y, peer))
            return lambda: (recv(y, peer), send(x, peer))

        def burst(isend: Callable, irecv: Callable, waitall: Callable, send: Callable,
                  recv: Callable, x: Any, y: Any) -> Callable[[], Any]:
            """One osu_bw window: *window* sends (rank 0) or receives (rank 1), waited for, then the ack."""
            if rank == 0:
                return lambda: (waitall([isend(x, peer, 1) for _ in range(window)]), recv(ack, peer, 2))
            return lambda: (waitall([irecv(y, peer, 1) for _ in range(window)]), send(ack, peer, 2))

        latency = {"native": bounce(comm.Send, comm.Recv, x, y),
                   "mpicomm": bounce(comm.send_array, comm.recv_array, x, y)}
        bandwidth = {
            "native": burst(comm.Isend, comm.Irecv, MPI.Request.Waitall, comm.Send, comm.Recv, x, y),
            "mpicomm": burst(comm.isend_array, comm.irecv_array, mpicomm.Request.Waitall, comm.send_array,
                             comm.recv_array, x, y),
        }
        rounds, bw_rounds = min(ROUNDS, iters), min(ROUNDS, windows)
        per, bw_per = iters // rounds, windows // bw_rounds
        lat = {name: [math.inf, 0.0, 0] for name in latency}  # [min s, max s, calls] of single round trips
        lat_means: dict[str, list[float]] = {name: [] for name in latency}  # s per round trip, one per measurement
        rates: dict[str, list[float]] = {name: [] for name in bandwidth}  # MB/s, one per measurement
        if rank < 2:
            for fn in latency.values():
                for _ in range(warm):
                    fn()
            for _ in range(args.repeat):
                took = dict.fromkeys(latency, 0.0)
                for _ in range(rounds):
                    for name, fn in latency.items():
                        took[name] += _time_each(fn, per, lat[name])
                for name in latency:
                    lat_means[name].append(took[name] / (per * rounds))
            for fn in bandwidth.values():
                for _ in range(warm_windows):
                    fn()
            unused = [math.inf, 0.0, 0]
            for _ in range(args.repeat):
                took = dict.fromkeys(bandwidth, 0.0)
                for _ in range(bw_rounds):
                    for name, fn in bandwidth.items():
                        took[name] += _time_each(fn, bw_per, unused)
                for name in bandwidth:
                    rates[name].append(size * window * bw_per * bw_rounds / took[name] / 1e6)
        row: dict[str, Any] = {"size": size}
        if rank == 0:
            for name, (low, high, _) in lat.items():  # one way: half a round trip, in µs
                row.update({f"{name}_us": statistics.median(lat_means[name]) / 2 * 1e6,
                            f"{name}_min_us": low / 2 * 1e6, f"{name}_max_us": high / 2 * 1e6})
            row["ratio"] = row["mpicomm_us"] / row["native_us"]
            row["iterations"] = per * rounds  # per measurement
            row["warmup"] = warm
            row["repeat"] = args.repeat
            for name in bandwidth:
                row[f"{name}_MBps"] = statistics.median(rates[name])
            row["bw_ratio"] = row["mpicomm_MBps"] / row["native_MBps"]
            row.update({"windows": bw_per * bw_rounds, "window": window, "warmup_windows": warm_windows})
        rows.append(comm.bcast(row, root=0))
        progress.step(f"{size} B: latency native {format_time(row['native_us'] * 1e-6)}, mpicomm "
                      f"{format_time(row['mpicomm_us'] * 1e-6)}; bandwidth native {row['native_MBps']:.1f} MB/s, "
                      f"mpicomm {row['mpicomm_MBps']:.1f} MB/s" if rank == 0 else "")
    comm.Barrier()
    return rows


# ---------------------------------------------------------------- collectives


@dataclass
class _Variant:
    """One row of a size: the native call, an mpicomm algorithm, ``auto``, or ``shm+pool``; out of place or in place.

    *send* is where the call's input lies (what validation writes), *recv* where its result lies (what
    validation compares); in place they are views of one buffer.
    """

    name: str
    algorithm: str | None  # the algorithm= argument (None: native)
    send: Any
    recv: Any
    call: Callable[[], Any] = field(repr=False)
    in_place: bool = False

    @property
    def key(self) -> str:
        """The variant's name among all of a size's: ``ring``, or ``ring (in-place)``."""
        return self.name + (IN_PLACE if self.in_place else "")


@dataclass
class _Call:
    """One call's buffers: *args* (the positional buffer arguments, ``MPI.IN_PLACE`` included), *input* (where
    the data lies), *result* (what the call writes and validation compares)."""

    args: tuple
    input: Any
    result: Any


def _label(algorithm: str) -> str:
    """A variant's row name: the algorithm's, but "native (mpicomm)" for mpicomm's barrier algorithm "native"."""
    return "native (mpicomm)" if algorithm == "native" else algorithm


def _keywords(spec: MeasuredCollective, op: str = "sum") -> dict[str, Any]:
    """The keyword arguments of one call: op *op* for the reducing collectives, root 0 for the rooted ones."""
    from mpi4py import MPI

    mpi_op = {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}[op]
    return ({"op": mpi_op} if spec.op else {}) | ({"root": 0} if spec.root else {})


def _arguments(spec: MeasuredCollective, send: Any, recv: Any, op: str = "sum") -> tuple[tuple, dict]:
    """The positional and keyword arguments of one out-of-place call (mpi4py's signature; op *op*, root 0)."""
    positional = () if spec.name == "barrier" else (recv,) if spec.name == "bcast" else (send, recv)
    return positional, _keywords(spec, op)


def _call_buffers(spec: MeasuredCollective, xp: Any, dtype: np.dtype, unit: int, nsend: int, nrecv: int, rank: int,
                  p: int, op: str, in_place: bool) -> _Call:
    """Fresh buffers of one call holding this rank's data, out of place or in place (the module's table)."""
    from mpi4py import MPI

    def filled(n: int) -> Any:
        buf = xp.zeros(n, dtype)
        put(buf, rank_values(n, rank, p, 0, dtype, op))
        return buf

    rooted_elsewhere = spec.name in ("reduce", "gather", "scatter") and rank != 0  # in place only at the root
    if not in_place or rooted_elsewhere:
        send, recv = filled(nsend), xp.zeros(nrecv, dtype)
        if spec.name == "bcast":
            put(recv, to_host(send))
        return _Call(_arguments(spec, send, recv)[0], send, recv)
    if not spec.in_place:
        raise ValueError(f"{spec.name} has no MPI.IN_PLACE form")
    if spec.name in ("allreduce", "scan", "reduce", "alltoall", "reduce_scatter"):
        buf = filled(nsend)  # the whole input: unit elements, or p blocks (alltoall, reduce_scatter)
        return _Call((MPI.IN_PLACE, buf), buf, buf[:unit] if spec.name == "reduce_scatter" else buf)
    if spec.name in ("allgather", "gather"):
        buf = xp.zeros(nrecv, dtype)
        block = buf[rank * unit:(rank + 1) * unit]
        put(block, rank_values(unit, rank, p, 0, dtype, op))
        return _Call((MPI.IN_PLACE, buf), block, buf)
    send = filled(nsend)  # scatter, at the root: its own block stays where it is in sendbuf
    return _Call((send, MPI.IN_PLACE), send, send[rank * unit:(rank + 1) * unit])


def _staged_native(spec: MeasuredCollective, library: Any, call: _Call, dtype: np.dtype, unit: int, nsend: int,
                   nrecv: int, rank: int, p: int, op: str, in_place: bool) -> Callable:
    """Native MPI on device buffers when the library is not CUDA-aware: what a program does by hand without a
    CUDA-aware MPI - copy the input to host buffers of the same layout, call the library on them, copy the result
    back - timed as one call (mpicomm's own rows stage by themselves)."""
    host = _call_buffers(spec, np, dtype, unit, nsend, nrecv, rank, p, op, in_place)
    run = _bind(spec, library, host.args, None, op)

    def staged() -> None:
        call.input.get(out=host.input)  # device to host (waits for the current stream)
        run()
        call.result.set(host.result)  # host to device

    return staged


def _bound(spec: MeasuredCollective, target: Any, send: Any, recv: Any, algorithm: str | None,
           op: str = "sum") -> Callable:
    """``target.<Method>(...)`` with this collective's arguments bound (and ``algorithm=`` for mpicomm)."""
    return _bind(spec, target, _arguments(spec, send, recv, op)[0], algorithm, op)


def _bind(spec: MeasuredCollective, target: Any, positional: tuple, algorithm: str | None, op: str = "sum",
          reproducible: bool = False) -> Callable:
    """``target.<Method>(*positional, op=..., root=...)`` as a call of no arguments (``algorithm=`` for mpicomm;
    ``reproducible=True`` where asked)."""
    method = getattr(target, spec.method)
    keywords = _keywords(spec, op)
    if algorithm is not None:
        keywords["algorithm"] = algorithm
    if reproducible:
        keywords["reproducible"] = True
    return lambda: method(*positional, **keywords)


def _persistent(spec: MeasuredCollective, comm: Any, send: Any, recv: Any, op: str = "sum") -> tuple[Callable, Any]:
    """(one Start and Wait of ``comm.<Method>_init(...)``, the request): the call ``--persistent`` times."""
    positional, keywords = _arguments(spec, send, recv, op)
    request = getattr(comm, spec.method + "_init")(*positional, **keywords)

    def run() -> None:
        request.Start()
        request.Wait()

    return run, request


def auto_choice(comm: Any, spec: MeasuredCollective, positional: tuple, op: str = "sum") -> tuple[str, str]:
    """(algorithm, where the choice came from) that ``algorithm="auto"`` runs for ``comm.<Method>(*positional)``
    of *spec*, op *op*, root 0 (*comm* an ``mpicomm.Comm``; not collective).

    Asks the selection, from the call's arguments read as the dispatcher reads them, so
    the answer uses the same facts (size, layout, measured rules) as the call.
    """
    from mpicomm.front import readers
    from mpicomm.plan.args import Args
    from mpicomm.selection import choose_for

    if spec.name == "barrier":
        args = Args("barrier")
    else:
        args = readers.read(spec.registry, comm, *positional, **_keywords(spec, op))
    algorithm, source = choose_for(comm._state, args, "auto")
    return algorithm.name, str(source)


def _predict(spec: MeasuredCollective, algorithm: str, nbytes: int, p: int, machine: Any) -> float | None:
    """The model's time for one call in µs, or None where it has no prediction."""
    from .. import registry

    for name in dict.fromkeys((spec.registry, spec.name)):
        try:
            seconds = registry.predict(name, algorithm, nbytes, p, machine=machine)
        except ValueError:  # no cost function for this pair
            continue
        if seconds is not None and math.isfinite(seconds):
            return float(seconds) * 1e6
    return None


def _rounds(variants: list[_Variant], iters: int, rounds: int, barrier: Callable[[], Any],
            warmup: int | None = None) -> dict[str, list[float]]:
    """Each variant's mean µs per call in each of *rounds* interleaved rounds on this rank (*iters* / *rounds*
    calls each), after *warmup* untimed calls each (default: a tenth of *iters*, at least one); all variants in
    each round, keyed by :attr:`_Variant.key`.

    Each call, warm-up or timed, is followed by an untimed barrier (OSU). Data
    that grows in place (a sum repeated in place) may overflow: NumPy's
    warnings about it are silenced here, where nothing is checked.
    """
    clock = time.perf_counter
    warm = max(1, iters // 10) if warmup is None else warmup
    per = max(1, iters // rounds)
    times: dict[str, list[float]] = {v.key: [] for v in variants}
    with np.errstate(all="ignore"):
        for v in variants:
            for _ in range(warm):
                v.call()
                barrier()
        for _ in range(rounds):
            for v in variants:
                call, total = v.call, 0.0
                for _ in range(per):
                    start = clock()
                    call()
                    total += clock() - start
                    barrier()
                times[v.key].append(total * 1e6 / per)
    return times


def _measure(variants: list[_Variant], iters: int, repeats: int, barrier: Callable[[], Any],
             warmup: int | None = None) -> dict[str, float]:
    """Each variant's µs per call on this rank: *repeats* measurements of *iters* calls each (the variants taking
    turns in :data:`ROUNDS` rounds, :func:`_rounds`; *warmup* untimed calls before the first), the median of
    their means."""
    means: dict[str, list[float]] = {v.key: [] for v in variants}
    for index in range(repeats):
        measured = _rounds(variants, iters, min(ROUNDS, iters), barrier, warmup if index == 0 else 0)
        for key, times in measured.items():
            means[key].append(sum(times) / len(times))  # every round has as many calls: the mean of all
    return {key: statistics.median(values) for key, values in means.items()}


def _validate(spec: MeasuredCollective, variants: list[_Variant], rank: int, p: int, salt: int,
              wrong: dict[str, int] | None = None, op: str = "sum", reference: np.ndarray | None = None,
              results: dict[str, np.ndarray] | None = None) -> dict[str, str | None]:
    """Run every variant once on fresh data; each one's mismatch with the first's (native) result on this rank.

    The result buffer is cleared (NaN, or -1) before the input is written, as
    in place it holds the input. *wrong*, when given, gets each variant's count
    of elements that differ from native on this rank. *reference*, when given,
    is the result every variant is compared with instead (the in-place pass is
    compared with native MPI out of place, which checks the in-place layout
    too); *results*, when given, gets each variant's result. Keys: the
    variants' names.
    """
    results = {} if results is None else results
    for v in variants:
        put(v.recv, np.nan if v.recv.dtype.kind == "f" else -1)
        put(v.send, rank_values(v.send.size, rank, p, salt, v.send.dtype, op))
        if spec.name == "bcast" and rank == 0:
            put(v.recv, rank_values(v.recv.size, rank, p, salt, v.recv.dtype, op))
        v.call()
        results[v.name] = to_host(v.recv)
    if spec.name == "barrier" or (spec.root_only and rank != 0):
        return dict.fromkeys(results)
    native = results[variants[0].name] if reference is None else reference
    if wrong is not None:
        wrong.update({name: wrong_elements(got, native) for name, got in results.items()})
    return {name: (None if got is native else mismatch(got, native)) for name, got in results.items()}


@dataclass
class CollectiveRun:
    """What :func:`collective_run` measured: rows (on rank 0; empty elsewhere), notes, and the run's facts.

    A row is one size of one variant, out of place; with ``--inplace`` its
    ``in_place`` entry holds the same variant's in-place numbers (nccl-tests'
    in-place columns), or None where the variant has no in-place form.
    """

    rows: list[dict]
    notes: list[str]
    overhead: dict | None
    p: int
    nodes: int
    machine: Any
    failed: bool
    in_place: bool = False


def collective_run(spec: MeasuredCollective, args: argparse.Namespace) -> CollectiveRun:
    """Measure *spec* at every size (see :mod:`mpicomm.bench`): every variant interleaved, rows on rank 0."""
    from mpi4py import MPI

    import mpicomm
    from mpicomm import shm

    world = MPI.COMM_WORLD
    comm = mpicomm.Comm()
    library: Any = world  # what the native rows call: the library's communicator
    if spec.neighbors:  # a periodic ring, the same for mpicomm and the library
        ring = comm.Get_size()
        library, comm = world.Create_cart([ring], periods=[True]), comm.Create_cart([ring], periods=[True])
    p, rank = comm.Get_size(), comm.Get_rank()
    loud = rank == 0 and not args.quiet
    xp = array_module(getattr(args, "backend", "numpy"))
    if xp is not np:
        comm.bind_device()
    names, notes = _resolve(spec, args.algorithms, comm)
    staged = xp is not np and not cuda_aware()  # the native rows stage by hand (see _staged_native)
    if staged:
        notes.append("this MPI is not CUDA-aware: the native rows copy the device buffers to host buffers, call MPI "
                     "on those and copy the result back; mpicomm's rows stage by themselves")
    pool_wanted = getattr(args, "pool", False)
    if pool_wanted and "shm" not in names:
        notes.append(f"--pool: {spec.name}'s 'shm' algorithm cannot run on this layout; no shm+pool row")
    use_pool = bool(pool_wanted and "shm" in names)
    in_place = bool(getattr(args, "inplace", False))
    if in_place and not spec.in_place:
        notes.append(f"--inplace: {spec.name} has no MPI.IN_PLACE form ("
                     + ("it is in place by nature" if spec.name == "bcast" else "it moves no data")
                     + "); out of place only")
        in_place = False
    if in_place and (use_pool or getattr(args, "persistent", False)):
        notes.append("--inplace: the shm+pool and persistent rows are measured out of place only")
    machine = comm.machine
    dtype = np.dtype(getattr(args, "dtype", "float64"))
    op = getattr(args, "op", "sum")
    item = dtype.itemsize
    sizes = [0] if spec.name == "barrier" else list(dict.fromkeys(layout(spec.name, s, p, item)[3]
                                                                   for s in args.sizes))
    progress = Progress(len(sizes), spec.name, show=loud)
    shown = ["native", *map(_label, names)] + (["shm+pool"] if use_pool else [])
    progress.note(f"{p} ranks on {comm.nodes} node(s), {len(sizes)} size(s), variants: {', '.join(shown)}"
                  + (", each also in place" if in_place else "") + "".join(f"\n  note: {n}" for n in notes))
    rows: list[dict] = []
    failed = False
    for index, size in enumerate(sizes):
        unit, nsend, nrecv, nbytes = layout(spec.name, size, p, item)
        iters = _iterations(nbytes, args.iters)
        warm = warmup_iterations(nbytes, iters, getattr(args, "warmup", None))
        out = _call_buffers(spec, xp, dtype, unit, nsend, nrecv, rank, p, op, in_place=False)
        send, recv = out.input, out.result
        native = (_staged_native(spec, library, out, dtype, unit, nsend, nrecv, rank, p, op, False) if staged
                  else _bind(spec, library, out.args, None, op))
        variants = [_Variant("native", None, send, recv, native)]
        variants += [_Variant(_label(n), n, send, recv, _bind(spec, comm, out.args, n, op)) for n in names]
        pool = None
        if use_pool:
            pool = shm.Pool(comm, (nsend + nrecv) * item + 2 * 4096)
            psend, precv = pool.empty(nsend, dtype), pool.empty(nrecv, dtype)
            psend[...], precv[...] = send, recv
            variants.append(_Variant("shm+pool", "shm", psend, precv, _bound(spec, comm, psend, precv, "shm", op)))
        if getattr(args, "reproducible", False):
            variants.append(_Variant("reproducible", "auto", send, recv,
                                     _bind(spec, comm, out.args, "auto", op, reproducible=True)))
        persistent = None
        if getattr(args, "persistent", False):
            run, persistent = _persistent(spec, comm, send, recv, op)
            plan = persistent.plan
            variants.append(_Variant("persistent", None if plan.library else plan.algorithm.name, send, recv, run))
        inner: list[_Variant] = []
        if in_place:
            buf = _call_buffers(spec, xp, dtype, unit, nsend, nrecv, rank, p, op, in_place=True)
            native = (_staged_native(spec, library, buf, dtype, unit, nsend, nrecv, rank, p, op, True) if staged
                      else _bind(spec, library, buf.args, None, op))
            inner = [_Variant("native", None, buf.input, buf.result, native, True)]
            inner += [_Variant(_label(n), n, buf.input, buf.result, _bind(spec, comm, buf.args, n, op), True)
                      for n in names]
        chosen = {}
        if "auto" in names:
            chosen["auto"] = auto_choice(comm, spec, out.args, op)
            if in_place:
                chosen["auto" + IN_PLACE] = auto_choice(comm, spec, buf.args, op)
        mine = _measure(variants + inner, iters, args.repeat, world.Barrier, warm)
        every = world.gather(mine, root=0)
        verdicts: dict[str, str | None] = {}
        wrongs: dict[str, int] = {}
        if args.validate:
            keys = [v.key for v in variants + inner]
            problems, counts = {}, {}
            reference = None  # native MPI's result out of place: what the in-place pass must give too
            for group in (variants, inner):
                if group:
                    found: dict[str, int] = {}
                    seen: dict[str, np.ndarray] = {}
                    checked = _validate(spec, group, rank, p, salt=1 + index, wrong=found, op=op,
                                        reference=reference, results=seen)
                    reference = seen["native"] if reference is None else reference
                    problems.update({v.key: checked[v.name] for v in group})
                    counts.update({v.key: found.get(v.name, 0) for v in group})
            for key in keys:
                if problems[key] is not None:
                    print(error_line("python -m mpicomm.bench", f"validation failed: {spec.name} algorithm {key} "
                                     f"size {nbytes} B: {problems[key]}", rank, p), file=sys.stderr, flush=True)
            flags = np.array([problems[key] is not None for key in keys], np.int32)
            world.Allreduce(MPI.IN_PLACE, flags, op=MPI.MAX)
            verdicts = {key: "Fail" if flag else "Pass" for key, flag in zip(keys, flags)}
            totals = np.array([counts[key] for key in keys], np.int64)
            world.Allreduce(MPI.IN_PLACE, totals, op=MPI.SUM)  # elements that differ from native, every rank
            wrongs = {key: int(t) for key, t in zip(keys, totals)}
            failed = failed or bool(flags.any())
        if rank == 0:
            assert every is not None  # (rank 0: the gather's root)
            here = _size_rows(spec, every, variants, unit, nbytes, p, iters, chosen.get("auto"), verdicts, machine,
                              item)
            facts = {"type": type_name(spec.name, dtype), "redop": redop_name(spec.name, op),
                     "root": root_of(spec.name), "warmup": warm, "repeat": args.repeat}
            for row in here:
                row.update(facts)
                row["wrong"] = wrongs.get(row["name"]) if args.validate else None
                if in_place:
                    row["in_place"] = None
            if inner:
                _in_place_rows(spec, here, every, inner, unit, p, item, chosen.get("auto" + IN_PLACE), verdicts,
                               wrongs if args.validate else None)
            rows += here
            progress.step(_progress_text(here))
        if persistent is not None:
            persistent.Free()
        if pool is not None:
            del psend, precv
            pool.free()
        if failed:
            break
    overhead = _overhead(spec, rows, library, comm, p) if not failed else None
    nodes = comm.nodes
    if spec.neighbors:
        comm.Free()
        library.Free()
    return CollectiveRun(rows, notes, overhead, p, nodes, machine, failed, in_place)


def _resolve(spec: MeasuredCollective, requested: str, comm: Any) -> tuple[list[str], list[str]]:
    """The algorithm names to measure, without those whose restrictions exclude this run, and notes on those."""
    from mpicomm import registry
    from mpicomm.facts import Facts

    p = comm.Get_size()
    facts = Facts(p=p, nodes=comm.nodes, ppn=comm.ppn, op="sum" if spec.op else None)
    keep, notes = [], []
    for name in _requested(spec, requested):
        if name != "auto":
            why = registry.allowed(registry.lookup(spec.registry, name), facts)
            if why:
                notes.append(f"skipped {spec.name} algorithm {name}: it {why}")
                continue
        keep.append(name)
    return keep, notes


def _requested(spec: MeasuredCollective, requested: str) -> list[str]:
    """``all`` → every registered algorithm and ``auto``; else the names given (ValueError for unknown ones)."""
    from mpicomm import registry

    known = registry.algorithms(spec.registry)
    if requested.strip() == "all":
        return known + ["auto"]
    names = [n.strip() for n in requested.split(",") if n.strip()]
    bad = [n for n in names if n not in known and n != "auto"]
    if bad or not names:
        from mpicomm.cli import did_you_mean

        hint = did_you_mean(bad[0], known + ["all", "auto"]) if len(bad) == 1 else ""
        raise ValueError(f"--algorithms {requested!r}: unknown {spec.name} algorithm(s) {', '.join(map(repr, bad))}"
                         f"{hint}; "
                         f"valid: all, auto, {', '.join(known)} (comma-separated)")
    return list(dict.fromkeys(names))


def _size_rows(spec: MeasuredCollective, every: list[dict], variants: list[_Variant], unit: int, nbytes: int, p: int,
               iters: int, chosen: tuple[str, str] | None, verdicts: dict, machine: Any,
               item: int = 8) -> list[dict]:
    """The rows of one size on rank 0, from every rank's µs per call per variant (out of place)."""
    rounds = min(ROUNDS, iters)
    per = iters // rounds
    native = sum(r["native"] for r in every) / len(every)
    out = []
    for v in variants:
        lat = [r[v.key] for r in every]
        avg = sum(lat) / len(lat)
        bw = bandwidths(spec.name, unit, item, p, avg * 1e-6)
        algorithm = chosen[0] if v.name == "auto" and chosen else v.algorithm
        predicted = _predict(spec, algorithm, model_bytes(spec.name, unit, item, p), spec.degree(p), machine) \
            if algorithm is not None else None  # (a neighbourhood collective's cost reads p as its degree)
        out.append({
            "collective": spec.name, "size": nbytes, "count": unit, "name": v.name, "algorithm": v.algorithm,
            "chose": chosen[0] if v.name == "auto" and chosen else None,
            "source": chosen[1] if v.name == "auto" and chosen else None,
            "avg_us": avg, "min_us": min(lat), "max_us": max(lat), "iterations": per * rounds,
            "algbw_GBps": bw[0] if bw else None, "busbw_GBps": bw[1] if bw else None,
            "model_us": predicted, "meas_over_model": avg / predicted if predicted else None,
            "vs_native": avg / native if native > 0 else None, "validation": verdicts.get(v.key),
        })
    return out


def _in_place_rows(spec: MeasuredCollective, rows: list[dict], every: list[dict], inner: list[_Variant], unit: int,
                   p: int, item: int, chosen: tuple[str, str] | None, verdicts: dict, wrongs: dict | None) -> None:
    """Give each row of *rows* whose variant ran in place its ``in_place`` numbers (vs_native: against native
    in place)."""
    native = sum(r["native" + IN_PLACE] for r in every) / len(every)
    by_name = {row["name"]: row for row in rows}
    for v in inner:
        lat = [r[v.key] for r in every]
        avg = sum(lat) / len(lat)
        bw = bandwidths(spec.name, unit, item, p, avg * 1e-6)
        by_name[v.name]["in_place"] = {
            "avg_us": avg, "min_us": min(lat), "max_us": max(lat),
            "algbw_GBps": bw[0] if bw else None, "busbw_GBps": bw[1] if bw else None,
            "vs_native": avg / native if native > 0 else None,
            "chose": chosen[0] if v.name == "auto" and chosen else None,
            "source": chosen[1] if v.name == "auto" and chosen else None,
            "validation": verdicts.get(v.key), "wrong": wrongs.get(v.key) if wrongs is not None else None,
        }


def _progress_text(rows: list[dict]) -> str:
    """One size's progress line: native, the best mpicomm algorithm, auto, in-place native, validation."""
    native = rows[0]
    ours = [r for r in rows[1:] if r["name"] != "auto"] or rows[1:]
    line = f"{native['size']} B: native {format_time(native['avg_us'] * 1e-6)}"
    if ours:
        best = min(ours, key=lambda r: r["avg_us"])
        line += f", best {best['name']} {format_time(best['avg_us'] * 1e-6)} ({best['vs_native']:.2f}x native)"
    for r in rows:
        if r["name"] == "auto":
            line += f", auto -> {r['chose']} {format_time(r['avg_us'] * 1e-6)}"
    if native.get("in_place"):
        line += f", in place: native {format_time(native['in_place']['avg_us'] * 1e-6)}"
    if native["validation"]:
        verdicts = [r["validation"] for r in rows] + [r["in_place"]["validation"] for r in rows if r.get("in_place")]
        line += ", validation " + ("pass" if all(v == "Pass" for v in verdicts) else "FAIL")
    return line


def _overhead(spec: MeasuredCollective, rows: list[dict], world: Any, comm: Any, p: int) -> dict | None:
    """mpicomm ``auto`` minus native for one element (8 B; barrier: no data), in µs, on rank 0.

    Taken from the rows when they have that size and ``auto``; otherwise
    measured here (collective: every rank calls it).
    """
    rank = world.Get_rank()
    smallest = 0 if spec.name == "barrier" else 1
    pair = {r["name"]: r["avg_us"] for r in rows if r["count"] == smallest} if rank == 0 else {}
    if world.bcast("auto" in pair, root=0):
        if rank != 0:
            return None
        auto, native = pair["auto"], pair["native"]
    else:
        _, nsend, nrecv, _ = layout(spec.name, 8, p)
        send, recv = rank_values(nsend, rank, p), np.zeros(nrecv)
        variants = [_Variant("native", None, send, recv, _bound(spec, world, send, recv, None)),
                    _Variant("auto", "auto", send, recv, _bound(spec, comm, send, recv, "auto"))]
        every = world.gather(_measure(variants, 1000, 1, world.Barrier), root=0)
        if rank != 0:
            return None
        auto, native = (sum(r[name] for r in every) / p for name in ("auto", "native"))
    return {"auto_us": auto, "native_us": native, "overhead_us": auto - native}




# ---------------------------------------------------------------- every algorithm, for a decision


def requested_algorithms(spec: MeasuredCollective, requested: str) -> list[str]:
    """``all`` → every registered algorithm of *spec* and ``auto``; else the names given (ValueError naming
    unknown ones and the valid names)."""
    return _requested(spec, requested)


def usable_algorithms(spec: MeasuredCollective, comm: Any) -> tuple[list[str], list[str]]:
    """The registered algorithms of *spec* that can run on *comm* (float64 SUM on host arrays, blocking calls),
    and a note for each one left out (a power-of-two algorithm at p = 3, a one-node one across nodes...)."""
    names, notes = _resolve(spec, "all", comm)
    return [n for n in names if n != "auto"], notes


def time_algorithms(comm: Any, spec: MeasuredCollective, names: Sequence[str], sizes: Sequence[int],
                    iters: Callable[[int], int] | None = None, rounds: int = 5,
                    progress: Callable[[str], None] | None = None) -> list[dict]:
    """Time each algorithm of *names* (``auto`` allowed) at each size; COLLECTIVE over *comm* (an ``mpicomm.Comm``).

    *sizes* are the benchmark's Size (rounded as :func:`~mpicomm.bench.metrics.layout`
    rounds them; sizes that round alike are measured once). Every algorithm
    runs in each of *rounds* interleaved rounds (:func:`_rounds`); an
    algorithm's time is the mean over ranks of each rank's **median** round, so
    one noisy round does not decide. *iters(nbytes)* gives the calls of each
    algorithm per size, spread over the rounds (``iters / rounds`` a round;
    default :func:`~mpicomm.bench.metrics.iterations`, OSU's).

    Returns, on every rank, one dict per size: ``size`` (the Size column),
    ``bytes`` (the selection size the dispatcher compares, see
    :meth:`mpicomm.plan.args.Args.message_bytes`), ``count`` and ``us``
    (algorithm → µs per call); with ``auto``, also ``auto`` (its algorithm
    and where that choice came from).
    """
    from mpi4py import MPI

    plain = MPI.Intracomm(comm)  # MPI's own barrier between timed calls, not mpicomm's
    p, rank = plain.Get_size(), plain.Get_rank()
    wanted = [0] if spec.name == "barrier" else list(dict.fromkeys(layout(spec.name, s, p)[3] for s in sizes))
    out: list[dict] = []
    for size in wanted:
        unit, nsend, nrecv, nbytes = layout(spec.name, size, p)
        calls = iters(nbytes) if iters is not None else _iterations(nbytes, None)
        turns = max(1, min(rounds, calls))
        send, recv = rank_values(nsend, rank, p), np.zeros(nrecv)
        if spec.name == "bcast":
            recv[...] = send
        variants = [_Variant(_label(n), n, send, recv, _bound(spec, comm, send, recv, n)) for n in names]
        chosen = auto_choice(comm, spec, _arguments(spec, send, recv)[0]) if "auto" in names else None
        mine = {name: statistics.median(t) for name, t in _rounds(variants, calls, turns, plain.Barrier).items()}
        every = plain.allgather(mine)
        times = {n: sum(r[_label(n)] for r in every) / p for n in names}
        row = {"size": nbytes, "bytes": model_bytes(spec.name, unit, 8, p) if spec.name != "barrier" else None,
               "count": unit, "us": times}
        if chosen is not None:
            row["auto"] = {"algorithm": chosen[0], "source": chosen[1]}
        out.append(row)
        if progress is not None and rank == 0:
            best = min((n for n in names if n != "auto"), key=times.__getitem__, default=None)
            progress(f"{spec.name} {nbytes} B: " + ", ".join(f"{n} {t:.1f} us" for n, t in times.items())
                     + (f"; best {best}" if best else ""))
    return out
