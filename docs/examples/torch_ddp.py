"""PyTorch on the mpicomm backend: torch.distributed collectives and DDP, launched by mpiexec or srun.

Run: mpiexec -n 2 python docs/examples/torch_ddp.py      (needs: pip install -e '.[torch]')
"""

import torch
import torch.distributed as dist

import mpicomm.torch  # noqa: F401  (registers the backend "mpicomm" and fills RANK, WORLD_SIZE... from MPI)

dist.init_process_group("mpicomm")                 # no MASTER_ADDR or torchrun needed
rank, p = dist.get_rank(), dist.get_world_size()

t = torch.arange(4, dtype=torch.float32) * (rank + 1)
dist.all_reduce(t)                                 # SUM; auto picks mpicomm's algorithm
assert torch.equal(t, torch.arange(4, dtype=torch.float32) * p * (p + 1) / 2)
gathered = [torch.empty(rank + 1) for rank in range(p)]
dist.all_gather(gathered, torch.full((rank + 1,), float(rank)))   # uneven sizes, which gloo refuses
assert all(torch.equal(g, torch.full((r + 1,), float(r))) for r, g in enumerate(gathered))

torch.manual_seed(0)                               # the same initial model on every rank
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(16, 8, generator=torch.Generator().manual_seed(rank))   # each rank its own data
model(x).square().mean().backward()                # DDP all-reduces the gradients on the mpicomm backend
opt.step()
weights = [torch.empty_like(model.module.weight) for _ in range(p)]
dist.all_gather(weights, model.module.weight.detach())
assert all(torch.equal(w, weights[0]) for w in weights)   # every replica took the same step

dist.destroy_process_group()
if rank == 0:
    print("torch backend: ok")
