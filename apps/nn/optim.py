"""Optimizers that update FLAT arrays in place: a whole parameter buffer or any contiguous slice of it.

Working on flat vectors is what lets one optimizer serve every training scheme:
data parallelism steps the whole buffer, ZeRO steps a rank's shard
(``params[lo:hi]`` with a state of ``hi - lo`` elements), a parameter server
steps the slice it owns. The state is a dict of per-element arrays named in
``state_names`` plus ``"step"``, a host 0-d int64 array, so it can be sharded,
gathered and checkpointed like any other array.

The update rules are those documented for ``torch.optim.SGD``, ``Adam`` and
``AdamW``; arithmetic stays in the parameters' dtype and in place.
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

import numpy as np

from .xp import array_module

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "make", "OPTIMIZERS"]


def _number(name: str, value: Any, *, low: float, low_open: bool = False, high: float | None = None,
            high_open: bool = True, hint: str = "") -> float:
    """*value* as a float, or a ValueError/TypeError naming *name*, the bad value and the valid range."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {value!r} of type {type(value).__name__}")
    v = float(value)
    ok = math.isfinite(v) and (v > low if low_open else v >= low)
    if high is not None:
        ok = ok and (v < high if high_open else v <= high)
    if not ok:
        lo = f"{'(' if low_open else '['}{low}"
        hi = "inf)" if high is None else f"{high}{')' if high_open else ']'}"
        raise ValueError(f"{name} must be in {lo}, {hi}, got {value!r}{hint}")
    return v


class Optimizer:
    """Base class: ``init_state`` makes the state for *n* elements, ``step`` updates params and state in place."""

    state_names: tuple[str, ...] = ()

    def __init__(self, lr: float) -> None:
        self.lr = _number("lr", lr, low=0.0, low_open=True, hint="; a typical value is 0.1 for SGD, 1e-3 for Adam")

    def init_state(self, n: int, xp: ModuleType = np, dtype: Any = np.float32) -> dict[str, Any]:
        """Zeroed per-element state for *n* parameters, plus ``"step"`` (host int64 0-d array, 0)."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"n must be a non-negative int (the number of parameters), got {n!r}")
        state: dict[str, Any] = {name: xp.zeros(int(n), dtype=dtype) for name in self.state_names}
        state["step"] = np.zeros((), dtype=np.int64)
        return state

    def state_bytes(self, n: int, itemsize: int) -> int:
        """Bytes of per-element state for *n* parameters of *itemsize* bytes (the step counter not counted)."""
        return len(self.state_names) * int(n) * int(itemsize)

    def step(self, params: Any, grads: Any, state: dict[str, Any]) -> None:
        """One update of *params* (in place) from *grads* (not modified); advances ``state["step"]``."""
        raise NotImplementedError

    def _check(self, params: Any, grads: Any, state: dict[str, Any]) -> None:
        if getattr(params, "shape", None) != getattr(grads, "shape", None):
            raise ValueError(f"params and grads must have the same shape, got {getattr(params, 'shape', None)} "
                             f"and {getattr(grads, 'shape', None)}")
        for name in (*self.state_names, "step"):
            if name not in state:
                raise ValueError(f"state has no {name!r} entry (it has {sorted(state)}); "
                                 f"create it with {type(self).__name__}.init_state(n)")
        for name in self.state_names:
            if state[name].shape != (params.size,):
                raise ValueError(f"state[{name!r}] has shape {state[name].shape} but params has {params.size} "
                                 f"elements; the state must be made for the same slice: init_state({params.size})")

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"


class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum, dampening, Nesterov and L2 weight decay (as torch.optim.SGD).

    ``g += wd·p``; with momentum ``buf = g`` on the first step, afterwards
    ``buf = momentum·buf + (1 - dampening)·g``; then ``g = g + momentum·buf``
    (Nesterov) or ``g = buf``; finally ``p -= lr·g``. Without momentum there is
    no per-element state.
    """

    def __init__(self, lr: float, momentum: float = 0.0, dampening: float = 0.0, weight_decay: float = 0.0,
                 nesterov: bool = False) -> None:
        super().__init__(lr)
        self.momentum = _number("momentum", momentum, low=0.0)
        self.dampening = _number("dampening", dampening, low=0.0, high=1.0, high_open=False)
        self.weight_decay = _number("weight_decay", weight_decay, low=0.0)
        if not isinstance(nesterov, (bool, np.bool_)):
            raise TypeError(f"nesterov must be True or False, got {nesterov!r}")
        self.nesterov = bool(nesterov)
        if self.nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise ValueError(f"nesterov=True requires momentum > 0 and dampening == 0, got momentum="
                             f"{self.momentum} and dampening={self.dampening}")
        self.state_names = ("momentum",) if self.momentum > 0 else ()

    def step(self, params: Any, grads: Any, state: dict[str, Any]) -> None:
        self._check(params, grads, state)
        first = int(state["step"]) == 0
        g = grads
        if self.weight_decay:
            g = grads + self.weight_decay * params
        if self.momentum > 0:
            buf = state["momentum"]
            if first:
                buf[...] = g
            else:
                buf *= self.momentum
                if self.dampening:
                    buf += (1.0 - self.dampening) * g
                else:
                    buf += g
            if self.nesterov:
                g = g + self.momentum * buf
            else:
                g = buf
        params -= self.lr * g
        state["step"] += 1


class Adam(Optimizer):
    """Adam with bias correction and L2 weight decay added to the gradient (as torch.optim.Adam).

    ``g += wd·p; m = β1·m + (1-β1)·g; v = β2·v + (1-β2)·g²;
    p -= lr · m̂ / (√v̂ + eps)`` with ``m̂ = m/(1-β1ᵗ)``, ``v̂ = v/(1-β2ᵗ)``.
    """

    state_names = ("exp_avg", "exp_avg_sq")

    def __init__(self, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0) -> None:
        super().__init__(lr)
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise TypeError(f"betas must be a pair (beta1, beta2), got {betas!r}")
        self.betas = (_number("betas[0]", betas[0], low=0.0, high=1.0),
                      _number("betas[1]", betas[1], low=0.0, high=1.0))
        self.eps = _number("eps", eps, low=0.0)
        self.weight_decay = _number("weight_decay", weight_decay, low=0.0)

    def _decay(self, params: Any, grads: Any) -> Any:
        """The gradient the moments see: L2 decay folded in (Adam), or untouched (AdamW overrides)."""
        return grads + self.weight_decay * params if self.weight_decay else grads

    def step(self, params: Any, grads: Any, state: dict[str, Any]) -> None:
        self._check(params, grads, state)
        state["step"] += 1
        t = int(state["step"])
        b1, b2 = self.betas
        g = self._decay(params, grads)
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m *= b1
        m += (1.0 - b1) * g
        v *= b2
        sq = g * g
        sq *= 1.0 - b2
        v += sq
        # p -= (lr / bc1) · m / (√v / √bc2 + eps), the same arithmetic as torch's implementation
        bc1 = 1.0 - b1 ** t
        bc2_sqrt = math.sqrt(1.0 - b2 ** t)
        denom = sq  # reuse the temporary
        array_module(v).sqrt(v, out=denom)
        denom /= bc2_sqrt
        denom += self.eps
        upd = m / denom
        upd *= self.lr / bc1
        params -= upd


class AdamW(Adam):
    """Adam with decoupled weight decay (as torch.optim.AdamW): ``p *= 1 - lr·wd`` before the Adam update."""

    def __init__(self, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2) -> None:
        super().__init__(lr, betas, eps, weight_decay)

    def _decay(self, params: Any, grads: Any) -> Any:
        if self.weight_decay:
            params *= 1.0 - self.lr * self.weight_decay
        return grads


#: The optimizers :func:`make` builds, by name.
OPTIMIZERS: dict[str, type[Optimizer]] = {"sgd": SGD, "adam": Adam, "adamw": AdamW}


def make(name: str, **kwargs: Any) -> Optimizer:
    """The optimizer called *name* (``"sgd"``, ``"adam"``, ``"adamw"``; any case) built with *kwargs*."""
    key = name.lower() if isinstance(name, str) else name
    if key not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(repr(n) for n in OPTIMIZERS)}")
    return OPTIMIZERS[key](**kwargs)
