"""Pictures of training runs: learning curves, and one step's timeline per rank (matplotlib, the ``plot`` extra)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mpicomm import cli

__all__ = ["curves", "timeline"]


def curves(runs: Mapping[str, Sequence[Mapping[str, float]]], path: str, title: str = "") -> None:
    """Loss and accuracy against step and against wall time, one line per run.

    Rows hold ``step``, ``seconds`` and ``train_loss``, with ``test_loss`` and
    ``test_accuracy`` where the run evaluates as it goes (apps.sgd), else
    ``train_accuracy`` (apps.torchddp's progress intervals).
    """
    plt = cli.pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharey="row")
    for label, rows in runs.items():
        if not rows:
            continue
        steps = [r["step"] for r in rows]
        seconds = [r["seconds"] for r in rows]
        tested = "test_loss" in rows[0]
        accuracy = "test_accuracy" if tested else "train_accuracy"
        for col, xs in enumerate((steps, seconds)):
            axes[0][col].plot(xs, [r["train_loss"] for r in rows], marker=".", label=f"{label} train")
            if tested:
                axes[0][col].plot(xs, [r["test_loss"] for r in rows], linestyle="--", label=f"{label} test")
            axes[1][col].plot(xs, [r[accuracy] for r in rows], marker=".", label=label)
        axes[1][0].set_ylabel(accuracy.replace("_", " "))
    axes[0][0].set_ylabel("loss")
    axes[1][0].set_xlabel("optimizer step")
    axes[1][1].set_xlabel("wall time (s)")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    axes[0][1].legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small")
    axes[1][1].legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


_COLORS = {"backward": "tab:blue", "bucket": "tab:orange", "wait": "tab:red"}


def timeline(per_rank: Sequence[Sequence[tuple[str, str, float, float]] | None], path: str, title: str = "") -> None:
    """One step per rank: each layer's backward (blue), each bucket's collective from launch to completion (orange)."""
    plt = cli.pyplot()
    ranks = [r for r in per_rank if r]
    fig, ax = plt.subplots(figsize=(11, 1.2 + 0.9 * max(1, len(per_rank))))
    for rank, events in enumerate(per_rank):
        for kind, label, start, end in events or ():
            # Buckets overlap in time: each on its own thin row above the rank's backward row.
            lane = int(label.split()[-1]) % 3 if kind == "bucket" else 0
            y = rank + (0.0 if kind == "backward" else 0.3 + 0.17 * lane)
            height = 0.3 if kind == "backward" else 0.15
            ax.broken_barh([(start * 1e3, max(end - start, 1e-6) * 1e3)], (y - height / 2, height),
                           facecolors=_COLORS.get(kind, "grey"), edgecolors="black", linewidth=0.3)
            if end - start > 0:
                ax.text((start + end) / 2 * 1e3, y, label.split()[-1], ha="center", va="center", fontsize=6)
    ax.set_yticks([r + 0.2 for r in range(len(per_rank))])
    ax.set_yticklabels([f"rank {r}" for r in range(len(per_rank))])
    ax.set_xlabel("ms since this rank's step started")
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=_COLORS["backward"], label="layer backward (number = layer)"),
                       Patch(color=_COLORS["bucket"], label="bucket collective, launch → done (number = bucket)")],
              loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    ax.set_title(title or "one training step")
    ax.grid(axis="x", alpha=0.3)
    if not ranks:
        ax.text(0.5, 0.5, "no events recorded", transform=ax.transAxes, ha="center")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
