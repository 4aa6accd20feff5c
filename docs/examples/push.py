"""Push: typed point-to-point messages. The receiver learns dtype and shape, or gets a clear error.

Run: mpiexec -n 2 python docs/examples/push.py
"""

import numpy as np
from mpi4py import MPI

import mpicomm

comm = mpicomm.Comm()
p, rank = comm.size, comm.rank
right, left = (rank + 1) % p, (rank - 1) % p

req = comm.isend_array(np.arange(10.0) + rank, right, tag=1)   # nonblocking send
x = comm.recv_array(source=left, tag=1)                          # allocates: dtype and shape come with the message
req.Wait()
assert x.dtype == np.float64 and np.array_equal(x, np.arange(10.0) + left)

y = comm.sendrecv_array(np.full((2, 3), rank, dtype=np.int32), right, left)   # both at once (rings, halos)
assert y.shape == (2, 3) and (y == left).all()

r = comm.irecv_array(source=left, tag=2)                        # wait() returns the array; Wait() returns True
s = comm.isend_array(np.array([rank]), right, tag=2)
mpicomm.Request.Waitall([s])                                    # mixes with plain MPI.Request objects too
assert r.wait()[0] == left

s = comm.isend_array(np.zeros(4, dtype=np.float32), right, tag=3)   # float32: a float64 buffer is refused
try:
    comm.recv_array(np.empty(4), source=left, tag=3)
except ValueError as exc:
    assert "float32" in str(exc)                                # names what came and how to receive it
else:
    raise AssertionError("a float64 buffer took float32 data")
s.Wait()                                                        # the refused message was drained: the send completes
comm.recv_array(source=MPI.PROC_NULL)                           # as in MPI: no-op
if rank == 0:
    print("push: ok")
