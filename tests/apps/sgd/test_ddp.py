"""apps.sgd.ddp and apps.sgd.zero: N ranks with global batch B end where one rank with batch B ends.

Each test trains on the pass's COMM_WORLD (1-4 ranks; 3 splits batches of 20 as 7/7/6)
and compares the parameters with the same run on this rank alone (COMM_SELF), which is
the single-rank training on the same data, in float64 to 1e-12 relative.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from apps.nn import mlp, softmax_cross_entropy
from apps.nn.optim import make
from apps.sgd.data import Sampler, load_digits
from apps.sgd.train import Config, train

# 1,210 float64 parameters (9.7 KB); a 2 KB cap makes 5 buckets, some splitting a layer's W and b.
BASE = Config(data="digits", hidden=(16,), dtype="float64", batch=20, steps=7, optimizer="adam", lr=1e-2,
              bucket_mb=2048 / (1 << 20), progress=False, eval_every=10 ** 9)


def _params(comm, cfg):
    report = train(comm, cfg, lambda s: None)
    return report.model.params.copy(), report


def _alone(cfg):
    return _params(mpicomm.Comm(MPI.COMM_SELF), cfg)[0]


def _close(a, b, rtol=1e-12):
    scale = np.abs(b).max()
    np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * scale)


@pytest.mark.mpi
@pytest.mark.parametrize("setting", [
    dict(),
    dict(overlap=False),
    dict(per_parameter=True),
    dict(bucket_mb=25.0),
    dict(accumulate=2),
    dict(accumulate=3, overlap=False),
    dict(optimizer="sgd", lr=0.1, momentum=0.9),
    dict(algorithm="recursive_doubling"),
    dict(algorithm="rabenseifner"),
    dict(mode="zero1"),
    dict(mode="zero2"),
    dict(mode="zero2", accumulate=2, algorithm="ring"),
    dict(mode="zero1", optimizer="adamw"),
], ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()) or "default")
def test_n_ranks_equal_one_rank(setting):
    comm = mpicomm.Comm()
    cfg = replace(BASE, **setting)
    mine, report = _params(comm, cfg)
    everyone = comm.allgather(mine)
    for other in everyone:
        np.testing.assert_array_equal(other, everyone[0])  # identical on every rank, bit for bit
    _close(mine, _alone(replace(cfg, algorithm="auto")))
    assert report.steps == 7


@pytest.mark.mpi
def test_the_last_uneven_batch_is_weighted_by_its_samples():
    """1437 samples in batches of 100: the 15th batch has 37, split unevenly (and 0 on some ranks at 4+)."""
    comm = mpicomm.Comm()
    cfg = replace(BASE, batch=100, steps=16)
    mine, _ = _params(comm, cfg)
    _close(mine, _alone(cfg))


@pytest.mark.mpi
def test_fp16_compression_stays_close_and_identical_across_ranks():
    comm = mpicomm.Comm()
    cfg = replace(BASE, dtype="float32", compress="fp16", optimizer="sgd", lr=0.1)
    mine, _ = _params(comm, cfg)
    everyone = comm.allgather(mine)
    for other in everyone:
        np.testing.assert_array_equal(other, everyone[0])
    exact = _alone(replace(cfg, compress=None))
    assert mine.dtype == np.float32
    np.testing.assert_allclose(mine, exact, atol=2e-3 * np.abs(exact).max())
    if comm.Get_size() > 1:
        assert not np.array_equal(mine, exact)  # the gradients really travelled in half precision


def _reference_uneven(cfg, world):
    """Join's result, computed on one process: step s averages the gradients of the ranks still active."""
    data = load_digits(np.float64)
    model = mlp([64, *cfg.hidden, 10], dtype=np.float64, seed=cfg.seed)
    opt = make(cfg.optimizer, lr=cfg.lr, weight_decay=0.0)
    state = opt.init_state(model.num_params, np, np.float64)
    samplers = [Sampler(data.n_train, cfg.batch, world, r, cfg.seed) for r in range(world)]
    per_epoch = samplers[0].steps_per_epoch
    total = np.zeros(model.num_params)
    for step in range(cfg.steps):
        epoch, s = divmod(step, per_epoch)
        active = [r for r in range(world) if step < cfg.steps - r]
        total[:] = 0
        for r in active:
            idx, count = samplers[r].batch(epoch, s)
            model.zero_grad()
            logits = model.forward(data.x_train[idx])
            _, d = softmax_cross_entropy(logits, data.y_train[idx], count / world)
            model.backward(d)
            total += model.grads
        model.grads[:] = total / len(active)
        opt.step(model.params, model.grads, state)
    return model.params


@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["ddp", "zero2"])
def test_uneven_inputs_join_with_zeros_and_divide_by_the_active_ranks(mode):
    comm = mpicomm.Comm()
    cfg = replace(BASE, uneven=True, mode=mode, steps=6)
    mine, report = _params(comm, cfg)
    everyone = comm.allgather(mine)
    for other in everyone:
        np.testing.assert_array_equal(other, everyone[0])  # nobody hung, everybody stepped alike
    _close(mine, _reference_uneven(cfg, comm.Get_size()), rtol=1e-11)


@pytest.mark.mpi
def test_zero_shards_optimizer_state_and_gradients():
    comm = mpicomm.Comm()
    p = comm.Get_size()
    sizes = {}
    for mode in ("ddp", "zero1", "zero2"):
        sizes[mode] = _params(comm, replace(BASE, mode=mode, steps=1))[1].memory
    psi = 1210
    assert sizes["ddp"]["optimizer"] == 16 * psi  # Adam: two float64 moments
    shard = -(-psi // p)
    assert sizes["zero1"]["optimizer"] <= 16 * shard and sizes["zero2"]["optimizer"] <= 16 * shard
    assert sizes["zero1"]["grads"] == 8 * psi + 8 * (sizes["zero1"]["optimizer"] // 16)
    assert sizes["zero2"]["grads"] == 8 * (sizes["zero2"]["optimizer"] // 16)  # only the kept shard
