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
* ``zero2`` - no full gradient buffer. Backward writes each bucket
  (:mod:`apps.sgd.buckets`) into one of S reused bucket buffers; the backward
  hook that completes the bucket starts its **nonblocking reduce-scatter**
  (mpicomm's) straight into this rank's gradient shard, as DDP starts its
  all-reduce, and the buffer is taken over by bucket b + S once that
  reduce-scatter has completed (:func:`apps.sgd.buckets.in_flight`). With
  ``--accumulate K`` every micro-batch is reduced this way and the shard sums
  them (DeepSpeed's ZeRO-2 does the same): no_sync would need the full buffer.

Stage 3, the parameters sharded too, is :mod:`apps.sgd.zero3` (this class with per-layer gathers).

Memory per rank between steps, as :meth:`Zero.memory` counts it (s bytes per
value, k optimizer vectors - fp32 Adam: s = 4, k = 2 -, Ψ parameters, Ψ/p this
rank's shard, :func:`apps.blocks.block` rounding it): ddp (2 + k)sΨ = 16Ψ;
zero1 2sΨ + (k + 1)sΨ/p = 8Ψ + 12Ψ/p (the full gradient, and the reduced shard
beside it); zero2 sΨ + (k + 1)sΨ/p + sB = 4Ψ + 12Ψ/p + 4B, where B is the
elements of the S bucket buffers (:func:`apps.sgd.buckets.buffer_sizes`) - the
buckets in flight. B < Ψ once the model has more buckets than S; with one
bucket (the default 25 MiB cap on a small model) B = Ψ and zero2 saves only the
optimizer state. :meth:`DDP.memory_formula` computes these from Ψ, p and the
bucket plan, not from the buffers, so a run can print both.
"""

from __future__ import annotations

import time
from typing import Any

from mpi4py import MPI
from mpi4py.util import dtlib

import mpicomm
from apps.blocks import blocks
from apps.nn.xp import array_module
from apps.sgd.buckets import Bucket, buffer_sizes, in_flight
from apps.sgd.ddp import DDP, Reducer, _as, _state_bytes, parameters_of

__all__ = ["Zero", "ShardReducer"]


class ShardReducer(Reducer):
    """ZeRO-2's reducer: each bucket lives in a reused buffer and is reduce-scattered into this rank's gradient shard.

    Takes the model's flat gradient buffer away (its ``grads`` becomes empty):
    every layer's gradient views point into the buffer of their bucket, b % S,
    for good. Each backward *opens* bucket b just before its highest layer's
    backward: waits until the buffer's previous bucket has completed its
    reduce-scatter (backward stalls there, counted in :attr:`stalled`), then
    zeroes it.
    """

    every_micro_batch = True

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
        # The reused bucket buffers; each bucket's parameters (and shapes); the buckets opened before each layer.
        self.slots = in_flight(self.buckets, overlap=self.overlap)
        xp, dtype = array_module(model.grads), model.grads.dtype
        self._buffers = [xp.zeros(n, dtype) for n in buffer_sizes(self.buckets, self.slots)]
        self._parts: list[Any] = [None] * self.slots  # accumulation: where a later micro-batch's shard part lands
        self._holder: list[int | None] = [None] * self.slots  # the bucket each buffer holds until its reduce-scatter ends
        where = {param.name: param for param in parameters_of(model)}
        shapes = {name: shape for name, _, _, shape in model.named_parameters()}
        self._members = [[(where[n], shapes[n]) for n in b.names] for b in self.buckets]
        self._opens: list[list[int]] = [[] for _ in model.layers]
        for b in self.buckets:
            self._opens[b.written_from].append(b.index)
        self._opened = 0
        self._add = False
        for b in self.buckets:  # a parameter always lands in the same buffer: bind once, then free the flat buffer
            self._bind(b)
        model.grads = xp.zeros(0, dtype)

    def part_sizes(self) -> list[int]:
        """Elements of each buffer's accumulation part: this rank's largest share of the buffer's buckets."""
        rank = self.comm.Get_rank()
        return [max(self._counts[i][rank] for i in range(s, len(self.buckets), self.slots))
                for s in range(self.slots)]

    @property
    def buffer_bytes(self) -> int:
        """Bytes of the bucket buffers (and of the accumulation parts, once a step has used them)."""
        return sum(int(b.nbytes) for b in self._buffers) + sum(0 if a is None else int(a.nbytes) for a in self._parts)

    def begin(self, divisor: int, add: bool = False, micro: tuple[int, int] | None = None) -> None:
        super().begin(divisor, add, micro)
        self._add = add
        self._opened = 0
        self._open_through(self._opens[-1])

    def hook(self, layer: int) -> None:
        """Launch what *layer* completes (:meth:`Reducer.hook`), then open the buckets the next layer writes."""
        super().hook(layer)
        if layer > 0:
            self._open_through(self._opens[layer - 1])

    def bucket_grad(self, bucket: Bucket) -> Any:
        if self._opened <= bucket.index:  # launched without backward having written it (a joined rank): zeros
            self._open_through([bucket.index])
        return self._buffers[bucket.index % self.slots][:bucket.size]

    def _open_through(self, indices: list[int]) -> None:
        """Open buckets up to the last of *indices*, in order: take over each one's buffer and zero it."""
        for index in range(self._opened, (indices[-1] + 1) if indices else 0):
            slot = index % self.slots
            while self._holder[slot] is not None:  # the previous bucket of this buffer is still reducing
                if not self._pending:
                    raise RuntimeError(f"bucket {index} needs buffer {slot}, held by bucket {self._holder[slot]} "
                                       f"whose reduce-scatter has not started: in_flight() planned too few buffers")
                self.stalled += self._complete_oldest()
            self._holder[slot] = index
            self._buffers[slot][:self.buckets[index].size].fill(0)
            self._opened = index + 1

    def _bind(self, bucket: Bucket) -> None:
        """Point the layers' gradient views of *bucket*'s parameters into its buffer."""
        buffer = self._buffers[bucket.index % self.slots]
        for param, shape in self._members[bucket.index]:
            name = param.name.split(".", 1)[1]
            view = buffer[param.start - bucket.start:param.stop - bucket.start]
            self.model.layers[param.layer].grads[name] = view.reshape(shape)

    def _start(self, bucket: Bucket, wire: Any) -> Any:
        a, b = self._views[bucket.index]
        out = self.grad_shard[a:b]
        if self._add:  # a later micro-batch: reduce beside the shard, add it when done
            slot = bucket.index % self.slots
            if self._parts[slot] is None:
                self._parts[slot] = array_module(wire).empty(self.part_sizes()[slot], wire.dtype)
            out = self._parts[slot][:b - a]
        return mpicomm.ireduce_scatter(wire, self._counts[bucket.index], out=out, algorithm=self.algorithm,
                                       comm=self.comm)

    def _start_stacked(self, bucket: Bucket, stack: Any, wire: Any) -> Any:
        """A reproducible step's last pass: the reproducible sum of the bucket's rows, scattered into the shard."""
        a, b = self._views[bucket.index]
        return mpicomm.ireduce_scatter(stack, self._counts[bucket.index], out=self.grad_shard[a:b],
                                       algorithm=self.algorithm, comm=self.comm, stacked=True)

    def _done(self, bucket: Bucket) -> None:
        slot = bucket.index % self.slots
        if self._add:
            a, b = self._views[bucket.index]
            self.grad_shard[a:b] += self._parts[slot][:b - a]
        self._holder[slot] = None


class Zero(DDP):
    """``zero1`` / ``zero2``: DDP's step with sharded optimizer state (and, at stage 2, sharded gradients)."""

    #: The stages this class runs (stage 3: :class:`apps.sgd.zero3.Zero3`).
    stages: tuple[int, ...] = (1, 2)

    def __init__(self, comm: Any, model: Any, optimizer: Any, *, stage: int, **options: Any):
        if stage not in self.stages:
            raise ValueError(f"ZeRO stage {stage}: {type(self).__name__} runs stage(s) "
                             f"{', '.join(map(str, self.stages))}; stage 3 is apps.sgd.zero3.Zero3")
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
        if self.stage == 1 and self.micro_batches is not None:  # every pass's gradients, one reproducible sum
            mpicomm.reduce_scatter(self.reducer.stack, self.counts, out=self.grad_shard,  # type: ignore[attr-defined]
                                   algorithm=self.algorithm, comm=self.comm, stacked=True)
        elif self.stage == 1:
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

    def _memory(self) -> dict[str, int]:
        """Parameters, gradients (zero1: the full buffer and the shard; zero2: the shard), zero2's bucket
        buffers (``grad_buckets``), optimizer state."""
        kept = int(self.grad_shard.nbytes)
        if self.stage == 1:
            return {"params": int(self.model.params.nbytes), "grads": int(self.model.grads.nbytes) + kept,
                    "optimizer": _state_bytes(self.state)}
        return {"params": int(self.model.params.nbytes), "grads": kept,
                "grad_buckets": self.reducer.buffer_bytes, "optimizer": _state_bytes(self.state)}

    def _formula(self) -> tuple[str, str, int]:
        """zero1 2sΨ + (k + 1)sΨ/p, zero2 sΨ + (k + 1)sΨ/p + sB [+ sA] (the terms: the module docstring)."""
        s, k = self.model.params.itemsize, len(self.optimizer.state_names)
        psi, shard = self.model.num_params, self.hi - self.lo
        where = f"Ψ = {psi:,}, Ψ/p = {shard:,} on rank {self.rank} of p = {self.world}"
        if self.stage == 1:
            return f"{2 * s}Ψ + {(k + 1) * s}Ψ/p", where, 2 * s * psi + (k + 1) * s * shard
        text, more_where, more = self.bucket_terms()
        return f"{s}Ψ + {(k + 1) * s}Ψ/p" + text, where + more_where, s * psi + (k + 1) * s * shard + more

    def bucket_terms(self) -> tuple[str, str, int]:
        """The formula's " + sB [+ sA]" (stages 2 and 3): its text, its symbols' values, its bytes."""
        s = self.model.grads.itemsize
        reducer: Any = self.reducer  # a ShardReducer
        b = sum(buffer_sizes(reducer.buckets, reducer.slots))
        text, where, value = f" + {s}B", f", B = {b:,} in {reducer.slots} of {len(reducer.buckets)} bucket buffers", s * b
        if self.accumulate > 1:  # the micro-batches after the first reduce beside the shard
            a = sum(reducer.part_sizes())
            text += f" + {s}A"
            where += f", A = {a:,} accumulation parts"
            value += s * a
        return text, where, value

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
    """Stage 1: no collective per bucket; remembers the divisor for the reduce-scatter after backward (and, in a
    reproducible step, keeps each pass's whole gradient as a row of :attr:`stack`)."""

    divisor = 1
    stack: Any = None

    def begin(self, divisor: int, add: bool = False, micro: tuple[int, int] | None = None) -> None:
        super().begin(divisor, add, micro)
        self.divisor = divisor

    def hook(self, layer: int) -> None:
        pass

    @property
    def stack_bytes(self) -> int:
        return 0 if self.stack is None else int(self.stack.nbytes)

    def finish(self) -> float:
        if self.micro is not None:
            j, passes = self.micro
            grads = self.model.grads
            if self.stack is None or self.stack.shape[0] != passes:
                self.stack = array_module(grads).empty((passes, grads.size), grads.dtype)
            self.stack[j] = grads
        return 0.0
