"""``python -m mpicomm.bench.summary RESULTS.json ...``: the speed targets, judged from benchmark JSON files.

Reads the files ``python -m mpicomm.bench <collective> --json`` wrote (any
number of collectives and rank counts; no MPI needed) and prints, per rank
count, one Markdown section:

* the per-call cost of an 8-byte allreduce: ``auto`` (the default blocking
  path, target ≤ 1.5× native) and ``persistent`` (a ``comm.Allreduce_init``
  request, when the run had ``--persistent``; target ≤ 1.2×) against the MPI
  library's own call;
* allreduce, bcast, allgather, reduce_scatter and alltoall from 64 KiB:
  ``auto`` and the best registered algorithm on ordinary arrays, against
  native; the targets (:data:`TARGETS`, the core v3 issue's) are ≤ 1.0× from
  64 KiB and ≤ 0.8× from 1 MiB; allreduce ≤ 0.8× from 64 KiB, ≤ 0.7× from
  1 MiB and ≤ 0.6× from 16 MiB;
* how often ``auto`` is within 10 % of the best registered algorithm on
  ordinary arrays (every collective, every size; target ≥ 95 %), with the
  worst points;
* how often the model is within 1.5× of the measurement, per (algorithm,
  size ≥ 64 KiB) point (target ≥ 90 %).

Ordinary arrays means every row but ``native``, ``shm+pool`` (arrays from a
shared-memory pool) and ``persistent``; the targets are judged out of place
(a row's ``in_place`` numbers, from ``--inplace``, are not read). ``--out
FILE`` writes the same text (an existing file is kept unless ``--append`` or
``--force``, :func:`mpicomm.cli.check_out`).

The files are :func:`mpicomm.cli.document`'s layout (rows in ``results``);
files written before it (rows in ``rows``, no ``schema``) are read too.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Iterable

from ..cli import SCHEMA, US, Parser, add_out, check_out, parse_or_exit

__all__ = ["summarize", "main"]

_SPECIAL = ("native", "shm+pool", "persistent")
_MiB = 1 << 20
#: ``(collective, from size in bytes, at most this many times native)``; the last row that applies counts
TARGETS = (
    ("allreduce", 65536, 0.8), ("allreduce", _MiB, 0.7), ("allreduce", 16 * _MiB, 0.6),
    *((name, start, ratio) for name in ("bcast", "allgather", "reduce_scatter", "alltoall")
      for start, ratio in ((65536, 1.0), (_MiB, 0.8))),
)
#: the 8-byte allreduce's per-call targets, against native
SMALL_TARGETS = {"auto": 1.5, "persistent": 1.2}


def target_of(collective: str, size: int) -> float | None:
    """The target ratio to native at this point (None: no target)."""
    found = None
    for name, start, ratio in TARGETS:
        if name == collective and size >= start:
            found = ratio
    return found


def _load(paths: Iterable[str]) -> dict[int, list[dict]]:
    """Every row of every file, by rank count."""
    by_p: dict[int, list[dict]] = defaultdict(list)
    for path in paths:
        try:
            with open(path) as f:
                document = json.load(f)
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: not a benchmark JSON file ({exc}); write one with "
                             f"mpiexec -n N python -m mpicomm.bench COLLECTIVE --json {path}") from None
        rows = document.get("results", document.get("rows")) if isinstance(document, dict) else None
        if not isinstance(rows, list) or document.get("schema", SCHEMA) != SCHEMA or "p" not in document:
            raise ValueError(f"{path}: has no rows or p; is it from python -m mpicomm.bench --json?")
        for row in rows:
            by_p[int(document["p"])].append(row)
    return by_p


def _by_point(rows: list[dict]) -> dict[tuple[str, int], dict[str, dict]]:
    points: dict[tuple[str, int], dict[str, dict]] = defaultdict(dict)
    for row in rows:
        if row.get("avg_us") is not None:
            points[(row["collective"], int(row["size"]))][row["name"]] = row
    return points


def _best(variants: dict[str, dict]) -> tuple[str, float] | None:
    ordinary = [(name, r["avg_us"]) for name, r in variants.items() if name not in _SPECIAL and name != "auto"]
    return min(ordinary, key=lambda item: item[1]) if ordinary else None


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a is not None and b else "-"


def _section(p: int, rows: list[dict]) -> list[str]:
    points = _by_point(rows)
    out = [f"### p = {p}", ""]
    small = points.get(("allreduce", 8))
    if small and "native" in small:
        native = small["native"]["avg_us"]
        line = f"8-byte allreduce: native {native:.1f} {US}"
        for name in ("auto", "persistent"):
            if name in small:
                mine = small[name]["avg_us"]
                verdict = "met" if mine / native <= SMALL_TARGETS[name] else "missed"
                line += (f"; {name} {mine:.1f} {US} ({mine / native:.1f}x, +{mine - native:.1f} {US} per call; "
                         f"target ≤ {SMALL_TARGETS[name]} {verdict})")
        out += [line, ""]
    out += [f"| collective | size (B) | native ({US}) | auto | auto vs native | best ordinary-array | best vs native "
            "| target |", "|---|---:|---:|---|---:|---|---:|---|"]
    met, judged_points = 0, 0
    for (collective, size), variants in sorted(points.items()):
        target = target_of(collective, size)
        if target is None or "native" not in variants:
            continue
        native = variants["native"]["avg_us"]
        auto = variants.get("auto")
        best = _best(variants)
        judged = auto["avg_us"] / native if auto else None
        verdict = "-" if judged is None else ("met" if judged <= target else "missed")
        judged_points += judged is not None
        met += verdict == "met"
        out.append(f"| {collective} | {size} | {native:.1f} | {auto.get('chose') or 'auto' if auto else '-'} | "
                   f"{_ratio(auto['avg_us'] if auto else None, native)} | {best[0] if best else '-'} | "
                   f"{_ratio(best[1] if best else None, native)} | ≤ {target} {verdict} |")
    if judged_points:
        out += ["", f"auto met its target at {met} of {judged_points} points."]
    within, total, worst = 0, 0, []
    for (collective, size), variants in points.items():
        best = _best(variants)
        auto = variants.get("auto")
        if best is None or auto is None:
            continue
        total += 1
        ratio = auto["avg_us"] / best[1]
        within += ratio <= 1.10
        worst.append((ratio, collective, size, auto.get("chose"), best[0]))
    worst.sort(reverse=True)
    if total:
        out += ["", f"auto within 10 % of the best registered algorithm (ordinary arrays): {within} of {total} points "
                f"({100 * within / total:.0f} %; target ≥ 95 %). Worst: "
                + "; ".join(f"{c} {s} B auto ({chose}) {r:.2f}x of {b}" for r, c, s, chose, b in worst[:5])]
    good, counted = 0, 0
    spread: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        ratio = row.get("meas_over_model")
        if ratio is None or row["name"] in _SPECIAL or row["name"] == "auto" or int(row["size"]) < 65536:
            continue
        counted += 1
        good += 1 / 1.5 <= ratio <= 1.5
        spread[f"{row['collective']} {row['name']}"].append(ratio)
    if counted:
        out += ["", f"model within 1.5x of the measurement at ≥ 64 KiB: {good} of {counted} (algorithm, size) points "
                f"({100 * good / counted:.0f} %; target ≥ 90 %)", "",
                "| collective algorithm | meas/model min – max |", "|---|---|"]
        out += [f"| {name} | {min(v):.2f} – {max(v):.2f} |" for name, v in sorted(spread.items())]
    return out + [""]


def summarize(paths: Iterable[str]) -> str:
    """The Markdown summary of the benchmark JSON files *paths* (see the module docstring); ValueError naming a
    file that is not one."""
    by_p = _load(paths)
    lines: list[str] = []
    for p in sorted(by_p):
        lines += _section(p, by_p[p])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args, text = parse_or_exit(_parse, argv)
    print(text)
    if args.out:
        with open(args.out, "a" if args.append else "w") as f:
            f.write(text + "\n")
    return 0


def _parse(argv: list[str] | None) -> tuple[argparse.Namespace, str]:
    """The checked command line and the summary (a file that is not a benchmark's is a usage error)."""
    parser = Parser(prog="python -m mpicomm.bench.summary", description=__doc__.splitlines()[0],
                    epilog="e.g. python -m mpicomm.bench.summary jobs/results/p*/bench-*.json "
                           "--out jobs/results/targets.md --force")
    parser.add_argument("files", nargs="+", metavar="RESULTS.json", help="files from python -m mpicomm.bench --json")
    add_out(parser, "the summary")
    args = parser.parse_args(argv)
    check_out(parser, args)
    try:
        text = summarize(args.files)
    except ValueError as exc:  # a file that is not a benchmark's: the command line named the wrong file
        parser.error(str(exc))
    return args, text


if __name__ == "__main__":
    sys.exit(main())
