"""Requests and progress: nonblocking collectives complete while the rank computes; mixed waits.

Run: mpiexec -n 2 python docs/examples/progress.py
"""

import time

import numpy as np
from mpi4py import MPI

import mpicomm

comm = mpicomm.Comm()
p, rank = comm.size, comm.rank
x = np.full(1 << 16, rank + 1.0)
y = np.empty_like(x)

req = comm.Iallreduce(x, y)                 # queued on the communicator; the progress thread drives it
time.sleep(0.05)                            # computing, sleeping or in another MPI call: it still completes
done = req.Test()
req.Wait()
assert np.array_equal(y, np.full_like(x, p * (p + 1) / 2))

native = comm.Ibarrier()                    # an mpicomm request ...
plain = MPI.COMM_WORLD.Ibarrier()           # ... and a plain mpi4py one, waited for together
mpicomm.Request.Waitall([native, plain])

calls = [comm.Iallreduce(np.full(4, float(i)), np.empty(4)) for i in range(3)]   # any number in flight
mpicomm.progress()                          # advance what can advance, without blocking
index = mpicomm.Request.Waitany(calls)      # MPI's semantics: the index of one completed request
mpicomm.Request.Waitall(calls)
assert 0 <= index < 3
if rank == 0:
    print(f"progress: ok (the first Iallreduce was {'already' if done else 'not yet'} complete after 50 ms)")
