"""Benchmarks, run under mpiexec: ``python -m mpicomm.bench <benchmark> [options]``.

    mpiexec -n 2 python -m mpicomm.bench pingpong --sizes 8:1M --out BENCHMARKS-pingpong.md
    mpiexec -n 2 python -m mpicomm.bench allreduce --sizes 8:64M --validate --json allreduce.json --plot allreduce.png

Every benchmark measures mpi4py's native call and mpicomm's **in the same
run, interleaved**: each size runs in rounds, and every round runs the native
call and then each mpicomm variant, so all of them see the same machine noise.

``pingpong``: ranks 0 and 1 bounce a message (``Send``/``Recv`` against
``send_array``/``recv_array``); one-way latency and the ratio.

A collective (allreduce, bcast, reduce, allgather, alltoall, reduce_scatter,
gather, scatter, scan, barrier): every registered algorithm of it, ``auto``
and the native call on ``MPI.COMM_WORLD``, with

* OSU's columns: ``Size``, ``Avg/Min/Max Latency(us)`` over ranks,
  ``Iterations`` (each iteration times one call, then an untimed barrier;
  1000 iterations up to 8 KiB, 100 above, one tenth more as warm-up);
* nccl-tests' ``algbw`` = S / t and ``busbw`` = algbw × factor (GB/s, 10⁹ B);
* the performance model's prediction (``mpicomm.model``), ``meas/model`` and
  ``vs native`` (Avg / native Avg); for ``auto`` the algorithm it chose;
* with ``--validate``, every algorithm's result compared with the native one.

Data are float64 values that depend on rank and index (integers, so every sum
is exact). Sizes are rounded down to whole float64 elements, at least one; for
reduce_scatter (``Reduce_scatter_block``) to whole elements per rank. The Size
column shows the bytes actually used: the whole vector for allreduce, bcast,
reduce, scan and reduce_scatter, one rank's block for allgather, alltoall
(the block sent to each peer), gather and scatter.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import os
import shlex
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

__all__ = [
    "BENCHMARKS", "Benchmark", "benchmark", "parse_sizes", "COLLECTIVES", "Collective", "nccl_bytes", "bus_factor",
    "bandwidths", "model_bytes", "layout", "rank_values", "mismatch", "markdown_table", "main",
]


@dataclass(frozen=True)
class Benchmark:
    """A sub-command: *run* measures and returns a :class:`Report` (the same on every rank that prints)."""

    name: str
    run: Callable[[argparse.Namespace], "Report"]
    summary: str
    description: str = ""
    collective: bool = False


@dataclass
class Report:
    """What a benchmark measured: a Markdown table, notes around it, rows for JSON, the exit code."""

    title: str
    header: list[str]
    cells: list[list[str]]
    notes: list[str] = field(default_factory=list)  # printed after the table
    method: str = ""  # how it was measured (for --out)
    rows: list[dict] = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    code: int = 0


BENCHMARKS: dict[str, Benchmark] = {}


def benchmark(name: str) -> Callable:
    """Register a benchmark sub-command (its docstring's first line is its help)."""

    def register(fn: Callable) -> Callable:
        doc = (fn.__doc__ or name).strip()
        BENCHMARKS[name] = Benchmark(name, fn, doc.splitlines()[0], doc)
        return fn

    return register


# ---------------------------------------------------------------- sizes and iterations

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _bytes(text: str) -> int:
    text = text.strip().upper().removesuffix("B")
    unit = text[-1] if text and text[-1] in "KMG" else ""
    try:
        value = int(text[: len(text) - len(unit)]) * _UNITS[unit]
    except ValueError:
        value = -1
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size; use bytes with an optional K, M or G (e.g. 64K)")
    return value


def parse_sizes(text: str) -> list[int]:
    """``"8:1M"`` → powers of two from 8 B to 1 MiB; ``"8,100,4K"`` → those sizes."""
    if ":" in text:
        low, high = (_bytes(t) for t in text.split(":", 1))
        if low > high:
            raise argparse.ArgumentTypeError(f"--sizes {text}: the first size is larger than the last")
        sizes, size = [], low
        while size <= high:
            sizes.append(size)
            size *= 2
        return sizes
    return [_bytes(t) for t in text.split(",")]


def _iterations(size: int, requested: int | None) -> int:
    return requested if requested else (1000 if size <= 8192 else 100)  # OSU's defaults


# ---------------------------------------------------------------- output helpers


def markdown_table(header: list[str], cells: list[list[str]]) -> str:
    """A Markdown table, columns padded to line up; the first column left-aligned, the rest right-aligned."""
    widths = [max(len(h), *(len(row[i]) for row in cells)) if cells else len(h) for i, h in enumerate(header)]

    def line(values: list[str]) -> str:
        return "| " + " | ".join(v.ljust(w) if i == 0 else v.rjust(w)
                                 for i, (v, w) in enumerate(zip(values, widths))) + " |"

    rule = "|" + "|".join(":" + "-" * (w + 1) if i == 0 else "-" * (w + 1) + ":" for i, w in enumerate(widths)) + "|"
    return "\n".join([line(header), rule, *(line(row) for row in cells)])


def _machine() -> str:
    from .config import describe_cpu

    return f"{describe_cpu()}, {_library()}"


def _library() -> str:
    from mpi4py import MPI

    return " ".join(MPI.Get_library_version().splitlines()[0].split())


def _command(argv: list[str]) -> str:
    from mpi4py import MPI

    return f"mpiexec -n {MPI.COMM_WORLD.Get_size()} python -m mpicomm.bench " + shlex.join(argv)


def _settings() -> str:
    """The ``MPICOMM_*`` variables in effect (they change what is measured), or ""."""
    found = sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith("MPICOMM_"))
    return " ".join(found)


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- pingpong


@benchmark("pingpong")
def pingpong(args: argparse.Namespace) -> Report:
    """Ranks 0 and 1 bounce a message: mpi4py Send/Recv against mpicomm send_array/recv_array."""
    import mpicomm

    comm = mpicomm.Comm()
    if comm.size < 2:
        raise SystemExit("pingpong needs 2 ranks: mpiexec -n 2 python -m mpicomm.bench pingpong")
    rank = comm.rank
    peer = 1 - rank if rank < 2 else None  # ranks beyond the first two only wait
    rows = []
    for size in args.sizes:
        iters = _iterations(size, args.iters)
        x = np.zeros(size, np.uint8)
        y = np.empty(size, np.uint8)

        def bounce(send: Callable, recv: Callable) -> Callable[[], None]:
            """One round trip: rank 0 sends then receives, rank 1 the other way round."""
            if rank == 0:
                return lambda: (send(x, peer), recv(y, peer))
            return lambda: (recv(y, peer), send(x, peer))

        native = bounce(comm.Send, comm.Recv)
        typed = bounce(comm.send_array, comm.recv_array)
        totals = {"native": 0.0, "mpicomm": 0.0}
        rounds = min(args.rounds, iters)
        if rank < 2:
            for name, fn in (("native", native), ("mpicomm", typed)):
                for _ in range(max(1, iters // 10)):  # warm-up
                    fn()
            for _ in range(rounds):
                for name, fn in (("native", native), ("mpicomm", typed)):
                    start = time.perf_counter()
                    for _ in range(max(1, iters // rounds)):
                        fn()
                    totals[name] += time.perf_counter() - start
        per = {k: v / (max(1, iters // rounds) * rounds) / 2 * 1e6 for k, v in totals.items()} if rank < 2 else {}
        per = comm.bcast(per, root=0)
        rows.append({"size": size, "native_us": per["native"], "mpicomm_us": per["mpicomm"],
                     "ratio": per["mpicomm"] / per["native"], "iterations": iters // rounds * rounds})
        if comm.rank == 0 and args.progress:
            _say(f"  {size} B done")
    comm.Barrier()
    header = ["Size (B)", "native MPI (us)", "mpicomm (us)", "ratio", "Iterations"]
    cells = [[str(r["size"]), f"{r['native_us']:.2f}", f"{r['mpicomm_us']:.2f}", f"{r['ratio']:.2f}",
              str(r["iterations"])] for r in rows]
    method = (f"One-way latency (half a round trip), mean over iterations; native and mpicomm "
              f"interleaved in {args.rounds} rounds per size.")
    return Report("pingpong", header, cells, method=method, rows=rows)


# ---------------------------------------------------------------- collectives: what each one moves


@dataclass(frozen=True)
class Collective:
    """How one collective is called and measured.

    ``unit`` is the count the sizes are made of: the whole vector (allreduce,
    bcast, reduce, scan) or one rank's block (the others). The send and
    receive buffers hold ``unit`` or ``unit·p`` elements.
    """

    name: str
    method: str  # the mpi4py / mpicomm.Comm method
    registry: str  # the collective's name in mpicomm.registry
    whole: bool  # unit = the whole vector (else one rank's block)
    send_p: bool  # send buffer holds unit·p elements
    recv_p: bool  # receive buffer holds unit·p elements
    op: bool = False
    root: bool = False
    root_only: bool = False  # only the root has a result
    size_is_all: bool = False  # OSU's Size is unit·p (reduce_scatter: the whole vector)

    def describe_size(self) -> str:
        """What the Size column measures, in words."""
        if self.name == "barrier":
            return "no data"
        if self.whole or self.size_is_all:
            return "the whole vector, in bytes"
        if self.name == "alltoall":
            return "the block each rank sends to each peer, in bytes"
        return "one rank's block, in bytes"


COLLECTIVES: dict[str, Collective] = {c.name: c for c in (
    Collective("allreduce", "Allreduce", "allreduce", True, False, False, op=True),
    Collective("bcast", "Bcast", "bcast", True, False, False, root=True),
    Collective("reduce", "Reduce", "reduce", True, False, False, op=True, root=True, root_only=True),
    Collective("allgather", "Allgather", "allgather", False, False, True),
    Collective("alltoall", "Alltoall", "alltoall", False, True, True),
    Collective("reduce_scatter", "Reduce_scatter_block", "reduce_scatter_block", False, True, False, op=True,
               size_is_all=True),
    Collective("gather", "Gather", "gather", False, False, True, root=True, root_only=True),
    Collective("scatter", "Scatter", "scatter", False, True, False, root=True),
    Collective("scan", "Scan", "scan", True, False, False, op=True),
    Collective("barrier", "Barrier", "barrier", True, False, False),
)}

_ALL_FACTOR = ("reduce_scatter", "allgather", "alltoall", "gather", "scatter")  # nccl-tests: S = count·typesize·p


def nccl_bytes(collective: str, count: int, itemsize: int, p: int) -> int:
    """nccl-tests' S: ``count·typesize`` (allreduce, bcast, reduce, scan) or ``count·typesize·p``.

    *count* is nccl-tests' count: the whole vector for allreduce, bcast,
    reduce, scan; one rank's block for reduce_scatter, allgather, alltoall
    (the block for each peer), gather, scatter. Barrier moves no data: 0.
    """
    if collective == "barrier":
        return 0
    return count * itemsize * (p if collective in _ALL_FACTOR else 1)


def bus_factor(collective: str, p: int) -> float:
    """nccl-tests' busbw factor: 2(p−1)/p for allreduce, (p−1)/p for the gathering and scattering ones, else 1.

    scan is not an nccl-tests collective: it gets 1, like reduce.
    """
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
    if collective == "allreduce":
        return 2 * (p - 1) / p
    if collective in _ALL_FACTOR:
        return (p - 1) / p
    return 0.0 if collective == "barrier" else 1.0


def bandwidths(collective: str, count: int, itemsize: int, p: int, seconds: float) -> tuple[float, float] | None:
    """(algbw, busbw) in GB/s (10⁹ B/s) for one call of *seconds*; None for barrier or a zero time."""
    if collective == "barrier" or seconds <= 0:
        return None
    algbw = nccl_bytes(collective, count, itemsize, p) / seconds / 1e9
    return algbw, algbw * bus_factor(collective, p)


def model_bytes(collective: str, count: int, itemsize: int, p: int) -> int:
    """The message size the selection table and the model use (``mpicomm.coll.dispatch.selection_bytes``).

    Whole vector for allreduce, bcast, reduce, scan; the block for gather and
    scatter; everything gathered for allgather; each rank's whole send for
    alltoall; the whole input for reduce_scatter.
    """
    if collective == "barrier":
        return 0
    spec = COLLECTIVES[collective]
    return count * itemsize * (1 if spec.whole or collective in ("gather", "scatter") else p)


def layout(collective: str, size: int, p: int, itemsize: int = 8) -> tuple[int, int, int, int]:
    """(unit, send elements, receive elements, Size in bytes) for a requested *size* in bytes.

    The unit count is the size rounded down to whole elements, at least one
    (reduce_scatter: whole elements per rank).
    """
    spec = COLLECTIVES[collective]
    if collective == "barrier":
        return 0, 0, 0, 0
    unit = max(1, size // (itemsize * (p if spec.size_is_all else 1)))
    send = unit * (p if spec.send_p else 1)
    recv = unit * (p if spec.recv_p else 1)
    return unit, send, recv, unit * itemsize * (p if spec.size_is_all else 1)


def rank_values(count: int, rank: int, p: int, salt: int = 0) -> np.ndarray:
    """Float64 data that depends on rank and index: ``index·p + rank + salt`` (distinct, and sums stay exact)."""
    return (np.arange(count, dtype=np.int64) * p + (rank + salt)).astype(np.float64)


def mismatch(got: np.ndarray, want: np.ndarray) -> str | None:
    """None if *got* equals *want* element for element (NaN never does); else what differs."""
    if got.shape != want.shape:
        return f"shape {got.shape} instead of {want.shape}"
    bad = np.flatnonzero(~(got == want))
    if bad.size == 0:
        return None
    i = int(bad[0])
    return f"{bad.size} of {want.size} elements differ (first at index {i}: {got[i]!r}, native MPI {want[i]!r})"


# ---------------------------------------------------------------- collectives: measuring


@dataclass
class _Variant:
    """One row of a size: the native call, an mpicomm algorithm, ``auto``, or ``shm+pool``."""

    name: str
    algorithm: str | None  # the algorithm= argument (None: native)
    send: np.ndarray
    recv: np.ndarray
    call: Callable[[], Any] = field(repr=False)


def _label(algorithm: str) -> str:
    """A variant's row name: the algorithm's, but "native (mpicomm)" for mpicomm's barrier algorithm "native"."""
    return "native (mpicomm)" if algorithm == "native" else algorithm


def _arguments(spec: Collective, send: np.ndarray, recv: np.ndarray) -> tuple[tuple, dict]:
    """The positional and keyword arguments of one call (mpi4py's signature; op SUM, root 0)."""
    from mpi4py import MPI

    keywords: dict[str, Any] = ({"op": MPI.SUM} if spec.op else {}) | ({"root": 0} if spec.root else {})
    positional = () if spec.name == "barrier" else (recv,) if spec.name == "bcast" else (send, recv)
    return positional, keywords


def _bound(spec: Collective, target: Any, send: np.ndarray, recv: np.ndarray, algorithm: str | None) -> Callable:
    """``target.<Method>(...)`` with this collective's arguments bound (and ``algorithm=`` for mpicomm)."""
    method = getattr(target, spec.method)
    positional, keywords = _arguments(spec, send, recv)
    if algorithm is not None:
        keywords["algorithm"] = algorithm
    return lambda: method(*positional, **keywords)


def _auto_choice(comm: Any, spec: Collective, send: np.ndarray, recv: np.ndarray, unit: int) -> tuple[str, str]:
    """(algorithm, where the choice came from) that ``algorithm="auto"`` runs for this call.

    Asks the dispatcher, from the call's arguments read as it reads them, so
    the answer uses the same facts (size, layout, fitted machine) as the call.
    """
    from mpicomm.coll import arguments, dispatch

    if spec.name == "barrier":
        args = dispatch.Args("barrier")
    else:
        positional, keywords = _arguments(spec, send, recv)
        args = arguments.read(spec.registry, comm, *positional, **keywords)
    algorithm, source = dispatch._choose(comm, args, "auto")
    return algorithm.name, str(source)


def _predict(spec: Collective, algorithm: str, nbytes: int, p: int, machine: Any) -> float | None:
    """The model's time for one call in µs, or None where it has no prediction."""
    from . import registry

    for name in dict.fromkeys((spec.registry, spec.name)):
        try:
            seconds = registry.predict(name, algorithm, nbytes, p, machine=machine)
        except (LookupError, ValueError, NotImplementedError):  # no cost function for this pair
            continue
        if seconds is not None and math.isfinite(seconds):
            return float(seconds) * 1e6
    return None


def _measure(variants: list[_Variant], iters: int, rounds: int, barrier: Callable[[], Any]) -> dict[str, float]:
    """Each variant's mean µs per call on this rank: warm-up, then *rounds* rounds, all variants in each.

    Each iteration times one call, then waits in an untimed barrier (OSU).
    """
    clock = time.perf_counter
    for v in variants:
        for _ in range(max(1, iters // 10)):
            v.call()
            barrier()
    per = max(1, iters // rounds)
    totals = dict.fromkeys((v.name for v in variants), 0.0)
    for _ in range(rounds):
        for v in variants:
            call, total = v.call, 0.0
            for _ in range(per):
                start = clock()
                call()
                total += clock() - start
                barrier()
            totals[v.name] += total
    return {name: total * 1e6 / (per * rounds) for name, total in totals.items()}


def _validate(spec: Collective, variants: list[_Variant], rank: int, p: int, salt: int) -> dict[str, str | None]:
    """Run every variant once on fresh data; each one's mismatch with the native result on this rank (or None)."""
    results: dict[str, np.ndarray] = {}
    for v in variants:
        v.send[...] = rank_values(v.send.size, rank, p, salt)
        v.recv[...] = np.nan
        if spec.name == "bcast" and rank == 0:
            v.recv[...] = rank_values(v.recv.size, rank, p, salt)
        v.call()
        results[v.name] = v.recv.copy()
    if spec.name == "barrier" or (spec.root_only and rank != 0):
        return dict.fromkeys(results)
    native = results[variants[0].name]
    return {name: (None if got is native else mismatch(got, native)) for name, got in results.items()}


def _format(value: float | None, digits: int = 2) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _collective(spec: Collective, args: argparse.Namespace) -> Report:
    """Measure *spec* at every size (see the module docstring)."""
    from mpi4py import MPI

    import mpicomm
    from mpicomm import shm

    world = MPI.COMM_WORLD
    comm = mpicomm.Comm()
    p, rank = comm.Get_size(), comm.Get_rank()
    loud = rank == 0 and not args.quiet
    names, notes = _resolve(spec, args.algorithms, comm)
    if args.pool and "shm" not in names:
        notes.append(f"--pool: {spec.name} has no usable 'shm' algorithm here; no shm+pool row")
    use_pool = bool(args.pool and "shm" in names)
    machine = comm.machine
    model_label = "model (us)" if machine is not None else "model (nominal)"
    sizes = [0] if spec.name == "barrier" else list(dict.fromkeys(layout(spec.name, s, p)[3] for s in args.sizes))
    if loud:
        shown = ["native", *map(_label, names)] + (["shm+pool"] if use_pool else [])
        _say(f"{spec.name}: {p} ranks on {comm.nodes} node(s), {len(sizes)} size(s), variants: {', '.join(shown)}"
             + "".join(f"\n  note: {n}" for n in notes))
    rows: list[dict] = []
    failed = False
    for index, size in enumerate(sizes):
        unit, nsend, nrecv, nbytes = layout(spec.name, size, p)
        iters = _iterations(nbytes, args.iters)
        rounds = max(1, min(args.rounds, iters))
        send, recv = rank_values(nsend, rank, p), np.zeros(nrecv)
        if spec.name == "bcast":
            recv[...] = send
        variants = [_Variant("native", None, send, recv, _bound(spec, world, send, recv, None))]
        variants += [_Variant(_label(n), n, send, recv, _bound(spec, comm, send, recv, n)) for n in names]
        pool = None
        if use_pool:
            pool = shm.Pool(comm, (nsend + nrecv) * 8 + 2 * 4096)
            psend, precv = pool.empty(nsend, np.float64), pool.empty(nrecv, np.float64)
            psend[...], precv[...] = send, recv
            variants.append(_Variant("shm+pool", "shm", psend, precv, _bound(spec, comm, psend, precv, "shm")))
        chosen = _auto_choice(comm, spec, send, recv, unit) if "auto" in names else None
        mine = _measure(variants, iters, rounds, world.Barrier)
        every = world.gather(mine, root=0)
        verdicts: dict[str, str | None] = {}
        if args.validate:
            problems = _validate(spec, variants, rank, p, salt=1 + index)
            for name, problem in problems.items():
                if problem is not None:
                    print(f"validation failed: {spec.name} algorithm {name} size {nbytes} B rank {rank}: {problem}",
                          file=sys.stderr, flush=True)
            flags = np.array([problems[v.name] is not None for v in variants], np.int32)
            world.Allreduce(MPI.IN_PLACE, flags, op=MPI.MAX)
            verdicts = {v.name: "Fail" if flag else "Pass" for v, flag in zip(variants, flags)}
            failed = failed or bool(flags.any())
        if rank == 0:
            rows += _size_rows(spec, every, variants, unit, nbytes, p, rounds, iters, chosen, verdicts, machine)
            if loud:
                _progress(spec, rows[-len(variants):], index, len(sizes))
        if pool is not None:
            variants.pop()
            del psend, precv
            pool.free()
        if failed:
            break
    overhead = _overhead(spec, rows, world, comm, p) if not failed else None
    return _collective_report(spec, args, p, comm.nodes, rows, notes, overhead, model_label, machine, failed)


def _resolve(spec: Collective, requested: str, comm: Any) -> tuple[list[str], list[str]]:
    """The algorithm names to measure, without those whose restrictions exclude this run, and notes on those."""
    from mpicomm import registry

    p = comm.Get_size()
    facts = {"p": p, "nodes": comm.nodes, "ppn": comm.ppn, "device": False, "commutative": True,
             "op": "sum" if spec.op else None}
    keep, notes = [], []
    for name in _requested(spec, requested):
        if name != "auto":
            why = registry.allowed(registry.lookup(spec.registry, name), facts)
            if why:
                notes.append(f"skipped {spec.name} algorithm {name}: it {why}")
                continue
        keep.append(name)
    return keep, notes


def _requested(spec: Collective, requested: str) -> list[str]:
    """``all`` → every registered algorithm and ``auto``; else the names given (ValueError for unknown ones)."""
    from mpicomm import registry

    known = registry.algorithms(spec.registry)
    if requested.strip() == "all":
        return known + ["auto"]
    names = [n.strip() for n in requested.split(",") if n.strip()]
    bad = [n for n in names if n not in known and n != "auto"]
    if bad or not names:
        raise ValueError(f"--algorithms {requested!r}: unknown {spec.name} algorithm(s) {', '.join(map(repr, bad))}; "
                         f"valid: all, auto, {', '.join(known)} (comma-separated)")
    return list(dict.fromkeys(names))


def _size_rows(spec: Collective, every: list[dict], variants: list[_Variant], unit: int, nbytes: int, p: int,
               rounds: int, iters: int, chosen: tuple[str, str] | None, verdicts: dict,
               machine: Any) -> list[dict]:
    """The rows of one size on rank 0, from every rank's mean µs per variant."""
    per = max(1, iters // rounds)
    native = sum(r["native"] for r in every) / len(every)
    out = []
    for v in variants:
        lat = [r[v.name] for r in every]
        avg = sum(lat) / len(lat)
        bw = bandwidths(spec.name, unit, 8, p, avg * 1e-6)
        algorithm = chosen[0] if v.name == "auto" and chosen else v.algorithm
        predicted = _predict(spec, algorithm, model_bytes(spec.name, unit, 8, p), p, machine) \
            if algorithm is not None else None
        out.append({
            "collective": spec.name, "size": nbytes, "count": unit, "name": v.name, "algorithm": v.algorithm,
            "chose": chosen[0] if v.name == "auto" and chosen else None,
            "source": chosen[1] if v.name == "auto" and chosen else None,
            "avg_us": avg, "min_us": min(lat), "max_us": max(lat), "iterations": per * rounds,
            "algbw_GBps": bw[0] if bw else None, "busbw_GBps": bw[1] if bw else None,
            "model_us": predicted, "meas_over_model": avg / predicted if predicted else None,
            "vs_native": avg / native if native > 0 else None, "validation": verdicts.get(v.name),
        })
    return out


def _progress(spec: Collective, rows: list[dict], index: int, total: int) -> None:
    native = rows[0]
    ours = [r for r in rows[1:] if r["name"] != "auto"] or rows[1:]
    line = f"[{index + 1}/{total}] {spec.name} {native['size']} B: native {native['avg_us']:.2f} us"
    if ours:
        best = min(ours, key=lambda r: r["avg_us"])
        line += f", best {best['name']} {best['avg_us']:.2f} us ({best['vs_native']:.2f}x native)"
    for r in rows:
        if r["name"] == "auto":
            line += f", auto -> {r['chose']} {r['avg_us']:.2f} us"
    if native["validation"]:
        line += ", validation " + ("pass" if all(r["validation"] == "Pass" for r in rows) else "FAIL")
    _say(line)


def _overhead(spec: Collective, rows: list[dict], world: Any, comm: Any, p: int) -> dict | None:
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
        every = world.gather(_measure(variants, 1000, 5, world.Barrier), root=0)
        if rank != 0:
            return None
        auto, native = (sum(r[name] for r in every) / p for name in ("auto", "native"))
    return {"auto_us": auto, "native_us": native, "overhead_us": auto - native}


_HEADER = ["Size", "Algorithm", "Avg Latency(us)", "Min Latency(us)", "Max Latency(us)", "Iterations",
           "algbw (GB/s)", "busbw (GB/s)", "{model}", "meas/model", "vs native"]


def _collective_report(spec: Collective, args: argparse.Namespace, p: int, nodes: int, rows: list[dict],
                       notes: list[str], overhead: dict | None, model_label: str, machine: Any,
                       failed: bool) -> Report:
    header = [model_label if h == "{model}" else h for h in _HEADER] + (["Validation"] if args.validate else [])
    cells = []
    for r in rows:
        name = r["name"] + (f" -> {r['chose']}" if r["chose"] else "")
        cells.append([str(r["size"]), name, _format(r["avg_us"]), _format(r["min_us"]), _format(r["max_us"]),
                      str(r["iterations"]), _format(r["algbw_GBps"], 3), _format(r["busbw_GBps"], 3),
                      _format(r["model_us"]), _format(r["meas_over_model"]), _format(r["vs_native"])]
                     + ([r["validation"] or ""] if args.validate else []))
    after = list(notes)
    if overhead is not None:
        what = "barrier" if spec.name == "barrier" else "8-byte call"
        after.insert(0, f"Python overhead of one {what} ({spec.name}, mpicomm auto minus native MPI): "
                        f"{overhead['overhead_us']:.2f} us (auto {overhead['auto_us']:.2f} us, "
                        f"native {overhead['native_us']:.2f} us)")
    if failed:
        after.append(f"validation FAILED: an algorithm's {spec.name} result differs from native MPI's "
                     f"(see the messages above); stopped after that size")
    data = ("" if spec.name == "barrier" else
            f"Size: {spec.describe_size()} (float64 data; sizes rounded down to whole elements). ")
    bandwidth = f"{_bandwidth_text(spec)} (nccl-tests, GB/s). " if spec.name != "barrier" else ""
    method = (
        f"{data}Each iteration times one call, then an untimed barrier; a rank's latency is its mean per call; Avg "
        f"is the mean over ranks, Min/Max over ranks. native (mpi4py on MPI.COMM_WORLD) and every algorithm run "
        f"interleaved in {args.rounds} rounds per size. {bandwidth}"
        f"{model_label.split(' (us)')[0]} (us): mpicomm.model's prediction "
        f"({'fitted machine' if machine is not None else 'nominal machine'}); vs native = Avg / native Avg."
        + (" Validation: each algorithm's result on fresh data equals native MPI's." if args.validate else "")
    )
    extra = {"p": p, "nodes": nodes, "overhead": overhead, "notes": notes, "validated": bool(args.validate),
             "model": "fitted" if machine is not None else "nominal"}
    return Report(f"{spec.name}, {p} ranks on {nodes} node(s)", header, cells, after, method, rows, extra,
                  code=1 if failed else 0)


def _describe(spec: Collective) -> str:
    from mpicomm import registry

    names = ", ".join(registry.algorithms(spec.registry))
    text = (f"Benchmark {spec.name}: mpicomm.Comm.{spec.method}(..., algorithm=NAME) for every algorithm ({names}) "
            f"and auto, against MPI.COMM_WORLD.{spec.method} (native), interleaved. Size: {spec.describe_size()}.")
    if spec.name != "barrier":
        text += f" {_bandwidth_text(spec)}."
    return text


def _bandwidth_text(spec: Collective) -> str:
    """How algbw and busbw are computed for *spec*, in words (count: float64 elements, see nccl_bytes)."""
    factor = {"allreduce": "2(p-1)/p"}.get(spec.name, "(p-1)/p" if spec.name in _ALL_FACTOR else "1")
    return (f"algbw = S/t with S = {'count*8*p' if spec.name in _ALL_FACTOR else 'count*8'} bytes, "
            f"busbw = algbw * {factor}")


def _plot(path: str, spec: Collective, rows: list[dict], p: int, machine: str) -> None:
    """Latency against size, log-log: one line per algorithm, native dashed black."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    lines: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        lines.setdefault(r["name"], []).append((max(r["size"], 1), r["avg_us"]))
    fig, ax = plt.subplots(figsize=(8, 5.5))
    markers = "os^vD<>ph*"
    for i, (name, points) in enumerate(lines.items()):
        xs, ys = zip(*points)
        if name == "native":
            ax.plot(xs, ys, "k--", marker="o", linewidth=2, label="native MPI", zorder=3)
        else:
            ax.plot(xs, ys, marker=markers[i % len(markers)], markersize=3.5, linewidth=2.2 if name == "auto" else 1.2,
                    label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: _human(x)))
    ax.set_xlabel(f"Size ({spec.describe_size()})")
    ax.set_ylabel("Avg latency (us)")
    ax.set_title(f"{spec.name}, p = {p}\n{machine}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _human(nbytes: float) -> str:
    """8 → "8", 4096 → "4K", 1 << 20 → "1M" (binary units)."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g}{unit}"
    return f"{nbytes:g}"


for _spec in COLLECTIVES.values():
    BENCHMARKS[_spec.name] = Benchmark(
        _spec.name, (lambda s: lambda args: _collective(s, args))(_spec),
        f"{_spec.name}: every algorithm and auto against native MPI",
        collective=True,
    )


# ---------------------------------------------------------------- command line


def _parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The command line: one sub-command per benchmark (returned too, by name, for their own errors)."""
    parser = argparse.ArgumentParser(
        prog="python -m mpicomm.bench",
        description="Benchmarks of mpicomm against native MPI (mpi4py), measured interleaved in the same run.",
        epilog="Run under the launcher, e.g. mpiexec -n 2 python -m mpicomm.bench allreduce --validate; "
               "python -m mpicomm.bench BENCHMARK --help for a benchmark's options.",
    )
    sub = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True,
                                help=f"one of: {', '.join(BENCHMARKS)}")
    subs = {}
    for name, bench in BENCHMARKS.items():
        description = bench.description
        if bench.collective:
            try:
                description = _describe(COLLECTIVES[name])
            except (ImportError, ValueError):  # the registry cannot load: still parse; the run reports it
                description = bench.summary
        p = subs[name] = sub.add_parser(name, help=bench.summary, description=description)
        p.add_argument("--sizes", type=parse_sizes, default=parse_sizes("8:1M"),
                       help="sizes in bytes: LOW:HIGH (powers of two) or a list, e.g. 8:1M (default) or 8,4K,64M")
        p.add_argument("--iters", type=int, default=None,
                       help="iterations per size (default: OSU's, 1000 up to 8 KiB, 100 above)")
        p.add_argument("--rounds", type=int, default=5,
                       help="interleaved rounds per size: each runs native and every variant iters/rounds times "
                            "(default: 5)")
        p.add_argument("--out", metavar="FILE.md",
                       help="also write the table, the command and the machine to this Markdown file")
        p.add_argument("--append", action="store_true", help="with --out: append to the file instead of replacing it")
        p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
        p.add_argument("--progress", action="store_true",
                       help="progress lines on stderr (the default for collectives)")
        if bench.collective:
            p.add_argument("--algorithms", default="all", metavar="all|NAME,...",
                           help="algorithms to measure: all (default: every registered one and auto) or a "
                                "comma-separated list (auto included)")
            p.add_argument("--validate", action="store_true",
                           help="after each size, check every algorithm's result against native MPI (exit 1 if any "
                                "differs)")
            p.add_argument("--json", metavar="OUT.json", help="write the rows, command, machine, MPI library, p, date")
            p.add_argument("--plot", metavar="OUT.png",
                           help="latency vs size, log-log, one line per algorithm and native (needs matplotlib)")
            p.add_argument("--pool", action="store_true",
                           help="also measure the shm algorithm on buffers from the shared-memory pool "
                                "(row shm+pool)")
    return parser, subs


def _write_markdown(args: argparse.Namespace, report: Report, command: str, machine: str,
                    plot: str | None) -> None:
    settings = _settings()
    lines = [f"# {report.title}" if args.benchmark == "pingpong" else f"## {report.title}", "",
             f"Command: `{command}`", "", f"Machine: {machine}", ""]
    if settings:
        lines += [f"Settings: `{settings}`", ""]
    if report.method:
        lines += [report.method, ""]
    lines.append(markdown_table(report.header, report.cells))
    lines.append("")
    for note in report.notes:
        lines += [note, ""]
    if plot:
        rel = os.path.relpath(os.path.abspath(plot), os.path.dirname(os.path.abspath(args.out)))
        lines += [f"![{args.benchmark} latency]({rel})", ""]
    with open(args.out, "a" if args.append else "w") as f:
        f.write("\n".join(lines) + ("\n" if args.append else ""))


def _finish(args: argparse.Namespace, argv: list[str], report: Report) -> None:
    """On rank 0: print the table and notes; write --out, --json, --plot."""
    command = _command(argv)
    machine = _machine()
    print(f"# {report.title}")
    print(markdown_table(report.header, report.cells))
    for note in report.notes:
        print(note)
    sys.stdout.flush()
    plotted = None
    if getattr(args, "plot", None) and report.rows:
        _plot(args.plot, COLLECTIVES[args.benchmark], report.rows, report.extra.get("p", 0), machine)
        plotted = args.plot
    if args.out:
        _write_markdown(args, report, command, machine, plotted)
    if getattr(args, "json", None):
        document = {
            "benchmark": args.benchmark, "command": command, "machine": machine, "mpi_library": _library(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "settings": _settings(), "sizes_requested": args.sizes, "rounds": args.rounds,
            "method": report.method, **report.extra, "rows": report.rows,
        }
        with open(args.json, "w") as f:
            json.dump(document, f, indent=1)


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, run the benchmark on every rank, print and write the results on rank 0."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, subs = _parser()
    args = parser.parse_args(argv)
    parser = subs[args.benchmark]  # errors from here on show the benchmark's own usage
    if args.iters is not None and args.iters < 1:
        parser.error(f"--iters {args.iters}: must be >= 1")
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: must be >= 1")
    if args.append and not args.out:
        parser.error("--append needs --out FILE.md")
    bench = BENCHMARKS[args.benchmark]
    if bench.collective:
        try:
            _requested(COLLECTIVES[args.benchmark], args.algorithms)
        except ValueError as exc:
            parser.error(str(exc))
        if args.plot and importlib.util.find_spec("matplotlib") is None:
            parser.error("--plot needs matplotlib, which is not installed: pip install matplotlib "
                         "(or install mpicomm with the plot extra: pip install -e '.[plot]')")
    else:
        args.quiet = not args.progress
    args.progress = not args.quiet

    from mpi4py import MPI

    world = MPI.COMM_WORLD
    code = 0
    try:
        report = bench.run(args)
        code = report.code
        if world.Get_rank() == 0:
            try:
                _finish(args, argv, report)
            except OSError as exc:  # an output path that cannot be written: say so, exit 1 everywhere
                print(f"python -m mpicomm.bench: cannot write the results: {exc}", file=sys.stderr, flush=True)
                code = 1
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        if world.Get_size() > 1:  # the other ranks may be waiting in a collective: end the job
            print(f"rank {world.Get_rank()}: {args.benchmark} benchmark failed; aborting the job",
                  file=sys.stderr, flush=True)
            world.Abort(1)
        raise
    return world.allreduce(code, op=MPI.MAX)


if __name__ == "__main__":
    sys.exit(main())
