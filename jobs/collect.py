"""Gather a scaling study's benchmark results into one table (Markdown) and one plot.

    python jobs/collect.py runs/scaling-1234                   # writes scaling.md and scaling.png there
    python jobs/collect.py runs/scaling-1234 --rows native,auto,best,ring --out scaling.md --no-plot
    python jobs/collect.py runs/scaling-1234 --force           # again: replace the report (or --append to it)

The scaling job array (jobs/scaling.sbatch) leaves one JSON file per rank count
(``pN.json``, written by ``python -m mpicomm.bench BENCHMARK --json``), each a
table of its own: its rows either at the top (``"rows"``) or, in the
``mpicomm-results`` document every command's ``--json`` writes
(:func:`mpicomm.cli.document`: ``schema``, ``schema_version``, ``versions``...),
under ``"results"`` (see :func:`bench_fields`). A scaling study is read across them: for each message size,
how the latency changes with the number of ranks. This script puts the runs side
by side — one table per row kind (the MPI library's own call, ``auto`` with the
algorithm it chose, the fastest mpicomm algorithm, or any named algorithm),
sizes down, rank counts across — and draws latency against ranks for a few
sizes. It reads only the JSON files (no MPI), so it runs anywhere, including as
a dependent job (``sbatch --dependency=afterok:JOBID --wrap "python jobs/collect.py DIR"``).

The report follows every command's ``--out`` rule (:func:`mpicomm.cli.check_out`):
an existing ``scaling.md`` (or ``--out`` file) is kept unless ``--append`` or
``--force``; usage errors read ``python jobs/collect.py: error: …`` (status 2).
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from typing import Any

from mpicomm import cli
from mpicomm.cli import SCHEMA, SCHEMA_VERSION

__all__ = ["Run", "bench_fields", "load", "cell", "tables", "plot", "parser", "main"]

PROG = "python jobs/collect.py"

#: Row kinds that are not algorithm names (see :func:`cell`).
KINDS = ("native", "auto", "best")


@dataclass(frozen=True)
class Run:
    """One benchmark run (one JSON file): its rank count, node count and rows by size and name."""

    path: str
    benchmark: str
    p: int
    nodes: int
    command: str
    machine: str
    rows: dict[int, dict[str, dict]]  #: size in bytes -> row name -> the row (avg_us, chose, ...)


def _paths(inputs: list[str]) -> list[str]:
    found: list[str] = []
    for item in inputs:
        if os.path.isdir(item):
            found += sorted(glob.glob(os.path.join(item, "*.json")))
        elif os.path.isfile(item):
            found.append(item)
        else:
            raise ValueError(f"{item}: no such file or directory; give the scaling run's directory "
                             f"(runs/scaling-<jobid>) or its JSON files")
    return found


def bench_fields(doc: Any, path: str = "<document>") -> dict[str, Any] | None:
    """The fields of a ``python -m mpicomm.bench --json`` document that :func:`load` reads, or None for other JSON.

    Two shapes are read alike: the rows at the top (``"rows": [...]``, beside
    ``benchmark``, ``p``, ``nodes``, ``command``, ``machine``), and a
    :func:`mpicomm.cli.document` (``schema`` ``mpicomm-results``, ``schema_version``,
    ``versions``...) whose ``results`` is the list of rows, or an object
    holding ``rows`` (and any of the other fields). A field at the top wins over
    the same field inside ``results``. A document of another schema is not a
    benchmark result (None); one of a later ``schema_version`` than this
    collect.py knows raises ValueError.
    """
    if not isinstance(doc, dict):
        return None
    if "schema" in doc:
        if doc["schema"] != SCHEMA:
            return None
        version = doc.get("schema_version")
        if not isinstance(version, int) or isinstance(version, bool) or version > SCHEMA_VERSION:
            raise ValueError(f"{path}: schema_version {version!r} of {SCHEMA}; this collect.py reads versions up "
                             f"to {SCHEMA_VERSION}: update mpicomm, or collect with the mpicomm that wrote it")
    fields = dict(doc)
    results = doc.get("results")
    if "rows" not in fields:
        if isinstance(results, list):
            fields["rows"] = results
        elif isinstance(results, dict):
            fields = {**results, **{k: v for k, v in doc.items() if k != "results"}}
    if not {"benchmark", "p", "rows"} <= fields.keys() or not isinstance(fields["rows"], list):
        return None
    return fields


def load(inputs: list[str]) -> list[Run]:
    """The benchmark runs in *inputs* (directories: their ``*.json``; or files), sorted by rank count.

    Raises ValueError when there is none, when they are results of different
    benchmarks, or when two have the same rank count; JSON files that are not
    ``mpicomm.bench --json`` results (a trace, say) are skipped.
    """
    runs: list[Run] = []
    for path in _paths(inputs):
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path}: cannot read it as JSON ({exc}); remove it or pass the other files") from None
        fields = bench_fields(doc, path)
        if fields is None:
            print(f"{PROG}: skipped {path}: not a result of python -m mpicomm.bench --json", file=sys.stderr)
            continue
        rows: dict[int, dict[str, dict]] = {}
        for row in fields["rows"]:
            rows.setdefault(int(row["size"]), {})[str(row["name"])] = row
        runs.append(Run(path, str(fields["benchmark"]), int(fields["p"]), int(fields.get("nodes") or 1),
                        str(fields.get("command", "")), str(fields.get("machine", "")), rows))
    if not runs:
        raise ValueError(f"no benchmark results (*.json from python -m mpicomm.bench --json) in {' '.join(inputs)}; "
                         f"did the array's tasks run? Their logs are mpicomm-scaling-<jobid>_<N>.out")
    kinds = sorted({r.benchmark for r in runs})
    if len(kinds) > 1:
        raise ValueError(f"results of different benchmarks ({', '.join(kinds)}) cannot share a table; "
                         f"pass one benchmark's files")
    by_p: dict[int, str] = {}
    for r in runs:
        if r.p in by_p:
            raise ValueError(f"two results for {r.p} rank(s): {by_p[r.p]} and {r.path}; keep one")
        by_p[r.p] = r.path
    return sorted(runs, key=lambda r: r.p)


def cell(rows: dict[str, dict] | None, kind: str) -> tuple[float, str] | None:
    """The latency (µs) and label a table shows for one size of one run.

    *kind* ``native``: the MPI library's call; ``auto``: mpicomm's choice (label:
    the algorithm it chose); ``best``: the fastest mpicomm algorithm measured
    (label: its name); anything else: that algorithm's row. None if absent.
    """
    if not rows:
        return None
    if kind == "best":
        candidates = [r for name, r in rows.items() if name != "native" and r.get("algorithm") != "auto"]
        if not candidates:
            return None
        fastest = min(candidates, key=lambda r: r["avg_us"])
        return float(fastest["avg_us"]), str(fastest["name"])
    row = rows.get(kind)
    if row is None:
        return None
    return float(row["avg_us"]), (str(row.get("chose") or "") if kind == "auto" else "")


def _title(kind: str) -> str:
    return {
        "native": "the MPI library's own call",
        "auto": "mpicomm auto (the algorithm it chose)",
        "best": "the fastest mpicomm algorithm measured (its name)",
    }.get(kind, f"mpicomm {kind}")


def tables(runs: list[Run], kinds: list[str]) -> str:
    """The Markdown document: a header naming the inputs, then one table per kind (Avg latency, µs)."""
    benchmark = runs[0].benchmark
    header = ["Size"] + [f"p={r.p}" + (f" ({r.nodes} nodes)" if r.nodes > 1 else "") for r in runs]
    sizes = sorted({size for r in runs for size in r.rows})
    lines = [f"# Scaling: {benchmark}, {runs[0].p} to {runs[-1].p} rank(s)", "",
             "Average latency per call (µs) over ranks; columns are rank counts; one run per column:", ""]
    lines += [f"- p={r.p}: `{r.command}` ({os.path.basename(r.path)})" for r in runs]
    lines += ["", f"Machine (p={runs[-1].p}): {runs[-1].machine}", ""]
    for kind in kinds:
        cells = []
        for size in sizes:
            row = [str(size)]
            for r in runs:
                found = cell(r.rows.get(size), kind)
                row.append("-" if found is None else f"{found[0]:.2f}" + (f" ({found[1]})" if found[1] else ""))
            cells.append(row)
        lines += [f"## {_title(kind)}", "", cli.markdown_table(header, cells), ""]
    return "\n".join(lines)


def plot(runs: list[Run], path: str, kinds: list[str]) -> None:
    """Latency against rank count (log-log) for up to four sizes, one line per size and kind."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({size for r in runs for size in r.rows})
    picked = sorted({sizes[round(i * (len(sizes) - 1) / 3)] for i in range(4)}) if len(sizes) > 4 else sizes
    styles = {"native": "--", "auto": "-", "best": ":"}
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for index, size in enumerate(picked):
        colour = f"C{index}"
        for kind in kinds:
            points = [(r.p, found[0]) for r in runs if (found := cell(r.rows.get(size), kind)) is not None]
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, styles.get(kind, "-."), color=colour, marker="o", label=f"{size} B, {kind}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks([r.p for r in runs], [str(r.p) for r in runs])
    ax.set_xlabel("ranks")
    ax.set_ylabel("average latency (µs)")
    ax.set_title(f"{runs[0].benchmark}: latency against ranks")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parser() -> argparse.ArgumentParser:
    """The command line's parser."""
    parser = cli.Parser(
        prog=PROG,
        description="Gather the JSON results of a scaling study (jobs/scaling.sbatch) into one Markdown table "
                    "per row kind and a plot of latency against ranks.",
    )
    parser.add_argument("inputs", nargs="+", metavar="DIR_OR_JSON",
                        help="the scaling run's directory (runs/scaling-<jobid>) or its pN.json files")
    parser.add_argument("--rows", default="native,auto,best", metavar="KIND,...",
                        help="tables to make: native, auto, best, or algorithm names (default: native,auto,best)")
    cli.add_out(parser, "the tables (default: scaling.md next to the inputs)")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="the plot (default: scaling.png next to the inputs, when matplotlib is installed)")
    parser.add_argument("--no-plot", action="store_true", help="make no plot")
    return parser


def _parse(argv: list[str] | None) -> tuple[argparse.Namespace, list[str], str, str | None, list[Any]]:
    """The checked command line: the options, the rows asked for, the report, the picture and the runs read."""
    p = parser()
    args = p.parse_args(argv)
    kinds = [k.strip() for k in args.rows.split(",") if k.strip()]
    if not kinds:
        p.error(f"--rows must name at least one of native, auto, best or an algorithm; got {args.rows!r}")
    if args.plot and args.no_plot:
        p.error("--plot and --no-plot contradict each other; give one")
    first = args.inputs[0]
    where = first if os.path.isdir(first) else os.path.dirname(first) or "."
    out = args.out or os.path.join(where, "scaling.md")
    cli.check_out(p, args, default=out)
    picture = None
    if not args.no_plot and importlib.util.find_spec("matplotlib") is not None:  # --plot without it: refused
        picture = args.plot or os.path.join(where, "scaling.png")
    try:
        runs = load(args.inputs)
    except ValueError as exc:
        p.error(str(exc))
    known = {name for r in runs for rows in r.rows.values() for name in rows} | set(KINDS)
    unknown = [k for k in kinds if k not in known]
    if unknown:
        p.error(f"--rows: {', '.join(unknown)} not in these results; they have: {', '.join(sorted(known))}")
    return args, kinds, out, picture, runs


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring); returns the exit status."""
    args, kinds, out, picture, runs = cli.parse_or_exit(_parse, argv)
    if not args.no_plot and picture is None:
        print(f"{PROG}: no plot (matplotlib is not installed: pip install -e '.[plot]')", file=sys.stderr)
    text = tables(runs, kinds)
    if picture:
        text += f"\n![latency against ranks]({os.path.relpath(picture, os.path.dirname(os.path.abspath(out)))})\n"
    cli.write_out(out, text, args.append)
    if picture:
        plot(runs, picture, [k for k in kinds if k != "best"] or kinds)
    print(text)
    print(f"written: {out}" + (f", {picture}" if picture else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
