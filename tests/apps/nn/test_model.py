"""apps.nn.model: flat buffers with views, hand-checked gradients, hook order and timing, seeds, dtypes."""

from __future__ import annotations

import numpy as np
import pytest

from apps.nn import GELU, Dropout, LayerNorm, Linear, ReLU, Sequential, mlp, softmax_cross_entropy

pytestmark = pytest.mark.serial  # no MPI: the serial pass runs it


def _batch(n=7, features=4, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, features)), rng.integers(0, classes, n)


def test_views_and_ranges():
    model = mlp([4, 6, 5, 3], layernorm=True, dropout=0.2, dtype=np.float64)
    assert model.params.ndim == 1 and model.grads.shape == model.params.shape
    assert np.all(model.grads == 0)
    # layer_ranges tile [0, num_params) in order; parameterless layers have start == stop.
    stop = 0
    for layer, (a, b) in zip(model.layers, model.layer_ranges):
        assert a == stop and b >= a
        assert (b - a) == sum(int(np.prod(s)) for s in layer.param_shapes().values())
        stop = b
    assert stop == model.num_params and model.nbytes == model.num_params * 8
    named = model.named_parameters()
    assert [n for n, *_ in named][:4] == ["0.W", "0.b", "1.gamma", "1.beta"]
    assert named[0][1] == 0 and named[-1][2] == model.num_params
    for (_, _, stop0, _), (_, start1, _, _) in zip(named, named[1:]):
        assert stop0 == start1
    for name, a, b, shape in named:
        i, key = name.split(".")
        layer = model.layers[int(i)]
        assert layer.params[key].shape == shape
        assert np.shares_memory(layer.params[key], model.params)
        assert np.shares_memory(layer.grads[key], model.grads)
        np.testing.assert_array_equal(layer.params[key].ravel(), model.params[a:b])
        model.grads[a:b] = 1.5  # writing the flat slice is seen through the view
        assert np.all(layer.grads[key] == 1.5)
    model.zero_grad()
    assert np.all(model.grads == 0)
    assert all(np.shares_memory(g, model.grads) for layer in model.layers for g in layer.grads.values())


def test_mlp_structure_and_errors():
    model = mlp([4, 8, 8, 2], activation="gelu", layernorm=True, dropout=0.1)
    kinds = [type(layer) for layer in model.layers]
    assert kinds == [Linear, LayerNorm, GELU, Dropout, Linear, LayerNorm, GELU, Dropout, Linear]
    assert [type(layer) for layer in mlp([3, 2]).layers] == [Linear]
    assert [type(layer) for layer in mlp([3, 5, 2]).layers] == [Linear, ReLU, Linear]
    with pytest.raises(ValueError, match="'relu', 'gelu'"):
        mlp([3, 2], activation="tanh")
    with pytest.raises(ValueError, match="at least 2 sizes"):
        mlp([3])
    with pytest.raises(ValueError, match="positive"):
        mlp([3, 0, 2])
    with pytest.raises(TypeError, match="Layer"):
        Sequential([Linear(2, 2), "relu"])
    with pytest.raises(ValueError, match="more than once"):
        relu = ReLU()
        Sequential([Linear(2, 2), relu, Linear(2, 2), relu])
    with pytest.raises(ValueError, match="floating-point"):
        mlp([2, 2], dtype=np.int32)


def test_two_layer_gradient_by_hand():
    model = mlp([4, 5, 3], dtype=np.float64, seed=3)
    W1, b1 = model.layers[0].params["W"].copy(), model.layers[0].params["b"].copy()
    W2, b2 = model.layers[2].params["W"].copy(), model.layers[2].params["b"].copy()
    x, labels = _batch()
    loss, dlogits = softmax_cross_entropy(model.forward(x), labels)
    model.backward(dlogits)

    # The same network written out with plain numpy.
    h = x @ W1 + b1
    a = np.maximum(h, 0)
    z = a @ W2 + b2
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    n = len(x)
    assert loss == pytest.approx(-np.log(p[np.arange(n), labels]).mean(), rel=1e-12)
    dz = p.copy()
    dz[np.arange(n), labels] -= 1
    dz /= n
    dW2 = a.T @ dz
    db2 = dz.sum(0)
    dh = (dz @ W2.T) * (h > 0)
    dW1 = x.T @ dh
    db1 = dh.sum(0)
    want = np.concatenate([dW1.ravel(), db1, dW2.ravel(), db2])
    np.testing.assert_allclose(model.grads, want, rtol=1e-12, atol=1e-15)


def test_hook_order_and_grads_final_when_called():
    model = mlp([4, 6, 6, 3], layernorm=True, dropout=0.3, dtype=np.float64, seed=1)
    model.rng_key = (5, 0)
    x, labels = _batch()
    _, d = softmax_cross_entropy(model.forward(x), labels)
    model.backward(d)
    full = model.grads.copy()
    model.zero_grad()

    seen: list[int] = []
    snapshots: dict[int, np.ndarray] = {}

    def hook(i: int) -> None:
        seen.append(i)
        a, b = model.layer_ranges[i]
        snapshots[i] = model.grads[a:b].copy()

    model.forward(x)
    model.backward(d, hook=hook)
    assert seen == list(range(len(model.layers) - 1, -1, -1))
    for i, (a, b) in enumerate(model.layer_ranges):
        np.testing.assert_array_equal(snapshots[i], full[a:b])


def test_forward_hook_runs_before_each_layer_in_order():
    model = mlp([4, 6, 3], dtype=np.float64, seed=1)
    x, _ = _batch()
    want = model.forward(x)
    seen: list[tuple[int, bool]] = []
    a, b = model.layer_ranges[0]
    kept = model.params[a:b].copy()

    def hook(i: int) -> None:  # as a sharded strategy does: the layer's parameters are put in place just before
        seen.append((i, bool(model.params[a:b].any())))
        if i == 0:
            model.params[a:b] = kept

    model.params[a:b] = 0
    got = model.forward(x, hook=hook)
    assert [i for i, _ in seen] == list(range(len(model.layers)))
    assert seen[0] == (0, False) and seen[1] == (1, True)  # called before layer 0 ran, and it ran with them
    np.testing.assert_array_equal(got, want)
    with pytest.raises(TypeError, match="hook must be callable"):
        model.forward(x, hook=3)


def test_backward_accumulates():
    model = mlp([4, 6, 3], layernorm=True, dtype=np.float64)
    x, labels = _batch()
    _, d = softmax_cross_entropy(model.forward(x), labels)
    model.backward(d)
    once = model.grads.copy()
    assert np.any(once != 0)
    model.forward(x)
    model.backward(d)
    np.testing.assert_allclose(model.grads, 2 * once, rtol=1e-14)
    model.zero_grad()
    assert np.all(model.grads == 0)


def test_microbatches_sum_to_batch_gradient():
    model = mlp([4, 6, 3], dtype=np.float64)
    x, labels = _batch(n=8)
    _, d = softmax_cross_entropy(model.forward(x), labels)
    model.backward(d)
    whole = model.grads.copy()
    model.zero_grad()
    for a, b in ((0, 3), (3, 3), (3, 8)):  # includes an empty micro-batch
        _, d = softmax_cross_entropy(model.forward(x[a:b]), labels[a:b], denominator=8)
        model.backward(d)
    np.testing.assert_allclose(model.grads, whole, rtol=1e-12, atol=1e-15)


def test_seeds_and_dtypes():
    a = mlp([4, 8, 3], layernorm=True, seed=7, dtype=np.float64)
    b = mlp([4, 8, 3], layernorm=True, seed=7, dtype=np.float64)
    c = mlp([4, 8, 3], layernorm=True, seed=8, dtype=np.float64)
    f = mlp([4, 8, 3], layernorm=True, seed=7, dtype=np.float32)
    assert np.array_equal(a.params, b.params)
    assert not np.array_equal(a.params, c.params)
    assert f.params.dtype == np.float32 and f.grads.dtype == np.float32
    np.testing.assert_array_equal(f.params, a.params.astype(np.float32))
    # Layer-by-layer from one generator, host float64 first.
    rng = np.random.default_rng(7)
    w = rng.uniform(-0.5, 0.5, (4, 8))
    np.testing.assert_array_equal(a.layers[0].params["W"], w)
    x, labels = _batch()
    for model, dtype in ((a, np.float64), (f, np.float32)):
        y = model.forward(x)
        assert y.dtype == dtype
        _, d = softmax_cross_entropy(y, labels)
        model.backward(d)
        assert model.grads.dtype == dtype and np.any(model.grads != 0)


def test_dropout_keys_follow_rng_key():
    model = mlp([4, 16, 3], dropout=0.5, dtype=np.float64)
    x, _ = _batch()
    model.rng_key = (1, 0)
    y1 = model.forward(x)
    assert model.layers[2].key == (0, 2, 1, 0)
    y1b = model.forward(x)
    model.rng_key = (2, 0)
    y2 = model.forward(x)
    np.testing.assert_array_equal(y1, y1b)
    assert not np.array_equal(y1, y2)
    np.testing.assert_array_equal(model.forward(x, train=False), model.forward(x, train=False))


def test_load_params():
    a = mlp([4, 8, 3], seed=1, dtype=np.float64)
    b = mlp([4, 8, 3], seed=2, dtype=np.float32)
    view = b.layers[0].params["W"]
    b.load_params(a.params)
    np.testing.assert_array_equal(b.params, a.params.astype(np.float32))
    assert np.shares_memory(view, b.params) and np.array_equal(view.ravel(), b.params[:32])
    with pytest.raises(ValueError, match=f"got 5 values but the model has {a.num_params}"):
        a.load_params(np.zeros(5))


def test_model_on_cupy():
    from tests.conftest import cupy_or_skip

    cp = cupy_or_skip()
    host = mlp([4, 8, 3], layernorm=True, dropout=0.2, activation="gelu", dtype=np.float64, seed=4)
    dev = mlp([4, 8, 3], layernorm=True, dropout=0.2, activation="gelu", dtype=np.float64, seed=4, xp=cp)
    assert isinstance(dev.params, cp.ndarray)
    np.testing.assert_array_equal(cp.asnumpy(dev.params), host.params)
    host.rng_key = dev.rng_key = (3, 1)
    x, labels = _batch()
    _, d = softmax_cross_entropy(host.forward(x), labels)
    host.backward(d)
    _, dd = softmax_cross_entropy(dev.forward(cp.asarray(x)), cp.asarray(labels))
    dev.backward(dd)
    np.testing.assert_allclose(cp.asnumpy(dev.grads), host.grads, rtol=1e-9, atol=1e-12)
