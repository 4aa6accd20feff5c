"""Shared memory on one node: arrays from a node-shared pool take the zero-copy path of the shm algorithms.

Run: mpiexec -n 2 python docs/examples/pool.py      (every rank on one node)
"""

import numpy as np

import mpicomm
from mpicomm import shm

comm = mpicomm.Comm()
p, rank = comm.size, comm.rank
n = 1 << 16
assert comm.nodes == 1, "the shm algorithms need every rank on one node"

with shm.Pool(comm, 4 * n * 4) as pool:       # collective: bytes on each rank of the node
    grads = pool.empty(n, np.float32)         # a NumPy array in node-shared memory
    out = pool.empty(n, np.float32)
    grads[:] = np.arange(n, dtype=np.float32) % 7 + rank
    comm.Allreduce(grads, out, algorithm="shm")   # zero-copy: nothing copied in, slices written in place
    expected = p * (np.arange(n, dtype=np.float32) % 7) + p * (p - 1) / 2
    assert np.array_equal(out, expected)
if rank == 0:
    print("pool: ok")
