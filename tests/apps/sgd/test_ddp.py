"""apps.sgd.ddp, apps.sgd.zero and apps.sgd.zero3: N ranks with global batch B end where one rank with batch B ends.

Each test trains on the pass's COMM_WORLD (1-4 ranks; 3 splits batches of 20 as 7/7/6)
and compares the parameters with the same run, in mode ddp, on this rank alone
(COMM_SELF), which is the single-rank training on the same data, in float64 to 1e-12
relative.
"""

from __future__ import annotations

import tracemalloc
from dataclasses import replace

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from apps.blocks import block, blocks
from apps.nn import mlp, softmax_cross_entropy
from apps.nn.optim import make
from apps.nn.xp import to_host
from apps.sgd.data import Sampler, load_digits
from apps.sgd.train import Config, train
from apps.sgd.zero import Zero
from tests.conftest import cupy_or_skip

# 1,210 float64 parameters (9.7 KB), one bucket under a 2 KB cap (the 1,024-element W of layer 0 closes it).
BASE = Config(data="digits", hidden=(16,), dtype="float64", batch=20, steps=7, optimizer="adam", lr=1e-2,
              bucket_mb=2048 / (1 << 20), progress=False, eval_every=10 ** 9)
# 7,690 float64 parameters in 7 Linear layers; a 1 KB cap makes one bucket per Linear (330, 5 × 1,056 and
# 2,080 elements), so ZeRO-2 alternates two bucket buffers of 2,080 + 1,056 elements instead of holding 7,690.
MANY = replace(BASE, hidden=(32,) * 6, bucket_mb=1024 / (1 << 20))
MANY_PSI, MANY_BUFFERS = 7690, 2080 + 1056


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
    dict(mode="zero2", hidden=MANY.hidden, bucket_mb=MANY.bucket_mb),
    dict(mode="zero2", hidden=MANY.hidden, bucket_mb=MANY.bucket_mb, accumulate=3),
    dict(mode="zero2", hidden=MANY.hidden, bucket_mb=MANY.bucket_mb, per_parameter=True),
    dict(mode="zero2", hidden=MANY.hidden, bucket_mb=MANY.bucket_mb, overlap=False),
    dict(mode="zero3"),
    dict(mode="zero3", accumulate=2, algorithm="ring"),
    dict(mode="zero3", hidden=MANY.hidden, bucket_mb=MANY.bucket_mb),
    dict(mode="zero3", hidden=MANY.hidden, bucket_mb=MANY.bucket_mb, accumulate=3),
    dict(mode="zero3", hidden=MANY.hidden, bucket_mb=MANY.bucket_mb, per_parameter=True),
    dict(mode="zero3", hidden=MANY.hidden, bucket_mb=MANY.bucket_mb, overlap=False),
    dict(mode="zero3", hidden=MANY.hidden, bucket_mb=MANY.bucket_mb, layernorm=True, optimizer="adamw"),
], ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items() if k != "hidden") or "default")
def test_n_ranks_equal_one_rank(setting):
    comm = mpicomm.Comm()
    cfg = replace(BASE, **setting)
    mine, report = _params(comm, cfg)
    everyone = comm.allgather(mine)
    for other in everyone:
        np.testing.assert_array_equal(other, everyone[0])  # identical on every rank, bit for bit
    _close(mine, _alone(replace(cfg, algorithm="auto", mode="ddp")))  # ZeRO too: against plain one-rank training
    assert report.steps == 7


@pytest.mark.mpi
@pytest.mark.parametrize("setting", [
    dict(),
    dict(mode="zero1"),
    dict(mode="zero2"),
    dict(mode="zero3"),
    dict(mode="zero2", hidden=MANY.hidden, bucket_mb=MANY.bucket_mb, algorithm="ring"),
    dict(mode="zero3", hidden=MANY.hidden, bucket_mb=MANY.bucket_mb, overlap=False),
    dict(hidden=MANY.hidden, bucket_mb=MANY.bucket_mb, dropout=0.2, optimizer="sgd", lr=0.1, momentum=0.9),
    dict(batch=100, steps=16, micro_batches=9),  # (the 15th batch has 37 samples: blocks of 4 and 5)
], ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items() if k != "hidden") or "ddp")
def test_reproducible_training_ends_with_the_same_bits_at_every_rank_count(setting):
    """``--reproducible``: fixed micro-batches, their gradients summed reproducibly: the parameters after 7
    steps equal one rank's (COMM_SELF, every micro-batch on it) and plain ddp's bit for bit - at 1, 2, 3 and 4
    ranks (one pass each), so at every rank count alike; ZeRO's shards too."""
    comm = mpicomm.Comm()
    cfg = replace(BASE, reproducible=True, **{"micro_batches": 8, **setting})
    mine, report = _params(comm, cfg)
    np.testing.assert_array_equal(mine, _alone(cfg))
    np.testing.assert_array_equal(mine, _alone(replace(cfg, mode="ddp", algorithm="auto", overlap=True)))
    assert report.steps == cfg.steps


@pytest.mark.mpi
def test_reproducible_training_keeps_every_micro_batchs_gradients_until_the_last():
    """The price, stated: the stacks hold (passes × Ψ) gradients between a step's passes (ddp)."""
    comm = mpicomm.Comm()
    cfg = replace(BASE, reproducible=True, micro_batches=8, steps=1)
    _, report = _params(comm, cfg)
    passes = -(-8 // comm.Get_size())
    assert report.memory["grad_stacks"] == passes * 1210 * 8
    text, _, value = report.memory_formula
    assert text.endswith(f" + {8 * passes}Ψ") and value == sum(report.memory.values())


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
@pytest.mark.parametrize("mode", ["ddp", "zero2", "zero2-buckets", "zero3-buckets"])
def test_uneven_inputs_join_with_zeros_and_divide_by_the_active_ranks(mode):
    comm = mpicomm.Comm()
    cfg = replace(BASE, uneven=True, mode=mode, steps=6)
    if mode.endswith("-buckets"):  # joined ranks reduce zeros through every reused bucket buffer (and gather)
        cfg = replace(MANY, uneven=True, mode=mode.split("-")[0], steps=6, accumulate=2)
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
    assert sizes["zero2"]["grad_buckets"] == 8 * psi  # BASE's one bucket: its buffer is the whole gradient


@pytest.mark.mpi
@pytest.mark.parametrize("accumulate", [1, 2])
def test_zero2_holds_its_gradient_shard_and_the_buckets_in_flight_as_the_formula_says(accumulate):
    """Memory per rank = 8Ψ + 24Ψ/p + 8B (+ 8A) for float64 Adam, from the report and from the formula."""
    comm = mpicomm.Comm()
    p, rank = comm.Get_size(), comm.Get_rank()
    report = _params(comm, replace(MANY, mode="zero2", steps=2, accumulate=accumulate))[1]
    shard = blocks(MANY_PSI, p)[0][rank]
    parts = 0
    if accumulate > 1:  # this rank's largest share of the buckets 0, 2, 4, 6 and of 1, 3, 5
        sizes = [330, 1056, 1056, 1056, 1056, 1056, 2080]
        starts = [MANY_PSI - int(c) for c in np.cumsum(sizes)]  # the buckets tile the buffer from the end
        lo, hi = block(MANY_PSI, p, rank)
        share = [max(0, min(hi, start + n) - max(lo, start)) for start, n in zip(starts, sizes)]
        parts = max(share[0::2]) + max(share[1::2])
    assert report.memory == {"params": 8 * MANY_PSI, "grads": 8 * shard, "grad_buckets": 8 * (MANY_BUFFERS + parts),
                             "optimizer": 16 * shard}
    text, _, value = report.memory_formula
    assert text == "8Ψ + 24Ψ/p + 8B" + (" + 8A" if accumulate > 1 else "") and value == sum(report.memory.values())
    assert report.model.grads.size == 0  # the model's flat gradient buffer is gone


def whole_blocks_after_two_steps(make_strategy) -> tuple[list[int], object]:
    """The sizes of the live NumPy blocks of at least 8Ψ bytes (MANY's model, float64) after two steps of the
    strategy ``make_strategy(comm, model, optimizer)`` makes, outside mpicomm's plan cache; and the model."""
    comm = mpicomm.Comm()
    data = load_digits(np.float64)
    a, b = block(20, comm.Get_size(), comm.Get_rank())
    tracemalloc.start()
    try:
        model = mlp([64, *MANY.hidden, 10], dtype=np.float64)
        strategy = make_strategy(comm, model, make("adam", lr=1e-2))
        for _ in range(2):
            strategy.step(data.x_train[a:b], data.y_train[a:b], 20)
        live = tracemalloc.take_snapshot().filter_traces([
            tracemalloc.DomainFilter(True, np.lib.tracemalloc_domain),
            tracemalloc.Filter(False, "*/mpicomm/*", all_frames=True)]).traces
    finally:
        tracemalloc.stop()
    return [t.size for t in live if t.size >= 8 * MANY_PSI], model


@pytest.mark.mpi
def test_zero2_allocates_no_array_the_size_of_the_gradient():
    """Live NumPy blocks of 8Ψ bytes after two steps, outside mpicomm's plan cache: the parameters only (at p = 1
    also the shard and the two Adam moments, which are whole there); keeping the flat gradient would add one."""
    whole, _ = whole_blocks_after_two_steps(
        lambda comm, model, optimizer: Zero(comm, model, optimizer, stage=2, cap_mb=MANY.bucket_mb))
    assert whole == [8 * MANY_PSI] * (4 if mpicomm.Comm().Get_size() == 1 else 1)


@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["ddp", "zero2", "zero3"])
def test_cupy_backend_equals_numpy(mode):
    """The same run with parameters, gradients and buckets on the GPU (the rank's own, bound by the run): the
    parameters of the NumPy run, identical on every rank."""
    cupy_or_skip()
    comm = mpicomm.Comm()
    cfg = replace(BASE, mode=mode)
    host, _ = _params(comm, cfg)
    device, report = _params(comm, replace(cfg, backend="cupy"))
    mine = to_host(device)
    everyone = comm.allgather(mine)
    for other in everyone:
        np.testing.assert_array_equal(other, everyone[0])
    _close(mine, host)
    assert report.steps == 7
