"""A sequential model whose parameters and gradients are each ONE flat buffer.

Every layer's parameters are reshaped views of ``Sequential.params`` (layer by
layer in forward order, each layer's parameters in ``param_shapes`` order), and
its gradients views of ``Sequential.grads`` in the same layout. So a bucket of
gradients to all-reduce, or a ZeRO shard to update, is a contiguous slice
(``layer_ranges`` / ``named_parameters`` give the offsets) and neither copies
nor gathers anything.

Initialisation draws host float64 values from one ``default_rng(seed)``, layer
by layer, then casts and copies them into the array module: the same seed gives
the same parameters on every process, with NumPy or CuPy.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from .layers import GELU, Dropout, Layer, LayerNorm, Linear, ReLU
from .xp import array_module, to_host

__all__ = ["Sequential", "mlp", "ACTIVATIONS"]

#: The activations :func:`mlp` knows, by name.
ACTIVATIONS: dict[str, type[Layer]] = {"relu": ReLU, "gelu": GELU}


class Sequential:
    """Layers applied in order, with flat parameter and gradient buffers (see the module docstring).

    ``rng_key`` is set by the trainer before each step (for example
    ``(step, rank)``); a layer's randomness key is ``(seed, index, *rng_key)``.
    """

    def __init__(self, layers: list[Layer], *, dtype: Any = np.float32, xp: ModuleType = np, seed: int = 0) -> None:
        layers = list(layers)
        if not layers:
            raise ValueError("Sequential needs at least one layer, got an empty list")
        for i, layer in enumerate(layers):
            if not isinstance(layer, Layer):
                raise TypeError(f"layer {i} is {layer!r} of type {type(layer).__name__}; "
                                f"every layer must be an apps.nn Layer")
        if len({id(layer) for layer in layers}) != len(layers):
            raise ValueError("the same Layer object appears more than once; create a separate instance for each "
                             "position (each position owns its own slice of the parameter buffer)")
        dt = np.dtype(dtype)
        if dt.kind != "f":
            raise ValueError(f"dtype must be a floating-point dtype such as np.float32 or np.float64, got {dt}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        self.layers: list[Layer] = layers
        self.dtype = dt
        self.xp = xp
        self.seed = int(seed)
        self.rng_key: tuple[int, ...] = ()

        self.layer_ranges: list[tuple[int, int]] = []
        self._named: list[tuple[str, int, int, tuple[int, ...]]] = []
        offset = 0
        for i, layer in enumerate(layers):
            start = offset
            for name, shape in layer.param_shapes().items():
                size = int(np.prod(shape, dtype=np.int64))
                self._named.append((f"{i}.{name}", offset, offset + size, tuple(int(s) for s in shape)))
                offset += size
            self.layer_ranges.append((start, offset))

        rng = np.random.default_rng(self.seed)
        host = np.empty(offset, dtype=np.float64)
        for i, layer in enumerate(layers):
            values = layer.init(rng)
            shapes = layer.param_shapes()
            if list(values) != list(shapes):
                raise ValueError(f"layer {i} ({layer!r}) init() returned parameters {list(values)}, but "
                                 f"param_shapes() declares {list(shapes)}; they must match in name and order")
            start = self.layer_ranges[i][0]
            for name, shape in shapes.items():
                value = np.asarray(values[name], dtype=np.float64)
                if value.shape != tuple(shape):
                    raise ValueError(f"layer {i} ({layer!r}) init() gave {name!r} shape {value.shape}, "
                                     f"expected {tuple(shape)}")
                host[start:start + value.size] = value.ravel()
                start += value.size

        self.params: Any = xp.asarray(host.astype(dt))
        self.grads: Any = xp.zeros(offset, dtype=dt)
        for (start, _stop), layer in zip(self.layer_ranges, layers):
            layer.params, layer.grads = {}, {}
            for name, shape in layer.param_shapes().items():
                size = int(np.prod(shape, dtype=np.int64))
                layer.params[name] = self.params[start:start + size].reshape(shape)
                layer.grads[name] = self.grads[start:start + size].reshape(shape)
                start += size

    def named_parameters(self) -> list[tuple[str, int, int, tuple[int, ...]]]:
        """``(name, start, stop, shape)`` of every parameter in flat order, named ``"<layer index>.<name>"``."""
        return list(self._named)

    @property
    def num_params(self) -> int:
        """Number of scalar parameters."""
        return int(self.params.size)

    @property
    def nbytes(self) -> int:
        """Bytes of the parameter buffer (the gradient buffer is the same size)."""
        return int(self.params.nbytes)

    def forward(self, x: Any, train: bool = True, hook: Callable[[int], None] | None = None) -> Any:
        """The model's output for the 2-D batch *x* (moved to the model's array module and dtype if needed).

        ``hook(i)``, when given, is called just before layer ``i``'s forward, for
        every layer in order 0 … n-1 (as :meth:`backward`'s after each layer): a
        sharded strategy gathers the layer's parameters there.
        """
        if hook is not None and not callable(hook):
            raise TypeError(f"hook must be callable as hook(layer_index), got {hook!r}")
        if array_module(x) is not self.xp:
            x = self.xp.asarray(to_host(x))
        if x.dtype != self.dtype:
            x = x.astype(self.dtype)
        key = tuple(int(k) for k in self.rng_key)
        for i, layer in enumerate(self.layers):
            layer.key = (self.seed, i, *key)
            if hook is not None:
                hook(i)
            x = layer.forward(x, train)
        return x

    def backward(self, dy: Any, hook: Callable[[int], None] | None = None) -> None:
        """Back-propagate *dy* through the layers in reverse, accumulating into :attr:`grads`.

        After layer ``i``'s backward, when its parameter gradients are final,
        ``hook(i)`` is called: for every layer (parameterless ones too), in the
        order n-1 … 0, so a communication hook can launch a bucket the moment its
        last layer is done. The first layer's input gradient is not computed.
        """
        if hook is not None and not callable(hook):
            raise TypeError(f"hook must be callable as hook(layer_index), got {hook!r}")
        for i in range(len(self.layers) - 1, -1, -1):
            dy = self.layers[i].backward(dy, need_input_grad=i > 0)
            if hook is not None:
                hook(i)

    def zero_grad(self) -> None:
        """Zero the gradient buffer in place (the layers' views stay bound)."""
        self.grads.fill(0)

    def load_params(self, flat: Any) -> None:
        """Copy a flat host or device array of :attr:`num_params` values into :attr:`params` (in place)."""
        size = getattr(flat, "size", None)
        if size is None:
            raise TypeError(f"load_params takes a NumPy or CuPy array, got {type(flat).__name__}")
        if size != self.num_params:
            raise ValueError(f"load_params got {size} values but the model has {self.num_params} parameters; "
                             f"pass the flat vector saved from a model of the same architecture")
        if array_module(flat) is not self.xp:
            flat = self.xp.asarray(to_host(flat))
        self.params[...] = flat.reshape(-1)

    def __repr__(self) -> str:
        inner = ", ".join(repr(layer) for layer in self.layers)
        return f"Sequential([{inner}], dtype={self.dtype}, params={self.num_params})"


def mlp(sizes: list[int], *, activation: str = "relu", layernorm: bool = False, dropout: float = 0.0,
        dtype: Any = np.float32, xp: ModuleType = np, seed: int = 0) -> Sequential:
    """A multilayer perceptron: ``Linear, [LayerNorm], activation, [Dropout]`` per hidden layer, then ``Linear``.

    ``sizes = [in, hidden..., out]``; the last Linear has nothing after it (it
    produces logits). Dropout layers are added only when ``dropout > 0``.
    """
    sizes = list(sizes)
    if len(sizes) < 2:
        raise ValueError(f"mlp needs at least 2 sizes (inputs and outputs), got {sizes}")
    for s in sizes:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s <= 0:
            raise ValueError(f"mlp sizes must be positive ints, got {sizes}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; choose one of "
                         f"{', '.join(repr(a) for a in ACTIVATIONS)}")
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float, np.floating)) or not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be a probability in [0, 1), got {dropout!r}")
    layers: list[Layer] = []
    for a, b in zip(sizes[:-2], sizes[1:-1]):
        layers.append(Linear(a, b))
        if layernorm:
            layers.append(LayerNorm(b))
        layers.append(ACTIVATIONS[activation]())
        if dropout > 0:
            layers.append(Dropout(dropout))
    layers.append(Linear(sizes[-2], sizes[-1]))
    return Sequential(layers, dtype=dtype, xp=xp, seed=seed)
