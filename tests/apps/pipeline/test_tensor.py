"""apps.pipeline.tensor: the column/row-parallel pair over this pass's ranks equals the unsplit layers."""

from __future__ import annotations

import numpy as np
import pytest

import mpicomm
from apps.nn import Linear, ReLU, Sequential
from apps.pipeline.tensor import ColumnParallelLinear, RowParallelLinear, ScatterGather, shard


@pytest.mark.mpi
def test_pair_equals_unsplit_layers_forward_and_backward():
    comm = mpicomm.Comm()
    T, t = comm.Get_size(), comm.Get_rank()
    a, h = 7, 12  # 12 is divisible by 1..4 ranks
    split = Sequential([ColumnParallelLinear(a, h, comm), ReLU(), RowParallelLinear(h, a, comm)], dtype=np.float64,
                       seed=3)
    whole = Sequential([Linear(a, h), ReLU(), Linear(h, a)], dtype=np.float64, seed=3)
    lo, hi = t * h // T, (t + 1) * h // T
    w1, b1 = whole.layers[0].params["W"], whole.layers[0].params["b"]
    w2, b2 = whole.layers[2].params["W"], whole.layers[2].params["b"]
    np.testing.assert_array_equal(split.layers[0].params["W"], w1[:, lo:hi])  # same init, sliced
    np.testing.assert_array_equal(split.layers[0].params["b"], b1[lo:hi])
    np.testing.assert_array_equal(split.layers[2].params["W"], w2[lo:hi, :])
    np.testing.assert_array_equal(split.layers[2].params["b"], b2)  # the row-parallel bias is whole
    x = np.random.default_rng(5).standard_normal((9, a)) * (1 + np.arange(a))  # depends on row and column
    dy = np.random.default_rng(6).standard_normal((9, a))
    y_split, y_whole = split.forward(x), whole.forward(x)
    np.testing.assert_allclose(y_split, y_whole, rtol=1e-12, atol=1e-12)
    dx_split = split.layers[2].backward(dy)
    dx_split = split.layers[1].backward(dx_split)
    dx_split = split.layers[0].backward(dx_split)
    dx_whole = dy
    for layer in reversed(whole.layers):
        dx_whole = layer.backward(dx_whole)
    np.testing.assert_allclose(dx_split, dx_whole, rtol=1e-12, atol=1e-12)
    g1, g2 = whole.layers[0].grads, whole.layers[2].grads
    np.testing.assert_allclose(split.layers[0].grads["W"], g1["W"][:, lo:hi], rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(split.layers[0].grads["b"], g1["b"][lo:hi], rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(split.layers[2].grads["W"], g2["W"][lo:hi, :], rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(split.layers[2].grads["b"], g2["b"], rtol=1e-12, atol=1e-13)  # whole on every rank


@pytest.mark.mpi
def test_split_backward_equals_the_whole_backward():
    comm = mpicomm.Comm()
    layer = ColumnParallelLinear(5, 12, comm)
    Sequential([layer], dtype=np.float64, seed=1)
    x = np.arange(15.0).reshape(3, 5) / 7
    dy = np.ones((3, layer.hi - layer.lo))
    layer.forward(x)
    dx = layer.backward_input(dy.copy())
    layer.backward_weight(dy)
    gw = layer.grads["W"].copy()
    layer.grads["W"][...] = 0
    layer.grads["b"][...] = 0
    np.testing.assert_array_equal(layer.backward(dy), dx)
    np.testing.assert_array_equal(layer.grads["W"], gw)


@pytest.mark.mpi
def test_size_not_divisible_names_the_fix():
    comm = mpicomm.Comm()
    if comm.Get_size() == 1:
        pytest.skip("every size divides over one rank")
    n = comm.Get_size() * 3 + 1
    with pytest.raises(ValueError, match=f"= {n} is not divisible by the tensor-parallel size {comm.Get_size()}"):
        shard(n, comm, "the column-parallel layer's output size")


@pytest.mark.mpi
@pytest.mark.parametrize("shape", [(5, 7), (3, 4), (1, 2)])  # 35 (uneven at 2-4 ranks), 12, 2 (< ranks: empty blocks)
def test_scatter_gather_sends_one_block_and_rebuilds_the_whole(shape):
    comm = mpicomm.Comm()
    T, t = comm.Get_size(), comm.Get_rank()
    x = np.random.default_rng(1).standard_normal(shape) * (1 + np.arange(shape[-1]))  # whole, alike on every rank
    link = ScatterGather(comm)
    mine = link.scatter(x)
    n = x.size
    assert mine.size == n // T + (1 if t < n % T else 0)  # the first n mod T ranks carry one element more
    np.testing.assert_array_equal(mine.reshape(-1), x.reshape(-1)[t * (n // T) + min(t, n % T):][:mine.size])
    np.testing.assert_array_equal(link.gather(mine.copy(), shape), x)
