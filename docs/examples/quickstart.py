"""Quick start: the drop-in Comm with a named algorithm, and an array-first function.

Run: mpiexec -n 2 python docs/examples/quickstart.py
"""

import numpy as np
from mpi4py import MPI

import mpicomm

comm = mpicomm.Comm(MPI.COMM_WORLD)              # was: comm = MPI.COMM_WORLD; every mpi4py call still works
x = np.arange(8.0) * (comm.rank + 1)
y = np.empty_like(x)
comm.Allreduce(x, y, op=MPI.SUM, algorithm="ring")   # mpi4py's signature, plus algorithm= ("auto" by default)
total = mpicomm.allreduce(x)                          # array in, new array out: the same sum, algorithm "auto"

p = comm.size
assert np.array_equal(y, np.arange(8.0) * p * (p + 1) / 2) and np.array_equal(total, y)
if comm.rank == 0:
    print(f"allreduce over {p} ranks: ok, algorithms {mpicomm.algorithms('allreduce')}")
