"""Data parallelism as PyTorch DDP does it: bucketed, overlapped, averaged gradient all-reduce.

Every rank holds the whole model; parameters are broadcast from rank 0 once, and
every step each rank computes the gradient of its share of the global batch, the
ranks average those gradients, and every rank applies the same optimizer step - so
the parameters stay identical without ever being sent again.

The averaging (:class:`Reducer`):

* gradients are grouped into buckets (:mod:`apps.sgd.buckets`), contiguous slices
  of the model's one flat gradient buffer, in reverse layer order;
* during backward, the model calls a hook after each layer; when the layer that
  completes a bucket has run, the bucket is divided by the number of ranks and
  its **nonblocking** all-reduce (mpicomm's, any algorithm) starts in place - it
  progresses while earlier layers compute (each hook also drives mpicomm's
  progress engine, since there is no progress thread);
* before the optimizer step every bucket is waited for, in launch order.

Variants, each to show why the default exists: ``overlap=False`` reduces after the
whole backward; ``per_parameter=True`` makes one all-reduce per tensor (no
buckets); ``compress="fp16"`` casts a bucket to half precision, divides, reduces
and casts back (DDP's fp16 compression hook: half the bytes, less precision);
``accumulate K`` (in :class:`DDP`) runs K micro-batches and synchronizes only on
the last (``no_sync``).

Reproducible steps (``--reproducible``, :meth:`DDP.step`): fixed micro-batches, each one's gradient kept
as a row of each bucket's stack, and every bucket's rows reduced once, after the last pass, as one
reproducible sum (``stacked=True``): the same parameters, bit for bit, at any number of ranks.

Uneven inputs (the training loop's ``--uneven``, PyTorch's ``Join``): every step starts with a
one-integer all-reduce counting the ranks that still have data. A rank that has
run out keeps taking part: it contributes zero gradients to every bucket, in the
same order, and applies the same optimizer step, so its parameters stay equal to
the others'. The divisor is the number of ranks still active, so the result is
the average of the active ranks' gradients. The loop ends when no rank has data.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

import mpicomm
from apps.blocks import block, grouped
from apps.nn import correct, softmax_cross_entropy
from apps.nn.xp import array_module
from apps.sgd.buckets import DEFAULT_CAP_MB, Bucket, Parameter, plan, ready_at
from mpicomm import trace

__all__ = ["Reducer", "DDP", "COMPRESSION", "parameters_of", "StepResult"]

#: ``--compress`` choices: the dtype a bucket travels in.
COMPRESSION = {"fp16": np.float16}


def _bf16() -> Any:
    """bfloat16 from ml_dtypes when installed (the well-kept package that gives NumPy that dtype)."""
    try:
        import ml_dtypes
    except ImportError:
        return None
    return ml_dtypes.bfloat16


def compression_dtype(name: str | None) -> Any:
    """The dtype of ``--compress NAME`` (None: no compression); ValueError naming the choices."""
    if name in (None, "none"):
        return None
    if name == "bf16":
        dt = _bf16()
        if dt is None:
            raise ValueError("--compress bf16 needs the ml_dtypes package: pip install ml_dtypes")
        return dt
    if name not in COMPRESSION:
        raise ValueError(f"--compress {name!r}: choose none, fp16 or bf16")
    return COMPRESSION[name]


def parameters_of(model: Any) -> list[Parameter]:
    """The model's parameters with their flat ranges and owning layers (for :func:`apps.sgd.buckets.plan`)."""
    layer_of = {}
    for i, (start, stop) in enumerate(model.layer_ranges):
        if stop > start:
            layer_of[start] = i
    out = []
    for name, start, stop, _shape in model.named_parameters():
        layer = int(name.split(".", 1)[0])
        out.append(Parameter(name, start, stop, layer))
    return out


class StepResult:
    """What one training step reports: the summed loss over this rank's samples, correct count, samples."""

    __slots__ = ("loss_sum", "correct", "samples", "compute", "exposed", "comm_total")

    def __init__(self) -> None:
        self.loss_sum = 0.0
        self.correct = 0
        self.samples = 0
        self.compute = 0.0  # seconds in forward/backward
        self.exposed = 0.0  # seconds waiting for communication after backward
        self.comm_total = 0.0  # sum over buckets of launch→completion time


class Reducer:
    """Averages the model's flat gradient buffer over the ranks of *comm*, bucket by bucket.

    A plan object: buckets, their readiness table and the compression scratch are
    built once; each step only launches and waits.

    What a subclass changes: where a bucket's gradients live (:meth:`bucket_grad`),
    its collective (:meth:`_start`), what completing it does (:meth:`_done`), and
    whether every micro-batch of an accumulated step is reduced
    (:attr:`every_micro_batch`).
    """

    #: Reduce after every micro-batch of ``--accumulate`` (True), or only after the last (``no_sync``).
    every_micro_batch = False

    def __init__(self, comm: Any, model: Any, *, algorithm: str = "auto", cap_mb: float = DEFAULT_CAP_MB,
                 per_parameter: bool = False, overlap: bool = True, compress: str | None = None):
        self.comm = comm
        self.model = model
        self.algorithm = algorithm
        self.overlap = overlap
        self.buckets: list[Bucket] = plan(parameters_of(model), model.grads.itemsize, cap_mb=cap_mb,
                                          per_parameter=per_parameter)
        self._ready = ready_at(self.buckets, len(model.layers))
        dt = compression_dtype(compress)
        xp = array_module(model.grads)
        self.wire_dtype = np.dtype(model.grads.dtype if dt is None else dt)
        self._scratch = [None if dt is None else xp.empty(b.size, dt) for b in self.buckets]
        self.scratch_bytes = sum(0 if w is None else int(w.nbytes) for w in self._scratch)
        self._pending: list[tuple[Bucket, Any, float]] = []
        self._launched = 0
        self._scale = 1.0
        self._since = 0.0
        self.stalled = 0.0  # seconds backward waited for a bucket's collective (reused buffers) this micro-batch
        self.timings: list[tuple[int, float, float]] = []  # (bucket, launched, completed) of the last step
        #: ``(j, passes)`` during a reproducible step's pass j (:meth:`DDP.step`): each bucket's gradients are kept
        #: as row j of its stack, and the last pass reduces the stacks (a reproducible sum of every row)
        self.micro: tuple[int, int] | None = None
        self._stacks: dict[int, Any] = {}

    @property
    def wire_bytes(self) -> int:
        """Bytes of one all-reduce input over all buckets (what each step reduces)."""
        return sum(b.size for b in self.buckets) * self.wire_dtype.itemsize

    def begin(self, divisor: int, add: bool = False, micro: tuple[int, int] | None = None) -> None:
        """Start a synchronizing backward: gradients will be divided by *divisor* (ranks taking part).

        *add*: this backward's reduced gradients add to those reduced earlier in
        the step (a later micro-batch, where :attr:`every_micro_batch`). *micro*:
        pass j of a reproducible step's *passes* (:attr:`micro`).
        """
        self._scale = 1.0 / divisor
        self.micro = micro
        self._launched = 0
        self._pending.clear()
        self.timings = []
        self.stalled = 0.0

    def backward_starts(self) -> None:
        """Mark the start of the synchronizing backward (the first layer's trace event begins here)."""
        self._since = time.perf_counter()

    def hook(self, layer: int) -> None:
        """The model's backward hook: drive progress, then launch the buckets this layer completes.

        Under ``MPICOMM_TRACE`` each layer's backward becomes an event next to the
        bucket collectives, so the overlap is visible in Perfetto.
        """
        if trace.ON:
            now = time.perf_counter()
            trace.record(f"backward layer {layer}", "backward", self._since, now, layer=layer)
            self._since = now
        if self._pending:
            mpicomm.progress()
        if self.overlap:
            for index in self._ready[layer]:
                self._launch(self.buckets[index])

    def _launch(self, bucket: Bucket) -> None:
        if bucket.index != self._launched:  # never out of order: every rank must pair the same buckets
            raise RuntimeError(f"bucket {bucket.index} ready before bucket {self._launched}")
        grad = self.bucket_grad(bucket)
        wire = self._scratch[bucket.index]
        if wire is None:
            if self._scale != 1.0:
                grad *= self._scale
            wire = grad
        else:
            wire[...] = grad  # cast down, then divide in the wire dtype (DDP's fp16 hook)
            if self._scale != 1.0:
                wire *= wire.dtype.type(self._scale)
        start = time.perf_counter()
        request = self._start(bucket, wire) if self.micro is None else self._keep(bucket, wire)
        self._pending.append((bucket, request, start))
        self._launched += 1

    def _keep(self, bucket: Bucket, wire: Any) -> Any:
        """A reproducible step's pass: the bucket's gradients become row j of its stack; the last pass starts the
        stacks' reduction (:meth:`_start_stacked`), earlier ones nothing (a request already complete)."""
        j, passes = self.micro  # type: ignore[misc]  # (set: see _launch)
        stack = self._stacks.get(bucket.index)
        if stack is None or stack.shape[0] != passes:
            stack = self._stacks[bucket.index] = array_module(wire).empty((passes, wire.size), wire.dtype)
        stack[j] = wire
        return self._start_stacked(bucket, stack, wire) if j == passes - 1 else _KEPT

    def _start_stacked(self, bucket: Bucket, stack: Any, wire: Any) -> Any:
        """Start the reproducible sum of the bucket's rows on every rank (here: an all-reduce into *wire*)."""
        return mpicomm.iallreduce(stack, out=wire, algorithm=self.algorithm, comm=self.comm, stacked=True)

    @property
    def stack_bytes(self) -> int:
        """Bytes of the reproducible step's stacks (every pass's gradients, kept until the last pass)."""
        return sum(int(s.nbytes) for s in self._stacks.values())

    def bucket_grad(self, bucket: Bucket) -> Any:
        """The bucket's gradients (here: its slice of the model's flat gradient buffer)."""
        return self.model.grads[bucket.start:bucket.stop]

    def _start(self, bucket: Bucket, wire: Any) -> Any:
        """Start the bucket's collective (here: the in-place all-reduce of the averaged gradients)."""
        return mpicomm.iallreduce(wire, out=wire, algorithm=self.algorithm, comm=self.comm)

    def finish(self, wait: Any = None) -> float:
        """Launch what is left, wait for every bucket in order, cast back; return seconds spent waiting.

        *wait(request)*, when given, replaces ``request.Wait()`` (a pipeline stage waits sleeping,
        so that an idle rank leaves its core to a computing one).
        """
        for bucket in self.buckets[self._launched:]:
            self._launch(bucket)
        waited = self.stalled
        while self._pending:
            waited += self._complete_oldest(wait)
        return waited

    def _complete_oldest(self, wait: Any = None) -> float:
        """Wait for the oldest bucket in flight (launch order) and complete it; return the seconds waited."""
        bucket, request, start = self._pending.pop(0)
        t0 = time.perf_counter()
        if not request.Test():
            if wait is None:
                request.Wait()
            else:
                wait(request)
        t1 = time.perf_counter()
        self.timings.append((bucket.index, start, t1))
        self._done(bucket)
        return t1 - t0

    def _done(self, bucket: Bucket) -> None:
        """A bucket's collective completed: cast a compressed bucket back into the gradients."""
        wire = self._scratch[bucket.index]
        if wire is not None:
            self.model.grads[bucket.start:bucket.stop] = wire


class _Kept:
    """The request of a bucket a reproducible step's pass only kept (nothing to wait for)."""

    def Test(self) -> bool:
        return True

    def Wait(self) -> None:
        pass


_KEPT = _Kept()


def micro_ranges(count: int, micro_batches: int, world: int, rank: int) -> list[tuple[int, int]]:
    """A reproducible step's micro-batches of this rank: the global batch of *count* samples cut into
    *micro_batches* fixed blocks (:func:`apps.blocks.grouped`), rank r taking blocks ``block(M, p, r)``; each as
    ``(start, stop)`` within the rank's share (the samples of its blocks, in order)."""
    return grouped(count, micro_batches, world, rank)[1]


class DDP:
    """The ``ddp`` mode: one training step = forward/backward on this rank's share, averaged gradients, a step.

    Subclasses (:mod:`apps.sgd.zero`) change what a bucket's collective is
    (:meth:`make_reducer`), what optimizer state a rank keeps (:meth:`make_state`)
    and how the step is applied (:meth:`update`); the step itself is shared.
    """

    name = "ddp"

    def __init__(self, comm: Any, model: Any, optimizer: Any, *, algorithm: str = "auto",
                 cap_mb: float = DEFAULT_CAP_MB, per_parameter: bool = False, overlap: bool = True,
                 compress: str | None = None, accumulate: int = 1, micro_batches: int | None = None):
        if accumulate < 1:
            raise ValueError(f"--accumulate {accumulate}: must be >= 1 (1 synchronizes every step)")
        if micro_batches is not None and (accumulate != 1 or compress):
            raise ValueError("--reproducible cuts the global batch into --micro-batches itself: drop --accumulate "
                             "and --compress")
        if micro_batches is not None and micro_batches < comm.Get_size():
            raise ValueError(f"--micro-batches {micro_batches}: fewer than the {comm.Get_size()} ranks; use "
                             f"--micro-batches >= {comm.Get_size()}")
        self.micro_batches = micro_batches
        self.comm = comm
        self.model = model
        self.optimizer = optimizer
        self.accumulate = accumulate
        self.algorithm = algorithm
        self.world = comm.Get_size()
        self.rank = comm.Get_rank()
        self.xp = array_module(model.params)
        self.reducer = self.make_reducer(algorithm=algorithm, cap_mb=cap_mb, per_parameter=per_parameter,
                                         overlap=overlap, compress=compress)
        self.state = self.make_state()
        self._flag = np.zeros(1, np.int64)
        # Rank 0's initial parameters everywhere (they are equal already when every rank uses the
        # same seed; the broadcast makes that a guarantee, as DDP's constructor does).
        mpicomm.bcast(model.params, 0, comm=comm, out=model.params)

    # ------------------------------------------------------------ what subclasses change

    def make_reducer(self, **options: Any) -> Reducer:
        return Reducer(self.comm, self.model, **options)

    def make_state(self) -> dict[str, Any]:
        return self.optimizer.init_state(self.model.num_params, self.xp, self.model.params.dtype)

    def update(self) -> float:
        """Apply the optimizer to the averaged gradients (every rank the same step); return seconds communicating."""
        self.optimizer.step(self.model.params, self.model.grads, self.state)
        return 0.0

    def memory(self) -> dict[str, int]:
        """Bytes this rank holds between steps (:meth:`_memory`), and a reproducible step's stacks
        (``grad_stacks``: each pass's gradients, kept until the last)."""
        held = self._memory()
        if self.micro_batches is not None:
            held["grad_stacks"] = self.reducer.stack_bytes
        return held

    def memory_formula(self) -> tuple[str, str, int]:
        """:meth:`_formula`, and a reproducible step's stacks: ``P·sΨ`` for P passes (⌈M / p⌉)."""
        text, where, value = self._formula()
        if self.micro_batches is not None:
            s, passes = self.model.params.itemsize, -(-self.micro_batches // self.world)
            psi = getattr(self, "num_params", self.model.num_params)
            text, where = text + f" + {passes * s}Ψ", where + f"; {passes}·{s}Ψ: the --reproducible stacks"
            value += passes * s * psi
        return text, where, value

    def _memory(self) -> dict[str, int]:
        """Bytes this rank holds between steps: parameters, gradients, optimizer state."""
        return {"params": int(self.model.params.nbytes),
                "grads": int(self.model.grads.nbytes) + self.reducer.scratch_bytes,
                "optimizer": _state_bytes(self.state)}

    def _formula(self) -> tuple[str, str, int]:
        """ZeRO's formula for this rank's :meth:`memory` total, the values of its symbols, and that total in bytes.

        Computed from Ψ, p, the dtype, the optimizer's number of state vectors
        and the bucket plan - not from the buffers - so a run can print it next
        to the measured total (the terms: :mod:`apps.sgd.zero`). Here (2 + k)sΨ:
        fp32 Adam 16Ψ, plus the compressed copy of every bucket with ``--compress``.
        """
        s, k, psi = self.model.params.itemsize, len(self.optimizer.state_names), self.model.num_params
        text, where, value = f"{(2 + k) * s}Ψ", f"Ψ = {psi:,}", (2 + k) * s * psi
        if self.reducer.scratch_bytes:
            w = self.reducer.wire_dtype.itemsize
            text, where = text + f" + {w}Ψ", where + f"; {w}Ψ: the {self.reducer.wire_dtype.name} bucket copies"
            value += w * psi
        return text, where, value

    def full_state(self) -> dict[str, Any]:
        """The whole optimizer state, on every rank (collective where it is sharded)."""
        return self.state

    def load_full_state(self, state: dict[str, Any]) -> None:
        """Take this rank's part of a whole optimizer state (from a checkpoint)."""
        for key, value in state.items():
            self.state[key][...] = _as(self.state[key], value)

    # ------------------------------------------------------------ the step

    def active_ranks(self, have_data: bool) -> int:
        """Join's "still here" all-reduce: how many ranks have a batch this step."""
        self._flag[0] = 1 if have_data else 0
        return int(mpicomm.allreduce(self._flag, comm=self.comm)[0])

    #: Called before each layer's forward in a training step (``hook(layer)``), or None: ZeRO-3 gathers there.
    forward_hook: Callable[[int], None] | None = None

    def step(self, x: Any, y: Any, global_count: int, divisor: int | None = None) -> StepResult:
        """One optimizer step on this rank's samples *x*, *y* of a global batch of *global_count*.

        Each rank's loss gradient is scaled by world_size / global_count, so the
        average over ranks is the gradient of the global batch's mean loss - the
        single-rank gradient, whatever the split. *divisor* (Join) overrides the
        number of ranks the sum is divided by.
        """
        if self.micro_batches is not None:
            return self._reproducible_step(x, y, global_count)
        model, reducer = self.model, self.reducer
        result = StepResult()
        denominator = global_count / self.world
        model.zero_grad()
        for k in range(self.accumulate):
            a, b = block(len(y), self.accumulate, k)
            sync = k == self.accumulate - 1 or reducer.every_micro_batch
            t0 = time.perf_counter()
            if sync:
                reducer.begin(self.world if divisor is None else divisor, add=k > 0)
            logits = model.forward(x[a:b], train=True, hook=self.forward_hook)
            loss, dlogits = softmax_cross_entropy(logits, y[a:b], denominator)
            result.loss_sum += loss * (b - a)
            result.correct += correct(logits, y[a:b])
            if sync:
                reducer.backward_starts()
            model.backward(dlogits, hook=reducer.hook if sync else None)
            result.compute += time.perf_counter() - t0 - (reducer.stalled if sync else 0.0)
            if sync:
                result.exposed += reducer.finish()
                result.comm_total += sum(done - start for _, start, done in reducer.timings)
        result.exposed += self.update()
        result.samples = len(y)
        return result

    def _reproducible_step(self, x: Any, y: Any, global_count: int) -> StepResult:
        """``--reproducible``: the global batch cut into fixed micro-batches (:func:`micro_ranges`), each one's
        loss gradient (scaled by 1 / global_count) computed on its own - the same bits whichever rank computes
        it - and kept, bucket by bucket, as a row of the bucket's stack; after the last pass every bucket's
        rows are reduced as one reproducible sum (``stacked=True``: :mod:`mpicomm.reproducible`), so the sum -
        the single-process gradient - has the same bits at any rank count. Every rank makes the same number
        of passes (the most micro-batches a rank has): a pass without a micro-batch keeps zeros (which change
        no sum) and takes part in the collectives."""
        model, reducer = self.model, self.reducer
        result = StepResult()
        mine = micro_ranges(global_count, self.micro_batches, self.world, self.rank)  # type: ignore[arg-type]
        passes = -(-self.micro_batches // self.world)  # type: ignore[operator]
        first = block(self.micro_batches, self.world, self.rank)[0]  # type: ignore[arg-type]
        step = model.rng_key[0] if model.rng_key else 0
        for j in range(passes):
            a, b = mine[j] if j < len(mine) else (0, 0)
            t0 = time.perf_counter()
            reducer.begin(1, micro=(j, passes))
            self.zero_pass()
            if b > a:
                model.rng_key = (step, first + j)  # (the micro-batch's own randomness, wherever it runs)
                logits = model.forward(x[a:b], train=True, hook=self.forward_hook)
                loss, dlogits = softmax_cross_entropy(logits, y[a:b], global_count)
                result.loss_sum += loss * (b - a)
                result.correct += correct(logits, y[a:b])
                reducer.backward_starts()
                model.backward(dlogits, hook=reducer.hook)
            else:
                self.idle_pass()
            result.compute += time.perf_counter() - t0 - reducer.stalled
            result.exposed += reducer.finish()
            result.comm_total += sum(done - start for _, start, done in reducer.timings)
        result.exposed += self.update()
        result.samples = len(y)
        return result

    def zero_pass(self) -> None:
        """Before a reproducible step's pass: zero the gradients it writes (here: the flat buffer)."""
        self.model.zero_grad()

    def idle_pass(self) -> None:
        """A reproducible step's pass without a micro-batch on this rank: nothing to compute (its buckets keep
        zeros when :meth:`Reducer.finish` launches them)."""

    def idle_step(self, divisor: int) -> None:
        """A joined rank's step: zero gradients through every bucket, then the same optimizer step."""
        self.model.zero_grad()
        for k in range(self.accumulate if self.reducer.every_micro_batch else 1):
            self.reducer.begin(divisor, add=k > 0)
            self.reducer.finish()
        self.update()


def _state_bytes(state: dict[str, Any]) -> int:
    return sum(int(v.nbytes) for k, v in state.items() if k != "step")


def _as(like: Any, value: Any) -> Any:
    """*value* (a host array from a checkpoint) on *like*'s array module."""
    xp = array_module(like)
    return value if xp is np else xp.asarray(value)
