"""Pull, receiver-initiated: ask the owner of a named array for it (or a slice); the owner answers.

Run: mpiexec -n 2 python docs/examples/rendezvous.py
"""

import numpy as np

import mpicomm

comm = mpicomm.Comm()
p, rank = comm.size, comm.rank
grad = np.arange(200.0) * (rank + 1)

with comm.rendezvous() as rdv:                             # collective
    rdv.publish(f"grad/{rank}", grad)                       # whenever it is ready
    g = rdv.pull("grad/0", owner=0)                         # asks rank 0, which answers with the data
    s = rdv.pull("grad/0", owner=0, offset=100, count=50)   # or a slice of it
    reqs = [rdv.ipull(f"grad/{r}", owner=r) for r in range(p)]
    pulled = [req.wait() for req in reqs]
# leaving the block is collective: each rank serves requests until every rank has finished pulling
assert np.array_equal(g, np.arange(200.0)) and np.array_equal(s, np.arange(100.0, 150.0))
assert all(np.array_equal(a, np.arange(200.0) * (r + 1)) for r, a in enumerate(pulled))
if rank == 0:
    print("rendezvous: ok")
