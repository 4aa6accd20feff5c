"""apps.sgd.ps: the parameter server against a single-process reference, staleness, determinism, bad input.

Each test runs on the pass's COMM_WORLD (2, 3 or 4 ranks with the last K as dedicated
servers; 1 to 4 ranks co-located, every rank a worker and a shard's server) with a
small float64 MLP and a synthetic batch that depends only on the sample index, so
every rank can build any sample and the single-process reference. Checkpoints:
tests/apps/sgd/test_ps_checkpoint.py.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from mpi4py import MPI

from apps.blocks import block
from apps.nn import mlp, softmax_cross_entropy
from apps.nn.optim import SGD
from apps.sgd.ps import COLOCATED, ParameterServer

SIZES = [8, 16, 4]
BATCH = 12
STEPS = 5


def _model(hidden=SIZES[1]):
    return mlp([SIZES[0], hidden, SIZES[-1]], dtype=np.float64, seed=1)


def _optimizer():
    return SGD(lr=0.1, momentum=0.9)


def _samples(indices):
    """Inputs and labels of the given global sample indices (a fixed function of the index)."""
    i = np.asarray(indices, dtype=np.float64)[:, None]
    x = np.sin(0.37 * i + 0.11 * np.arange(SIZES[0]) + 0.05 * i * np.arange(SIZES[0]) / 7.0)
    y = (np.asarray(indices, dtype=np.int64) * 7 + 3) % SIZES[-1]
    return x, y


def _batch(step):
    return np.arange(step * BATCH, (step + 1) * BATCH)


def _reference(steps=STEPS, staleness=0, hidden=SIZES[1]):
    """One process, the whole global batch, the whole flat buffer: the parameters after *steps* steps.

    With *staleness* S, step c's gradient is taken at the parameters of version max(0, c - S)
    (the parameters after that many steps) and applied to the newest ones.
    """
    model, opt = _model(hidden), _optimizer()
    state = opt.init_state(model.num_params, np, model.params.dtype)
    versions = [model.params.copy()]
    current = model.params.copy()
    for step in range(steps):
        x, y = _samples(_batch(step))
        model.params[...] = versions[max(0, step - staleness)]
        model.zero_grad()
        _, dlogits = softmax_cross_entropy(model.forward(x, train=True), y)
        model.backward(dlogits)
        opt.step(current, model.grads, state)
        versions.append(current.copy())
    return current


def _run(comm, servers=1, staleness=0, steps=STEPS, hidden=SIZES[1], model=None):
    """Train with the parameter server; every rank returns (ps, its final params, or None on a dedicated server)."""
    model = _model(hidden) if model is None else model
    ps = ParameterServer(comm, model, _optimizer(), servers=servers, staleness=staleness, total_steps=steps)
    if ps.is_worker:
        for step in range(steps):
            a, b = block(BATCH, ps.workers, ps.worker_index)
            x, y = _samples(_batch(step)[a:b])
            res = ps.step(x, y, BATCH)
            assert res.samples == b - a
        ps.close()
        return ps, model.params.copy()
    ps.serve()
    ps.close()
    return ps, None


def _worker_params(ps, mine):
    """Every worker's final parameters (on every rank), and the servers' shards joined in order (rank order is
    shard order in both layouts)."""
    every = MPI.COMM_WORLD.allgather((mine, ps.shard.copy() if ps.is_server else None))
    workers = [p for p, _ in every if p is not None]
    shards = [s for _, s in every if s is not None]
    return workers, np.concatenate(shards)


def _close(got, want):
    """Equal up to rounding: the sums' order depends on the reduction algorithm (a commutative op may be
    summed in any order), so elements near zero are compared against the vector's scale."""
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * float(np.abs(want).max()))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("servers", [1, 2])
def test_sync_equals_single_process(comm, servers):
    size = comm.Get_size()
    if servers >= size:
        pytest.skip(f"{servers} servers need at least {servers + 1} ranks")
    ps, mine = _run(comm, servers=servers, staleness=0)
    workers, joined = _worker_params(ps, mine)
    assert ps.name == "ps-sync"
    assert ps.workers == size - servers and len(workers) == ps.workers
    assert ps.is_server == (comm.Get_rank() >= size - servers)
    reference = _reference()
    assert not np.allclose(reference, _model().params)  # training moved the weights
    for params in workers:
        _close(params, reference)
        assert np.array_equal(params, workers[0])
    assert np.array_equal(joined, workers[0])  # workers end with exactly the servers' weights


@pytest.mark.mpi(min_size=2)
def test_sync_stats_and_memory(comm):
    size = comm.Get_size()
    servers = 2 if size >= 3 else 1
    ps, _ = _run(comm, servers=servers, staleness=0)
    n, itemsize = _model().num_params, 8
    shard_bytes = [(b - a) * itemsize for a, b in (block(n, servers, k) for k in range(servers))]
    s = ps.stats
    assert s["clocks"] == STEPS
    if ps.is_worker:
        assert s["pushed"] == [STEPS * b for b in shard_bytes]
        assert s["pulled"] == [(STEPS + 1) * b for b in shard_bytes]  # versions 0 .. STEPS, once each
        assert s["link_bytes"] == sum(s["pushed"]) + sum(s["pulled"])
        assert ps.memory()["params"] == n * itemsize and ps.memory()["optimizer"] == 0
    else:
        mine = shard_bytes[ps.server_index]
        assert s["received"] == STEPS * ps.workers * mine
        assert s["sent"] == (STEPS + 1) * ps.workers * mine
        memory = ps.memory()
        assert memory["params"] == mine  # every published version was released
        assert memory["optimizer"] == mine  # SGD momentum for the shard only


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("staleness", [1, 2])
def test_fixed_staleness_is_deterministic_and_matters(comm, staleness):
    servers = 2 if comm.Get_size() >= 4 else 1
    ps, first = _run(comm, servers=servers, staleness=staleness)
    workers_a, joined_a = _worker_params(ps, first)
    _, again = _run(comm, servers=servers, staleness=staleness)
    workers_b, _ = _worker_params(ps, again)
    _, sync = _run(comm, servers=servers, staleness=0)
    workers_sync, _ = _worker_params(ps, sync)
    assert ps.name == "ps-async"
    for params in workers_a + workers_b:
        assert np.array_equal(params, workers_a[0])  # every worker, both runs: the same bits
    assert np.array_equal(joined_a, workers_a[0])
    assert not np.allclose(workers_a[0], workers_sync[0], rtol=1e-6, atol=0)  # stale gradients change the path
    # exactly stale synchronous parallel: clock c computed at version max(0, c - S)
    _close(workers_a[0], _reference(staleness=staleness))
    assert not np.allclose(_reference(staleness=staleness), _reference(staleness=0), rtol=1e-6, atol=0)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("staleness", [0, 1])
def test_large_shards_match_the_reference(comm, staleness):
    # 600 hidden units: ~8,000 float64 parameters, so every shard is sent in a header and a payload
    servers = comm.Get_size() - 1 if comm.Get_size() <= 3 else 2
    ps, mine = _run(comm, servers=servers, staleness=staleness, hidden=600)
    workers, joined = _worker_params(ps, mine)
    assert min(b - a for a, b in ps.bounds) * 8 > 16 * 1024
    for params in workers:
        assert np.array_equal(params, joined)
    _close(joined, _reference(staleness=staleness, hidden=600))


@pytest.mark.mpi(min_size=2)
def test_staleness_beyond_the_run_uses_the_initial_weights_and_ends_on_the_final_version(comm):
    ps, mine = _run(comm, staleness=STEPS + 3)
    workers, joined = _worker_params(ps, mine)
    for params in workers:
        assert np.array_equal(params, joined)
    _close(joined, _reference(staleness=STEPS + 3))
    assert not np.array_equal(joined, _model().params)


@pytest.mark.mpi(min_size=2)
def test_unbounded_async_finishes_with_identical_workers(comm):
    servers = 2 if comm.Get_size() >= 4 else 1
    ps, mine = _run(comm, servers=servers, staleness=None, steps=8)
    workers, joined = _worker_params(ps, mine)
    assert ps.name == "ps-async" and ps.stats["clocks"] == 8
    for params in workers:
        assert np.array_equal(params, workers[0])
    assert np.array_equal(joined, workers[0])
    assert np.all(np.isfinite(joined)) and not np.array_equal(joined, _model().params)


@pytest.mark.mpi(min_size=2)
def test_zero_steps_ends_on_the_initial_weights(comm):
    ps, mine = _run(comm, staleness=0, steps=0)
    workers, joined = _worker_params(ps, mine)
    for params in workers:
        assert np.array_equal(params, _model().params)
    assert np.array_equal(joined, _model().params)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("kwargs,message", [
    ({"servers": "size"}, r"--servers \d+: need 1 <= K < N ranks \(N = \d+\); the rest are workers"),
    ({"servers": -1}, r"--servers -1: need 1 <= K < N ranks .*or --servers 0: every rank a worker"),
    ({"staleness": -1}, r"--staleness -1: must be >= 0 \(0 is synchronous\)"),
    ({"total_steps": -1}, r"total_steps -1: must be >= 0"),
    ({"start": STEPS + 1}, rf"start {STEPS + 1}: the run resumes at a step in 0 .. total_steps={STEPS}"),
])
def test_bad_input_raises_on_every_rank(comm, kwargs, message):
    options = {"servers": 1, "staleness": 0, "total_steps": STEPS} | kwargs
    if options["servers"] == "size":
        options["servers"] = comm.Get_size()
    with pytest.raises(ValueError, match=message):
        ParameterServer(comm, _model(), _optimizer(), **options)
    comm.Barrier()  # and nobody was left inside a collective: the next test starts together


# ---------------------------------------------------------------- co-located: every rank a worker and a server


@pytest.mark.mpi
@pytest.mark.parametrize("staleness", [0, 2])
def test_colocated_equals_the_reference_from_one_rank(comm, staleness):
    size, rank = comm.Get_size(), comm.Get_rank()
    ps, mine = _run(comm, servers=COLOCATED, staleness=staleness)
    workers, joined = _worker_params(ps, mine)
    assert ps.colocated and ps.is_worker and ps.is_server
    assert ps.workers == ps.servers == len(workers) == size and ps.worker_index == ps.server_index == rank
    assert ps.name == ("ps-sync" if staleness == 0 else "ps-async")
    for params in workers:
        assert np.array_equal(params, workers[0])
    assert np.array_equal(joined, workers[0])  # every rank ends with exactly the shards' weights
    _close(workers[0], _reference(staleness=staleness))
    assert not np.allclose(workers[0], _model().params)


@pytest.mark.mpi
def test_colocated_unbounded_async_finishes_with_identical_workers(comm):
    ps, mine = _run(comm, servers=COLOCATED, staleness=None, steps=8)
    workers, joined = _worker_params(ps, mine)
    assert ps.stats["clocks"] == 8
    for params in workers:
        assert np.array_equal(params, joined)
    assert np.all(np.isfinite(joined)) and not np.array_equal(joined, _model().params)


@pytest.mark.mpi
def test_colocated_stats_leave_out_the_traffic_with_the_own_shard(comm):
    size, rank = comm.Get_size(), comm.Get_rank()
    ps, _ = _run(comm, servers=COLOCATED, staleness=0)
    n, itemsize = _model().num_params, 8
    shard_bytes = [(b - a) * itemsize for a, b in (block(n, size, k) for k in range(size))]
    mine = shard_bytes[rank]
    s = ps.stats
    assert s["role"] == "worker and server" and s["clocks"] == STEPS
    assert s["pushed"] == [STEPS * b for b in shard_bytes]
    assert s["pulled"] == [(STEPS + 1) * b for b in shard_bytes]
    assert s["received"] == STEPS * size * mine and s["sent"] == (STEPS + 1) * size * mine
    others = sum(shard_bytes) - mine
    assert s["link_bytes"] == (2 * STEPS + 1) * others + (2 * STEPS + 1) * (size - 1) * mine
    memory = ps.memory()
    assert memory["params"] == n * itemsize + mine  # the model, and the shard with no version left published
    assert memory["optimizer"] == mine


@pytest.mark.mpi(min_size=2)
def test_a_colocated_server_takes_pushes_while_its_rank_computes(comm):
    """Rank 1 is slow in its backward of clock 1: rank 0 starts clock 1 only then, and pushes it while rank 1 is
    still in that backward. Rank 1's server takes the push during the backward (a poll between layers), not
    at the end of the step."""
    rank = comm.Get_rank()
    world = MPI.COMM_WORLD
    model = _model()
    seen = []
    backward = model.backward

    def wait_for(tag):
        note = world.irecv(source=1 - rank, tag=tag)
        deadline = time.monotonic() + 30
        while not note.Test() and time.monotonic() < deadline:
            time.sleep(0.002)

    def rank0_backward(dy, hook=None):
        backward(dy, hook=hook)
        if ps.clock == 1:
            world.send(None, dest=1, tag=78)  # computed: the push follows at once

    def rank1_backward(dy, hook=None):
        if ps.clock == 1:
            before = ps.stats["received_from"][0]  # rank 0 has not started clock 1 yet
            world.send(None, dest=0, tag=77)
            wait_for(78)
            time.sleep(0.2)
            backward(dy, hook=hook)
            seen.append((before, ps.stats["received_from"][0]))
            return
        backward(dy, hook=hook)

    if rank in (0, 1):
        model.backward = rank0_backward if rank == 0 else rank1_backward
    ps = ParameterServer(comm, model, _optimizer(), servers=COLOCATED, staleness=0, total_steps=3)
    for step in range(3):
        if rank == 0 and step == 1:
            wait_for(77)
        a, b = block(BATCH, ps.workers, ps.worker_index)
        ps.step(*_samples(_batch(step)[a:b]), BATCH)
    ps.close()
    if rank == 1:
        piece = (ps.bounds[1][1] - ps.bounds[1][0]) * 8
        assert seen == [(piece, 2 * piece)]  # clock 0's push before the backward, clock 1's taken inside it
