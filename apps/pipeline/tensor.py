"""Tensor parallelism (Megatron-LM): one MLP block's two Linear layers split over T ranks.

The block ``Linear(a, h) → activation → Linear(h, a)`` becomes::

    x (whole, on every rank)
      │  f: forward identity, backward all-reduce of the input gradient
    ColumnParallelLinear   W[:, cols of rank t]   →  y_t = x·W_t + b_t   (h/T columns)
      │  activation on the rank's columns (elementwise: no communication)
    RowParallelLinear      W[rows of rank t, :]   →  z = Σ_t y_t·W_t  + b
      │  g: forward all-reduce of the partial outputs, backward identity
    z (whole, on every rank)

Two all-reduces per block and step direction, each of the block's output size,
and each rank holds 1/T of the block's weights and of its hidden activations.
The bias of the row-parallel layer is added once, after the all-reduce, and
every rank keeps it whole (its gradient is the same on every rank).

Between pipeline stages (:class:`ScatterGather`, Megatron's scatter-gather
optimisation): the activation leaving a stage, and the gradient coming back,
is whole and identical on the stage's T tensor ranks, so sending it whole from
each of them to its counterpart moves it T times. Instead tensor rank t sends
only block t of the flattened array (:func:`apps.blocks.block`: sizes that T
does not divide give the first blocks one element more) and the receiving
stage's T ranks all-gather the blocks over their tensor group::

    stage s, ranks t = 0..T-1          stage s+1, ranks t = 0..T-1
    x (whole) ─ block t ─ send ──────▶ block t ─ allgatherv(tensor group) ─▶ x (whole)

Between stages each rank then sends n/T elements instead of n; the
all-gather runs inside the receiving stage's tensor group (in Megatron, over
the node's fast links).

Initialisation draws the WHOLE weight matrix from the generator, exactly as
:class:`apps.nn.Linear` would, and keeps this rank's slice: a model built with
these layers has, slice for slice, the parameters of the unsplit model built
with the same seed - which is what lets the tests compare them. The
communicator is any mpicomm communicator of the T ranks (``comm.Split`` of the
tensor-parallel group); nothing else here knows about MPI.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

import mpicomm
from apps.blocks import block, blocks
from apps.nn import Layer
from apps.nn.xp import array_module

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "ScatterGather", "shard"]


def shard(n: int, comm: Any, what: str) -> tuple[int, int]:
    """``(start, stop)`` of this rank's equal share of *n*; ValueError naming *what* unless T divides n."""
    t, size = comm.Get_rank(), comm.Get_size()
    if n % size:
        raise ValueError(f"{what} = {n} is not divisible by the tensor-parallel size {size}; "
                         f"choose a size that is a multiple of {size} (or another --tensor)")
    part = n // size
    return t * part, (t + 1) * part


def _draw(rng: np.random.Generator, fan_in: int, fan_out: int) -> tuple[np.ndarray, np.ndarray]:
    """The whole (W, b) of an unsplit Linear(fan_in, fan_out), drawn in its order (W, then b)."""
    bound = 1.0 / math.sqrt(fan_in)
    return rng.uniform(-bound, bound, size=(fan_in, fan_out)), rng.uniform(-bound, bound, size=(fan_out,))


class ColumnParallelLinear(Layer):
    """``Linear(in, out)`` holding output columns [lo, hi) on each rank; backward all-reduces the input gradient."""

    saved = ("_x",)

    def __init__(self, in_features: int, out_features: int, comm: Any) -> None:
        super().__init__()
        self.in_features, self.out_features, self.comm = int(in_features), int(out_features), comm
        self.lo, self.hi = shard(self.out_features, comm, "the column-parallel layer's output size")
        self._x: Any = None

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"W": (self.in_features, self.hi - self.lo), "b": (self.hi - self.lo,)}

    def init(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        w, b = _draw(rng, self.in_features, self.out_features)
        return {"W": w[:, self.lo:self.hi], "b": b[self.lo:self.hi]}

    def forward(self, x: Any, train: bool = True) -> Any:
        self._x = x  # f: identity forward
        return x @ self.params["W"] + self.params["b"]

    def backward(self, dy: Any, need_input_grad: bool = True) -> Any:
        self.backward_weight(dy)
        return self.backward_input(dy) if need_input_grad else None

    def backward_input(self, dy: Any) -> Any:
        partial = dy @ self.params["W"].T  # this rank's columns' share of the input gradient
        return mpicomm.allreduce(partial, comm=self.comm, out=partial)  # f: all-reduce backward

    def backward_weight(self, dy: Any) -> None:
        self.grads["W"] += self._x.T @ dy
        self.grads["b"] += dy.sum(axis=0)

    def __repr__(self) -> str:
        return f"ColumnParallelLinear({self.in_features}, {self.out_features}, columns {self.lo}:{self.hi})"


class RowParallelLinear(Layer):
    """``Linear(in, out)`` holding input rows [lo, hi) on each rank; forward all-reduces the partial outputs."""

    saved = ("_x",)

    def __init__(self, in_features: int, out_features: int, comm: Any) -> None:
        super().__init__()
        self.in_features, self.out_features, self.comm = int(in_features), int(out_features), comm
        self.lo, self.hi = shard(self.in_features, comm, "the row-parallel layer's input size")
        self._x: Any = None

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"W": (self.hi - self.lo, self.out_features), "b": (self.out_features,)}

    def init(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        w, b = _draw(rng, self.in_features, self.out_features)
        return {"W": w[self.lo:self.hi, :], "b": b}

    def forward(self, x: Any, train: bool = True) -> Any:
        self._x = x
        partial = x @ self.params["W"]
        z = mpicomm.allreduce(partial, comm=self.comm, out=partial)  # g: all-reduce forward
        z += self.params["b"]  # the bias once, after the sum
        return z

    def backward(self, dy: Any, need_input_grad: bool = True) -> Any:
        self.backward_weight(dy)
        return self.backward_input(dy) if need_input_grad else None

    def backward_input(self, dy: Any) -> Any:
        return dy @ self.params["W"].T  # g: identity backward (dy is whole on every rank)

    def backward_weight(self, dy: Any) -> None:
        self.grads["W"] += self._x.T @ dy
        self.grads["b"] += dy.sum(axis=0)

    def __repr__(self) -> str:
        return f"RowParallelLinear({self.in_features}, {self.out_features}, rows {self.lo}:{self.hi})"


class ScatterGather:
    """Send 1/T of a stage's output between stages, all-gather it on arrival (see the module docstring).

    *comm*: the stage's tensor group (any mpicomm communicator of its T ranks);
    with T = 1 both directions hand the array through unchanged.
    """

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.T, self.t = comm.Get_size(), comm.Get_rank()

    def part(self, count: int) -> tuple[int, int]:
        """``(start, stop)`` of this rank's block of a flattened array of *count* elements."""
        return block(count, self.T, self.t)

    def scatter(self, x: Any) -> Any:
        """This rank's block of *x*, flattened (a view when *x* is contiguous): what it sends to the next stage."""
        if self.T == 1:
            return x
        lo, hi = self.part(x.size)
        return x.reshape(-1)[lo:hi]

    def gather(self, mine: Any, shape: tuple[int, ...]) -> Any:
        """The whole array of *shape* from every tensor rank's block (collective over the tensor group)."""
        if self.T == 1:
            return mine.reshape(shape)
        counts, displs = blocks(math.prod(shape), self.T)
        whole = array_module(mine).empty(shape, mine.dtype)
        self.comm.Allgatherv(mine, [whole, counts, displs])  # counts known: no size exchange first
        return whole
