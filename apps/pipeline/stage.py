"""One stage of the pipeline: its layers, their flat parameters, and the activations of micro-batches in flight.

A stage runs ``forward(mb, x)``, ``backward(mb, dy)`` (B), or the split pair
``backward_input(mb, dy)`` (I) and ``backward_weight(mb)`` (W), for any order
of micro-batches a schedule gives. Between a micro-batch's forward and its
backward the layers' saved activations (:meth:`apps.nn.Layer.stash`) are kept
by one of three strategies (the course notes' three answers to activation
memory):

``store``
    keep them, in this rank's memory, until the backward (fastest, most memory);
``recompute``
    keep only the stage's input; the backward runs the forward again to rebuild
    them (about one more forward per micro-batch, least memory; torchgpipe's
    checkpointing, Megatron's full recompute);
``offload``
    pack them into one byte buffer and write it into a slot of another rank's
    memory (its RMA window, or its piece of a node-shared window when both
    ranks share a node), read it back for the backward: this rank holds none
    of them in between (:mod:`apps.pipeline.offload`: the partner is the next
    rank of the pipeline, and the parking rank's planned peak in flight sets
    the number of slots). :meth:`Stage.prefetch` starts reading a parked
    micro-batch back before its backward (the executor calls it for the next
    backward of its row).

For the zero-bubble split, I keeps, per parameter layer, its saved input and
the gradient of its output until W has used them. With ``recompute`` I first
rebuilds the activations (or with ``offload`` fetches them back), so between I
and W the stage holds what store would; recompute saves the interval from F to I.

Memory is accounted, per rank in a :class:`Meter` all its stages report to, as
the bytes of the arrays each strategy holds for micro-batches in flight, with
its peak (for recompute: the inputs kept plus the rebuilt activations of the
micro-batch whose backward runs; for offload: the micro-batches fetched back
or being prefetched, from the moment their fetch starts),
and the peak number of micro-batches in flight.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from apps.nn import Layer, Sequential

__all__ = ["Stage", "STRATEGIES", "Meter"]

#: ``--activations`` choices.
STRATEGIES = ("store", "recompute", "offload")


def _nbytes(*values: Any) -> int:
    """Bytes of the distinct arrays in *values* (nested tuples/lists; an array held twice counts once)."""
    seen: dict[int, int] = {}

    def walk(v: Any) -> None:
        if isinstance(v, (tuple, list)):
            for item in v:
                walk(item)
        elif v is not None:
            seen[id(v)] = int(getattr(v, "nbytes", 0))

    walk(values)
    return sum(seen.values())


class Meter:
    """Activation memory of one rank over all its stages: bytes held and micro-batches in flight, with peaks.

    Every :class:`Stage` of a rank reports to the same meter, so an interleaved
    rank's peak is that of its chunks together, transients included.
    """

    def __init__(self) -> None:
        self.held = self.peak_bytes = self.live = self.peak_micro = 0

    def add(self, delta: int) -> None:
        self.held += delta
        self.peak_bytes = max(self.peak_bytes, self.held)

    def count(self, delta: int) -> None:
        self.live += delta
        self.peak_micro = max(self.peak_micro, self.live)

    def reset(self) -> None:
        """Start new peaks from what is held now (at a step's start)."""
        self.peak_bytes, self.peak_micro = self.held, self.live


class Stage:
    """Stage *index*: *layers* (global layer numbers *numbers*) with their own flat parameter and gradient buffers."""

    def __init__(self, index: int, layers: list[Layer], numbers: list[int], values: dict[int, dict[str, np.ndarray]],
                 *, dtype: Any = np.float64, seed: int = 0, strategy: str = "store", meter: Meter | None = None,
                 xp: Any = np) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"--activations {strategy!r}: choose one of {', '.join(STRATEGIES)}")
        if not layers or len(numbers) != len(layers):
            raise ValueError(f"a stage needs at least one layer and one global number per layer, got {len(layers)} "
                             f"layers and {len(numbers)} numbers")
        self.meter = meter if meter is not None else Meter()
        self.index = index
        self.numbers = list(numbers)
        self.first_layer = self.numbers[0] == 0
        self.model = Sequential(layers, dtype=dtype, seed=seed, xp=xp)
        self.xp = xp
        self.layers = self.model.layers
        flat = np.concatenate([np.asarray(values[n][name], dtype=np.float64).reshape(-1)
                               for n, layer in zip(self.numbers, self.layers) for name in layer.param_shapes()]
                              or [np.empty(0)])
        self.model.load_params(flat)
        self.seed = seed
        self.strategy = strategy
        self.offload: Any = None  # an Offload when the strategy is offload
        self._kept: dict[int, Any] = {}  # micro-batch -> what the strategy holds
        self._wgrad: dict[int, list[tuple[int, tuple[Any, ...], Any]]] = {}  # I → W: (layer, stash, dy)
        self._bytes: dict[int, int] = {}
        self._in_flight: set[int] = set()

    # ------------------------------------------------------------ accounting

    def _account(self, mb: int, nbytes: int) -> None:
        self.meter.add(nbytes - self._bytes.get(mb, 0))
        if nbytes:
            self._bytes[mb] = nbytes
        else:
            self._bytes.pop(mb, None)

    def _live(self, mb: int, alive: bool) -> None:
        if alive and mb not in self._in_flight:
            self._in_flight.add(mb)
            self.meter.count(1)
        elif not alive and mb in self._in_flight:
            self._in_flight.discard(mb)
            self.meter.count(-1)

    @property
    def held(self) -> int:
        """Bytes this stage holds for its micro-batches in flight (the meter sums the rank's stages)."""
        return sum(self._bytes.values())

    @property
    def in_flight(self) -> int:
        """Micro-batches whose forward ran here and whose gradient pass (B, or W) has not."""
        return len(self._in_flight)

    # ------------------------------------------------------------ passes

    def _run_forward(self, x: Any, key: tuple[int, ...]) -> Any:
        for n, layer in zip(self.numbers, self.layers):
            layer.key = (self.seed, n, *key)
            x = layer.forward(x, True)
        return x

    def _stash(self) -> list[tuple[Any, ...]]:
        return [layer.stash() for layer in self.layers]

    def _restore(self, mb: int) -> None:
        kept = self._kept.pop(mb)
        if self.strategy == "store":
            stash = kept
        elif self.strategy == "recompute":
            x, key = kept
            self._run_forward(x, key)
            # the rebuilt activations are held until this backward ends: count them in the peak
            self._account(mb, _nbytes(x, [[getattr(layer, n) for n in layer.saved] for layer in self.layers]))
            return
        else:
            stash = self.offload.fetch((self.index, mb), len(self.layers))
            self._account(mb, _nbytes(stash))  # fetched back: held here until this backward ends
        for layer, values in zip(self.layers, stash):
            layer.unstash(values)

    def prefetch(self, mb: int) -> None:
        """Start reading micro-batch *mb*'s offloaded activations back, if parked (a no-op for store, recompute)."""
        if self.strategy == "offload" and self.offload is not None:
            started = self.offload.prefetch((self.index, mb))
            if started:
                self._account(mb, started)  # held from now on: the buffer the fetch fills

    def forward(self, mb: int, x: Any, key: tuple[int, ...]) -> Any:
        """The stage's output for micro-batch *mb*; its activations are kept by the strategy."""
        y = self._run_forward(x, key)
        stash = self._stash()
        if self.strategy == "store":
            self._kept[mb] = stash
            self._account(mb, _nbytes(stash))
        elif self.strategy == "recompute":
            self._kept[mb] = (x, key)
            self._account(mb, _nbytes(x))
        else:
            if self.offload is None:
                raise RuntimeError("the offload strategy needs Stage.offload set (the partner's window)")
            self.offload.park((self.index, mb), stash)
            self._kept[mb] = None
        self._live(mb, True)
        return y

    def backward(self, mb: int, dy: Any, hook: Callable[[int], None] | None = None) -> Any:
        """B: input and parameter gradients of micro-batch *mb*; ``hook(i)`` after layer i (for gradient buckets)."""
        self._restore(mb)
        for i in range(len(self.layers) - 1, -1, -1):
            need = not (self.first_layer and i == 0)
            dy = self.layers[i].backward(dy, need)
            if hook is not None:
                hook(i)
        self._account(mb, 0)
        self._live(mb, False)
        return dy

    def backward_input(self, mb: int, dy: Any) -> Any:
        """I: the input gradient only; keeps each parameter layer's input and output gradient for W."""
        self._restore(mb)
        keep = []
        for i in range(len(self.layers) - 1, -1, -1):
            layer = self.layers[i]
            if layer.param_shapes():
                keep.append((i, layer.stash(), dy))
                layer.unstash(keep[-1][1])
            if self.first_layer and i == 0:
                break
            dy = layer.backward_input(dy)
        for layer in self.layers:
            layer.stash()  # drop what W does not need
        self._wgrad[mb] = keep
        self._account(mb, sum(_nbytes(s) + _nbytes(d) for _, s, d in keep))
        return None if self.first_layer else dy

    def backward_weight(self, mb: int, hook: Callable[[int], None] | None = None) -> None:
        """W: the parameter gradients of micro-batch *mb* from what I kept; ``hook(i)`` for every layer, n−1 … 0."""
        keep = {i: (stash, dy) for i, stash, dy in self._wgrad.pop(mb)}
        for i in range(len(self.layers) - 1, -1, -1):
            if i in keep:
                stash, dy = keep[i]
                self.layers[i].unstash(stash)
                self.layers[i].backward_weight(dy)
                self.layers[i].stash()
            if hook is not None:
                hook(i)
        self._account(mb, 0)
        self._live(mb, False)

    def stash_bytes(self, rows: int, key: tuple[int, ...] = (0,)) -> int:
        """Bytes of the activations one micro-batch of *rows* rows leaves here (a dry forward; collective with T > 1)."""
        x = self.xp.zeros((rows, self._in_features()), dtype=self.model.dtype)
        self._run_forward(x, key)
        return _nbytes(self._stash())

    def _in_features(self) -> int:
        first = self.layers[0]
        return int(first.in_features)

    @property
    def out_features(self) -> int:
        for layer in reversed(self.layers):
            if hasattr(layer, "out_features"):
                return int(layer.out_features)
        raise ValueError("a stage needs at least one Linear layer")

    @property
    def in_features(self) -> int:
        return self._in_features()
