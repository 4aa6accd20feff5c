"""apps.nn.optim: SGD, Adam and AdamW against their published update rules, written out independently here."""

from __future__ import annotations

import math

import numpy as np
import pytest

from apps.nn import SGD, Adam, AdamW, make

pytestmark = pytest.mark.serial  # no MPI: the serial pass runs it

P0 = [0.5, -1.25, 2.0, 0.0]
GRADS = [[0.1, -0.2, 0.3, 0.4], [0.05, 0.0, -0.6, 0.2], [-0.3, 0.25, 0.1, 0.0],
         [0.2, 0.2, -0.1, -0.5], [0.0, -0.4, 0.7, 0.3]]


def _run(opt, steps=5):
    params = np.array(P0)
    state = opt.init_state(len(P0), np, np.float64)
    for g in GRADS[:steps]:
        grads = np.array(g)
        keep = grads.copy()
        opt.step(params, grads, state)
        assert np.array_equal(grads, keep), "step must not modify the gradients"
    assert int(state["step"]) == steps
    return params


def _sgd_reference(lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
    """torch.optim.SGD's documented algorithm, one scalar at a time."""
    out = []
    for j, p in enumerate(P0):
        buf = None
        for t, gs in enumerate(GRADS):
            g = gs[j] + weight_decay * p
            if momentum != 0:
                buf = g if t == 0 else momentum * buf + (1 - dampening) * g
                g = g + momentum * buf if nesterov else buf
            p = p - lr * g
        out.append(p)
    return np.array(out)


def _adam_reference(lr, b1, b2, eps, weight_decay, decoupled):
    """torch.optim.Adam / AdamW's documented algorithms, one scalar at a time."""
    out = []
    for j, p in enumerate(P0):
        m = v = 0.0
        for t, gs in enumerate(GRADS, start=1):
            g = gs[j]
            if decoupled:
                p = p - lr * weight_decay * p
            elif weight_decay:
                g = g + weight_decay * p
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            mhat = m / (1 - b1 ** t)
            vhat = v / (1 - b2 ** t)
            p = p - lr * mhat / (math.sqrt(vhat) + eps)
        out.append(p)
    return np.array(out)


SGD_CASES = {
    "plain": dict(lr=0.1),
    "momentum": dict(lr=0.1, momentum=0.9),
    "dampening": dict(lr=0.05, momentum=0.8, dampening=0.3),
    "nesterov": dict(lr=0.1, momentum=0.9, nesterov=True),
    "weight_decay": dict(lr=0.1, weight_decay=0.01),
    "all": dict(lr=0.2, momentum=0.5, weight_decay=0.1, nesterov=True),
}


@pytest.mark.parametrize("case", list(SGD_CASES))
def test_sgd_matches_rule(case):
    kw = SGD_CASES[case]
    np.testing.assert_allclose(_run(SGD(**kw)), _sgd_reference(**kw), rtol=1e-13, atol=1e-15)


def test_sgd_reference_distinguishes_cases():
    """The variants really differ on these numbers, so each comparison above can fail."""
    results = [_sgd_reference(**kw) for kw in SGD_CASES.values()]
    for i in range(len(results)):
        for j in range(i + 1, len(results)):
            assert not np.allclose(results[i], results[j])


@pytest.mark.parametrize("kw", [dict(lr=0.01), dict(lr=0.05, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)])
def test_adam_matches_rule(kw):
    b1, b2 = kw.get("betas", (0.9, 0.999))
    want = _adam_reference(kw["lr"], b1, b2, kw.get("eps", 1e-8), kw.get("weight_decay", 0.0), decoupled=False)
    np.testing.assert_allclose(_run(Adam(**kw)), want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("kw", [dict(lr=0.01), dict(lr=0.05, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.3)])
def test_adamw_matches_rule(kw):
    b1, b2 = kw.get("betas", (0.9, 0.999))
    want = _adam_reference(kw["lr"], b1, b2, kw.get("eps", 1e-8), kw.get("weight_decay", 1e-2), decoupled=True)
    np.testing.assert_allclose(_run(AdamW(**kw)), want, rtol=1e-12, atol=1e-14)
    coupled = _adam_reference(kw["lr"], b1, b2, kw.get("eps", 1e-8), kw.get("weight_decay", 1e-2), decoupled=False)
    assert not np.allclose(want, coupled)


def test_adam_float32_state():
    opt = Adam(lr=0.01)
    params = np.array(P0, np.float32)
    state = opt.init_state(4, np, np.float32)
    opt.step(params, np.array(GRADS[0], np.float32), state)
    assert params.dtype == np.float32 and state["exp_avg"].dtype == np.float32


@pytest.mark.parametrize("opt", [SGD(0.1, momentum=0.9, weight_decay=0.1), Adam(0.1, weight_decay=0.1), AdamW(0.1)])
def test_step_on_slice_touches_only_slice(opt):
    flat = np.arange(1.0, 11.0)
    grads = np.full(10, 0.5)
    before = flat.copy()
    state = opt.init_state(4, np, np.float64)
    for _ in range(3):
        opt.step(flat[3:7], grads[3:7], state)
    assert np.array_equal(flat[:3], before[:3]) and np.array_equal(flat[7:], before[7:])
    assert not np.any(flat[3:7] == before[3:7])
    # The slice ends where stepping it as a standalone array would.
    alone = before[3:7].copy()
    state2 = opt.init_state(4, np, np.float64)
    for _ in range(3):
        opt.step(alone, grads[3:7].copy(), state2)
    np.testing.assert_array_equal(flat[3:7], alone)


def test_state_layout():
    assert SGD(0.1).state_names == () and SGD(0.1, momentum=0.9).state_names == ("momentum",)
    assert Adam().state_names == ("exp_avg", "exp_avg_sq") and AdamW().state_names == Adam().state_names
    state = Adam().init_state(6, np, np.float32)
    assert set(state) == {"exp_avg", "exp_avg_sq", "step"}
    assert state["exp_avg"].shape == (6,) and state["exp_avg"].dtype == np.float32
    assert isinstance(state["step"], np.ndarray) and state["step"].shape == () and state["step"].dtype == np.int64
    assert set(SGD(0.1).init_state(6)) == {"step"}
    assert Adam().state_bytes(10, 4) == 80 and SGD(0.1, momentum=0.5).state_bytes(10, 4) == 40
    assert SGD(0.1).state_bytes(10, 4) == 0


def test_make():
    assert isinstance(make("sgd", lr=0.1, momentum=0.9), SGD)
    assert isinstance(make("Adam"), Adam) and not isinstance(make("adam"), AdamW)
    opt = make("adamw", lr=0.01, weight_decay=0.2)
    assert isinstance(opt, AdamW) and opt.weight_decay == 0.2
    with pytest.raises(ValueError, match="'sgd', 'adam', 'adamw'"):
        make("rmsprop")


def test_argument_errors():
    with pytest.raises(ValueError, match="lr must be in"):
        SGD(0.0)
    with pytest.raises(ValueError, match="lr must be in.*-1"):
        Adam(lr=-1)
    with pytest.raises(TypeError, match="lr must be a number"):
        SGD("0.1")
    with pytest.raises(ValueError, match="momentum"):
        SGD(0.1, momentum=-0.5)
    with pytest.raises(ValueError, match="nesterov=True requires momentum > 0"):
        SGD(0.1, nesterov=True)
    with pytest.raises(ValueError, match="dampening == 0"):
        SGD(0.1, momentum=0.9, dampening=0.1, nesterov=True)
    with pytest.raises(ValueError, match="weight_decay"):
        AdamW(weight_decay=-1)
    with pytest.raises(ValueError, match=r"betas\[1\]"):
        Adam(betas=(0.9, 1.0))
    with pytest.raises(TypeError, match="betas must be a pair"):
        Adam(betas=0.9)
    with pytest.raises(ValueError, match="eps"):
        Adam(eps=-1e-8)
    opt = Adam()
    with pytest.raises(ValueError, match="init_state\\(4\\)"):
        opt.step(np.zeros(4), np.zeros(4), opt.init_state(3))
    with pytest.raises(ValueError, match="same shape"):
        opt.step(np.zeros(4), np.zeros(5), opt.init_state(4))
    with pytest.raises(ValueError, match="no 'momentum' entry"):
        SGD(0.1, momentum=0.9).step(np.zeros(2), np.zeros(2), {"step": np.zeros((), np.int64)})


def test_optimizer_on_cupy():
    from tests.conftest import cupy_or_skip

    cp = cupy_or_skip()
    for opt in (SGD(0.1, momentum=0.9, nesterov=True), Adam(0.01, weight_decay=0.1), AdamW(0.01)):
        params = cp.asarray(P0)
        state = opt.init_state(4, cp, cp.float64)
        for g in GRADS:
            opt.step(params, cp.asarray(g), state)
        np.testing.assert_allclose(cp.asnumpy(params), _run(type(opt)(**_kwargs(opt))), rtol=1e-12)


def _kwargs(opt):
    if isinstance(opt, SGD):
        return dict(lr=opt.lr, momentum=opt.momentum, dampening=opt.dampening,
                    weight_decay=opt.weight_decay, nesterov=opt.nesterov)
    return dict(lr=opt.lr, betas=opt.betas, eps=opt.eps, weight_decay=opt.weight_decay)
