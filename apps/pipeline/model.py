"""The model a pipeline splits: an MLP of identical blocks, its partition into stages, its initial values.

Layers, in forward order (``L = blocks``)::

    embed     Linear(features, width), activation
    block 1   Linear(width, hidden), activation, Linear(hidden, width), activation
    ...
    block L
    head      Linear(width, classes)                  (logits; the loss is on the last stage)

The blocks are what stages split: ``p·v`` stages need ``L >= p·v``; the embed
goes with the first stage, the head with the last. With tensor parallelism
(T > 1) each block's pair becomes :class:`~apps.pipeline.tensor.ColumnParallelLinear`
→ activation → :class:`~apps.pipeline.tensor.RowParallelLinear` (``hidden`` must
be a multiple of T); the embed and head are small and replicated.

Balance (:func:`partition`): contiguous runs of blocks, one per stage, that
minimise the largest stage cost - by parameter count, or by measured time per
block (``--balance time``). Interleaved schedules need equal chunks: L must be a
multiple of p·v, as in Megatron.

Initial values (:func:`initial_values`) are drawn layer by layer from one
generator over the WHOLE model, as :class:`apps.nn.Sequential` draws them, and a
stage keeps its own layers' values: every split (and the single-rank reference)
starts from the same parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from apps.nn import ACTIVATIONS, Layer, Linear

from .tensor import ColumnParallelLinear, RowParallelLinear

__all__ = ["ModelSpec", "ModelError", "layers", "stage_layers", "partition", "block_ranges", "initial_values",
           "block_params"]


class ModelError(ValueError):
    """A model or split that cannot be built (the message names the values and the fix)."""


@dataclass(frozen=True)
class ModelSpec:
    """The MLP's sizes (see the module docstring)."""

    features: int = 64
    width: int = 128
    hidden: int = 256
    blocks: int = 8
    classes: int = 10
    activation: str = "relu"

    def check(self) -> None:
        for name in ("features", "width", "hidden", "blocks", "classes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ModelError(f"--{name} must be an integer >= 1, got {value!r}")
        if self.activation not in ACTIVATIONS:
            raise ModelError(f"--activation {self.activation!r}: choose one of {', '.join(ACTIVATIONS)}")


def _act(spec: ModelSpec) -> Layer:
    return ACTIVATIONS[spec.activation]()


def layers(spec: ModelSpec, unit: int, tp: Any = None) -> list[Layer]:
    """The layers of unit *unit*: 0 = embed, 1..L = blocks, L+1 = head (tensor-parallel blocks over *tp*)."""
    if unit == 0:
        return [Linear(spec.features, spec.width), _act(spec)]
    if unit == spec.blocks + 1:
        return [Linear(spec.width, spec.classes)]
    if tp is not None and tp.Get_size() > 1:
        return [ColumnParallelLinear(spec.width, spec.hidden, tp), _act(spec),
                RowParallelLinear(spec.hidden, spec.width, tp), _act(spec)]
    return [Linear(spec.width, spec.hidden), _act(spec), Linear(spec.hidden, spec.width), _act(spec)]


def block_params(spec: ModelSpec) -> list[int]:
    """Parameters of each block (the embed's added to the first, the head's to the last): the default balance."""
    block = 2 * spec.width * spec.hidden + spec.hidden + spec.width
    costs = [float(block)] * spec.blocks
    costs[0] += spec.features * spec.width + spec.width
    costs[-1] += spec.width * spec.classes + spec.classes
    return costs


def partition(costs: Sequence[float], parts: int) -> list[tuple[int, int]]:
    """Contiguous ``[lo, hi)`` runs of *costs*, one per part, minimising the largest run's sum (exact, O(n²·parts))."""
    n = len(costs)
    if parts < 1:
        raise ModelError(f"cannot split into {parts} stages; use at least 1")
    if parts > n:
        raise ModelError(f"{parts} stages but only {n} blocks to split; use --blocks >= {parts} or fewer stages")
    prefix = np.concatenate([[0.0], np.cumsum(np.asarray(costs, dtype=float))])
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for k in range(1, parts + 1):
        for j in range(k, n - (parts - k) + 1):
            for i in range(k - 1, j):
                value = max(best[k - 1][i], prefix[j] - prefix[i])
                if value < best[k][j] - 1e-12:
                    best[k][j], cut[k][j] = value, i
    bounds, j = [], n
    for k in range(parts, 0, -1):
        i = cut[k][j]
        bounds.append((i, j))
        j = i
    return bounds[::-1]


def block_ranges(spec: ModelSpec, stages: int, *, equal: bool = False,
                 costs: Sequence[float] | None = None) -> list[tuple[int, int]]:
    """Blocks ``[lo, hi)`` of each of *stages* stages (0-based block indices).

    *equal* (interleaved schedules): L/stages blocks each, ModelError unless divisible.
    Else balanced by *costs* (per block; default :func:`block_params`).
    """
    spec.check()
    if stages < 1:
        raise ModelError(f"cannot split into {stages} stages; use at least 1")
    if stages > spec.blocks:
        raise ModelError(f"{stages} stages but the model has {spec.blocks} blocks; use --blocks >= {stages} "
                         f"or fewer --stages/--chunks")
    if equal:
        if spec.blocks % stages:
            raise ModelError(f"interleaved and looped-bfs need the blocks ({spec.blocks}) divisible by stages x chunks ({stages}); "
                             f"use --blocks {spec.blocks + stages - spec.blocks % stages}")
        k = spec.blocks // stages
        return [(i * k, (i + 1) * k) for i in range(stages)]
    return partition(list(costs) if costs is not None else block_params(spec), stages)


def stage_layers(spec: ModelSpec, lo: int, hi: int, tp: Any = None) -> tuple[list[Layer], list[int]]:
    """Layers of the stage holding blocks [lo, hi) (plus embed/head at the ends), and their global layer indices."""
    if not 0 <= lo < hi <= spec.blocks:
        raise ModelError(f"blocks [{lo}, {hi}) are not a non-empty run of the model's {spec.blocks} blocks")
    units = list(range(lo + 1, hi + 1))
    if lo == 0:
        units.insert(0, 0)
    if hi == spec.blocks:
        units.append(spec.blocks + 1)
    out: list[Layer] = []
    index: list[int] = []
    for u in units:
        first = 0 if u == 0 else 2 + 4 * (u - 1)
        group = layers(spec, u, tp)
        out.extend(group)
        index.extend(range(first, first + len(group)))
    return out, index


def initial_values(spec: ModelSpec, wanted: set[int], seed: int, tp: Any = None) -> dict[int, dict[str, np.ndarray]]:
    """Initial parameters of the global layers in *wanted*, drawn as ``Sequential`` draws the whole model."""
    rng = np.random.default_rng(seed)
    values: dict[int, dict[str, np.ndarray]] = {}
    index = 0
    for u in range(spec.blocks + 2):
        for layer in layers(spec, u, tp):
            drawn = layer.init(rng)
            if index in wanted:
                values[index] = drawn
            index += 1
    return values
