"""A small layer library for training on NumPy or CuPy, built so distributed code can move its memory in bulk.

No MPI here: the data-parallel, ZeRO, parameter-server and pipeline apps add
the communication; this package only guarantees the memory layout they rely on.

Layers (:mod:`apps.nn.layers`), each with explicit ``forward(x, train)`` and
``backward(dy)`` on 2-D (batch, features) arrays; ``backward`` accumulates
parameter gradients (``+=``) and returns the input gradient:

* ``Linear(in, out, bias=True)`` - ``x @ W + b``, PyTorch's uniform init
* ``ReLU()``, ``GELU()`` (tanh approximation), ``LayerNorm(features, eps=1e-5)``
* ``Dropout(p)`` - inverted dropout whose mask is a pure function of a key
  ``(seed, layer_index, *model.rng_key)``, so restarts need no saved RNG state

Model (:mod:`apps.nn.model`): ``Sequential(layers, dtype=, xp=, seed=)`` keeps
all parameters in ONE flat buffer ``params`` and all gradients in ONE flat
buffer ``grads`` (layer views are reshaped slices); ``layer_ranges`` and
``named_parameters()`` give the offsets; ``backward(dy, hook)`` calls
``hook(i)`` as soon as layer *i*'s gradients are final (i = n-1 … 0).
``mlp(sizes, activation=, layernorm=, dropout=)`` builds the usual MLP.

Loss (:mod:`apps.nn.loss`): ``softmax_cross_entropy(logits, labels,
denominator=None) -> (mean loss, dlogits)`` and ``correct(logits, labels)``.

Optimizers (:mod:`apps.nn.optim`) on flat arrays or contiguous slices (ZeRO
shards): ``SGD``, ``Adam``, ``AdamW`` (torch's update rules) and
``make(name, **kwargs)``; state from ``init_state(n, xp, dtype)``.

Array modules (:mod:`apps.nn.xp`): ``array_module(x)`` and ``to_host(a)``;
CuPy is imported only when a CuPy array is seen.
"""

from __future__ import annotations

from .layers import GELU, Dropout, Layer, LayerNorm, Linear, ReLU
from .loss import correct, softmax_cross_entropy
from .model import ACTIVATIONS, Sequential, mlp
from .optim import OPTIMIZERS, SGD, Adam, AdamW, Optimizer, make
from .xp import array_module, to_host

__all__ = [
    "Layer",
    "Linear",
    "ReLU",
    "GELU",
    "LayerNorm",
    "Dropout",
    "softmax_cross_entropy",
    "correct",
    "Sequential",
    "mlp",
    "ACTIVATIONS",
    "Optimizer",
    "SGD",
    "Adam",
    "AdamW",
    "make",
    "OPTIMIZERS",
    "array_module",
    "to_host",
]
