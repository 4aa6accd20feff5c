"""``--plot``: a collective's latency against size, as a PNG (needs matplotlib; rank 0, after the measuring).

Every variant is a line of its Avg latency over ranks, log-log, inside a
shaded band from its Min to its Max latency over ranks; native MPI is the
dashed black line; with ``--inplace`` the in-place lines are dotted, in their
variant's colour. The legend sits outside the axes, right of them, so it never
hides data. barrier has no size axis: one bar per variant (Avg), with the
Min–Max range as an error bar.
"""

from __future__ import annotations

from typing import Any

from ..cli import US
from .metrics import MeasuredCollective

__all__ = ["plot_collective"]

_MARKERS = "os^vD<>ph*"


def _human(nbytes: float) -> str:
    """8 → "8", 4096 → "4K", 1 << 20 → "1M" (binary units)."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g}{unit}"
    return f"{nbytes:g}"


def _series(rows: list[dict]) -> dict[tuple[str, bool], list[tuple[int, float, float, float]]]:
    """(variant name, in place) → [(size, avg, min, max)] in the rows' order."""
    lines: dict[tuple[str, bool], list[tuple[int, float, float, float]]] = {}
    for r in rows:
        lines.setdefault((r["name"], False), []).append((max(r["size"], 1), r["avg_us"], r["min_us"], r["max_us"]))
    for r in rows:
        got = r.get("in_place")
        if got:
            lines.setdefault((r["name"], True), []).append((max(r["size"], 1), got["avg_us"], got["min_us"],
                                                            got["max_us"]))
    return lines


def _lines(ax: Any, spec: MeasuredCollective, rows: list[dict]) -> None:
    order: dict[str, int] = {}  # a variant's colour and marker, the same out of place and in place
    for (name, in_place), points in _series(rows).items():
        xs, avg, low, high = zip(*points)
        index = order.setdefault(name, len(order))
        colour = "black" if name == "native" else f"C{(index - 1) % 10}"
        label = ("native MPI" if name == "native" else name) + (" (in-place)" if in_place else "")
        style = ":" if in_place else "--" if name == "native" else "-"
        width = 2.2 if name in ("auto", "native") else 1.2
        ax.plot(xs, avg, style, color=colour, marker=_MARKERS[index % len(_MARKERS)], markersize=3.5,
                linewidth=width, label=label, zorder=3 if name == "native" else 2)
        ax.fill_between(xs, low, high, color=colour, alpha=0.08 if name == "native" else 0.12, linewidth=0)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    from matplotlib.ticker import FuncFormatter

    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: _human(x)))
    ax.set_xlabel(f"Size ({spec.describe_size()})")
    ax.set_ylabel(f"Avg latency ({US}); band: min–max over ranks")
    ax.grid(True, which="both", alpha=0.3)


def _bars(ax: Any, rows: list[dict]) -> None:
    names = [r["name"] + (f" -> {r['chose']}" if r.get("chose") else "") for r in rows]
    avg = [r["avg_us"] for r in rows]
    below = [r["avg_us"] - r["min_us"] for r in rows]
    above = [r["max_us"] - r["avg_us"] for r in rows]
    colours = ["black" if n == "native" else f"C{i % 10}" for i, n in enumerate(names)]
    bars = ax.bar(range(len(rows)), avg, yerr=[below, above], capsize=4, color=colours, alpha=0.85,
                  error_kw={"linewidth": 1, "ecolor": "0.3"})
    for bar, name in zip(bars, names):
        bar.set_label("native MPI" if name == "native" else name)
    ax.set_xticks(range(len(rows)), ["native MPI" if n == "native" else n for n in names], rotation=30, ha="right")
    ax.set_ylabel(f"Avg latency ({US}); error bars: min–max over ranks")
    ax.grid(True, axis="y", alpha=0.3)


def plot_collective(path: str, spec: MeasuredCollective, rows: list[dict], p: int, machine: str) -> None:
    """Draw *rows* (one collective's, from :func:`mpicomm.bench.measure.collective_run`) into the PNG *path*."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    if spec.name == "barrier":
        _bars(ax, rows)
    else:
        _lines(ax, spec, rows)
    ax.set_title(f"{spec.name}, p = {p}\n{machine}", fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, frameon=False)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
