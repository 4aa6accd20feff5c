"""apps.nn.layers: gradients against finite differences, dtypes kept, empty batches, keyed Dropout."""

from __future__ import annotations

import numpy as np
import pytest

from apps.nn import GELU, Dropout, Layer, LayerNorm, Linear, ReLU

pytestmark = pytest.mark.serial  # no MPI: the serial pass runs it


def _bind(layer: Layer, dtype=np.float64, seed: int = 0, perturb: bool = True) -> Layer:
    """Give a standalone layer its own parameter and gradient arrays (what the model does with views)."""
    rng = np.random.default_rng(seed)
    values = layer.init(rng)
    # Move LayerNorm off gamma=1, beta=0 so their gradients are exercised in general position.
    layer.params = {k: (v + (0.3 * rng.standard_normal(v.shape) if perturb else 0)).astype(dtype)
                    for k, v in values.items()}
    layer.grads = {k: np.zeros(v.shape, dtype) for k, v in values.items()}
    return layer


def _check_gradients(layer: Layer, x: np.ndarray, h: float = 1e-6, tol: float = 1e-6) -> None:
    """Input and parameter gradients of loss = sum(forward(x) * R) against central differences."""
    rng = np.random.default_rng(99)
    y = layer.forward(x, train=True)
    R = rng.standard_normal(y.shape)

    def loss() -> float:
        return float((layer.forward(x, train=True) * R).sum())

    for g in layer.grads.values():
        g[...] = 0
    layer.forward(x, train=True)
    dx = layer.backward(R.copy())
    analytic = {"x": dx, **{k: g.copy() for k, g in layer.grads.items()}}
    targets = {"x": x, **layer.params}
    for name, arr in targets.items():
        numeric = np.zeros_like(arr)
        for idx in np.ndindex(arr.shape):
            old = arr[idx]
            arr[idx] = old + h
            up = loss()
            arr[idx] = old - h
            down = loss()
            arr[idx] = old
            numeric[idx] = (up - down) / (2 * h)
        np.testing.assert_allclose(analytic[name], numeric, rtol=tol, atol=tol, err_msg=f"gradient of {name}")


LAYERS = {
    "linear": lambda: Linear(4, 3),
    "linear-nobias": lambda: Linear(4, 3, bias=False),
    "relu": ReLU,
    "gelu": GELU,
    "layernorm": lambda: LayerNorm(4),
    "dropout": lambda: Dropout(0.4),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_gradients_match_finite_differences(name):
    layer = _bind(LAYERS[name]())
    layer.key = (7, 1, 3)
    x = np.random.default_rng(1).standard_normal((5, 4))
    if name == "relu":
        x[np.abs(x) < 1e-3] = 0.5  # keep away from the kink, where differences are meaningless
    _check_gradients(layer, x)


def test_finite_difference_check_can_fail():
    """The checker itself rejects a wrong backward (here: GELU's slope replaced by ReLU's)."""

    class WrongGELU(GELU):
        def backward(self, dy, need_input_grad=True):
            return dy * (self._x > 0)

    with pytest.raises(AssertionError):
        _check_gradients(WrongGELU(), np.random.default_rng(2).standard_normal((3, 4)))


def test_linear_forward_and_init_bound():
    layer = Linear(3, 2)
    values = layer.init(np.random.default_rng(0))
    assert list(values) == ["W", "b"] and values["W"].shape == (3, 2) and values["b"].shape == (2,)
    bound = 1 / np.sqrt(3)
    big = Linear(3, 500).init(np.random.default_rng(0))["W"]
    assert np.abs(big).max() <= bound and np.abs(big).max() > 0.95 * bound
    _bind(layer)
    x = np.arange(6.0).reshape(2, 3)
    np.testing.assert_allclose(layer.forward(x), x @ layer.params["W"] + layer.params["b"])
    assert Linear(3, 2, bias=False).param_shapes() == {"W": (3, 2)}


def test_backward_accumulates_and_first_layer_skip():
    layer = _bind(Linear(4, 3))
    x = np.random.default_rng(3).standard_normal((6, 4))
    dy = np.random.default_rng(4).standard_normal((6, 3))
    layer.forward(x)
    layer.backward(dy)
    once = {k: g.copy() for k, g in layer.grads.items()}
    layer.forward(x)
    assert layer.backward(dy, need_input_grad=False) is None
    for k in once:
        np.testing.assert_allclose(layer.grads[k], 2 * once[k])


def test_gelu_formula():
    x = np.array([[-3.0, -0.5, 0.0, 0.7, 2.5]])
    want = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    np.testing.assert_allclose(GELU().forward(x), want, rtol=1e-15)


def test_layernorm_matches_definition():
    layer = LayerNorm(5, eps=1e-5)
    _bind(layer, perturb=False)
    assert np.all(layer.params["gamma"] == 1) and np.all(layer.params["beta"] == 0)
    x = np.random.default_rng(5).standard_normal((3, 5)) * 4 + 2
    y = layer.forward(x)
    want = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5)  # biased variance
    np.testing.assert_allclose(y, want, rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", list(LAYERS))
def test_dtype_kept_and_empty_batch(name, dtype):
    layer = _bind(LAYERS[name](), dtype=np.float64)  # parameters in another dtype than the input
    layer.key = (0, 0)
    x = np.random.default_rng(6).standard_normal((3, 4)).astype(dtype)
    y = layer.forward(x)
    assert y.dtype == dtype
    assert layer.backward(np.ones_like(y)).dtype == dtype
    for g in layer.grads.values():
        g[...] = 0
    empty = np.zeros((0, 4), dtype)
    y0 = layer.forward(empty)
    assert y0.shape == (0, y.shape[1]) and y0.dtype == dtype
    dx0 = layer.backward(np.zeros_like(y0))
    assert dx0.shape == (0, 4)
    for g in layer.grads.values():
        assert np.all(g == 0)


def test_dropout_mask_keyed():
    layer = Dropout(0.5)
    x = np.ones((64, 32))
    layer.key = (1, 2, 3)
    a = layer.forward(x)
    b = layer.forward(x)
    assert np.array_equal(a, b)
    layer.key = (1, 2, 4)
    c = layer.forward(x)
    assert not np.array_equal(a, c)
    assert set(np.unique(a)) == {0.0, 2.0}
    # The mask is the documented function of the key: default_rng(SeedSequence(key)).random(shape) >= p.
    layer.key = (1, 2, 3)
    keep = np.random.default_rng(np.random.SeedSequence([1, 2, 3])).random(x.shape) >= 0.5
    np.testing.assert_array_equal(a, keep * 2.0)
    # Backward uses the mask of the latest forward.
    layer.forward(x)
    np.testing.assert_array_equal(layer.backward(np.ones_like(x)), a)


def test_dropout_eval_identity_and_expectation():
    layer = Dropout(0.3)
    x = np.random.default_rng(8).standard_normal((10, 7))
    assert layer.forward(x, train=False) is x
    assert layer.backward(x) is x
    p0 = Dropout(0.0)
    assert p0.forward(x, train=True) is x  # no key needed either
    layer.key = (5,)
    big = np.ones((400, 500))
    y = layer.forward(big)
    assert abs(y.mean() - 1.0) < 0.01  # inverted scaling keeps the expectation
    assert abs((y == 0).mean() - 0.3) < 0.01


def test_dropout_needs_key_and_valid_p():
    with pytest.raises(RuntimeError, match="key"):
        Dropout(0.5).forward(np.ones((2, 2)))
    for bad in (1.0, -0.1, 1.5):
        with pytest.raises(ValueError, match=r"\[0, 1\)"):
            Dropout(bad)
    with pytest.raises(TypeError):
        Dropout("0.5")


def test_argument_errors():
    with pytest.raises(ValueError, match="in_features must be positive, got 0"):
        Linear(0, 3)
    with pytest.raises(TypeError, match="out_features must be an int"):
        Linear(3, 2.5)
    with pytest.raises(ValueError, match="eps"):
        LayerNorm(4, eps=0)
    layer = _bind(Linear(4, 3))
    with pytest.raises(ValueError, match="expects 4 features"):
        layer.forward(np.ones((2, 5)))
    with pytest.raises(ValueError, match="2-D"):
        ReLU().forward(np.ones(3))


def test_layer_on_cupy():
    from tests.conftest import cupy_or_skip

    cp = cupy_or_skip()
    for make in (lambda: Linear(4, 3), GELU, lambda: LayerNorm(4), lambda: Dropout(0.5)):
        host = _bind(make())
        dev = make()
        dev.params = {k: cp.asarray(v) for k, v in host.params.items()}
        dev.grads = {k: cp.zeros_like(cp.asarray(v)) for k, v in host.grads.items()}
        host.key = dev.key = (1, 2)
        x = np.random.default_rng(9).standard_normal((5, 4))
        y_host = host.forward(x)
        y_dev = dev.forward(cp.asarray(x))
        assert isinstance(y_dev, cp.ndarray)
        np.testing.assert_allclose(cp.asnumpy(y_dev), y_host, rtol=1e-10, atol=1e-12)
        dy = np.random.default_rng(10).standard_normal(y_host.shape)
        np.testing.assert_allclose(cp.asnumpy(dev.backward(cp.asarray(dy))), host.backward(dy),
                                   rtol=1e-10, atol=1e-12)
        for k in host.grads:
            np.testing.assert_allclose(cp.asnumpy(dev.grads[k]), host.grads[k], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", list(LAYERS))
def test_split_backward_equals_backward(name):
    """backward_input then backward_weight (zero-bubble's I and W) give what backward gives."""
    x = np.random.default_rng(3).standard_normal((5, 4)) * np.arange(1, 5)
    dy_rng = np.random.default_rng(4)
    whole, split = _bind(LAYERS[name](), seed=1), _bind(LAYERS[name](), seed=1)
    for layer in (whole, split):
        layer.key = (0, 0, 0)
    y = whole.forward(x)
    split.forward(x)
    dy = dy_rng.standard_normal(y.shape)
    dx = whole.backward(dy)
    dx_split = split.backward_input(dy)
    split.backward_weight(dy)
    np.testing.assert_array_equal(dx_split, dx)
    for k in whole.grads:
        np.testing.assert_array_equal(split.grads[k], whole.grads[k])


@pytest.mark.parametrize("name", list(LAYERS))
def test_stash_and_unstash_keep_two_micro_batches_apart(name):
    layer = _bind(LAYERS[name](), seed=2)
    ref = _bind(LAYERS[name](), seed=2)
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((3, 4)), rng.standard_normal((2, 4))]
    dys = [rng.standard_normal((3, ref.forward(xs[0]).shape[1] if name.startswith("linear") else 4)),
           rng.standard_normal((2, 3 if name.startswith("linear") else 4))]
    stashes = []
    for k, x in enumerate(xs):
        layer.key = (0, 0, k)
        layer.forward(x)
        stashes.append(layer.stash())
        assert all(getattr(layer, n) is None for n in layer.saved)
    got = []
    for k in (1, 0):
        layer.unstash(stashes[k])
        got.append((k, layer.backward(dys[k])))
    for k, dx in got:
        ref.key = (0, 0, k)
        ref.forward(xs[k])
        np.testing.assert_array_equal(dx, ref.backward(dys[k]))
    with pytest.raises(ValueError, match="unstash got 7 values"):
        layer.unstash((None,) * 7)
