"""OSU micro-benchmarks' text layout (``--format osu``), so that scripts written for OSU's output read ours.

OSU prints a ``# OSU MPI … Test`` line, ``#``-commented column headers and
whitespace-separated numbers, one line per size::

    # OSU MPI Allreduce Latency Test (mpicomm.bench)
    # Algorithm: native MPI
    # Datatype: MPI_DOUBLE.
    # Size       Avg Latency(us)   Min Latency(us)   Max Latency(us)  Iterations
    8                       3.57              3.03              4.11        1000

with OSU's widths (Size 10 left-aligned, each latency 18 with two decimals,
Iterations 12; with ``--validate`` a ``Validation`` column of Pass/Fail, as
OSU's ``-c``). One run measures several variants, so the output holds one
such table per variant, in the order of the Markdown table (native MPI first:
the number ``osu_allreduce`` itself would report; then every algorithm,
``auto``, ``shm+pool``, ``persistent``; with ``--inplace`` the in-place
tables after the out-of-place ones). Each table starts with its own
``# OSU MPI`` line and is followed by a blank line, so a script that wants
one table splits on those lines (``# Algorithm:`` names the variant). The
notes that end the Markdown report end this one as ``#`` lines. barrier has no
Size column (as ``osu_barrier``).

The ping-pong prints ``osu_latency``'s table (one way, with Min/Max and
Iterations as OSU's full format) and ``osu_bw``'s (``# Size      Bandwidth
(MB/s)``), each for native MPI and for mpicomm. With ``--backend cupy`` the
title says ``OSU MPI-CUDA``, as OSU's does for device buffers.

Pure functions of the rows; no MPI here. Microseconds are written ``(us)``
here, as OSU writes them (the Markdown tables write µs).
"""

from __future__ import annotations

from collections.abc import Iterable

from .metrics import MeasuredCollective

__all__ = ["TITLES", "title", "collective_tables", "pingpong_tables"]

#: OSU's name of each collective's test (scan, which OSU lacks, by analogy; the neighbourhood ones as OSU 7 names
#: its osu_neighb_* tests).
TITLES = {
    "allreduce": "Allreduce", "bcast": "Broadcast", "reduce": "Reduce", "allgather": "Allgather",
    "alltoall": "All-to-All Personalized Exchange", "reduce_scatter": "Reduce_scatter_block", "gather": "Gather",
    "scatter": "Scatter", "scan": "Scan", "barrier": "Barrier",
    "neighbor_allgather": "Neighborhood Allgather", "neighbor_alltoall": "Neighborhood All-to-All",
}

_LATENCY = "# Size       Avg Latency(us)" + "".join(f"{h:>18}" for h in ("Min Latency(us)", "Max Latency(us)"))
_BARRIER = "# Avg Latency(us)" + "".join(f"{h:>18}" for h in ("Min Latency(us)", "Max Latency(us)"))
_BANDWIDTH = "# Size      Bandwidth (MB/s)"


def title(test: str, backend: str = "numpy") -> str:
    """``# OSU MPI Allreduce Latency Test (mpicomm.bench)``; *test* a collective, ``latency`` or ``bandwidth``."""
    what = {"latency": "Latency", "bandwidth": "Bandwidth"}.get(test) or f"{TITLES[test]} Latency"
    return f"# OSU MPI{'-CUDA' if backend == 'cupy' else ''} {what} Test (mpicomm.bench)"


def _line(size: int | None, avg: float, low: float, high: float, iterations: int, verdict: str | None) -> str:
    text = (f"{size:<10d}{avg:18.2f}" if size is not None else f"{avg:17.2f}") + f"{low:18.2f}{high:18.2f}"
    text += f"{iterations:12d}"
    return text + (f"{verdict or '-':>18}" if verdict is not None else "")


def _label(name: str, numbers: list[dict]) -> str:
    """The ``# Algorithm:`` of a variant: ``native MPI``, ``mpicomm ring``, ``mpicomm auto (chose ring)``."""
    if name == "native":
        return "native MPI"
    chose = list(dict.fromkeys(n["chose"] for n in numbers if n.get("chose")))
    return f"mpicomm {name.replace(' (mpicomm)', '')}" + (f" (chose {', '.join(chose)})" if chose else "")


def collective_tables(spec: MeasuredCollective, rows: list[dict], datatype: str, validated: bool,
                      backend: str = "numpy", notes: Iterable[str] = ()) -> list[str]:
    """The lines of every variant's OSU table (out of place, then in place), then *notes* as ``#`` lines."""
    variants: dict[str, list[dict]] = {}
    for row in rows:
        variants.setdefault(row["name"], []).append(row)
    places = [("", lambda r: r)]
    if any(r.get("in_place") for r in rows):
        places.append((", in-place", lambda r: r.get("in_place")))
    barrier = spec.name == "barrier"
    header = (_BARRIER if barrier else _LATENCY) + f"{'Iterations':>12}" + (f"{'Validation':>18}" if validated else "")
    lines: list[str] = []
    for place, numbers in places:
        for name, mine in variants.items():
            measured = [(r, numbers(r)) for r in mine if numbers(r)]
            if not measured:
                continue
            lines += [title(spec.name, backend), f"# Algorithm: {_label(name, [got for _, got in measured])}{place}"]
            if not barrier:
                lines.append(f"# Datatype: {datatype}.")
            lines.append(header)
            for row, got in measured:
                lines.append(_line(None if barrier else row["size"], got["avg_us"], got["min_us"], got["max_us"],
                                   row["iterations"], (got.get("validation") or "-") if validated else None))
            lines.append("")
    return lines + [f"# {note}" for note in notes]


def pingpong_tables(rows: list[dict], backend: str = "numpy") -> list[str]:
    """osu_latency's and osu_bw's tables, for native MPI and for mpicomm."""
    lines: list[str] = []
    calls = {"native": ("native MPI", "Send/Recv", "Isend/Irecv"),
             "mpicomm": ("mpicomm", "send_array/recv_array", "isend_array/irecv_array")}
    for name, (who, blocking, _) in calls.items():
        lines += [title("latency", backend), f"# Algorithm: {who} ({blocking}, one way: half a round trip)",
                  _LATENCY + f"{'Iterations':>12}"]
        lines += [_line(r["size"], r[f"{name}_us"], r[f"{name}_min_us"], r[f"{name}_max_us"], r["iterations"], None)
                  for r in rows]
        lines.append("")
    for name, (who, _, nonblocking) in calls.items():
        window = rows[0]["window"] if rows else 0
        lines += [title("bandwidth", backend), f"# Algorithm: {who} ({nonblocking}, window {window})", _BANDWIDTH]
        lines += [f"{r['size']:<10d}{r[f'{name}_MBps']:18.2f}" for r in rows]
        lines.append("")
    return lines

