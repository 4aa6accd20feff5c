"""ZeRO stages 1 and 2 (Rajbhandari et al., 2019): optimizer state, then gradients, sharded over the ranks.

The flat parameter buffer is cut into p contiguous shards (near-equal, by
:func:`apps.blocks.blocks`); rank r owns shard r. Each step:

* ``zero1`` - backward as usual into the full gradient buffer; then one
  **reduce-scatter** (instead of an all-reduce) leaves on rank r the averaged
  gradient of its shard only; rank r applies the optimizer to its shard with the
  optimizer state of its shard only (the Adam moments: 8Ψ/p bytes instead of
  8Ψ); then an **all-gather** of the updated shards gives every rank the whole
  new parameter vector. Reduce-scatter + all-gather move what one all-reduce
  moves, so the memory saving is free in bytes.
* ``zero2`` - the reduce-scatter goes bucket by bucket *during* backward (as
  DDP's all-reduce does), straight into this rank's gradient shard; what a rank
  keeps of the reduced gradients is its shard (4Ψ/p).

Memory per rank with fp32 Adam (Ψ parameters, p ranks): no ZeRO 16Ψ (4 params +
4 grads + 8 optimizer), zero1 8Ψ + 8Ψ/p, zero2 4Ψ + 12Ψ/p. Here the layer library
writes every gradient into its one flat buffer during backward, so zero2 still
holds that full buffer as backward's scratch; :meth:`Zero.memory` reports it
separately from the kept shard.
"""

from __future__ import annotations

import time
from typing import Any

from mpi4py import MPI
from mpi4py.util import dtlib

import mpicomm
from apps.blocks import blocks
from apps.nn.xp import array_module
from apps.sgd.buckets import Bucket
from apps.sgd.ddp import DDP, Reducer, _as, _state_bytes

__all__ = ["Zero", "ShardReducer"]


class ShardReducer(Reducer):
    """Reduce-scatters each bucket into this rank's gradient shard (ZeRO-2) instead of all-reducing it."""

    def __init__(self, comm: Any, model: Any, grad_shard: Any, **options: Any):
        if options.get("compress"):
            raise ValueError("--compress applies to ddp's all-reduce; zero1/zero2 reduce in the model's dtype")
        super().__init__(comm, model, **options)
        p, rank = comm.Get_size(), comm.Get_rank()
        counts, displs = blocks(model.num_params, p)
        self._lo = displs[rank]
        self.grad_shard = grad_shard
        # Per bucket: how many of its elements each rank owns, and where this rank's land in its shard.
        self._counts: list[list[int]] = []
        self._views: list[tuple[int, int]] = []
        for b in self.buckets:
            parts = [max(0, min(b.stop, d + c) - max(b.start, d)) for c, d in zip(counts, displs)]
            self._counts.append(parts)
            lo = max(b.start, displs[rank])
            self._views.append((lo - self._lo, lo - self._lo + parts[rank]))

    def _start(self, bucket: Bucket, wire: Any) -> Any:
        a, b = self._views[bucket.index]
        return mpicomm.ireduce_scatter(wire, self._counts[bucket.index], out=self.grad_shard[a:b],
                                       algorithm=self.algorithm, comm=self.comm)


class Zero(DDP):
    """``zero1`` / ``zero2``: DDP's step with sharded optimizer state (and, at stage 2, sharded gradients)."""

    def __init__(self, comm: Any, model: Any, optimizer: Any, *, stage: int, **options: Any):
        if stage not in (1, 2):
            raise ValueError(f"ZeRO stage {stage}: this application implements stages 1 and 2")
        self.stage = stage
        self.name = f"zero{stage}"
        p, rank = comm.Get_size(), comm.Get_rank()
        self.counts, self.displs = blocks(model.num_params, p)
        self.lo, self.hi = self.displs[rank], self.displs[rank] + self.counts[rank]
        self.grad_shard = array_module(model.params).zeros(self.hi - self.lo, model.params.dtype)
        self._datatype = None
        super().__init__(comm, model, optimizer, **options)

    def make_reducer(self, **options: Any) -> Reducer:
        if self.stage == 2:
            return ShardReducer(self.comm, self.model, self.grad_shard, **options)
        if options.get("compress"):
            raise ValueError("--compress applies to ddp's all-reduce; zero1/zero2 reduce in the model's dtype")
        # Stage 1 reduces after backward, in one reduce-scatter: no bucket collectives during it.
        return _NoReducer(self.comm, self.model, **{**options, "overlap": False})

    def make_state(self) -> dict[str, Any]:
        return self.optimizer.init_state(self.hi - self.lo, self.xp, self.model.params.dtype)

    def update(self) -> float:
        model = self.model
        t0 = time.perf_counter()
        if self.stage == 1:
            grads = model.grads
            if self.reducer.divisor != 1:
                grads *= 1.0 / self.reducer.divisor
            mpicomm.reduce_scatter(grads, self.counts, out=self.grad_shard, algorithm=self.algorithm,
                                   comm=self.comm)
        t1 = time.perf_counter()
        self.optimizer.step(model.params[self.lo:self.hi], self.grad_shard, self.state)
        t2 = time.perf_counter()
        self._allgather()
        return (t1 - t0) + (time.perf_counter() - t2)

    def _allgather(self) -> None:
        """Every rank's updated shard to every rank, in place in the flat parameter buffer."""
        params = self.model.params
        if self._datatype is None:
            self._datatype = dtlib.from_numpy_dtype(params.dtype)
        self.comm.Allgatherv(MPI.IN_PLACE, [params, self.counts, self.displs, self._datatype],
                             algorithm=self.algorithm)

    def memory(self) -> dict[str, int]:
        kept = int(self.grad_shard.nbytes)
        scratch = int(self.model.grads.nbytes)
        return {"params": int(self.model.params.nbytes),
                "grads": kept + (scratch if self.stage == 1 else 0),
                "grads_scratch": scratch if self.stage == 2 else 0,
                "optimizer": _state_bytes(self.state)}

    def full_state(self) -> dict[str, Any]:
        """Every rank's optimizer shard gathered into whole vectors (collective)."""
        whole: dict[str, Any] = {}
        for key, value in self.state.items():
            if key == "step":
                whole[key] = value
                continue
            whole[key] = mpicomm.allgatherv(value, self.counts, comm=self.comm)
        return whole

    def load_full_state(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            part = value if key == "step" else value[self.lo:self.hi]
            self.state[key][...] = _as(self.state[key], part)


class _NoReducer(Reducer):
    """Stage 1: no collective per bucket; remembers the divisor for the reduce-scatter after backward."""

    divisor = 1

    def begin(self, divisor: int) -> None:
        super().begin(divisor)
        self.divisor = divisor

    def hook(self, layer: int) -> None:
        pass

    def finish(self) -> float:
        return 0.0
