"""apps.sgd.zero3: what a rank holds (the formula, and no Ψ-sized array between steps), the gathers' schedule and
bytes, checkpoints resumed bit for bit. Training results against one-rank ddp: tests/apps/sgd/test_ddp.py."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import mpicomm
from apps.blocks import block, blocks
from apps.nn import mlp
from apps.nn.optim import make
from apps.sgd.bench import _collective_bytes
from apps.sgd.data import load_digits
from apps.sgd.train import train
from apps.sgd.zero3 import Zero3
from tests.apps.sgd.test_ddp import MANY, MANY_BUFFERS, MANY_PSI, whole_blocks_after_two_steps

# MANY's 7 Linear layers: 2,080, 5 × 1,056 and 330 parameters; layer j is gathered into buffer j % 2.
MANY_LAYERS = 2080 + 1056


def _quiet(comm, cfg):
    return train(comm, cfg, lambda s: None)


@pytest.mark.mpi
@pytest.mark.parametrize("accumulate", [1, 2])
def test_zero3_holds_its_shards_and_two_layers_as_the_formula_says(accumulate):
    """Memory per rank = 32Ψ/p + 8L + 8B (+ 8A) for float64 Adam, from the report and from the formula."""
    comm = mpicomm.Comm()
    p, rank = comm.Get_size(), comm.Get_rank()
    report = _quiet(comm, replace(MANY, mode="zero3", steps=2, accumulate=accumulate))
    shard = blocks(MANY_PSI, p)[0][rank]
    parts = 0
    if accumulate > 1:  # this rank's largest share of the buckets 0, 2, 4, 6 and of 1, 3, 5 (as zero2's)
        sizes = [330, 1056, 1056, 1056, 1056, 1056, 2080]
        starts = [MANY_PSI - int(c) for c in np.cumsum(sizes)]
        lo, hi = block(MANY_PSI, p, rank)
        share = [max(0, min(hi, start + n) - max(lo, start)) for start, n in zip(starts, sizes)]
        parts = max(share[0::2]) + max(share[1::2])
    assert report.memory == {"params": 8 * shard, "param_layers": 8 * MANY_LAYERS, "grads": 8 * shard,
                             "grad_buckets": 8 * (MANY_BUFFERS + parts), "optimizer": 16 * shard}
    text, where, value = report.memory_formula
    assert text == "32Ψ/p + 8L + 8B" + (" + 8A" if accumulate > 1 else "") and value == sum(report.memory.values())
    assert f"L = {MANY_LAYERS:,} in 2 layer buffers" in where and report.params == MANY_PSI
    assert report.model.params.size == MANY_PSI  # gathered whole at the end of the run, for the report


def _schedule(strategy):
    """Record, after each layer's gather has been waited for, which gathers are in flight."""
    gather = strategy.layer_gather
    seen = []
    need = gather.need

    def recording(j, step):
        waited = need(j, step)
        seen.append((j, sorted(gather._requests)))
        return waited

    gather.need = recording
    return seen


@pytest.mark.mpi
@pytest.mark.parametrize("overlap", [True, False])
def test_each_layer_is_gathered_before_forward_and_backward_with_the_next_in_flight(overlap):
    """Forward computes layer j while j + 1 is gathered, backward j while j − 1 is: each layer twice per
    micro-batch, 2Ψ elements - with the reduce-scatter of Ψ, 1.5× what ddp's all-reduce moves."""
    comm = mpicomm.Comm()
    p, rank = comm.Get_size(), comm.Get_rank()
    data = load_digits(np.float64)
    a, b = block(20, p, rank)
    model = mlp([64, *MANY.hidden, 10], dtype=np.float64)
    strategy = Zero3(comm, model, make("adam", lr=1e-2), cap_mb=MANY.bucket_mb, overlap=overlap, accumulate=2)
    seen = _schedule(strategy)
    strategy.step(data.x_train[a:b], data.y_train[a:b], 20)
    forward = [(j, [j + 1] if overlap and j < 6 else []) for j in range(7)]
    backward = [(j, [j - 1] if overlap and j > 0 else []) for j in range(6, -1, -1)]
    assert seen == (forward + backward) * 2  # two micro-batches
    assert strategy.gathered == 2 * 2 * MANY_PSI
    n = 8 * MANY_PSI
    assert _collective_bytes("zero3", n, 4, "ring") == 3 * 3 / 4 * n == 1.5 * _collective_bytes("overlapped", n, 4,
                                                                                              "ring")


@pytest.mark.mpi
def test_zero3_allocates_no_array_the_size_of_the_parameters():
    """Live NumPy blocks of 8Ψ bytes after two steps, outside mpicomm's plan cache: none (at p = 1 the shards of
    parameters and gradients and the two Adam moments, which are whole there); the flat parameters would add one."""
    whole, model = whole_blocks_after_two_steps(
        lambda comm, model, optimizer: Zero3(comm, model, optimizer, cap_mb=MANY.bucket_mb))
    assert whole == [8 * MANY_PSI] * (4 if mpicomm.Comm().Get_size() == 1 else 0)
    assert model.params.size == 0 and model.grads.size == 0


@pytest.mark.mpi
def test_a_resumed_zero3_run_equals_an_uninterrupted_one_bit_for_bit(shared_dir):
    """Checkpoints at steps 3 and 5 (the whole parameters gathered on rank 0, the optimizer shards gathered),
    evaluations every 2 steps in between; resumed from step 5 to 8."""
    comm = mpicomm.Comm()
    cfg = replace(MANY, mode="zero3", steps=8, dropout=0.1, eval_every=2, checkpoint_dir=shared_dir)
    straight = _quiet(comm, cfg)
    _quiet(comm, replace(cfg, steps=5, checkpoint_every=3))
    resumed = _quiet(comm, replace(cfg, checkpoint_every=3, restart=True))
    assert resumed.start_step == 5
    np.testing.assert_array_equal(resumed.model.params, straight.model.params)
    if comm.Get_rank() == 0:
        assert resumed.history[-1]["test_loss"] == straight.history[-1]["test_loss"]
