"""Reduction ops: names, MPI.Op objects, ufuncs, your own with a declared commutativity, and pairs.

Run: mpiexec -n 2 python docs/examples/ops.py
"""

import numpy as np
from mpi4py import MPI

import mpicomm

comm = mpicomm.Comm()
p, rank = comm.size, comm.rank
x = np.array([rank + 1.0, 10.0 - rank])

assert np.array_equal(mpicomm.allreduce(x, op="max"), mpicomm.allreduce(x, op=MPI.MAX))
assert np.array_equal(mpicomm.allreduce(x, op=np.minimum), np.array([1.0, 10.0 - (p - 1)]))

# A non-commutative op: fn(a, b) returns a ⊕ b, a from the lower ranks. "last" keeps b: the highest rank's value.
last = mpicomm.ops.create(lambda a, b: b, commutative=False, name="last")
ranks = np.full(3, float(rank))
assert np.array_equal(mpicomm.allreduce(ranks, op=last), np.full(3, p - 1.0))   # auto keeps rank order
try:
    mpicomm.allreduce(ranks, op=last, algorithm="ring")    # ring reorders operands: refused on every rank
except ValueError as exc:
    assert "commutative" in str(exc)
else:
    raise AssertionError("ring took a non-commutative op")

# maxloc/minloc: (value, index) pairs as MPI's DOUBLE_INT, handed to the MPI library's own Allreduce
pairs = np.zeros(1, dtype=mpicomm.ops.pair_dtype(np.float64))
pairs[0] = (float(rank % 2), rank)
best = np.zeros_like(pairs)
comm.Allreduce([pairs, MPI.DOUBLE_INT], [best, MPI.DOUBLE_INT], op=MPI.MAXLOC)
assert best[0]["value"] == min(1, p - 1) and best[0]["index"] == min(1, p - 1)   # ties go to the lower index
if rank == 0:
    print("ops: ok")
