"""Reproducible sums: the same bits for every algorithm, order and rank count.

Run: mpiexec -n 2 python docs/examples/reproducible.py
"""

import numpy as np

import mpicomm
from mpicomm import reproducible

comm = mpicomm.Comm()
p, rank = comm.size, comm.rank


def contribution(r):
    """Rank r's values, over a wide range of exponents (where the order of a sum changes its bits)."""
    rng = np.random.default_rng(r)
    return rng.standard_normal(10_000) * np.exp2(rng.integers(-30, 30, 10_000))


grad = contribution(rank)

results = []
for algorithm in ("recursive_doubling", "ring", "rabenseifner"):
    out = np.empty_like(grad)
    comm.Allreduce(grad, out, algorithm=algorithm, reproducible=True)  # one call
    results.append(out)
assert all(r.tobytes() == results[0].tobytes() for r in results)          # every algorithm: the same bits

every = [contribution(r) for r in range(p)]
assert np.array_equal(reproducible.sum_of(every[::-1]), results[0])       # = the sum in one process, any order

comm.reproducible = True                                                  # every call on this communicator
out = np.empty_like(grad)
comm.Allreduce(grad, out)
assert out.tobytes() == results[0].tobytes()

request = comm.Iallreduce(grad, out)                                      # nonblocking: the same bits
request.Wait()
assert out.tobytes() == results[0].tobytes()
assert mpicomm.allreduce(grad, comm=comm).tobytes() == out.tobytes()      # the array functions too
if rank == 0:
    print(f"reproducible: ok (3 algorithms and the serial sum agree bit for bit at {p} ranks)")
