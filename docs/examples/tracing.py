"""Annotate your own phases in the timeline trace (MPICOMM_TRACE=trace.json records them; off, a no-op).

Run: MPICOMM_TRACE=trace.json mpiexec -n 2 python docs/examples/tracing.py    (then open trace.json in Perfetto)
"""

import numpy as np

import mpicomm
from mpicomm import trace

comm = mpicomm.Comm()
u = np.full(1000, float(comm.rank))
for step in range(3):
    with trace.span("update", step=step) as note:    # one event of category "user" on this rank's lane
        u *= 0.5
        note["cells"] = u.size                        # what the block learns on the way
    comm.Allreduce(u.copy(), u)                       # recorded too: algorithm, why chosen, bytes, peers
if comm.rank == 0:
    print(f"tracing: ok ({'recording' if trace.ON else 'off: set MPICOMM_TRACE=trace.json'})")
