"""The data every rank makes for itself, its micro-batches, and the single-process reference training.

A step's global batch is a pure function of (seed, step): Gaussian inputs
labelled by a fixed random teacher, so no data moves between ranks and every
split sees the same samples. Replica d takes its contiguous share
(:func:`apps.blocks.block`) and cuts it into M micro-batches.

:func:`reference` trains the unsplit model in one process on exactly those
micro-batches, with the same randomness keys and the global batch as the loss
denominator: what every pipeline split must equal.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from apps.blocks import block
from apps.nn import Sequential, softmax_cross_entropy
from apps.nn.optim import make as make_optimizer

from .model import ModelSpec, layers

__all__ = ["batch", "micro_slices", "reference"]


def _teacher(spec: ModelSpec, seed: int) -> np.ndarray:
    return np.random.default_rng([seed, 7]).standard_normal((spec.features, spec.classes))


def batch(spec: ModelSpec, size: int, step: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The global batch of step *step*: Gaussian inputs and the teacher's labels (the same on every rank)."""
    x = np.random.default_rng([seed, 11, step]).standard_normal((size, spec.features))
    y = np.argmax(x @ _teacher(spec, seed), axis=1).astype(np.int64)
    return x, y


def micro_slices(size: int, replicas: int, replica: int, micro: int) -> list[tuple[int, int]]:
    """Rows [lo, hi) of the global batch in each of replica *replica*'s micro-batches."""
    if micro < 1 or size // max(replicas, 1) < micro:
        raise ValueError(f"{size} samples over {replicas} replica(s) cannot fill {micro} micro-batches; "
                         f"each micro-batch needs at least one sample")
    lo, hi = block(size, replicas, replica)
    out = []
    for k in range(micro):
        a, b = block(hi - lo, micro, k)
        out.append((lo + a, lo + b))
    return out


# ---------------------------------------------------------------- the single-process reference


def reference(cfg: Any, replicas: int = 1, steps: int | None = None) -> tuple[list[float], np.ndarray]:
    """Train the unsplit model in this process on the same micro-batches: (losses per step, final flat params).

    Micro-batch k of replica d runs with the same randomness key (step, d, k) as
    in the pipeline; gradients are summed over all micro-batches of all
    replicas, with the global batch as the loss denominator.
    """
    spec = cfg.spec
    all_layers = [layer for u in range(spec.blocks + 2) for layer in layers(spec, u)]
    model = Sequential(all_layers, dtype=np.dtype(cfg.dtype), seed=cfg.seed)
    opt = make_optimizer(cfg.optimizer, lr=cfg.lr)
    state = opt.init_state(model.num_params, np, model.dtype)
    losses = []
    for step in range(cfg.steps if steps is None else steps):
        x, y = batch(spec, cfg.batch, step, cfg.seed)
        model.zero_grad()
        total = 0.0
        for d in range(replicas):
            for k, (lo, hi) in enumerate(micro_slices(cfg.batch, replicas, d, cfg.micro)):
                model.rng_key = (step, d, k)
                logits = model.forward(x[lo:hi].astype(model.dtype))
                loss, dlogits = softmax_cross_entropy(logits, y[lo:hi], denominator=cfg.batch)
                total += loss * (hi - lo)
                model.backward(dlogits)
        losses.append(total / cfg.batch)
        opt.step(model.params, model.grads, state)
    return losses, model.params.copy()
