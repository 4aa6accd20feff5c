"""What a benchmark shows: the Markdown table (or OSU's text), the notes around it, and the
``--out``/``--json``/``--plot`` files.

Everything here runs on rank 0 after the measuring is done; the tables are
:func:`mpicomm.cli.markdown_table`'s, as every command's (re-exported here for
the callers that import it from :mod:`mpicomm.bench`).

The collective table has OSU's columns (Size, Avg/Min/Max Latency, Iterations)
and nccl-tests' (count, type, redop, root, algbw, busbw, #wrong; with
``--inplace`` its in-place columns), then the model's. ``--json`` writes
:func:`mpicomm.cli.document`'s layout (schema, schema_version, command,
machine, host, versions, date, results = the rows) with this benchmark's
fields beside it; ``rows`` repeats ``results`` for the readers written before
(``jobs/collect.py``).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from .. import cli
from ..cli import US, markdown_table
from .measure import ROUNDS, CollectiveRun
from .metrics import (
    _ALL_FACTOR,
    COLLECTIVES,
    LARGE,
    OSU_BANDWIDTH,
    OSU_BANDWIDTH_SKIP,
    OSU_COLLECTIVE,
    OSU_LATENCY,
    OSU_SKIP,
    MeasuredCollective,
    mpi_type_name,
)
from .osu import collective_tables, pingpong_tables
from .plot import plot_collective

__all__ = ["Report", "markdown_table", "pingpong_report", "collective_report", "finish", "settings"]


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
    osu: list[str] = field(default_factory=list)  # the same results in OSU's layout (--format osu)



def _machine() -> str:
    from ..config import describe_cpu

    return f"{describe_cpu()}, {_library()}"


def publish(args: argparse.Namespace, argv: list[str], command: str, sections: list[str]) -> None:
    """Print a small benchmark's report - its command line, the machine, then *sections* (paragraphs, tables) -
    and write it to ``--out`` if given (rank 0 only calls this)."""
    text = "\n\n".join([f"`{cli.command_line(command, argv)}`", f"Machine: {_machine()}", *sections]) + "\n"
    print(text)
    if args.out:
        cli.write_out(args.out, text, args.append)


def _library() -> str:
    from mpi4py import MPI

    return " ".join(MPI.Get_library_version().splitlines()[0].split())


def _command(argv: list[str]) -> str:
    from mpi4py import MPI

    return cli.command_line(f"mpiexec -n {MPI.COMM_WORLD.Get_size()} python -m mpicomm.bench", argv)


def settings() -> str:
    """The ``MPICOMM_*`` and MPICH ``MPIR_CVAR_*`` variables in effect (they change what is measured), or "".

    Not named: the cache folder (a path of this machine) and ``MPICOMM_TORCH_SET`` (the mark
    :mod:`mpicomm.torch` leaves on the variables it set itself).
    """
    found = sorted(f"{k}={v}" for k, v in os.environ.items()
                   if k.startswith(("MPICOMM_", "MPIR_CVAR_")) and k not in ("MPICOMM_CACHE_DIR", "MPICOMM_TORCH_SET"))
    return " ".join(found)



def _format(value: float | None, digits: int = 2) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def pingpong_report(args: argparse.Namespace, rows: list[dict]) -> Report:
    """The pingpong table of *rows* (from :func:`mpicomm.bench.measure.pingpong_rows`)."""
    header = ["Size (B)", f"native Avg ({US})", f"native Min ({US})", f"native Max ({US})", f"mpicomm Avg ({US})",
              f"mpicomm Min ({US})", f"mpicomm Max ({US})", "ratio", "native (MB/s)", "mpicomm (MB/s)", "bw ratio",
              "Iterations", "Windows"]
    cells = [[str(r["size"]), *(_format(r[k]) for k in ("native_us", "native_min_us", "native_max_us", "mpicomm_us",
                                                         "mpicomm_min_us", "mpicomm_max_us", "ratio")),
              _format(r["native_MBps"]), _format(r["mpicomm_MBps"]), _format(r["bw_ratio"]),
              str(r["iterations"]), str(r["windows"])] for r in rows]
    window = rows[0]["window"] if rows else 0
    method = (f"Latency (osu_latency): one way, half a round trip; Avg is {_repeat_text(args)} (a round trip's), "
              f"Min and Max of single round trips (halved); ratio = mpicomm Avg / native Avg. Bandwidth (osu_bw): "
              f"windows of {window} non-blocking sends answered by a one-byte acknowledgement, MB/s = 10^6 B/s; bw "
              f"ratio = mpicomm / native. Native (Send/Recv, Isend/Irecv) and mpicomm (send_array/recv_array, "
              f"isend_array/irecv_array) take turns in {_rounds_text(args)} per size, after {_warmup_text(args, 'pingpong')}; "
              f"{_iterations_text(args, 'pingpong')}; {_backend_text(args)}.")
    report = Report("pingpong", header, cells, method=method, rows=rows,
                    extra={"p": _world_size(), "window": window})
    report.osu = pingpong_tables(rows, getattr(args, "backend", "numpy"))
    return report


_LARGE_TEXT = cli.format_size(LARGE)


def _world_size() -> int:
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_size()


def _warmup_text(args: argparse.Namespace, benchmark: str = "") -> str:
    if getattr(args, "warmup", None) is not None:
        return f"{args.warmup} untimed warm-up calls per variant"
    small, large = OSU_SKIP
    if benchmark == "pingpong":
        return (f"untimed warm-up calls per variant (OSU's: {small} round trips up to {_LARGE_TEXT} and {large} "
                f"above, {OSU_BANDWIDTH_SKIP[0]} and {OSU_BANDWIDTH_SKIP[1]} windows, never more than the timed ones)")
    return (f"untimed warm-up calls per variant (OSU's: {small} up to {_LARGE_TEXT} and {large} above, never more "
            f"than the timed ones)")


def _iterations_text(args: argparse.Namespace, benchmark: str = "") -> str:
    """Where the Iterations column's counts come from."""
    if getattr(args, "iters", None) is not None:
        return f"{args.iters} timed calls per variant and size (--iters)"
    if benchmark == "pingpong":
        return (f"osu_latency's timed round trips per size ({OSU_LATENCY[0]} up to {_LARGE_TEXT}, {OSU_LATENCY[1]} "
                f"above) and osu_bw's windows ({OSU_BANDWIDTH[0]} and {OSU_BANDWIDTH[1]})")
    return (f"OSU's timed calls per variant and size ({OSU_COLLECTIVE[0]} up to {_LARGE_TEXT}, {OSU_COLLECTIVE[1]} "
            f"above)")


def _rounds_text(args: argparse.Namespace) -> str:
    """How many interleaved rounds a measurement has: ROUNDS, or --iters where that is fewer."""
    iters: int | None = getattr(args, "iters", None)
    rounds = min(ROUNDS, iters) if iters else ROUNDS
    return "1 round" if rounds == 1 else f"{rounds} rounds"


def _repeat_text(args: argparse.Namespace) -> str:
    """What a row's time is: one measurement's mean, or the median of --repeat measurements' means."""
    repeat: int = getattr(args, "repeat", 1)
    return "its mean per call" if repeat == 1 else f"the median of {repeat} measurements' means per call"


def _backend_text(args: argparse.Namespace) -> str:
    return ("buffers in GPU memory (CuPy)" if getattr(args, "backend", "numpy") == "cupy"
            else "buffers in host memory (NumPy)")


def _place(row: dict, key: str, digits: int = 2) -> str:
    got = row.get("in_place")
    return "" if not got else _format(got[key], digits)


def _verdict(row: dict) -> str:
    """Pass only when the row's out-of-place and in-place results both equal native MPI's."""
    verdicts = [row["validation"]] + ([row["in_place"]["validation"]] if row.get("in_place") else [])
    if any(v == "Fail" for v in verdicts):
        return "Fail"
    return row["validation"] or ""


def _collective_report(spec: MeasuredCollective, args: argparse.Namespace, p: int, nodes: int, rows: list[dict],
                       notes: list[str], overhead: dict | None, model_label: str, machine: Any,
                       failed: bool, in_place: bool = False) -> Report:
    header = ["Size", "count", "type", "redop", "root", "Algorithm", f"Avg Latency({US})", f"Min Latency({US})",
              f"Max Latency({US})", "Iterations", "algbw (GB/s)", "busbw (GB/s)"]
    if in_place:
        header += [f"in-place Avg Latency({US})", "in-place algbw (GB/s)", "in-place busbw (GB/s)"]
    header += [model_label, "meas/model", "vs native"]
    if args.validate:
        header += ["#wrong"] + (["in-place #wrong"] if in_place else []) + ["Validation"]
    cells = []
    for r in rows:
        name = r["name"] + (f" -> {r['chose']}" if r["chose"] else "")
        line = [str(r["size"]), str(r["count"]), r["type"], r["redop"], str(r["root"]), name, _format(r["avg_us"]),
                _format(r["min_us"]), _format(r["max_us"]), str(r["iterations"]), _format(r["algbw_GBps"], 3),
                _format(r["busbw_GBps"], 3)]
        if in_place:
            line += [_place(r, "avg_us"), _place(r, "algbw_GBps", 3), _place(r, "busbw_GBps", 3)]
        line += [_format(r["model_us"]), _format(r["meas_over_model"]), _format(r["vs_native"])]
        if args.validate:
            line += [_count(r.get("wrong"))]
            if in_place:
                line += [_count(r["in_place"]["wrong"]) if r.get("in_place") else ""]
            line += [_verdict(r)]
        cells.append(line)
    after = list(notes)
    bus = [r["busbw_GBps"] for r in rows if r["name"] == "auto" and r.get("busbw_GBps") is not None]
    if bus:  # as nccl-tests ends its table
        after.append(f"Avg bus bandwidth (auto): {sum(bus) / len(bus):.3f} GB/s over {len(bus)} size(s)")
    if overhead is not None:
        what = "barrier" if spec.name == "barrier" else "8-byte call"
        after.insert(0, f"Python overhead of one {what} ({spec.name}, mpicomm auto minus native MPI): "
                        f"{cli.format_time(overhead['overhead_us'] * 1e-6)} (auto "
                        f"{cli.format_time(overhead['auto_us'] * 1e-6)}, native "
                        f"{cli.format_time(overhead['native_us'] * 1e-6)})")
    if failed:
        after.append(f"validation FAILED: an algorithm's {spec.name} result differs from native MPI's "
                     f"(see the messages above); stopped after that size")
    dtype = getattr(args, "dtype", "float64")
    data = ("" if spec.name == "barrier" else
            f"Size: {spec.describe_size()} ({dtype} data"
            + (f", op {getattr(args, 'op', 'sum')}" if spec.op else "") + "; sizes rounded down to whole elements). ")
    columns = ("count, type, redop, root: nccl-tests' (count: elements of the whole vector or of one rank's block, "
               "as Size; root -1: none). ")
    bandwidth = f"{_bandwidth_text(spec)} (nccl-tests, GB/s). " if spec.name != "barrier" else ""
    places = (" With --inplace every variant also ran with MPI.IN_PLACE in the same rounds (the in-place columns; "
              "empty where a row has no in-place form)." if in_place else "")
    method = (
        f"{data}{columns}Each iteration times one call, then an untimed barrier, after "
        f"{_warmup_text(args)}; {_iterations_text(args)}. native (mpi4py on MPI.COMM_WORLD) and every algorithm "
        f"take turns in {_rounds_text(args)} per size; a rank's latency is {_repeat_text(args)}; Avg is the mean over ranks, "
        f"Min/Max over ranks; {_backend_text(args)}. {bandwidth}"
        f"{model_label}: mpicomm.model's prediction ({'fitted machine' if machine is not None else 'nominal machine'}"
        f"); vs native = Avg / native Avg.{places}"
        + (" Validation: each algorithm's result on fresh data equals native MPI's (#wrong: elements that differ, "
           "all ranks)." if args.validate else "")
    )
    extra = {"p": p, "nodes": nodes, "overhead": overhead, "notes": notes, "validated": bool(args.validate),
             "model": "fitted" if machine is not None else "nominal", "in_place": in_place,
             "dtype": dtype, "op": getattr(args, "op", None)}
    report = Report(f"{spec.name}, {p} ranks on {nodes} node(s)", header, cells, after, method, rows, extra,
                    code=1 if failed else 0)
    report.osu = collective_tables(spec, rows, mpi_type_name(dtype), bool(args.validate),
                                   getattr(args, "backend", "numpy"), after)
    return report


def _count(value: int | None) -> str:
    return "" if value is None else str(value)


def collective_report(spec: MeasuredCollective, args: argparse.Namespace, run: CollectiveRun) -> Report:
    """The report of one collective's run (from :func:`mpicomm.bench.measure.collective_run`)."""
    model_label = f"model ({US})" if run.machine is not None else f"model (nominal, {US})"
    return _collective_report(spec, args, run.p, run.nodes, run.rows, run.notes, run.overhead, model_label,
                              run.machine, run.failed, run.in_place)


def _bandwidth_text(spec: MeasuredCollective) -> str:
    """How algbw and busbw are computed for *spec*, in words (count: float64 elements, see nccl_bytes)."""
    factor = {"allreduce": "2(p-1)/p"}.get(spec.name, "(p-1)/p" if spec.name in _ALL_FACTOR else "1")
    return (f"algbw = S/t with S = {'count*8*p' if spec.name in _ALL_FACTOR else 'count*8'} bytes, "
            f"busbw = algbw * {factor}")


def _write_markdown(args: argparse.Namespace, report: Report, command: str, machine: str,
                    plot: str | None) -> None:
    variables = settings()
    lines = [f"# {report.title}" if args.benchmark == "pingpong" else f"## {report.title}", "",
             f"Command: `{command}`", "", f"Machine: {machine}", ""]
    if variables:
        lines += [f"Settings: `{variables}`", ""]
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
    """On rank 0: print the table and notes (Markdown, or OSU's layout); write --out, --json, --plot."""
    command = _command(argv)
    machine = _machine()
    if getattr(args, "format", "markdown") == "osu":
        print("\n".join(report.osu))
    else:
        print(f"# {report.title}")
        print(markdown_table(report.header, report.cells))
        for note in report.notes:
            print(note)
    sys.stdout.flush()
    plotted = None
    if getattr(args, "plot", None) and report.rows:
        plot_collective(args.plot, COLLECTIVES[args.benchmark], report.rows, report.extra.get("p", 0), machine)
        plotted = args.plot
    if args.out:
        _write_markdown(args, report, command, machine, plotted)
    if getattr(args, "json", None):
        cli.write_json(args.json, command, report.rows, benchmark=args.benchmark, settings=settings(),
                       sizes_requested=args.sizes, iters=args.iters, repeat=args.repeat, warmup=args.warmup,
                       backend=getattr(args, "backend", "numpy"), method=report.method, **report.extra,
                       rows=report.rows)
