"""Where every rank lives, and the hierarchical allreduce across nodes: a program for multi-node tests.

    srun -N 2 --ntasks-per-node=2 --mpi=pmi2 python tests/jobs/nodes_probe.py [--count 1000]

Tests that start real or simulated nodes (tests/jobs/test_slurm.py, tests/test_multinode.py)
run it to see what mpicomm's topology layer reports there and whether the hierarchical
algorithm ran over two levels, not one. Rank 0 prints one JSON object: every rank's
rank, host, node, nodes, local_rank and local_size, the size of the node-leaders
communicator the hierarchical algorithms use (on each leader), and whether
``Allreduce(..., algorithm="hierarchical")`` equals the MPI library's own Allreduce on
data that depends on rank and index. Exit status 1 if it does not.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

__all__ = ["run"]


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/jobs/nodes_probe.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1000, help="float64 elements per rank (default: 1000)")
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error(f"--count {args.count}: must be >= 1")
    from mpi4py import MPI

    import mpicomm
    comm = mpicomm.Comm()
    data = np.arange(args.count, dtype=np.float64) + comm.rank * 1_000_000.0
    mine = np.empty_like(data)
    comm.Allreduce(data, mine, algorithm="hierarchical")
    expected = np.empty_like(data)
    MPI.COMM_WORLD.Allreduce(data, expected)
    node_level, leader_level = comm._state.levels  # made by the hierarchical call's first run
    me = {
        "rank": comm.rank, "host": comm.host, "node": comm.node, "nodes": comm.nodes,
        "local_rank": comm.local_rank, "local_size": comm.local_size,
        "leaders_size": leader_level.size if leader_level is not None else None,
        "levels_nodes": len(set(comm._state.node_of)), "hierarchical_ok": bool(np.array_equal(mine, expected)),
    }
    everyone = comm.gather(me, root=0)
    if comm.rank == 0:
        print(json.dumps({"ranks": everyone}), flush=True)
    return 0 if comm.allreduce(int(me["hierarchical_ok"]), op=MPI.MIN) else 1


if __name__ == "__main__":
    from mpicomm.runtime import main

    sys.exit(main(run))
