"""The timing loops: every variant of a size (native MPI, each mpicomm algorithm, ``auto``) in interleaved rounds.

Each round runs every variant in turn, so all of them see the same machine
noise; a variant's time is its mean (the benchmark tables, as OSU) or its
median over rounds (:func:`time_algorithms`, which ``python -m mpicomm.tune
--collectives`` decides from). What is measured goes back as plain rows;
tables and files are :mod:`mpicomm.bench.report`'s business.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from .metrics import Collective, _iterations, bandwidths, layout, mismatch, model_bytes, rank_values, wrong_elements

__all__ = ["pingpong_rows", "CollectiveRun", "collective_run", "time_algorithms", "requested_algorithms",
           "usable_algorithms"]


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- pingpong


def pingpong_rows(args: argparse.Namespace) -> list[dict]:
    """Ranks 0 and 1 bounce a message: mpi4py Send/Recv against mpicomm send_array/recv_array; one row per size."""
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
    return rows


# ---------------------------------------------------------------- collectives


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


def _arguments(spec: Collective, send: np.ndarray, recv: np.ndarray, op: str = "sum") -> tuple[tuple, dict]:
    """The positional and keyword arguments of one call (mpi4py's signature; op *op*, root 0)."""
    from mpi4py import MPI

    mpi_op = {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}[op]
    keywords: dict[str, Any] = ({"op": mpi_op} if spec.op else {}) | ({"root": 0} if spec.root else {})
    positional = () if spec.name == "barrier" else (recv,) if spec.name == "bcast" else (send, recv)
    return positional, keywords


def _bound(spec: Collective, target: Any, send: np.ndarray, recv: np.ndarray, algorithm: str | None,
           op: str = "sum") -> Callable:
    """``target.<Method>(...)`` with this collective's arguments bound (and ``algorithm=`` for mpicomm)."""
    method = getattr(target, spec.method)
    positional, keywords = _arguments(spec, send, recv, op)
    if algorithm is not None:
        keywords["algorithm"] = algorithm
    return lambda: method(*positional, **keywords)


def _persistent(spec: Collective, comm: Any, send: np.ndarray, recv: np.ndarray,
                op: str = "sum") -> tuple[Callable, Any]:
    """(one Start and Wait of ``comm.<Method>_init(...)``, the request): the call ``--persistent`` times."""
    positional, keywords = _arguments(spec, send, recv, op)
    request = getattr(comm, spec.method + "_init")(*positional, **keywords)

    def run() -> None:
        request.Start()
        request.Wait()

    return run, request


def _auto_choice(comm: Any, spec: Collective, send: np.ndarray, recv: np.ndarray, unit: int,
                 op: str = "sum") -> tuple[str, str]:
    """(algorithm, where the choice came from) that ``algorithm="auto"`` runs for this call.

    Asks the dispatcher, from the call's arguments read as it reads them, so
    the answer uses the same facts (size, layout, fitted machine) as the call.
    """
    from mpicomm.coll import arguments, dispatch

    if spec.name == "barrier":
        args = dispatch.Args("barrier")
    else:
        positional, keywords = _arguments(spec, send, recv, op)
        args = arguments.read(spec.registry, comm, *positional, **keywords)
    algorithm, source = dispatch._choose(comm, args, "auto")
    return algorithm.name, str(source)


def _predict(spec: Collective, algorithm: str, nbytes: int, p: int, machine: Any) -> float | None:
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


def _rounds(variants: list[_Variant], iters: int, rounds: int, barrier: Callable[[], Any]) -> dict[str, list[float]]:
    """Each variant's µs per call in each of *rounds* rounds on this rank, after a warm-up; all variants in each.

    Each iteration times one call, then waits in an untimed barrier (OSU).
    """
    clock = time.perf_counter
    for v in variants:
        for _ in range(max(1, iters // 10)):
            v.call()
            barrier()
    per = max(1, iters // rounds)
    times: dict[str, list[float]] = {v.name: [] for v in variants}
    for _ in range(rounds):
        for v in variants:
            call, total = v.call, 0.0
            for _ in range(per):
                start = clock()
                call()
                total += clock() - start
                barrier()
            times[v.name].append(total * 1e6 / per)
    return times


def _measure(variants: list[_Variant], iters: int, rounds: int, barrier: Callable[[], Any]) -> dict[str, float]:
    """Each variant's mean µs per call on this rank over :func:`_rounds` (every round has as many calls)."""
    return {name: sum(times) / len(times) for name, times in _rounds(variants, iters, rounds, barrier).items()}


def _validate(spec: Collective, variants: list[_Variant], rank: int, p: int, salt: int,
              wrong: dict[str, int] | None = None, op: str = "sum") -> dict[str, str | None]:
    """Run every variant once on fresh data; each one's mismatch with the native result on this rank (or None).

    *wrong*, when given, gets each variant's count of elements that differ from native on this rank.
    """
    results: dict[str, np.ndarray] = {}
    for v in variants:
        v.send[...] = rank_values(v.send.size, rank, p, salt, v.send.dtype, op)
        v.recv[...] = np.nan if v.recv.dtype.kind == "f" else -1
        if spec.name == "bcast" and rank == 0:
            v.recv[...] = rank_values(v.recv.size, rank, p, salt, v.recv.dtype, op)
        v.call()
        results[v.name] = v.recv.copy()
    if spec.name == "barrier" or (spec.root_only and rank != 0):
        return dict.fromkeys(results)
    native = results[variants[0].name]
    if wrong is not None:
        wrong.update({name: wrong_elements(got, native) for name, got in results.items()})
    return {name: (None if got is native else mismatch(got, native)) for name, got in results.items()}



@dataclass
class CollectiveRun:
    """What :func:`collective_run` measured: rows (on rank 0; empty elsewhere), notes, and the run's facts."""

    rows: list[dict]
    notes: list[str]
    overhead: dict | None
    p: int
    nodes: int
    machine: Any
    failed: bool


def collective_run(spec: Collective, args: argparse.Namespace) -> CollectiveRun:
    """Measure *spec* at every size (see :mod:`mpicomm.bench`): every variant interleaved, rows on rank 0."""
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
    dtype = np.dtype(getattr(args, "dtype", "float64"))
    op = getattr(args, "op", "sum")
    item = dtype.itemsize
    sizes = [0] if spec.name == "barrier" else list(dict.fromkeys(layout(spec.name, s, p, item)[3]
                                                                   for s in args.sizes))
    if loud:
        shown = ["native", *map(_label, names)] + (["shm+pool"] if use_pool else [])
        _say(f"{spec.name}: {p} ranks on {comm.nodes} node(s), {len(sizes)} size(s), variants: {', '.join(shown)}"
             + "".join(f"\n  note: {n}" for n in notes))
    rows: list[dict] = []
    failed = False
    for index, size in enumerate(sizes):
        unit, nsend, nrecv, nbytes = layout(spec.name, size, p, item)
        iters = _iterations(nbytes, args.iters)
        rounds = max(1, min(args.rounds, iters))
        send, recv = rank_values(nsend, rank, p, 0, dtype, op), np.zeros(nrecv, dtype)
        if spec.name == "bcast":
            recv[...] = send
        variants = [_Variant("native", None, send, recv, _bound(spec, world, send, recv, None, op))]
        variants += [_Variant(_label(n), n, send, recv, _bound(spec, comm, send, recv, n, op)) for n in names]
        pool = None
        if use_pool:
            pool = shm.Pool(comm, (nsend + nrecv) * item + 2 * 4096)
            psend, precv = pool.empty(nsend, dtype), pool.empty(nrecv, dtype)
            psend[...], precv[...] = send, recv
            variants.append(_Variant("shm+pool", "shm", psend, precv, _bound(spec, comm, psend, precv, "shm", op)))
        persistent = None
        if getattr(args, "persistent", False):
            run, persistent = _persistent(spec, comm, send, recv, op)
            plan = persistent.plan
            variants.append(_Variant("persistent", None if plan.library else plan.algorithm.name, send, recv, run))
        chosen = _auto_choice(comm, spec, send, recv, unit, op) if "auto" in names else None
        mine = _measure(variants, iters, rounds, world.Barrier)
        every = world.gather(mine, root=0)
        verdicts: dict[str, str | None] = {}
        wrongs: dict[str, int] = {}
        if args.validate:
            counts: dict[str, int] = {}
            problems = _validate(spec, variants, rank, p, salt=1 + index, wrong=counts, op=op)
            for name, problem in problems.items():
                if problem is not None:
                    print(f"validation failed: {spec.name} algorithm {name} size {nbytes} B rank {rank}: {problem}",
                          file=sys.stderr, flush=True)
            flags = np.array([problems[v.name] is not None for v in variants], np.int32)
            world.Allreduce(MPI.IN_PLACE, flags, op=MPI.MAX)
            verdicts = {v.name: "Fail" if flag else "Pass" for v, flag in zip(variants, flags)}
            totals = np.array([counts.get(v.name, 0) for v in variants], np.int64)
            world.Allreduce(MPI.IN_PLACE, totals, op=MPI.SUM)  # elements that differ from native, every rank
            wrongs = {v.name: int(t) for v, t in zip(variants, totals)}
            failed = failed or bool(flags.any())
        if rank == 0:
            rows += _size_rows(spec, every, variants, unit, nbytes, p, rounds, iters, chosen, verdicts, machine, item)
            for row in rows[-len(variants):]:
                row["wrong"] = wrongs.get(row["name"]) if args.validate else None
            if loud:
                _progress(spec, rows[-len(variants):], index, len(sizes))
        if persistent is not None:
            persistent.Free()
        if pool is not None:
            del psend, precv
            pool.free()
        if failed:
            break
    overhead = _overhead(spec, rows, world, comm, p) if not failed else None
    return CollectiveRun(rows, notes, overhead, p, comm.nodes, machine, failed)


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
               machine: Any, item: int = 8) -> list[dict]:
    """The rows of one size on rank 0, from every rank's mean µs per variant."""
    per = max(1, iters // rounds)
    native = sum(r["native"] for r in every) / len(every)
    out = []
    for v in variants:
        lat = [r[v.name] for r in every]
        avg = sum(lat) / len(lat)
        bw = bandwidths(spec.name, unit, item, p, avg * 1e-6)
        algorithm = chosen[0] if v.name == "auto" and chosen else v.algorithm
        predicted = _predict(spec, algorithm, model_bytes(spec.name, unit, item, p), p, machine) \
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




# ---------------------------------------------------------------- every algorithm, for a decision


def requested_algorithms(spec: Collective, requested: str) -> list[str]:
    """``all`` → every registered algorithm of *spec* and ``auto``; else the names given (ValueError naming
    unknown ones and the valid names)."""
    return _requested(spec, requested)


def usable_algorithms(spec: Collective, comm: Any) -> tuple[list[str], list[str]]:
    """The registered algorithms of *spec* that can run on *comm* (float64 SUM on host arrays, blocking calls),
    and a note for each one left out (a power-of-two algorithm at p = 3, a one-node one across nodes...)."""
    names, notes = _resolve(spec, "all", comm)
    return [n for n in names if n != "auto"], notes


def time_algorithms(comm: Any, spec: Collective, names: Sequence[str], sizes: Sequence[int],
                    iters: Callable[[int], int] | None = None, rounds: int = 5,
                    progress: Callable[[str], None] | None = None) -> list[dict]:
    """Time each algorithm of *names* (``auto`` allowed) at each size; COLLECTIVE over *comm* (an ``mpicomm.Comm``).

    *sizes* are the benchmark's Size (rounded as :func:`~mpicomm.bench.metrics.layout`
    rounds them; sizes that round alike are measured once). Every algorithm
    runs in each of *rounds* interleaved rounds (:func:`_rounds`); an
    algorithm's time is the mean over ranks of each rank's **median** round, so
    one noisy round does not decide. *iters(nbytes)* gives the calls per size
    (default :func:`~mpicomm.bench.metrics.iterations`, OSU's).

    Returns, on every rank, one dict per size: ``size`` (the Size column),
    ``bytes`` (the selection size the dispatcher compares, see
    ``mpicomm.coll.dispatch.selection_bytes``), ``count`` and ``us``
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
        chosen = _auto_choice(comm, spec, send, recv, unit) if "auto" in names else None
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
