"""ZeRO stage 3 (Rajbhandari et al., 2019): the parameters sharded too, each layer all-gathered just in time.

Rank r keeps shard r of the flat parameters (the cut of :mod:`apps.sgd.zero`,
:func:`apps.blocks.blocks`), its gradient shard and its optimizer-state shard;
no array of Ψ elements stays alive between steps. Each micro-batch:

* forward - the model's forward hook before every layer with parameters
  (:attr:`apps.sgd.ddp.DDP.forward_hook`; DeepSpeed registers one on every
  module) waits for that layer's **nonblocking
  all-gather** (mpicomm's ``Iallgatherv``) and starts the next layer's, so
  layer j + 1 is gathered while layer j computes;
* backward - the layers are gathered again, in reverse: before the backward of
  layer j its gather is waited for and layer j − 1's started (:class:`GatherReducer`
  does it in the backward hook of the layer after j - the model's only hook).
  Gradients are reduce-scattered per bucket into this rank's gradient shard
  exactly as zero2 does (:class:`apps.sgd.zero.ShardReducer`);
* the optimizer updates the shard. No all-gather after it: the next forward gathers.

Layer j (counting the layers with parameters) lives in gather buffer j mod 2,
sized for the largest of its layers, its parameter views bound there once
(as zero2's bucket buffers hold gradients): two layers at a time, the one
computing and the one in flight. Layer j + 2 takes the buffer over once
layer j has computed::

    forward of layer     0            1            2
    buffer 0             layer 0  →   (free)       layer 2 (gathered during 1)
    buffer 1             (gathering)  layer 1  →   (gathering 3)

``overlap=False`` (``--no-overlap``) gathers each layer only when it is
needed, as it reduces each bucket only after backward.

Bytes per micro-batch: two all-gathers of the Ψ parameters and one
reduce-scatter of the Ψ gradients, 3(p − 1)/p · sΨ per rank with the ring
algorithms - 1.5× ddp's all-reduce (:attr:`Zero3.gathered` counts the gathered
elements, 2Ψ per micro-batch).

Memory per rank between steps (:meth:`Zero3.memory`; s bytes per value, k
optimizer vectors): (k + 2)sΨ/p + sL + sB [+ sA] - fp32 Adam 16Ψ/p + 4L + 4B:
the parameter shard, the gradient shard and the optimizer shard, L elements of
the two gather buffers, B of zero2's bucket buffers (and A accumulation parts
with ``--accumulate``).

Outside the steps (evaluation, checkpoints, the final model) :meth:`Zero3.whole`
gathers the whole vector into ``model.params`` on one rank or all - a
collective every rank enters.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from mpi4py.util import dtlib

import mpicomm
from apps.nn.xp import array_module
from apps.sgd.ddp import _as, _state_bytes
from apps.sgd.zero import ShardReducer, Zero

__all__ = ["Zero3", "LayerGather", "GatherReducer"]


class LayerGather:
    """The plan of the per-layer all-gathers: which layers have parameters, the buffers, each rank's part.

    *counts*, *displs*: the shards of the flat parameter vector. Layer j's
    gather receives into buffer j mod 2 from every rank the part of the
    layer's range ``[a, b)`` that rank holds (zero elements from most ranks).
    """

    def __init__(self, comm: Any, model: Any, counts: list[int], displs: list[int], *, prefetch: bool = True,
                 algorithm: str = "auto"):
        self.comm = comm
        self.prefetch = prefetch
        self.algorithm = algorithm
        rank = comm.Get_rank()
        lo = displs[rank]
        #: Model indices of the layers with parameters (layer j of the gathers is model layer ``layers[j]``).
        self.layers = [i for i, (a, b) in enumerate(model.layer_ranges) if b > a]
        self.number = {layer: j for j, layer in enumerate(self.layers)}
        self.ranges = [model.layer_ranges[i] for i in self.layers]
        self.slots = min(2, len(self.layers))
        xp, dtype = array_module(model.params), model.params.dtype
        self.buffers = [xp.empty(max(b - a for a, b in self.ranges[s::self.slots]), dtype)
                        for s in range(self.slots)]
        self._datatype = dtlib.from_numpy_dtype(dtype)
        self._plan: list[tuple[int, int, list[int], list[int]]] = []  # per layer: send [c, d) of the shard, counts, displs
        for a, b in self.ranges:
            parts = [max(0, min(b, d + c) - max(a, d)) for c, d in zip(counts, displs)]
            starts = [min(max(a, d), b) - a for d in displs]
            mine = max(a, lo) - lo if parts[rank] else 0
            self._plan.append((mine, mine + parts[rank], parts, starts))
        self.shard: Any = None  # this rank's parameter shard, set by Zero3
        self._requests: dict[int, Any] = {}
        self.gathered = 0  # elements gathered (each layer's whole size), since construction

    @property
    def nbytes(self) -> int:
        return sum(int(b.nbytes) for b in self.buffers)

    def buffer_of(self, j: int) -> Any:
        """Layer j's place in its gather buffer."""
        a, b = self.ranges[j]
        return self.buffers[j % self.slots][:b - a]

    def start(self, j: int) -> None:
        """Start layer j's nonblocking all-gather into its buffer (once; no-op if running or j is out of range)."""
        if 0 <= j < len(self.layers) and j not in self._requests:
            c, d, parts, starts = self._plan[j]
            self._requests[j] = self.comm.Iallgatherv(self.shard[c:d], [self.buffer_of(j), parts, starts,
                                                                        self._datatype], algorithm=self.algorithm)
            self.gathered += self.ranges[j][1] - self.ranges[j][0]

    def need(self, j: int, step: int) -> float:
        """Layer j is about to compute: start its gather if not running, wait for it, and prefetch layer j + *step*
        (+1 in forward, −1 in backward) into the other buffer, which the layer before j has released.
        Returns the seconds waited."""
        self.start(j)
        t0 = time.perf_counter()
        request = self._requests.pop(j)
        if not request.Test():
            request.Wait()
        waited = time.perf_counter() - t0
        if self.prefetch:
            self.start(j + step)
        return waited


class GatherReducer(ShardReducer):
    """zero2's reducer plus the backward gathers: the last layer before backward starts, layer j − 1 in the hook
    after layer j (the model's backward calls hooks after a layer, never before one)."""

    def __init__(self, comm: Any, model: Any, grad_shard: Any, gather: LayerGather, **options: Any):
        super().__init__(comm, model, grad_shard, **options)
        self.gather = gather

    def backward_starts(self) -> None:
        self._need(len(self.model.layers) - 1)
        super().backward_starts()

    def hook(self, layer: int) -> None:
        super().hook(layer)
        if layer > 0:
            self._need(layer - 1)

    def _need(self, layer: int) -> None:
        j = self.gather.number.get(layer)
        if j is not None:
            self.stalled += self.gather.need(j, -1)


class Zero3(Zero):
    """``zero3``: zero2's sharded gradients and optimizer state, and only a shard of the parameters between uses."""

    stages = (3,)

    def __init__(self, comm: Any, model: Any, optimizer: Any, **options: Any):
        super().__init__(comm, model, optimizer, stage=3, **options)
        # The broadcast parameters (DDP's constructor): keep this rank's shard, then free the flat vector.
        self.num_params = model.num_params
        self.param_shard = model.params[self.lo:self.hi].copy()
        self.layer_gather.shard = self.param_shard
        self.is_whole: bool = False  # model.params holds the whole vector (see whole())
        self._release()

    def make_reducer(self, **options: Any) -> GatherReducer:
        counts, displs = self.counts, self.displs
        self.layer_gather = LayerGather(self.comm, self.model, counts, displs, prefetch=options.get("overlap", True),
                                        algorithm=self.algorithm)
        return GatherReducer(self.comm, self.model, self.grad_shard, self.layer_gather, **options)

    def forward_hook(self, layer: int) -> None:  # type: ignore[override]  # (a method where DDP has None)
        """Before *layer*'s forward in a step: its parameters gathered, the next layer's on their way."""
        j = self.layer_gather.number.get(layer)
        if j is not None and not self.is_whole:
            self.reducer.stalled += self.layer_gather.need(j, +1)

    @property
    def gathered(self) -> int:
        """Parameter elements all-gathered so far (2Ψ per micro-batch: forward and backward)."""
        return self.layer_gather.gathered

    def update(self) -> float:
        self.optimizer.step(self.param_shard, self.grad_shard, self.state)
        return 0.0

    def idle_step(self, divisor: int) -> None:
        """A joined rank's step: every gather and reduce-scatter of the working ranks, in their order, on zeros."""
        for k in range(self.accumulate):
            self.reducer.begin(divisor, add=k > 0)
            self.idle_pass()
            self.reducer.finish()
        self.update()

    def idle_pass(self) -> None:
        """A forward and backward without a micro-batch: every layer's gathers and every bucket's hooks, in the
        working ranks' order (the buckets keep zeros)."""
        gather, reducer = self.layer_gather, self.reducer
        for j in range(len(gather.layers)):
            gather.need(j, +1)
        reducer.backward_starts()
        for i in range(len(self.model.layers) - 1, -1, -1):
            reducer.hook(i)

    # ------------------------------------------------------------ the whole vector, outside the steps

    def _bind(self, flat: Any, offset: int, layers: list[int]) -> None:
        """Point the parameter views of model *layers* into *flat* (element ``offset`` of the model's flat layout at 0)."""
        for name, start, stop, shape in self.model.named_parameters():
            i, key = name.split(".", 1)
            if int(i) in layers:
                self.model.layers[int(i)].params[key] = flat[start - offset:stop - offset].reshape(shape)

    def _release(self) -> None:
        """Back to the shard: no flat vector, each layer's views in its gather buffer."""
        self.is_whole = False
        self.model.params = self.xp.zeros(0, self.param_shard.dtype)
        gather = self.layer_gather
        for j, i in enumerate(gather.layers):
            self._bind(gather.buffer_of(j), gather.ranges[j][0], [i])

    def gather_params(self, root: int | None = None) -> None:
        """The whole parameter vector in ``model.params``, layers bound to it, on *root* (None: every rank).

        Collective. Until :meth:`release_params`, the model computes on it
        without gathering (evaluation, a checkpoint, the final model).
        """
        if root is None:
            full = mpicomm.allgatherv(self.param_shard, self.counts, comm=self.comm, algorithm=self.algorithm)
        else:
            full = mpicomm.gatherv(self.param_shard, self.counts, root, comm=self.comm)
        self.is_whole = True
        if full is not None:
            self.model.params = full
            self._bind(full, 0, list(range(len(self.model.layers))))

    def release_params(self) -> None:
        """Drop the whole vector :meth:`gather_params` made."""
        self._release()

    @contextmanager
    def whole(self, root: int | None = None) -> Iterator[None]:
        """:meth:`gather_params` for the block, :meth:`release_params` after it (collective)."""
        self.gather_params(root)
        try:
            yield
        finally:
            self.release_params()

    def load_params(self, flat: Any) -> None:
        """Take this rank's shard of a whole parameter vector (from a checkpoint)."""
        if flat.size != self.num_params:
            raise ValueError(f"load_params got {flat.size} values but the model has {self.num_params} parameters; "
                             f"pass the flat vector saved from a model of the same architecture")
        self.param_shard[...] = _as(self.param_shard, flat.reshape(-1)[self.lo:self.hi])

    # ------------------------------------------------------------ memory

    def _memory(self) -> dict[str, int]:
        """Parameter shard, the two gather buffers (``param_layers``), gradient shard, zero2's bucket buffers,
        optimizer shard."""
        reducer: Any = self.reducer  # a GatherReducer
        return {"params": int(self.param_shard.nbytes), "param_layers": self.layer_gather.nbytes,
                "grads": int(self.grad_shard.nbytes), "grad_buckets": reducer.buffer_bytes,
                "optimizer": _state_bytes(self.state)}

    def _formula(self) -> tuple[str, str, int]:
        """(k + 2)sΨ/p + sL + sB [+ sA] (the terms: the module docstring)."""
        s, k = self.param_shard.itemsize, len(self.optimizer.state_names)
        shard, gather = self.hi - self.lo, self.layer_gather
        layers = sum(int(b.size) for b in gather.buffers)
        text = f"{(k + 2) * s}Ψ/p + {s}L"
        where = (f"Ψ = {self.num_params:,}, Ψ/p = {shard:,} on rank {self.rank} of p = {self.world}, "
                 f"L = {layers:,} in {gather.slots} layer buffers")
        more_text, more_where, more = self.bucket_terms()
        return text + more_text, where + more_where, (k + 2) * s * shard + s * layers + more
