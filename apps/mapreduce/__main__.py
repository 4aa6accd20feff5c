"""Command line: ``python -m apps.mapreduce {wordcount,invindex,corpus,bench} ...``.

    mpiexec -n 4 python -m apps.mapreduce wordcount [FILE...] [--top 20] [--output counts.tsv [--force]] [--lowercase]
                                                  [--memory-limit 512M] [--spill-dir DIR] [--errors strict|replace]
                                                  [--checkpoint-every 1] [--checkpoint-dir DIR] [--restart]
                                                  [--check] [--json FILE] [--quiet]
    mpiexec -n 4 python -m apps.mapreduce invindex [FILE...] [--output index.tsv] [same options]
    python -m apps.mapreduce corpus DIR --size 200M [--files 8] [--vocabulary 100000] [--zipf 1.0] [--seed 1]
    mpiexec -n 2 python -m apps.mapreduce bench --size 200M [--out jobs/results/mapreduce-wordcount.md] [--json F]

The conventions of :mod:`mpicomm.cli` and :mod:`apps.options`: sizes as 4096,
64K, 64KiB, 1M or 1e6; ``--json FILE`` (every sub-command) writes the results in
one document with the command, machine, versions and date; ``--out`` is the
benchmark's Markdown report only (an existing one is kept unless ``--append`` or
``--force``); the jobs write their data with ``--output`` (an existing file is
kept unless ``--force``); the checkpoint options are every application's
(``--checkpoint-dir``, default ``checkpoints/mapreduce``), except that a job
has one point to resume from, after the map phase, so ``--checkpoint-every`` is
1 (checkpoint it) or 0 (never) and there is no ``--keep``. Arguments are
checked before the work starts: a usage error, ``<prog>: error: …`` and status 2, once per job.
Inputs are checked collectively before any work: what is wrong is said once
per job (a rank whose peers never answer names itself: ``<prog>: error: rank r
of N: …``) and the job exits with status 2 instead of hanging. Without FILE, a
job counts :data:`DEFAULT_CORPUS`, a corpus it generates (once: later runs
reuse it) and says where, and checks its answer (``--check``: every result
against one process's count of the same files, :mod:`.check`; status 1 if one
differs): ``mpiexec -n 2 python -m apps.mapreduce wordcount`` is the default
run, needing nothing but the repository. Progress goes to stderr from rank 0 (``[i/N]`` lines with
elapsed time and ETA); results and per-phase timings to stdout.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from mpicomm import cli

from .inputs import ERRORS, InputError, format_size

__all__ = ["main", "parser", "parse", "run_job", "run_corpus", "default_corpus", "PROG", "DEFAULT_CORPUS"]

PROG = "python -m apps.mapreduce"

#: What a job counts when no FILE is given: the corpus sub-command's Zipf text (s = 1, seed 1), small enough to make
#: and count in seconds on a laptop, large enough that every rank maps and shuffles tens of thousands of words.
DEFAULT_CORPUS = {"size": 4 << 20, "files": 8, "vocabulary": 20_000}


def _job_options(p: argparse.ArgumentParser, output: str) -> None:
    from apps import options

    p.add_argument("files", nargs="*", metavar="FILE",
                   help=f"input text files (UTF-8); none: a generated corpus of {DEFAULT_CORPUS['files']} files, "
                        f"{format_size(DEFAULT_CORPUS['size'])} (Zipf over {DEFAULT_CORPUS['vocabulary']} words, "
                        f"seed 1), made once in a private temporary directory and reused, with --check")
    p.add_argument("--top", type=int, default=20, help="how many entries to print (default: 20)")
    cli.add_output(p, output)
    cli.renamed(p, "--out", "--output", "--out is for Markdown reports")
    p.add_argument("--lowercase", action="store_true", help="lowercase every word (str.lower, after tokenizing)")
    p.add_argument("--errors", choices=ERRORS, default="strict",
                   help="invalid UTF-8: strict stops with file and byte offset (default); replace reads U+FFFD")
    p.add_argument("--memory-limit", type=cli.size_arg, default="512M", metavar="SIZE",
                   help="per-rank memory for the engine's buffers, e.g. 512M, 2G or 1e9 (default: 512M); "
                        "spills beyond")
    p.add_argument("--spill-dir", metavar="DIR", help="where spill files go (default: the system's temp directory)")
    options.add_checkpoint_options(
        p, "mapreduce", keep=False,
        every="1: checkpoint the map output when the map phase ends, the one point a job resumes from; 0: never "
              "(default: 0)",
        restart="reuse a valid checkpoint of the same job in --checkpoint-dir and skip the map (map and "
                "checkpoint when there is none)")
    p.add_argument("--check", action="store_true",
                   help="compare every result with one process's answer for the same files (collections.Counter, "
                        "same tokenizer) on rank 0; status 1 if one differs (on when no FILE is given)")
    cli.add_json(p, "the results, per-phase timings and memory")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def parser() -> argparse.ArgumentParser:
    """The command line's parser, with its four sub-commands (:func:`parse` checks the values)."""
    parser = cli.Parser(prog=PROG,
                        description="Map-reduce on mpicomm: word count, inverted index, corpus, benchmark.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{wordcount,invindex,corpus,bench}")
    wc = sub.add_parser("wordcount", help="count words; print the most frequent",
                        description="Count words (Unicode-aware; see apps/mapreduce/wordcount.py for the policy).")
    _job_options(wc, "every 'word<TAB>count' line, sorted by count then word (rank 0)")
    ii = sub.add_parser("invindex", help="inverted index: for each word, the files it occurs in",
                        description="For every word, the input files it occurs in.")
    _job_options(ii, "every 'word<TAB>files<TAB>file…' line, sorted by word (rank 0)")
    co = sub.add_parser("corpus", help="generate a reproducible Zipf corpus (one process, no MPI)")
    co.add_argument("directory", help="where to write corpus-NNN.txt")
    co.add_argument("--size", type=cli.size_arg, default="64M", metavar="SIZE",
                    help="total bytes, e.g. 200M, 64KiB or 1e6 (default: 64M)")
    co.add_argument("--files", type=int, default=8, help="number of files (default: 8)")
    co.add_argument("--vocabulary", type=int, default=100_000, help="distinct words (default: 100000)")
    co.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent s (default: 1.0)")
    co.add_argument("--unicode", type=float, default=0.05, help="fraction of non-ASCII words (default: 0.05)")
    co.add_argument("--seed", type=int, default=1, help="random seed (default: 1)")
    cli.add_json(co, "the files written")
    be = sub.add_parser("bench", help="word count: MPI engine against one process's Counter, same files, same run",
                        description="Word count on the MPI engine against one process's collections.Counter: the same "
                                    "files, timed in the same run; the Markdown table goes to --out.")
    from .bench import add_arguments

    add_arguments(be)
    return parser


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The checked command line; a usage error exits with status 2 (argparse's) before the work starts."""
    top = parser()
    args = top.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # for the command line in --json and --out
    own = cli.subparser(top, args.command)  # its errors name the sub-command
    from apps import options
    if args.command in ("wordcount", "invindex"):
        cli.at_least(own, args, 0, "--top")
        if args.checkpoint_every not in (0, 1):
            own.error(f"--checkpoint-every must be 0 or 1 (a job checkpoints once, after the map phase), got "
                      f"{args.checkpoint_every}")
        options.check_checkpoint_options(own, args)
        if args.spill_dir and not os.path.isdir(args.spill_dir):
            own.error(f"--spill-dir {args.spill_dir!r}: not an existing directory")
        cli.check_out(own, args)
    for name in ("output", "json"):
        path = getattr(args, name, None)
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            own.error(f"--{name} {path!r}: its directory does not exist")
    if args.command in ("wordcount", "invindex", "bench"):
        from .engine import MIN_MEMORY

        if args.memory_limit < MIN_MEMORY:
            own.error(f"--memory-limit must be >= {format_size(MIN_MEMORY)}, got {format_size(args.memory_limit)}")
    if args.command == "bench":
        cli.at_least(own, args, 1, "--repeat", "--top", "--files", "--vocabulary")
        cli.check_out(own, args)
    if args.command == "corpus":
        if cli.launched_ranks()[1] > 1:
            own.error("run corpus without mpiexec (one process writes the files)")
        cli.at_least(own, args, 1, "--files", "--vocabulary")
        if not args.zipf > 0:
            own.error(f"--zipf must be > 0, got {args.zipf:g}")
        if not 0 <= args.unicode <= 1:
            own.error(f"--unicode must be in [0, 1], got {args.unicode:g}")
    return args


def _phase_table(summary: list[dict[str, Any]]) -> list[str]:
    names = [n for n in ("map", "checkpoint", "shuffle", "reduce", "output") if any(n in s["timings"] for s in summary)]
    lines = [f"  {'phase':<11} {'max s':>8} {'min s':>8}   per rank"]
    for name in names:
        ts = [s["timings"].get(name, 0.0) for s in summary]
        extra = ""
        if name == "map":
            rates = [s["counters"]["bytes_mapped"] / 2**20 / t if t > 0 else 0.0 for s, t in zip(summary, ts)]
            extra = "MiB/s " + " ".join(f"{r:.1f}" for r in rates)
        elif name == "shuffle":
            extra = "keys sent " + " ".join(str(s["counters"]["items_sent"]) for s in summary)
        lines.append(f"  {name:<11} {max(ts):8.3f} {min(ts):8.3f}   {extra}")
    total = [sum(s["timings"].values()) for s in summary]
    lines.append(f"  {'total':<11} {max(total):8.3f} {min(total):8.3f}")
    return lines


def default_corpus(comm: Any, command: str) -> tuple[list[str], str | None]:
    """The files of :data:`DEFAULT_CORPUS` on every rank, and a directory to remove afterwards (or None); collective.

    Rank 0 generates them (a corpus already there with the same parameters is
    reused) into the private directory the benchmark uses too
    (:func:`.bench.corpus_directory`) and says what it did on stdout.
    """
    import time

    from .bench import corpus_directory
    from .corpus import STAMP, generate

    made: tuple[list[str], str | None] | None = None
    if comm.rank == 0:
        size, files, words = DEFAULT_CORPUS["size"], DEFAULT_CORPUS["files"], DEFAULT_CORPUS["vocabulary"]
        directory, throwaway = corpus_directory(None, size, "mapreduce-default-corpus")
        stamp = os.path.join(directory, STAMP)
        before = os.stat(stamp).st_mtime_ns if os.path.isfile(stamp) else None
        start = time.perf_counter()
        paths = generate(directory, size, files=files, vocabulary_size=words)
        how = ("reused" if os.stat(stamp).st_mtime_ns == before
               else f"made in {cli.format_time(time.perf_counter() - start)}")
        print(f"{command}: no FILE given: a generated corpus of {len(paths)} files, "
              f"{format_size(sum(map(os.path.getsize, paths)))} (Zipf s = 1 over {words} words, seed 1) in "
              f"{directory} ({how}), its answer checked against one process's count; give FILE... to count your "
              f"own files", flush=True)
        made = (paths, directory if throwaway else None)
    shared: tuple[list[str], str | None] = comm.bcast(made, root=0)
    return shared


def run_job(args: argparse.Namespace) -> int:
    """wordcount / invindex on every rank (through mpicomm.runtime.main)."""
    import shutil

    import mpicomm

    comm = mpicomm.Comm()
    throwaway = None
    if not args.files:
        args.files, throwaway = default_corpus(comm, args.command)
        args.check = True
    try:
        return _job(comm, args)
    finally:
        if throwaway and comm.rank == 0:
            shutil.rmtree(throwaway, ignore_errors=True)


def _job(comm: Any, args: argparse.Namespace) -> int:
    """The job proper, on *args.files*."""
    import numpy as np

    from .engine import memory_usage

    before = memory_usage(reset=True)
    progress = None if args.quiet else sys.stderr
    checkpointing = bool(args.checkpoint_every or args.restart)
    options = dict(lowercase=args.lowercase, errors=args.errors, top=args.top, out=args.output,
                   memory_limit=args.memory_limit, spill_dir=args.spill_dir,
                   checkpoint_dir=args.checkpoint_dir if checkpointing else None, restart=args.restart,
                   progress=progress)
    try:
        if args.command == "wordcount":
            from .wordcount import wordcount as job
        else:
            from .invindex import invindex as job
        best, mr = job(comm, args.files, **options)
    except InputError as exc:  # agreed by every rank (apps.agree): said once, every rank exits with status 2
        sys.stdout.flush()
        from apps.options import exit_error

        exit_error(f"{PROG} {args.command}", str(exc), comm.rank, comm.size)
    try:
        summary = mr.summary()
        words = sum(v for _, v in mr.items()) if args.command == "wordcount" else 0
        words, keys = (int(x) for x in comm.allreduce(np.array([words, mr.counters["keys"]])))
        after = memory_usage()
        memory = comm.gather({"baseline": before and before["rss"], "peak": after and after["peak"],
                              "measured_from_start": bool(before and before["reset"])}, root=0)
        problem = None
        if args.check:
            from .check import check

            problem = check(comm, args.command, mr, args.files, args.lowercase, args.errors)
    finally:
        mr.close()
    if problem:  # the same on every rank: said once, every rank exits with status 1
        sys.stdout.flush()
        from mpicomm.runtime import exit_together

        prog = f"{PROG} {args.command}"
        exit_together(1, cli.error_line(prog, problem), alone=cli.error_line(prog, problem, comm.rank, comm.size))
    if comm.rank != 0:
        return 0
    total = sum(os.path.getsize(p) for p in args.files)
    head = f"{args.command}: {len(args.files)} file(s), {format_size(total)}, {comm.size} rank(s): "
    if args.command == "wordcount":
        print(head + f"{words} words, {keys} distinct")
        if args.top:
            print(f"  {'count':>10}  word")
            for word, count in best:
                print(f"  {count:>10}  {word}")
        if args.output:
            print(f"all {keys} words written to {args.output} (word<TAB>count, by count then word)")
    else:
        print(head + f"{keys} distinct words")
        if args.top:
            print(f"  {'files':>6}  word")
            for word, files in best:
                print(f"  {len(files):>6}  {word}")
        if args.output:
            print(f"the index of {keys} words written to {args.output} (word<TAB>count<TAB>files, by word)")
    if mr.restored_from:
        print(f"map output restored from {mr.restored_from} (map skipped)")
    if args.check:
        what = "count" if args.command == "wordcount" else "file list"
        print(f"check passed: every word's {what} equals one process's answer for the same files")
    print("phases (seconds, max and min over ranks):")
    print("\n".join(_phase_table(summary)))
    spills = sum(s["counters"]["map_spills"] + s["counters"]["results_spilled"] for s in summary)
    buckets = max(s["counters"]["buckets"] for s in summary)
    print(f"memory limit {format_size(args.memory_limit)} per rank: {spills} map/result spill(s), "
          f"{buckets} reduce bucket(s) at most")
    if args.json:
        results = {"command": args.command, "ranks": comm.size, "words": words, "keys": keys,
                   "top": [[k, v] for k, v in best], "summary": summary, "memory": memory,
                   "memory_limit": args.memory_limit, "restored_from": mr.restored_from, "checked": args.check}
        from apps import report as json_report

        json_report.write_json(args.json, PROG, args.argv, comm.size, results)
    return 0


#: Bytes the corpus generator holds per vocabulary word (the word, its encoded and capitalized forms, the set
#: that keeps them distinct, the arrays that draw from them; measured: about 220).
VOCABULARY_BYTES = 240


def run_corpus(args: argparse.Namespace) -> int:
    """Generate the corpus (one process); a vocabulary that cannot fit in memory is refused first."""
    from apps import memory

    from .corpus import generate

    try:
        memory.check(None, lambda v: v["--vocabulary"] * VOCABULARY_BYTES + (64 << 20),
                     [memory.Knob("--vocabulary", args.vocabulary)])
    except memory.MemoryNeedError as exc:
        sys.stderr.write(cli.error_line(f"{PROG} corpus", str(exc)) + "\n")
        return 2
    paths = generate(args.directory, args.size, files=args.files, vocabulary_size=args.vocabulary, zipf=args.zipf,
                     seed=args.seed, unicode=args.unicode)
    total = sum(os.path.getsize(p) for p in paths)
    print(f"corpus: {len(paths)} file(s), {format_size(total)} in {args.directory} "
          f"(vocabulary {args.vocabulary}, zipf {args.zipf}, seed {args.seed})")
    if args.json:
        results = {"directory": args.directory, "files": paths, "bytes": total, "size": args.size,
                   "vocabulary": args.vocabulary, "zipf": args.zipf, "unicode": args.unicode, "seed": args.seed}
        cli.write_json(args.json, cli.command_line(PROG, args.argv), results)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = cli.parse_or_exit(parse, argv)
    if args.command == "corpus":
        return run_corpus(args)
    from mpicomm.runtime import main as guarded

    if args.command == "bench":
        from .bench import run

        return guarded(run, args, args.argv)
    return guarded(run_job, args)


if __name__ == "__main__":
    sys.exit(main())
