"""Command line: ``python -m apps.mapreduce {wordcount,invindex,corpus,bench} ...``.

    mpiexec -n 4 python -m apps.mapreduce wordcount FILES... [--top 20] [--output counts.tsv] [--lowercase]
                                                  [--memory-limit 512M] [--spill-dir DIR] [--errors strict|replace]
                                                  [--checkpoint-dir D] [--restart] [--json FILE] [--quiet]
    mpiexec -n 4 python -m apps.mapreduce invindex FILES... [--output index.tsv] [same options]
    python -m apps.mapreduce corpus DIR --size 200M [--files 8] [--vocabulary 100000] [--zipf 1.0] [--seed 1]
    mpiexec -n 2 python -m apps.mapreduce bench --size 200M [--out jobs/results/mapreduce-wordcount.md] [--json F]

The conventions of :mod:`mpicomm.cli`: sizes as 4096, 64K, 64KiB, 1M or 1e6;
``--json FILE`` (every sub-command) writes the results in one document with the
command, machine, versions and date; ``--out`` is the benchmark's Markdown
report only (an existing one is kept unless ``--append`` or ``--force``); the
jobs write their data with ``--output`` (``--out`` is still accepted there).
Arguments are checked before MPI starts, on every rank; inputs are checked
collectively before any work. Either way every rank prints what is wrong,
naming itself, and the job exits with status 2 instead of hanging. Progress goes
to stderr from rank 0 (``[i/N]`` lines with elapsed time and ETA); results and
per-phase timings to stdout.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, NoReturn

from mpicomm import cli

from .inputs import ERRORS, InputError, format_size

__all__ = ["main", "parse", "run_job", "run_corpus", "PROG"]

PROG = "python -m apps.mapreduce"


def _who() -> str:
    from mpicomm.launcher import from_environment

    info = from_environment()
    return f"rank {info.rank or 0} of {info.size or 1}"


class _Parser(argparse.ArgumentParser):
    """argparse that names the rank in its error (every rank of a job prints one)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: {_who()}: error: {message}\n")


def _job_options(p: argparse.ArgumentParser, output_help: str) -> None:
    p.add_argument("files", nargs="+", metavar="FILE", help="input text files (UTF-8)")
    p.add_argument("--top", type=int, default=20, help="how many entries to print (default: 20)")
    p.add_argument("--output", metavar="FILE", help=output_help + " (replaced if it exists)")
    p.add_argument("--out", dest="output", help=argparse.SUPPRESS)  # the option's earlier name
    p.add_argument("--lowercase", action="store_true", help="lowercase every word (str.lower, after tokenizing)")
    p.add_argument("--errors", choices=ERRORS, default="strict",
                   help="invalid UTF-8: strict stops with file and byte offset (default); replace reads U+FFFD")
    p.add_argument("--memory-limit", type=cli.size_arg, default="512M", metavar="SIZE",
                   help="per-rank memory for the engine's buffers, e.g. 512M, 2G or 1e9 (default: 512M); "
                        "spills beyond")
    p.add_argument("--spill-dir", metavar="DIR", help="where spill files go (default: the system's temp directory)")
    p.add_argument("--checkpoint-dir", metavar="D", help="save the map output here (after map+combine)")
    p.add_argument("--restart", action="store_true", help="reuse a valid checkpoint of the same job in --checkpoint-dir")
    cli.add_json(p, "the results, per-phase timings and memory")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = _Parser(prog=PROG, description="Map-reduce on mpicomm: word count, inverted index, corpus, benchmark.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    wc = sub.add_parser("wordcount", help="count words; print the most frequent",
                        description="Count words (Unicode-aware; see apps/mapreduce/wordcount.py for the policy).")
    _job_options(wc, "write every 'word<TAB>count' line here, sorted by count then word (rank 0)")
    ii = sub.add_parser("invindex", help="inverted index: for each word, the files it occurs in",
                        description="For every word, the input files it occurs in.")
    _job_options(ii, "write every 'word<TAB>files<TAB>file…' line here, sorted by word (rank 0)")
    co = sub.add_parser("corpus", help="generate a reproducible Zipf corpus (run without mpiexec)")
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
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # for the command line in --json and --out
    own = {"wordcount": wc, "invindex": ii, "corpus": co, "bench": be}[args.command]  # names the sub-command
    if args.command in ("wordcount", "invindex"):
        if args.top < 0:
            parser.error(f"--top {args.top}: must be >= 0")
        if args.restart and not args.checkpoint_dir:
            parser.error("--restart needs --checkpoint-dir (where the earlier run saved its checkpoint)")
        if args.spill_dir and not os.path.isdir(args.spill_dir):
            parser.error(f"--spill-dir {args.spill_dir!r}: not an existing directory")
    for name in ("output", "json"):
        path = getattr(args, name, None)
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            own.error(f"--{name} {path!r}: its directory does not exist")
    if args.command in ("wordcount", "invindex", "bench"):
        from .engine import MIN_MEMORY

        if args.memory_limit < MIN_MEMORY:
            own.error(f"--memory-limit {format_size(args.memory_limit)} is below the minimum of "
                         f"{format_size(MIN_MEMORY)}")
    if args.command == "bench":
        cli.check_out(own, args)
    if args.command == "corpus" and (args.files < 1 or args.vocabulary < 1 or args.zipf <= 0
                                     or not 0 <= args.unicode <= 1):
        parser.error("corpus: need --files >= 1, --vocabulary >= 1, --zipf > 0, 0 <= --unicode <= 1")
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


def run_job(args: argparse.Namespace) -> int:
    """wordcount / invindex on every rank (through mpicomm.runtime.main)."""
    import numpy as np

    import mpicomm

    from .engine import memory_usage

    comm = mpicomm.Comm()
    where = f"{PROG} {args.command}: rank {comm.rank} of {comm.size}"
    before = memory_usage(reset=True)
    progress = None if args.quiet else sys.stderr
    options = dict(lowercase=args.lowercase, errors=args.errors, top=args.top, out=args.output,
                   memory_limit=args.memory_limit, spill_dir=args.spill_dir, checkpoint_dir=args.checkpoint_dir,
                   restart=args.restart, progress=progress)
    try:
        if args.command == "wordcount":
            from .wordcount import wordcount as job
        else:
            from .invindex import invindex as job
        best, mr = job(comm, args.files, **options)
    except InputError as exc:
        sys.stdout.flush()
        sys.stderr.write(f"{where}: error: {exc}\n")
        sys.stderr.flush()
        return 2
    try:
        summary = mr.summary()
        words = sum(v for _, v in mr.items()) if args.command == "wordcount" else 0
        words, keys = (int(x) for x in comm.allreduce(np.array([words, mr.counters["keys"]])))
        after = memory_usage()
        memory = comm.gather({"baseline": before and before["rss"], "peak": after and after["peak"],
                              "measured_from_start": bool(before and before["reset"])}, root=0)
    finally:
        mr.close()
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
    print("phases (seconds, max and min over ranks):")
    print("\n".join(_phase_table(summary)))
    spills = sum(s["counters"]["map_spills"] + s["counters"]["results_spilled"] for s in summary)
    buckets = max(s["counters"]["buckets"] for s in summary)
    print(f"memory limit {format_size(args.memory_limit)} per rank: {spills} map/result spill(s), "
          f"{buckets} reduce bucket(s) at most")
    if args.json:
        results = {"command": args.command, "ranks": comm.size, "words": words, "keys": keys,
                   "top": [[k, v] for k, v in best], "summary": summary, "memory": memory,
                   "memory_limit": args.memory_limit, "restored_from": mr.restored_from}
        cli.write_json(args.json, f"mpiexec -n {comm.size} {cli.command_line(PROG, args.argv)}", results,
                       ranks=comm.size)
    return 0


#: Bytes the corpus generator holds per vocabulary word (the word, its encoded and capitalized forms, the set
#: that keeps them distinct, the arrays that draw from them; measured: about 220).
VOCABULARY_BYTES = 240


def run_corpus(args: argparse.Namespace) -> int:
    """Generate the corpus (one process); a vocabulary that cannot fit in memory is refused first."""
    from apps import memory

    from .corpus import generate

    info_size = os.environ.get("PMI_SIZE") or os.environ.get("OMPI_COMM_WORLD_SIZE")
    if info_size and int(info_size) > 1:
        sys.stderr.write(f"{PROG} corpus: {_who()}: error: run corpus without mpiexec (one process writes the files)\n")
        return 2
    try:
        memory.check(None, lambda v: v["--vocabulary"] * VOCABULARY_BYTES + (64 << 20),
                     [memory.Knob("--vocabulary", args.vocabulary)])
    except memory.MemoryNeedError as exc:
        sys.stderr.write(f"{PROG} corpus: error: {exc}\n")
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
    args = parse(argv)
    if args.command == "corpus":
        return run_corpus(args)
    from mpicomm.runtime import main as guarded

    if args.command == "bench":
        from .bench import run

        return guarded(run, args, args.argv)
    return guarded(run_job, args)


if __name__ == "__main__":
    sys.exit(main())
