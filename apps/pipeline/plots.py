"""Gantt charts of pipeline steps: the planned timetable, and the measured one beside it (matplotlib, ``plot`` extra);
and the planned one as text (:func:`text_chart`, no matplotlib: the pictures of docs/pipeline.md).

One row per rank, time to the right; forward, backward, input-gradient (I) and
weight-gradient (W) actions in their own colours, labelled with the micro-batch
(and the stage when a rank holds several); what is not coloured is the bubble.
Measured charts also draw the waits (hatched), so a bubble that is a wait for a
neighbour can be told from a bubble that is the rank's own overhead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mpicomm import cli

from .timeline import plan

__all__ = ["gantt", "run_chart", "text_chart", "COLOURS"]

#: Colour per op; "wait" is drawn hatched.
COLOURS = {"F": "#4c72b0", "B": "#dd8452", "I": "#c44e52", "W": "#55a868", "wait": "#ffffff"}
_NAMES = {"F": "forward", "B": "backward", "I": "backward (input)", "W": "backward (weights)", "wait": "waiting"}


def _draw(ax: Any, rows: Sequence[Sequence[Sequence[Any]]], title: str, unit: str, label_stage: bool) -> set[str]:
    """*rows*[rank] = [(op, mb, stage, start, end), ...]; return the ops drawn."""
    seen = set()
    span = max((e[4] for row in rows for e in row), default=1.0) or 1.0
    for r, row in enumerate(rows):
        for op, mb, stage, start, end in row:
            seen.add(op)
            hatch = "////" if op == "wait" else None
            ax.barh(r, end - start, left=start, height=0.8, color=COLOURS.get(op, "#999999"),
                    edgecolor="#333333" if op != "wait" else "#999999", linewidth=0.4, hatch=hatch)
            if op != "wait" and (end - start) > span / 60:
                text = f"{stage}:{mb}" if label_stage else f"{mb}"
                ax.text((start + end) / 2, r, text, ha="center", va="center", fontsize=6, color="white")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"rank {r}" for r in range(len(rows))])
    ax.invert_yaxis()
    ax.set_xlabel(unit)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    return seen


def text_chart(tt: Any, chunk_of: Any = None) -> list[str]:
    """The planned timetable *tt* as text: one line per rank, two characters per time quantum.

    An action is its op and micro-batch (``F3``), followed by ``-`` for each
    further quantum it lasts; ``·`` is idle. *chunk_of(stage)* (for ranks holding
    several chunks) writes the chunks after the first in lower case (``f3``, ``i3``).
    The quantum is the shortest action: 1 forward, or ½ when a rank holds two chunks.
    """
    durations = [s.end - s.start for row in tt.slots for s in row if s.end > s.start]
    if not durations:
        return [f"rank {r}" for r in range(tt.p)]
    quantum = min(durations)
    cells = int(round(tt.makespan / quantum))
    lines = []
    for r, row in enumerate(tt.slots):
        grid = ["· "] * cells
        for s in row:
            a = s.action
            lower = chunk_of is not None and chunk_of(a.stage) > 0
            label = (a.op.lower() if lower else a.op) + str(a.mb)
            first, n = int(round(s.start / quantum)), max(1, int(round((s.end - s.start) / quantum)))
            text = label.ljust(2 * n, "-")
            for k in range(n):
                if first + k < cells:
                    grid[first + k] = text[2 * k:2 * k + 2]
            if len(label) > 2 * n and first + n < cells:  # a 3-character label spills into the next cell
                grid[first + n - 1] = text[2 * n - 2:]
        lines.append(f"rank {r}  " + "".join(grid).rstrip())
    return lines


def gantt(path: str, planned: Sequence[Sequence[Sequence[Any]]], measured: Sequence[Sequence[Sequence[Any]]] | None,
          *, title: str = "", planned_note: str = "", measured_note: str = "", label_stage: bool = False) -> None:
    """Write the planned chart (and the measured one under it, when given) to *path*."""
    from matplotlib.patches import Patch

    plt = cli.pyplot()
    n = 2 if measured is not None else 1
    height = max(2.0, 0.45 * len(planned) + 1.2)
    fig, axes = plt.subplots(n, 1, figsize=(12, height * n), squeeze=False)
    seen = _draw(axes[0][0], planned, "planned" + (f" - {planned_note}" if planned_note else ""),
                 "time (units: one forward = 1)", label_stage)
    if measured is not None:
        measured_ms = [[(op, mb, st, a * 1e3, b * 1e3) for op, mb, st, a, b in row] for row in measured]
        seen |= _draw(axes[1][0], measured_ms, "measured" + (f" - {measured_note}" if measured_note else ""),
                      "time (ms)", label_stage)
    handles = [Patch(facecolor=COLOURS[k], edgecolor="#333333", hatch="////" if k == "wait" else None,
                     label=_NAMES[k]) for k in COLOURS if k in seen]
    fig.legend(handles=handles, loc="upper right", fontsize="small", ncol=len(handles), frameon=False)
    if title:
        fig.suptitle(title, x=0.01, ha="left", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_chart(path: str, cfg: Any, ranks: Sequence[dict[str, Any]], summary: dict[str, Any]) -> None:
    """A training run's chart: the planned timetable of its schedule, and the last step measured on replica 0."""
    tt = plan(cfg.schedule, cfg.stages, cfg.micro, cfg.chunks)
    planned = [[(s.action.op, s.action.mb, s.action.stage, s.start, s.end) for s in row] for row in tt.slots]
    rows = sorted((r for r in ranks if r["d"] == 0 and r["t"] == 0), key=lambda r: r["s"])
    measured = [[tuple(e) for e in r["events"]] for r in rows]
    gantt(path, planned, measured, title=f"{cfg.schedule}, S={cfg.stages}, M={cfg.micro}"
          + (f", V={cfg.chunks}" if cfg.chunks > 1 else "") + f", activations {cfg.activations}",
          planned_note=f"bubble {tt.bubble():.1%}",
          measured_note=f"last step; bubble {summary.get('bubble', 0):.1%} (median over the steps)", label_stage=cfg.chunks > 1)
