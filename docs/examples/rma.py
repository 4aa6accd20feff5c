"""Pull, one-sided: every rank exposes an array in an RMA window; peers get and put slices of it.

Run: mpiexec -n 2 python docs/examples/rma.py
"""

import numpy as np

import mpicomm

comm = mpicomm.Comm()
p, rank = comm.size, comm.rank
local = np.arange(100.0) + 1000 * rank

with comm.expose(local) as win:                      # collective; each rank exposes one array (any length)
    part = win.get(target=0, offset=10, count=5)      # passive target: rank 0 does nothing
    assert np.array_equal(part, np.arange(10.0, 15.0))
    win.put(np.full(2, -1.0 - rank), target=(rank + 1) % p, offset=50 + 2 * rank if p > 1 else 50)
    comm.Barrier()
    win.collect()                                    # see what peers put into `local`
    sender = (rank - 1) % p
    assert np.array_equal(local[50 + 2 * sender : 52 + 2 * sender], np.full(2, -1.0 - sender))
    local[:5] = -7.0                                 # change my own array, then publish it to the peers
    win.publish(0, 5)
    comm.Barrier()
    assert np.array_equal(win.get(target=(rank + 1) % p, offset=0, count=5), np.full(5, -7.0))
    comm.Barrier()
if rank == 0:
    print("rma: ok")
