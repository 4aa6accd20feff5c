"""Benchmark: word count on the MPI engine against one process's ``collections.Counter``, same files, same run.

    mpiexec -n 2 python -m apps.mapreduce bench --size 200M --out jobs/results/mapreduce-wordcount.md --force

Rank 0 generates the corpus (reused when one with the same arguments is there)
in a directory private to the user (:func:`corpus_directory`: never a fixed
name in the shared temporary directory that someone else could have made or
linked) and reads it once so both contenders find it in the page cache. Then, for each
repetition: rank 0 alone counts the files with ``Counter`` (the same tokenizer,
:func:`.wordcount.count_files`, and ``most_common`` for the top list) while the
other ranks wait asleep (a polled ``Ibarrier``, so they take no core); then
every rank runs the engine (map, combine, shuffle, reduce, top list on rank 0).
Both are timed inside the processes: interpreter and MPI start-up are excluded
from both, and so is one-time set-up (building the word pattern, mpicomm's
first collective). The engine's answer must equal the baseline's (top list,
number of words, number of distinct words), or the benchmark fails.

The Markdown table written to ``--out`` holds the median and best times, the
speed-up, per-phase times (max over ranks) and MiB/s per rank, the command that
made it and the machine; an existing file is kept unless ``--append`` or
``--force``. ``--json FILE`` writes every repetition's times and phases.
Progress (one ``[i/N]`` line per repetition) goes to stderr from rank 0.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import stat
import statistics
import sys
import tempfile
import time
from typing import Any

from apps import report as json_report
from mpicomm import cli

from .inputs import format_size

__all__ = ["add_arguments", "run", "idle_barrier", "private_cache", "corpus_directory"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The bench sub-command's options."""
    p.add_argument("--size", type=cli.size_arg, default="200M", metavar="SIZE",
                   help="corpus size, e.g. 200M, 64KiB or 1e6 (default: 200M)")
    p.add_argument("--dir", default=None, metavar="DIR",
                   help="corpus directory (default: <temp>/mpicomm-<uid>/mapreduce-corpus-<size>, in a private "
                        "directory of this user, reused by later runs)")
    p.add_argument("--files", type=int, default=8, help="corpus files (default: 8)")
    p.add_argument("--vocabulary", type=int, default=100_000, help="distinct words in the corpus (default: 100000)")
    cli.add_repeat(p, 3, "each contender (interleaved)")
    p.add_argument("--top", type=int, default=20, help="top list compared between both (default: 20)")
    p.add_argument("--memory-limit", type=cli.size_arg, default="512M", metavar="SIZE",
                   help="the engine's per-rank memory limit (default: 512M)")
    cli.add_out(p, "the table")
    cli.add_json(p, "every repetition's times, phases and the medians")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def private_cache() -> str | None:
    """``<temp>/mpicomm-<uid>``, made 0700 if absent; None unless it is a real directory this user owns, private.

    Why: the system's temporary directory is shared, so a fixed name there can
    be made in advance by someone else (or be a symbolic link to their
    directory). The name is only trusted after ``lstat`` shows a directory (not
    a link) owned by this user with no access for group or others.
    """
    getuid = getattr(os, "getuid", None)
    if getuid is None:
        return None
    path = os.path.join(tempfile.gettempdir(), f"mpicomm-{getuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != getuid() or st.st_mode & 0o077:
        return None
    return path


def corpus_directory(given: str | None, size: int, name: str | None = None) -> tuple[str, bool]:
    """Where a generated corpus goes, and whether it is a throw-away directory to remove afterwards.

    *given* (``--dir``) is used as it is; otherwise *name* (default
    ``mapreduce-corpus-<size>``, the benchmark's) in :func:`private_cache`
    (reused by later runs), or, when that cannot be trusted, a fresh
    ``mkdtemp`` directory removed after the run.
    """
    if given:
        return given, False
    name = name or f"mapreduce-corpus-{size}"
    cache = private_cache()
    if cache is not None:
        return os.path.join(cache, name), False
    return tempfile.mkdtemp(prefix=f"{name}-"), True


def idle_barrier(comm: Any) -> None:
    """A barrier that waits asleep (polling every 2 ms), leaving the cores to whoever works."""
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(0.002)


def _machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    from mpi4py import MPI

    library = MPI.Get_library_version().splitlines()[0].strip()
    return f"{os.cpu_count()} CPU(s), {model}; Python {platform.python_version()}; {library}"


def run(args: argparse.Namespace, argv: list[str]) -> int:
    """The benchmark (every rank; rank 0 reports)."""
    import mpicomm

    comm = mpicomm.Comm()
    directory, throwaway = corpus_directory(args.dir, args.size) if comm.rank == 0 else (None, False)
    try:
        return _run(args, argv, comm, directory)
    finally:
        if throwaway:
            shutil.rmtree(directory, ignore_errors=True)


def _run(args: argparse.Namespace, argv: list[str], comm: Any, directory: str | None) -> int:
    """The benchmark proper; *directory*: the corpus's, on rank 0 (None elsewhere)."""
    from collections import Counter

    import numpy as np
    from mpi4py import MPI

    from .corpus import generate
    from .wordcount import count_files, order, word_pattern, wordcount

    p, rank = comm.size, comm.rank
    paths = None
    if rank == 0:
        start = time.perf_counter()
        paths = generate(directory, args.size, files=args.files, vocabulary_size=args.vocabulary)
        for path in paths:  # into the page cache, for both contenders alike
            with open(path, "rb") as f:
                while f.read(1 << 24):
                    pass
        print(f"bench: corpus of {format_size(sum(map(os.path.getsize, paths)))} in {directory} "
              f"({cli.format_time(time.perf_counter() - start)})", flush=True)
    idle_barrier(comm)
    paths = comm.bcast(paths, root=0)
    total = sum(map(os.path.getsize, paths))
    word_pattern()  # built once per process, outside the timings
    warm = np.zeros(p, np.int64)
    comm.Alltoall(warm, warm.copy())  # mpicomm's one-time set-up of its first collective, outside the timings
    base_times, engine_times, base_cpu, engine_cpu, phases = [], [], [], [], []
    reference = engine = None
    progress = cli.Progress(args.repeat, "bench", show=rank == 0 and not args.quiet)
    for _ in range(args.repeat):
        if rank == 0:
            start, cpu = time.perf_counter(), time.process_time()
            counts: Counter = count_files(paths)
            best = sorted(counts.most_common(args.top), key=order)
            base_times.append(time.perf_counter() - start)
            base_cpu.append(time.process_time() - cpu)
            reference = (best, sum(counts.values()), len(counts))
            del counts
        idle_barrier(comm)
        comm.Barrier()
        start, cpu = time.perf_counter(), time.process_time()
        top, mr = wordcount(comm, paths, top=args.top, memory_limit=args.memory_limit)
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        words = comm.allreduce(sum(v for _, v in mr.items()))
        summary = mr.summary()
        keys = sum(s["counters"]["keys"] for s in summary)
        mr.close()
        engine_times.append(comm.allreduce(elapsed, op=MPI.MAX))
        engine_cpu.append(comm.allreduce(cpu, op=MPI.SUM))
        phases.append(summary)
        if rank == 0:
            engine = (top, words, keys)
            if engine != reference:
                print(cli.error_line("python -m apps.mapreduce bench",
                                     f"the engine's answer differs from Counter's: {engine[1:]} against "
                                     f"{reference[1:]}; top {engine[0][:3]} against {reference[0][:3]}"),
                      file=sys.stderr)
                return 1
            progress.step(f"Counter {cli.format_time(base_times[-1])}, "
                          f"engine on {p} rank(s) {cli.format_time(engine_times[-1])}")
    if rank != 0:
        return 0
    text = _table(args, argv, p, paths, total, (base_times, base_cpu), (engine_times, engine_cpu), phases, reference)
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        cli.write_out(args.out, text, args.append)
        print(f"bench: table written to {args.out}")
    if args.json:
        results = {"ranks": p, "files": len(paths), "bytes": total, "vocabulary": args.vocabulary,
                   "memory_limit": args.memory_limit, "repeat": args.repeat,
                   "words": reference[1], "distinct": reference[2],
                   "counter": {"seconds": base_times, "cpu_seconds": base_cpu,
                               "median_s": statistics.median(base_times)},
                   "engine": {"seconds": engine_times, "cpu_seconds": engine_cpu,
                              "median_s": statistics.median(engine_times), "phases": phases},
                   "speedup": statistics.median(base_times) / statistics.median(engine_times)}
        json_report.write_json(args.json, "python -m apps.mapreduce", argv, p, results)
    return 0


def _command(p: int, argv: list[str]) -> str:
    return json_report.command("python -m apps.mapreduce", argv, p)


def _table(args: argparse.Namespace, argv: list[str], p: int, paths: list[str], total: int,
           baseline: tuple[list[float], list[float]], engine: tuple[list[float], list[float]],
           phases: list[list[dict[str, Any]]], reference: Any) -> str:
    mib = total / 2**20
    (base, base_cpu), (eng, eng_cpu) = baseline, engine
    b_med, e_med = statistics.median(base), statistics.median(eng)
    b_cpu, e_cpu = statistics.median(base_cpu), statistics.median(eng_cpu)
    command = _command(p, argv)
    names = ["map", "shuffle", "reduce", "output"]
    per_phase = {n: statistics.median(max(s["timings"].get(n, 0.0) for s in summary) for summary in phases)
                 for n in names}
    rates = [statistics.median(s[r]["counters"]["bytes_mapped"] / 2**20 / s[r]["timings"]["map"]
                               for s in phases) for r in range(p)]
    shuffled = sum(s["counters"]["items_sent"] for s in phases[-1])
    lines = [
        f"## Word count: {p} MPI ranks against one process's `collections.Counter`",
        "",
        "```bash",
        command,
        "```",
        "",
        f"{datetime.date.today().isoformat()}; {_machine()}.",
        f"Corpus: {len(paths)} files, {mib:.1f} MiB, Zipf s = 1.0 over {args.vocabulary} words "
        f"({reference[1]} words, {reference[2]} distinct); memory limit {format_size(args.memory_limit)} per rank; "
        f"{args.repeat} repetitions, each contender timed inside its process (start-up excluded).",
        "",
        "| contender | median s | best s | MiB/s | speed-up (median) | CPU s, all processes (median) |",
        "|---|---:|---:|---:|---:|---:|",
        f"| `Counter`, 1 process | {b_med:.2f} | {min(base):.2f} | {mib / b_med:.1f} | 1.00 | {b_cpu:.2f} |",
        f"| engine, {p} ranks | {e_med:.2f} | {min(eng):.2f} | {mib / e_med:.1f} | **{b_med / e_med:.2f}** "
        f"| {e_cpu:.2f} |",
        "",
        "| engine phase (max over ranks, median) | seconds |",
        "|---|---:|",
    ]
    lines += [f"| {n} | {per_phase[n]:.3f} |" for n in names]
    lines += [
        "",
        "Map throughput per rank (MiB/s, median): " + ", ".join(f"rank {r}: {x:.1f}" for r, x in enumerate(rates))
        + f". Keys shuffled: {shuffled} (after the map-side combiner). CPU seconds of the engine over "
        f"`Counter`'s: {e_cpu / b_cpu:.2f} (what the parallel version adds: every rank combines and packs "
        f"nearly the whole vocabulary, and MPI polls busily while a rank waits for another).",
        "",
    ]
    return "\n".join(lines)
