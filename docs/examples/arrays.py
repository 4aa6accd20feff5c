"""The array-first functions: arrays in, new arrays out (out= writes in place; comm= picks a communicator).

Run: mpiexec -n 2 python docs/examples/arrays.py
"""

import numpy as np

import mpicomm

comm = mpicomm.world()                                    # the process's Comm over MPI.COMM_WORLD
p, rank = comm.size, comm.rank
x = np.full(4, float(rank + 1))

total = mpicomm.allreduce(x)                              # NumPy in, NumPy out (CuPy in, CuPy out)
assert np.array_equal(total, np.full(4, p * (p + 1) / 2))
mpicomm.allreduce(x, op="max", out=x)                     # in place, no allocation
assert np.array_equal(x, np.full(4, float(p)))

stacked = mpicomm.allgather(np.array([rank, 10 * rank]))  # shape (p, 2): one row per rank
assert stacked.shape == (p, 2) and np.array_equal(stacked[:, 1], 10 * np.arange(p))

mine = mpicomm.reduce_scatter(np.arange(2.0 * p), op="sum")   # near-equal blocks of the sum (or counts=[...])
assert np.array_equal(mine, p * np.arange(2.0 * rank, 2.0 * rank + 2))

parts = mpicomm.alltoall(np.arange(p, dtype=np.int64) + 100 * rank)   # first axis split among the ranks
assert np.array_equal(parts, rank + 100 * np.arange(p))

req = mpicomm.iallreduce(np.ones(3))                      # nonblocking; wait() returns the array
assert np.array_equal(req.wait(), np.full(3, float(p)))

half = comm.Split(rank % 2, rank)                         # any communicator: an mpicomm.Comm or an mpi4py one
sub = mpicomm.allreduce(np.array([1.0]), comm=half)
assert sub[0] == half.size
half.Free()
if rank == 0:
    print("array-first functions: ok")
