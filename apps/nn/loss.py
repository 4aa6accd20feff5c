"""Softmax cross-entropy (loss and gradient in one pass) and a correct-prediction count.

The gradient's *denominator* is a parameter because data-parallel training
needs it: each rank sees only part of the global batch, and the gradients the
ranks then sum (or average) must add up to the gradient of the mean over the
**global** batch. A rank holding ``n_r`` of ``N`` samples whose gradients are
averaged over ``p`` ranks passes ``denominator = N / p``; a single process
leaves it at its default, the number of rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .xp import array_module, to_host

__all__ = ["softmax_cross_entropy", "correct"]


def _check(logits: Any, labels: Any) -> None:
    if getattr(logits, "ndim", None) != 2:
        raise ValueError(f"logits must be a 2-D (batch, classes) array, got shape "
                         f"{getattr(logits, 'shape', type(logits).__name__)}")
    if getattr(labels, "shape", None) != (logits.shape[0],):
        raise ValueError(f"labels must have shape ({logits.shape[0]},) to match logits {logits.shape}, got "
                         f"{getattr(labels, 'shape', type(labels).__name__)}")
    if np.dtype(labels.dtype).kind not in "iu":
        raise TypeError(f"labels must be an integer array of class indices, got dtype {labels.dtype}; "
                        f"convert with labels.astype(np.int64)")


def softmax_cross_entropy(logits: Any, labels: Any, denominator: float | None = None) -> tuple[float, Any]:
    """Mean cross-entropy of ``softmax(logits)`` against integer *labels*, and its gradient.

    Returns ``(loss, dlogits)``: *loss* is the mean over the rows as a Python
    float (0.0 for an empty batch); ``dlogits = (softmax(logits) - onehot(labels))
    / denominator``. *denominator* defaults to the number of rows, giving the
    gradient of the mean; a data-parallel rank passes ``global_batch / world_size``
    so that the averaged gradients are those of the global mean. Stable for
    large logits: each row's maximum is subtracted before exponentiating.
    """
    _check(logits, labels)
    n, k = logits.shape
    if denominator is None:
        denominator = n
    elif isinstance(denominator, bool) or not isinstance(denominator, (int, float, np.integer, np.floating)):
        raise TypeError(f"denominator must be a number, got {denominator!r}")
    elif not denominator > 0:
        raise ValueError(f"denominator must be positive, got {denominator}; "
                         f"pass the number of samples the gradient is averaged over")
    xp = array_module(logits)
    if n == 0:
        return 0.0, xp.zeros_like(logits)
    lo, hi = (int(v) for v in to_host(xp.stack([labels.min(), labels.max()])))
    if lo < 0 or hi >= k:
        raise ValueError(f"labels must lie in [0, {k}) for {k} classes, got values from {lo} to {hi}")
    rows = xp.arange(n)
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = xp.exp(shifted)
    total = exp.sum(axis=1, keepdims=True)
    log_total = xp.log(total)
    loss = float((log_total[:, 0] - shifted[rows, labels]).sum()) / n
    exp /= total
    exp[rows, labels] -= 1.0
    exp /= float(denominator)
    return loss, exp


def correct(logits: Any, labels: Any) -> int:
    """How many rows' argmax equals their label."""
    _check(logits, labels)
    if logits.shape[0] == 0:
        return 0
    return int((logits.argmax(axis=1) == labels).sum())
