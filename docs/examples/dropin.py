"""Code written for mpi4py, run unchanged on mpicomm.Comm: buffer specs, in place, v-forms, nonblocking.

Run: mpiexec -n 2 python docs/examples/dropin.py
"""

import numpy as np
from mpi4py import MPI

import mpicomm

comm = mpicomm.Comm(MPI.COMM_WORLD)
p, rank = comm.size, comm.rank
x = np.arange(1000, dtype=np.float64) * (rank + 1)
y = np.empty_like(x)
expected = np.arange(1000.0) * p * (p + 1) / 2

comm.Allreduce(x, y, op=MPI.SUM)                          # algorithm "auto": the selection rules choose
assert np.array_equal(y, expected)
comm.Allreduce([x, MPI.DOUBLE], [y, MPI.DOUBLE], algorithm="recursive_doubling")   # mpi4py's buffer specs
assert np.array_equal(y, expected)
y[:] = x
comm.Allreduce(MPI.IN_PLACE, y)                           # in place
assert np.array_equal(y, expected)

counts = [i + 1 for i in range(p)]                        # rank i contributes i + 1 elements
out = np.empty(sum(counts))
comm.Allgatherv(x[: rank + 1], [out, counts, MPI.DOUBLE])
starts = np.cumsum([0] + counts[:-1])
assert all(np.array_equal(out[s : s + c], np.arange(c) * (i + 1)) for i, (s, c) in enumerate(zip(starts, counts)))

req = comm.Iallreduce(x, y, algorithm="ring")             # an mpicomm.Request: overlap work, then wait
busy = sum(range(10_000))
req.Wait()
assert np.array_equal(y, expected) and busy > 0

comm.set_algorithm("bcast", "binomial")                   # this communicator's default for bcast
z = np.arange(5.0) if rank == 0 else np.empty(5)
comm.Bcast(z, root=0)
assert np.array_equal(z, np.arange(5.0)) and comm.get_algorithm("bcast") == "binomial"

assert comm.allreduce(rank) == p * (p - 1) // 2           # mpi4py's pickle-based lowercase methods work too
if rank == 0:
    print("drop-in: ok")
