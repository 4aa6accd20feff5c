"""The transport: how arrays reach MPI (:mod:`.buffers`, :mod:`.specs`) and node-shared memory (:mod:`.memory`).

The lowest layer but the floor: it knows mpi4py, NumPy and CuPy, and nothing of
collectives, plans or the executor above it.
"""
