"""Layers with explicit forward and backward passes on 2-D (batch, features) arrays.

Each layer declares its parameters (:meth:`Layer.param_shapes`) and their
initial values (:meth:`Layer.init`) but does not own their storage: the model
binds ``layer.params`` and ``layer.grads`` to reshaped views of its two flat
buffers, so every parameter and gradient lives in one contiguous vector that
communication code can slice into buckets or shards without copying.

``backward`` *accumulates* (``+=``) parameter gradients, as PyTorch does: a
batch split into micro-batches sums their gradients, and the model zeroes them
between steps.

For pipeline schedules two more things are public:

* ``saved`` names the attributes a forward keeps for its backward;
  :meth:`Layer.stash` takes them out (a tuple) and :meth:`Layer.unstash` puts
  them back, so several micro-batches can be in flight through one layer, or
  their activations parked elsewhere and brought back;
* ``backward`` = ``backward_input`` (the input gradient, B) then
  ``backward_weight`` (the parameter gradient, W): zero-bubble schedules run W
  later, from the same saved input and the output gradient kept for it. Every pass runs on the array module of its input (NumPy or
CuPy) and keeps the input's dtype; a batch of zero rows is valid.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .xp import array_module

__all__ = ["Layer", "Linear", "ReLU", "GELU", "LayerNorm", "Dropout"]


def _like(p: Any, x: Any) -> Any:
    """Parameter *p* in *x*'s dtype (no copy when they already agree), so outputs keep the input's dtype."""
    return p if p.dtype == x.dtype else p.astype(x.dtype)


def _check_input(layer: Layer, x: Any, features: int | None = None) -> None:
    if getattr(x, "ndim", None) != 2:
        raise ValueError(f"{type(layer).__name__} takes a 2-D (batch, features) array, got shape "
                         f"{getattr(x, 'shape', type(x).__name__)}; reshape the input to (batch, features)")
    if features is not None and x.shape[1] != features:
        raise ValueError(f"{type(layer).__name__} expects {features} features, got input of shape {x.shape}; "
                         f"the previous layer's output size must equal this layer's input size")


def _check_size(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {value!r} of type {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return int(value)


class Layer:
    """Base class: no parameters, identity passes. Subclasses override what they need.

    ``params`` and ``grads`` map parameter names to arrays; the model binds them
    to views of its flat buffers. ``key`` is the Dropout-style randomness key
    the model sets before each forward: ``(seed, layer_index, *model.rng_key)``.
    """

    #: Attributes a training forward sets and the backward reads (see :meth:`stash`).
    saved: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.params: dict[str, Any] = {}
        self.grads: dict[str, Any] = {}
        self.key: tuple[int, ...] | None = None

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Parameter names and shapes, in storage order ({} for a parameterless layer)."""
        return {}

    def init(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Initial parameter values as host float64 arrays (same keys and shapes as :meth:`param_shapes`)."""
        return {}

    def forward(self, x: Any, train: bool = True) -> Any:
        """The layer's output for *x*; keeps what :meth:`backward` needs."""
        return x

    def backward(self, dy: Any, need_input_grad: bool = True) -> Any:
        """Accumulate parameter gradients from *dy* and return the input gradient.

        With ``need_input_grad=False`` (the first layer of a model) the input
        gradient may be skipped and ``None`` returned.
        """
        return dy

    def backward_input(self, dy: Any) -> Any:
        """The input gradient alone (B); parameter gradients are left to :meth:`backward_weight`."""
        return self.backward(dy, True)

    def backward_weight(self, dy: Any) -> None:
        """Accumulate the parameter gradients (W) from *dy* and the saved input; nothing for parameterless layers."""

    def stash(self) -> tuple[Any, ...]:
        """Take the saved activations of the last forward out of the layer (they are cleared here)."""
        values = tuple(getattr(self, name) for name in self.saved)
        for name in self.saved:
            setattr(self, name, None)
        return values

    def unstash(self, values: tuple[Any, ...]) -> None:
        """Put back activations taken by :meth:`stash`, so the matching backward can run."""
        if len(values) != len(self.saved):
            raise ValueError(f"{type(self).__name__}.unstash got {len(values)} values, expected {len(self.saved)} "
                             f"({', '.join(self.saved) or 'none'}); pass what stash() returned")
        for name, value in zip(self.saved, values):
            setattr(self, name, value)

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}={v}" for k, v in self.param_shapes().items())
        return f"{type(self).__name__}({shapes})"


class Linear(Layer):
    """``y = x @ W + b`` with ``W`` of shape (in, out), initialised as PyTorch does: U(-1/√in, 1/√in)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        self.in_features = _check_size("in_features", in_features)
        self.out_features = _check_size("out_features", out_features)
        if not isinstance(bias, (bool, np.bool_)):
            raise TypeError(f"bias must be True or False, got {bias!r}")
        self.bias = bool(bias)
        self._x: Any = None

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes: dict[str, tuple[int, ...]] = {"W": (self.in_features, self.out_features)}
        if self.bias:
            shapes["b"] = (self.out_features,)
        return shapes

    def init(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        bound = 1.0 / math.sqrt(self.in_features)
        return {name: rng.uniform(-bound, bound, size=shape) for name, shape in self.param_shapes().items()}

    def forward(self, x: Any, train: bool = True) -> Any:
        _check_input(self, x, self.in_features)
        self._x = x
        y = x @ _like(self.params["W"], x)
        if self.bias:
            y += _like(self.params["b"], x)
        return y

    saved = ("_x",)

    def backward(self, dy: Any, need_input_grad: bool = True) -> Any:
        self.backward_weight(dy)
        return self.backward_input(dy) if need_input_grad else None

    def backward_input(self, dy: Any) -> Any:
        return dy @ _like(self.params["W"], dy).T

    def backward_weight(self, dy: Any) -> None:
        gw = self.grads["W"]
        gw += self._x.T @ dy
        if self.bias:
            gb = self.grads["b"]
            gb += dy.sum(axis=0)

    def __repr__(self) -> str:
        return f"Linear({self.in_features}, {self.out_features}, bias={self.bias})"


class ReLU(Layer):
    """``max(x, 0)``; the gradient at 0 is taken as 0."""

    saved = ("_mask",)

    def __init__(self) -> None:
        super().__init__()
        self._mask: Any = None

    def forward(self, x: Any, train: bool = True) -> Any:
        _check_input(self, x)
        self._mask = x > 0
        return x * self._mask

    def backward(self, dy: Any, need_input_grad: bool = True) -> Any:
        return dy * self._mask if need_input_grad else None


class GELU(Layer):
    """GELU, tanh approximation: ``0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))``.

    The approximation (PyTorch's ``approximate="tanh"``, GPT-2's form) needs no
    ``erf``, which NumPy lacks, and has a closed-form derivative.
    """

    _C = math.sqrt(2.0 / math.pi)
    _A = 0.044715
    saved = ("_x", "_t")

    def __init__(self) -> None:
        super().__init__()
        self._x: Any = None
        self._t: Any = None

    def forward(self, x: Any, train: bool = True) -> Any:
        _check_input(self, x)
        xp = array_module(x)
        t = xp.tanh(self._C * (x + self._A * x * x * x))
        self._x, self._t = x, t
        return 0.5 * x * (1.0 + t)

    def backward(self, dy: Any, need_input_grad: bool = True) -> Any:
        if not need_input_grad:
            return None
        x, t = self._x, self._t
        # d/dx [0.5 x (1 + t)] = 0.5 (1 + t) + 0.5 x (1 - t²) · C (1 + 3A x²)
        d = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * self._C * (1.0 + 3.0 * self._A * x * x)
        return dy * d


class LayerNorm(Layer):
    """Normalise each row over its last axis (biased variance, as PyTorch), then scale by gamma and shift by beta."""

    def __init__(self, features: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.features = _check_size("features", features)
        if not isinstance(eps, (int, float, np.floating)) or isinstance(eps, bool) or not eps > 0:
            raise ValueError(f"eps must be a positive number, got {eps!r}; PyTorch's default is 1e-5")
        self.eps = float(eps)
        self._xhat: Any = None
        self._rstd: Any = None

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"gamma": (self.features,), "beta": (self.features,)}

    def init(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {"gamma": np.ones(self.features), "beta": np.zeros(self.features)}

    def forward(self, x: Any, train: bool = True) -> Any:
        _check_input(self, x, self.features)
        xp = array_module(x)
        mean = x.mean(axis=-1, keepdims=True)
        centred = x - mean
        var = (centred * centred).mean(axis=-1, keepdims=True)
        rstd = 1.0 / xp.sqrt(var + self.eps)
        xhat = centred * rstd
        self._xhat, self._rstd = xhat, rstd
        return xhat * _like(self.params["gamma"], x) + _like(self.params["beta"], x)

    saved = ("_xhat", "_rstd")

    def backward(self, dy: Any, need_input_grad: bool = True) -> Any:
        self.backward_weight(dy)
        return self.backward_input(dy) if need_input_grad else None

    def backward_weight(self, dy: Any) -> None:
        gg = self.grads["gamma"]
        gg += (dy * self._xhat).sum(axis=0)
        gb = self.grads["beta"]
        gb += dy.sum(axis=0)

    def backward_input(self, dy: Any) -> Any:
        xhat, rstd = self._xhat, self._rstd
        dxhat = dy * _like(self.params["gamma"], dy)
        n = self.features
        # dx = rstd/n · (n·dxhat - Σdxhat - xhat·Σ(dxhat·xhat)), sums over the row
        s1 = dxhat.sum(axis=-1, keepdims=True)
        s2 = (dxhat * xhat).sum(axis=-1, keepdims=True)
        return (rstd / n) * (n * dxhat - s1 - xhat * s2)

    def __repr__(self) -> str:
        return f"LayerNorm({self.features}, eps={self.eps})"


class Dropout(Layer):
    """Inverted dropout: zero each element with probability p and scale the rest by 1/(1-p) in training.

    The mask is a pure function of ``self.key`` (which the model sets to
    ``(seed, layer_index, *model.rng_key)`` before each forward): it is drawn on
    the host from ``default_rng(SeedSequence(key))`` and moved to the input's
    array module. A run restarted from a checkpoint therefore draws the same
    masks without saving any RNG state, and NumPy and CuPy runs agree.
    Evaluation (``train=False``) and ``p == 0`` are the identity.
    """

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if isinstance(p, bool) or not isinstance(p, (int, float, np.floating)):
            raise TypeError(f"Dropout p must be a number in [0, 1), got {p!r} of type {type(p).__name__}")
        if not 0.0 <= p < 1.0:
            raise ValueError(f"Dropout p must be in [0, 1), got {p}; use 0 for no dropout")
        self.p = float(p)
        self._mask: Any = None

    saved = ("_mask",)

    def mask(self, shape: tuple[int, ...], xp: Any = np, dtype: Any = np.float64) -> Any:
        """The scaled keep-mask (0 or 1/(1-p)) for the current key, on *xp* in *dtype*."""
        if self.key is None:
            raise RuntimeError("Dropout.key is not set: run the layer inside Sequential, or set "
                               "layer.key = (seed, layer_index, ...) before a training forward")
        rng = np.random.default_rng(np.random.SeedSequence([int(k) for k in self.key]))
        keep = rng.random(shape) >= self.p
        host = keep.astype(dtype) * np.asarray(1.0 / (1.0 - self.p), dtype=dtype)
        return xp.asarray(host)

    def forward(self, x: Any, train: bool = True) -> Any:
        _check_input(self, x)
        if not train or self.p == 0.0:
            self._mask = None
            return x
        self._mask = self.mask(x.shape, array_module(x), x.dtype)
        return x * self._mask

    def backward(self, dy: Any, need_input_grad: bool = True) -> Any:
        if not need_input_grad:
            return None
        return dy if self._mask is None else dy * self._mask

    def __repr__(self) -> str:
        return f"Dropout(p={self.p})"
