"""Persistent collectives: read, agree, choose and compile once; Start and Wait many times.

Run: mpiexec -n 2 python docs/examples/persistent.py
"""

import numpy as np

import mpicomm

comm = mpicomm.Comm()
p, rank = comm.size, comm.rank
n, steps = 1000, 5
grad = np.zeros(n)
total = np.zeros(n)

req = comm.Allreduce_init(grad, total)       # collective: the plan is compiled once, bound to grad and total
for step in range(steps):
    grad[:] = np.arange(n) * (rank + 1) + step   # "compute a gradient" into the bound buffer
    req.Start()                               # runs on what grad holds now; returns at once
    busy = sum(range(1000))                   # overlap: the progress thread completes it meanwhile
    req.Wait()
    assert np.array_equal(total, np.arange(n) * p * (p + 1) / 2 + p * step) and busy
algorithm = req.plan.algorithm.name
req.Free()
if rank == 0:
    print(f"persistent: ok ({steps} starts of one {algorithm} plan)")
