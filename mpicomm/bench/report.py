"""What a benchmark shows: the Markdown table, the notes around it, and the ``--out``/``--json``/``--plot`` files.

Everything here runs on rank 0 after the measuring is done (and
:func:`markdown_table` anywhere: ``jobs/collect.py`` builds its tables with it).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
from dataclasses import dataclass, field
from typing import Any

from .measure import CollectiveRun
from .metrics import _ALL_FACTOR, COLLECTIVES, Collective

__all__ = ["Report", "markdown_table", "pingpong_report", "collective_report", "finish"]


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



def markdown_table(header: list[str], cells: list[list[str]]) -> str:
    """A Markdown table, columns padded to line up; the first column left-aligned, the rest right-aligned."""
    widths = [max(len(h), *(len(row[i]) for row in cells)) if cells else len(h) for i, h in enumerate(header)]

    def line(values: list[str]) -> str:
        return "| " + " | ".join(v.ljust(w) if i == 0 else v.rjust(w)
                                 for i, (v, w) in enumerate(zip(values, widths))) + " |"

    rule = "|" + "|".join(":" + "-" * (w + 1) if i == 0 else "-" * (w + 1) + ":" for i, w in enumerate(widths)) + "|"
    return "\n".join([line(header), rule, *(line(row) for row in cells)])


def _machine() -> str:
    from ..config import describe_cpu

    return f"{describe_cpu()}, {_library()}"


def _library() -> str:
    from mpi4py import MPI

    return " ".join(MPI.Get_library_version().splitlines()[0].split())


def _command(argv: list[str]) -> str:
    from mpi4py import MPI

    return f"mpiexec -n {MPI.COMM_WORLD.Get_size()} python -m mpicomm.bench " + shlex.join(argv)


def _settings() -> str:
    """The ``MPICOMM_*`` variables in effect (they change what is measured), or "" (the cache folder is not named:
    it is a path of this machine)."""
    found = sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith("MPICOMM_") and k != "MPICOMM_CACHE_DIR")
    return " ".join(found)



def _format(value: float | None, digits: int = 2) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def pingpong_report(args: argparse.Namespace, rows: list[dict]) -> Report:
    """The pingpong table of *rows* (from :func:`mpicomm.bench.measure.pingpong_rows`)."""
    header = ["Size (B)", "native MPI (us)", "mpicomm (us)", "ratio", "Iterations"]
    cells = [[str(r["size"]), f"{r['native_us']:.2f}", f"{r['mpicomm_us']:.2f}", f"{r['ratio']:.2f}",
              str(r["iterations"])] for r in rows]
    method = (f"One-way latency (half a round trip), mean over iterations; native and mpicomm "
              f"interleaved in {args.rounds} rounds per size.")
    return Report("pingpong", header, cells, method=method, rows=rows)


_HEADER = ["Size", "Algorithm", "Avg Latency(us)", "Min Latency(us)", "Max Latency(us)", "Iterations",
           "algbw (GB/s)", "busbw (GB/s)", "{model}", "meas/model", "vs native"]


def _collective_report(spec: Collective, args: argparse.Namespace, p: int, nodes: int, rows: list[dict],
                       notes: list[str], overhead: dict | None, model_label: str, machine: Any,
                       failed: bool) -> Report:
    header = [model_label if h == "{model}" else h for h in _HEADER] + (["#wrong", "Validation"] if args.validate
                                                                         else [])
    cells = []
    for r in rows:
        name = r["name"] + (f" -> {r['chose']}" if r["chose"] else "")
        cells.append([str(r["size"]), name, _format(r["avg_us"]), _format(r["min_us"]), _format(r["max_us"]),
                      str(r["iterations"]), _format(r["algbw_GBps"], 3), _format(r["busbw_GBps"], 3),
                      _format(r["model_us"]), _format(r["meas_over_model"]), _format(r["vs_native"])]
                     + ([str(r.get("wrong", "")), r["validation"] or ""] if args.validate else []))
    after = list(notes)
    bus = [r["busbw_GBps"] for r in rows if r["name"] == "auto" and r.get("busbw_GBps") is not None]
    if bus:  # as nccl-tests ends its table
        after.append(f"Avg bus bandwidth (auto): {sum(bus) / len(bus):.3f} GB/s over {len(bus)} size(s)")
    if overhead is not None:
        what = "barrier" if spec.name == "barrier" else "8-byte call"
        after.insert(0, f"Python overhead of one {what} ({spec.name}, mpicomm auto minus native MPI): "
                        f"{overhead['overhead_us']:.2f} us (auto {overhead['auto_us']:.2f} us, "
                        f"native {overhead['native_us']:.2f} us)")
    if failed:
        after.append(f"validation FAILED: an algorithm's {spec.name} result differs from native MPI's "
                     f"(see the messages above); stopped after that size")
    data = ("" if spec.name == "barrier" else
            f"Size: {spec.describe_size()} ({getattr(args, 'dtype', 'float64')} data"
            + (f", op {getattr(args, 'op', 'sum')}" if spec.op else "") + "; sizes rounded down to whole elements). ")
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



def collective_report(spec: Collective, args: argparse.Namespace, run: CollectiveRun) -> Report:
    """The report of one collective's run (from :func:`mpicomm.bench.measure.collective_run`)."""
    model_label = "model (us)" if run.machine is not None else "model (nominal)"
    return _collective_report(spec, args, run.p, run.nodes, run.rows, run.notes, run.overhead, model_label,
                              run.machine, run.failed)


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


def finish(args: argparse.Namespace, argv: list[str], report: Report) -> None:
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
