"""Topology: where each rank runs, read from MPI and, before MPI starts, from the launcher.

Run: mpiexec -n 2 python docs/examples/topology.py
"""

from mpicomm.launcher import from_environment     # does not import mpi4py.MPI

info = from_environment()                           # LaunchInfo(launcher, rank, size, local_rank, ...)

import mpicomm  # noqa: E402  (after the launcher's view: a program may pick a GPU or a log file first)

comm = mpicomm.Comm()                               # wraps MPI.COMM_WORLD
assert (info.rank, info.size) in ((comm.rank, comm.size), (None, None))
assert 0 <= comm.local_rank < comm.local_size and 0 <= comm.node < comm.nodes
assert comm.node_comm.size == comm.local_size       # the ranks of this node
assert (comm.leader_comm is not None) == (comm.local_rank == 0)   # one rank per node
rows = comm.gather((comm.rank, comm.local_rank, comm.node, comm.host, info.launcher), root=0)
if comm.rank == 0:
    for rank, local, node, host, launcher in rows:
        print(f"rank {rank}: local rank {local} on node {node} ({host}), launched by {launcher}")
    print("topology: ok")
