"""apps.pipeline.train on this pass's ranks: every split trains exactly as one process on the same micro-batches.

At N ranks every (T, S) with T in {1, 2} and T·S dividing N runs, D = N / (T·S)
replicas: over the passes at 1-4 ranks that is S = 1..4, T = 1 and 2, D = 1..4.
Float64, 3 steps of Adam; the losses and the whole model's parameters must equal
the single-process reference to 1e-12 relative.
"""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest

import mpicomm
from apps.checkpoint import CheckpointError
from apps.pipeline.config import Config, ConfigError
from apps.pipeline.data import micro_slices, reference
from apps.pipeline.model import ModelSpec
from apps.pipeline.schedules import CHUNKED, SCHEDULES, default_chunks, splits_backward
from apps.pipeline.stage import STRATEGIES
from apps.pipeline.train import train

SPEC = ModelSpec(features=5, width=6, hidden=8, blocks=24, classes=3)
BASE = Config(spec=SPEC, batch=26, steps=3, optimizer="adam", lr=0.02, progress=False)
#: The schedules tested at 2 ranks only (CI time): their rows are tested in full, pure, in test_schedules.
TWO_RANKS_ONLY = ("looped-bfs", "zb-h2", "zb-v", "dualpipev")


def _splits(n):
    for t in (1, 2):
        for s in range(1, 5):
            if n % (t * s) == 0:
                yield t, s


def _close(a, b):
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12 * float(np.max(np.abs(b))))


@pytest.mark.mpi
@pytest.mark.parametrize("activations", STRATEGIES)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_every_split_equals_one_process(schedule, activations):
    comm = mpicomm.Comm()
    n = comm.Get_size()
    newer = schedule in TWO_RANKS_ONLY or (splits_backward(schedule) and activations == "recompute")
    if newer and (n != 2 or (schedule == "looped-bfs" and activations != "store")):
        pytest.skip("the newer schedules (and recompute with a split backward) train at 2 ranks only (T x S = 1 x 2 "
                    "and 2 x 1); looped-bfs, a reordering of whole backwards, with stored activations only")
    for t, s in _splits(n):
        if newer and t * s == 1:
            continue
        chunk_counts = (2, 3) if schedule == "interleaved" else (2,) if schedule in CHUNKED else \
            (default_chunks(schedule),)
        for chunks in chunk_counts:
            if SPEC.blocks % (s * chunks):
                continue
            micro = 2 * s if schedule in ("interleaved", "dualpipev") else 3  # 3 < S = 4: fewer than stages
            cfg = replace(BASE, stages=s, tensor=t, schedule=schedule, chunks=chunks, micro=micro,
                          activations=activations)
            result = train(comm, cfg)
            if comm.Get_rank() == 0:
                losses, params = reference(cfg, replicas=n // (t * s))
                _close(np.array(result.losses), np.array(losses))
                _close(result.full, params)


@pytest.mark.mpi
def test_recompute_with_a_split_backward_holds_less_than_store():
    """DualPipeV on 2 stages: recompute keeps the stage inputs from F to I, and what W needs only from I to W."""
    comm = mpicomm.Comm()
    if comm.Get_size() != 2:
        pytest.skip("the newer schedules train at 2 ranks only")
    cfg = replace(BASE, stages=2, micro=4, steps=2, schedule="dualpipev", chunks=2, spec=replace(SPEC, blocks=4))
    store = train(comm, cfg).stats
    recompute = train(comm, replace(cfg, activations="recompute")).stats
    assert recompute["peak_micro"] == store["peak_micro"] == store["planned_peak"] == 5  # 2p + 1 chunk micro-batches
    assert recompute["peak_bytes"] < store["peak_bytes"]


@pytest.mark.mpi
def test_balance_by_time_trains_the_same_model():
    comm = mpicomm.Comm()
    cfg = replace(BASE, stages=comm.Get_size(), micro=4, balance="time", steps=2)
    result = train(comm, cfg)
    if comm.Get_rank() == 0:
        _close(result.full, reference(cfg)[1])


@pytest.mark.mpi
def test_measurements_add_up():
    comm = mpicomm.Comm()
    n = comm.Get_size()
    cfg = replace(BASE, stages=n, micro=4, steps=3, schedule="gpipe")
    result = train(comm, cfg)
    stats = result.stats
    assert stats["busy"] > 0 and stats["steps"] == 2
    assert stats["peak_micro"] == 4  # GPipe holds every micro-batch on every stage
    ops = sorted(e[0] for e in stats["events"] if e[0] != "wait")
    assert ops == ["B"] * 4 + ["F"] * 4
    if comm.Get_rank() == 0:
        assert len(result.ranks) == n


@pytest.mark.mpi
@pytest.mark.parametrize("change,match", [
    (dict(stages=30), "30 stages but the model has 24 blocks; use --blocks >= 30"),
    (dict(micro=0), "--micro must be an integer >= 1, got 0"),
    (dict(schedule="interleaved", chunks=2, micro=3, stages=2), r"multiple of the stages \(2\)"),
    (dict(schedule="interleaved", chunks=5, micro=2, stages=1), r"blocks \(24\) divisible by stages x chunks \(5\)"),
    (dict(schedule="dualpipev", chunks=2, micro=1), r"dualpipev needs at least twice as many micro-batches"),
    (dict(schedule="zb-v"), "zb-v places exactly two chunks on each rank .*; use --chunks 2"),
    (dict(tensor=3), "--hidden 8 is not divisible by --tensor 3"),
    (dict(schedule="bogus"), "--schedule 'bogus': choose one of"),
    (dict(batch=2, micro=3), "--batch 2 is smaller than --micro 3"),
    (dict(backend="jax"), "--backend 'jax': choose one of numpy, cupy"),
    (dict(offload_window="disk"), "--offload-window 'disk': choose one of auto, rma, shared"),
])
def test_bad_options_raise_on_every_rank(change, match):
    comm = mpicomm.Comm()
    with pytest.raises(ConfigError, match=match):
        train(comm, replace(BASE, **{"stages": comm.Get_size(), **change}))


@pytest.mark.mpi
def test_ranks_not_t_times_s_times_d():
    comm = mpicomm.Comm()
    n = comm.Get_size()
    s = n + 1
    with pytest.raises(ConfigError, match=f"{n} ranks cannot be split into --tensor 1 x --stages {s} x D"):
        train(comm, replace(BASE, stages=s))


@pytest.mark.mpi
@pytest.mark.parametrize("schedule", ["1f1b", "dualpipev"])
def test_restart_resumes_bit_for_bit(shared_dir, schedule):
    comm = mpicomm.Comm()
    if schedule in TWO_RANKS_ONLY and comm.Get_size() != 2:
        pytest.skip("the newer schedules train at 2 ranks only")
    directory = shared_dir
    cfg = replace(BASE, stages=comm.Get_size(), micro=4, steps=4, checkpoint_dir=directory, schedule=schedule,
                  chunks=default_chunks(schedule))
    straight = train(comm, cfg)
    train(comm, replace(cfg, steps=2, checkpoint_every=2))
    resumed = train(comm, replace(cfg, restart=True, checkpoint_every=2))
    assert resumed.start_step == 2
    for st, params in straight.params.items():
        np.testing.assert_array_equal(resumed.params[st], params)
    assert resumed.losses == straight.losses[2:]
    # a checkpoint of another split is refused on every rank
    with pytest.raises(CheckpointError, match="another model, split or run"):
        train(comm, replace(cfg, restart=True, spec=replace(SPEC, width=7)))
    comm.Barrier()
    if comm.Get_rank() == 0:  # flip one bit of step 4's last data file
        victim = sorted(f for f in os.listdir(directory) if f.endswith(".bin"))[-1]
        with open(os.path.join(directory, victim), "r+b") as f:
            f.seek(-1, 2)
            byte = f.read(1)
            f.seek(-1, 2)
            f.write(bytes([byte[0] ^ 1]))
    comm.Barrier()
    again = train(comm, replace(cfg, restart=True))  # step 4 is refused: back to step 2, same result
    assert again.start_step == 2 and again.losses == straight.losses[2:]


@pytest.mark.mpi
def test_unwritable_log_is_an_error_on_every_rank_even_with_offload():
    comm = mpicomm.Comm()
    cfg = replace(BASE, stages=comm.Get_size(), micro=3, activations="offload", log="/nonexistent-dir/x.csv")
    with pytest.raises(ConfigError, match="--log /nonexistent-dir/x.csv"):
        train(comm, cfg)


@pytest.mark.mpi
def test_activation_memory_store_recompute_offload():
    """1F1B on rank 0: store holds every in-flight micro-batch's activations; recompute its inputs plus one
    rebuilt micro-batch; offload only the one fetched back - and the next rank hosts what it parks."""
    comm = mpicomm.Comm()
    n = comm.Get_size()
    peaks = {}
    for activations in ("store", "recompute", "offload"):
        cfg = replace(BASE, stages=n, micro=4, steps=2, spec=replace(SPEC, blocks=4, width=16, hidden=32),
                      activations=activations)
        peaks[activations] = train(comm, cfg).stats
    store, recompute, offload = (peaks[a]["peak_bytes"] for a in ("store", "recompute", "offload"))
    planned = peaks["store"]["planned_peak"]  # 1F1B: p - rank micro-batches in flight
    assert planned == min(n - comm.Get_rank(), 4)
    assert peaks["store"]["peak_micro"] == planned == peaks["offload"]["peak_micro"] == peaks["recompute"]["peak_micro"]
    if n > 1 and comm.Get_rank() == 0:  # rank 0 keeps n micro-batches in flight: one is what recompute rebuilds
        assert recompute < store and offload <= store
        if planned > 2 or peaks["offload"]["offload_window"] == "shared":  # held: the one whose backward runs
            assert offload < store  # (and, prefetched over RMA, the next)
    assert peaks["offload"]["hosted_bytes"] > 0


@pytest.mark.mpi
def test_balance_by_time_restarts_on_the_split_it_saved(shared_dir):
    comm = mpicomm.Comm()
    cfg = replace(BASE, stages=comm.Get_size(), micro=3, steps=2, balance="time", checkpoint_every=1,
                  checkpoint_dir=shared_dir)
    first = train(comm, cfg)
    resumed = train(comm, replace(cfg, steps=3, restart=True))  # measuring again could pick another split
    assert resumed.start_step == 2 and len(resumed.losses) == 1
    assert first.stats["stages"] == resumed.stats["stages"]


def _block_bytes(n, T, t, itemsize=8):
    return (n // T + (1 if t < n % T else 0)) * itemsize


@pytest.mark.mpi
@pytest.mark.parametrize("activations", ["store", "offload"])
def test_tensor_ranks_send_one_block_between_stages(activations):
    """T x S = 2 x 2 (and 1 x 2 for comparison): each tensor rank sends its 1/T block of every activation and
    gradient - an uneven split, width 5 - and the stage all-gathers the rest; training equals one process."""
    comm = mpicomm.Comm()
    n = comm.Get_size()
    runs = [t for t in (1, 2) if n % (2 * t) == 0]
    if not runs:
        pytest.skip("needs a multiple of 2 (T = 1) or 4 (T = 2) ranks")
    spec = replace(SPEC, width=5, blocks=4)  # rows 9, 9, 8 of 5 columns: 45 and 40 elements, odd over T = 2
    for T in runs:
        cfg = replace(BASE, stages=2, tensor=T, micro=3, spec=spec, activations=activations, steps=2)
        result = train(comm, cfg)
        t, D = comm.Get_rank() % T, n // (2 * T)
        d = comm.Get_rank() // (2 * T)
        rows = [hi - lo for lo, hi in micro_slices(cfg.batch, D, d, cfg.micro)]
        expected = sum(_block_bytes(r * spec.width, T, t) for r in rows)  # one activation (or gradient) each
        assert result.stats["sent_bytes"] == expected
        assert result.stats["gathered_bytes"] == (sum(r * spec.width * 8 for r in rows) - expected if T > 1 else 0)
        if comm.Get_rank() == 0:
            losses, params = reference(cfg, replicas=D)
            _close(np.array(result.losses), np.array(losses))
            _close(result.full, params)


@pytest.mark.mpi
@pytest.mark.parametrize("window", ["rma", "shared"])
@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1"])
def test_offload_prefetches_through_either_window(schedule, window):
    """Offloaded activations, parked in the next rank's RMA window (fetched back ahead of each backward) or its
    piece of a node-shared window (copied back at the backward): the same training as one process; over RMA every
    rank but the last stage prefetches, through the shared window none does."""
    comm = mpicomm.Comm()
    n = comm.Get_size()
    cfg = replace(BASE, stages=n, micro=4, steps=2, schedule=schedule, activations="offload", offload_window=window,
                  spec=replace(SPEC, blocks=4))
    if window == "shared" and comm.nodes > 1:  # some rank parks on a rank of another node: refused on every rank
        with pytest.raises(ConfigError, match="--offload-window shared: pipeline rank"):
            train(comm, cfg)
        cfg = replace(cfg, offload_window="auto")
    result = train(comm, cfg)
    assert result.stats["offload_window"] in (window, "rma" if comm.nodes > 1 else window)
    if result.stats["offload_window"] == "shared":
        assert result.stats["prefetched"] == 0
    elif n > 1 and comm.Get_rank() < n - 1:  # the last stage runs each backward right after its forward
        assert result.stats["prefetched"] > 0
    if comm.Get_rank() == 0:
        losses, params = reference(cfg)
        _close(np.array(result.losses), np.array(losses))
        _close(result.full, params)


def _has_cupy():
    try:
        import cupy  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.mpi
@pytest.mark.skipif(_has_cupy(), reason="CuPy is installed: the refusal cannot happen")
def test_cupy_backend_without_cupy_names_the_fix_on_every_rank():
    comm = mpicomm.Comm()
    with pytest.raises(ConfigError, match=r"--backend cupy needs CuPy: pip install -e '\.\[cuda12\]'"):
        train(comm, replace(BASE, stages=comm.Get_size(), backend="cupy"))


def _has_gpu():
    from mpicomm.device import visible_devices

    return visible_devices() > 0  # 0 without CuPy, without a driver, or with no device visible


@pytest.mark.mpi
@pytest.mark.skipif(not _has_gpu(), reason="needs CuPy and a GPU")
@pytest.mark.parametrize("activations", STRATEGIES)
def test_cupy_backend_equals_one_process(activations):
    comm = mpicomm.Comm()
    n = comm.Get_size()
    for t, s in _splits(n):
        cfg = replace(BASE, stages=s, tensor=t, micro=3, backend="cupy", activations=activations,
                      spec=replace(SPEC, blocks=4), steps=2)
        result = train(comm, cfg)
        if comm.Get_rank() == 0:
            losses, params = reference(cfg, replicas=n // (t * s))
            _close(np.array(result.losses), np.array(losses))
            _close(result.full, params)
