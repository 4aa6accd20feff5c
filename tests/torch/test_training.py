"""PyTorch's own parallel training on the mpicomm backend: the same parameters as single-process training.

DDP (several buckets, gradient_as_bucket_view, no_sync), ZeroRedundancyOptimizer,
FSDP's fully_shard and torch.distributed.pipelining's GPipe and 1F1B, each run
for a few steps on its share of a fixed batch and compared with one process
training on the whole batch (float64, so the only difference is summation order).
"""

from __future__ import annotations

import pytest
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from .conftest import torch

pytestmark = pytest.mark.mpi

PER_RANK = 8
STEPS = 3


def model() -> torch.nn.Sequential:
    """Four Linear layers with ReLUs between: deep enough to split into up to 4 pipeline stages."""
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for i, (a, b) in enumerate([(6, 24), (24, 24), (24, 24), (24, 3)]):
        layers.append(torch.nn.Linear(a, b))
        if i < 3:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers).double()


def batch(p: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    return (torch.randn(PER_RANK * p, 6, dtype=torch.float64, generator=g),
            torch.randn(PER_RANK * p, 3, dtype=torch.float64, generator=g))


def reference(p: int, optimizer=torch.optim.SGD, **kw) -> list[torch.Tensor]:
    """The parameters after STEPS steps of one process on the whole batch."""
    x, y = batch(p)
    m = model()
    opt = optimizer(m.parameters(), **kw)
    for _ in range(STEPS):
        opt.zero_grad()
        F.mse_loss(m(x), y).backward()
        opt.step()
    return [q.detach() for q in m.parameters()]


def mine(p: int, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = batch(p)
    return x[r * PER_RANK:(r + 1) * PER_RANK], y[r * PER_RANK:(r + 1) * PER_RANK]


def assert_params(got, expected, what):
    got = list(got)
    assert len(got) == len(expected), what
    for a, b in zip(got, expected):
        torch.testing.assert_close(a.detach(), b, rtol=1e-10, atol=1e-12, msg=what)


@pytest.mark.parametrize("variant", ["default", "small-buckets", "bucket-view", "no-sync"])
def test_ddp_matches_single_process(groups, variant):
    r, p = dist.get_rank(), dist.get_world_size()
    m = model()
    options = {"small-buckets": {"bucket_cap_mb": 0.002}, "bucket-view": {"gradient_as_bucket_view": True,
                                                                           "bucket_cap_mb": 0.002}}.get(variant, {})
    ddp = torch.nn.parallel.DistributedDataParallel(m, **options)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    x, y = mine(p, r)
    for _ in range(STEPS):
        opt.zero_grad()
        if variant == "no-sync":  # two half-batches, gradients synchronised once, after the second
            half = PER_RANK // 2
            with ddp.no_sync():
                (F.mse_loss(ddp(x[:half]), y[:half]) / 2).backward()
            (F.mse_loss(ddp(x[half:]), y[half:]) / 2).backward()
        else:
            F.mse_loss(ddp(x), y).backward()
        opt.step()
    assert_params(m.parameters(), reference(p, lr=0.1), f"DDP {variant}")


def test_zero_redundancy_optimizer(groups):
    from torch.distributed.optim import ZeroRedundancyOptimizer

    r, p = dist.get_rank(), dist.get_world_size()
    m = model()
    ddp = torch.nn.parallel.DistributedDataParallel(m)
    opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=0.01)
    x, y = mine(p, r)
    for _ in range(STEPS):
        opt.zero_grad()
        F.mse_loss(ddp(x), y).backward()
        opt.step()
    assert_params(m.parameters(), reference(p, torch.optim.Adam, lr=0.01), "ZeroRedundancyOptimizer(Adam)")


def test_fsdp_fully_shard(groups):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    r, p = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (p,))
    m = model()
    for layer in m:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x, y = mine(p, r)
    for _ in range(STEPS):
        opt.zero_grad()
        F.mse_loss(m(x), y).backward()
        opt.step()
    assert_params([q.full_tensor() for q in m.parameters()], reference(p, lr=0.1), "FSDP fully_shard")


@pytest.mark.parametrize("schedule", ["GPipe", "1F1B"])
def test_pipelining_schedules(groups, schedule):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    r, p = dist.get_rank(), dist.get_world_size()
    if p < 2:
        pytest.skip("a pipeline needs 2 or more stages (ranks)")
    layers = list(model())
    # stage s gets the Linear layers s·4/p … and the ReLUs after them: every stage has parameters
    linear = [i for i, layer in enumerate(layers) if isinstance(layer, torch.nn.Linear)]
    if p > len(linear):
        pytest.skip(f"the model has {len(linear)} Linear layers, a stage's parameters; {p} stages leave one without")
    cuts = [linear[(s * len(linear)) // p] for s in range(p)] + [len(layers)]
    part = torch.nn.Sequential(*layers[cuts[r]:cuts[r + 1]])
    x, y = batch(p)
    stage = PipelineStage(part, r, p, torch.device("cpu"))
    kind = {"GPipe": ScheduleGPipe, "1F1B": Schedule1F1B}[schedule]
    # each micro-batch's mean loss; the schedule divides the summed gradients by the 4 micro-batches (scale_grads)
    run = kind(stage, n_microbatches=4, loss_fn=F.mse_loss)
    opt = torch.optim.SGD(part.parameters(), lr=0.1)
    for _ in range(STEPS):
        opt.zero_grad()
        if r == 0:
            run.step(x)
        elif r == p - 1:
            run.step(target=y)
        else:
            run.step()
        opt.step()
    expected = reference(p, lr=0.1)
    owned = [k for k, layer in enumerate(layers) for _ in layer.parameters() if cuts[r] <= k < cuts[r + 1]]
    first = sum(1 for k, layer in enumerate(layers) for _ in layer.parameters() if k < cuts[r])
    assert_params(part.parameters(), expected[first:first + len(owned)], f"pipelining {schedule}")


def test_reproducible_ddp_gives_the_same_bits_whatever_the_algorithm(groups, monkeypatch):
    """DDP over a reproducible group (``pg_options={"reproducible": True}``), its small buckets all-reduced by
    each allreduce algorithm in turn: the same parameters to the bit, and the single process's to rounding."""
    from mpicomm import registry

    r, p = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(backend="mpicomm", pg_options={"reproducible": True})
    x, y = mine(p, r)
    ends = []
    for algorithm in ("ring", "recursive_doubling", "tree"):
        assert algorithm in registry.algorithms("allreduce")
        monkeypatch.setenv("MPICOMM_ALLREDUCE_ALGORITHM", algorithm)
        m = model()
        ddp = torch.nn.parallel.DistributedDataParallel(m, process_group=group, bucket_cap_mb=0.002)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for _ in range(STEPS):
            opt.zero_grad()
            F.mse_loss(ddp(x), y).backward()
            opt.step()
        ends.append([q.detach().clone() for q in m.parameters()])
    for other in ends[1:]:
        assert all(torch.equal(a, b) for a, b in zip(ends[0], other))
    assert_params(ends[0], reference(p, lr=0.1), "reproducible DDP")
