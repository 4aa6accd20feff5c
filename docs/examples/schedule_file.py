"""An algorithm as a file: an allreduce's schedules written as JSON, registered on every rank, and run.

Run: mpiexec -n 2 python docs/examples/schedule_file.py

The file could come from anywhere - another program, a hand edit -
``python -m mpicomm algorithms --schedule allreduce ring -p 2 --count 5
--schedule-file ring2.json`` writes the same one. Registering checks it
(views within bounds, every message meeting its receive, no deadlock,
the result on rank- and index-dependent data); the algorithm then
runs the call the file was made for: this p, this count.
"""

import os
import tempfile

import numpy as np
from mpi4py import MPI

import mpicomm
from mpicomm.plan.preview import schedules_for
from mpicomm.schedule_file import to_json

comm = mpicomm.Comm()
p, rank = comm.size, comm.rank
count = 5

text = to_json(schedules_for("allreduce", "ring", p, count)) if rank == 0 else None
text = comm.bcast(text)                        # every rank registers the file itself
with tempfile.TemporaryDirectory() as folder:
    path = os.path.join(folder, f"ring{p}.json")
    with open(path, "w") as f:
        f.write(text)
    mpicomm.register_schedule_file(path, name="ring_file")

x = rank * 1000.0 + np.arange(count)           # data that depends on rank and index
mine, library = np.zeros(count), np.zeros(count)
comm.Allreduce(x, mine, algorithm="ring_file")
MPI.COMM_WORLD.Allreduce(x, library)
assert np.array_equal(mine, library)
try:                                           # another count: refused on every rank, with the reason
    comm.Allreduce(x[:3], np.zeros(3), algorithm="ring_file")
except ValueError as exc:
    assert "made for count 5 only" in str(exc)
else:
    raise AssertionError("the file's algorithm ran a call it was not made for")
if rank == 0:
    print(f"schedule_file: ok (allreduce of {count} elements on {p} ranks from a file of {len(text)} bytes)")
