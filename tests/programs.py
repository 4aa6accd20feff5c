"""Small MPI programs the tests launch as separate jobs: ``python -m tests.programs NAME [ARGS]``.

Each either prints one JSON line from rank 0 (every rank's report, gathered: hydra
may merge lines written by different ranks) or behaves badly on purpose.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time


def topology() -> None:
    """Every rank reports what MPI and the launcher say about its place."""
    import mpicomm
    from mpicomm.launcher import from_environment

    env = from_environment()
    comm = mpicomm.Comm()
    leaders = comm.leader_comm
    report = {
        "rank": comm.rank, "size": comm.size, "local_rank": comm.local_rank, "local_size": comm.local_size,
        "node": comm.node, "nodes": comm.nodes, "host": comm.host, "is_leader": comm.is_leader,
        "leader_size": None if leaders is None else leaders.Get_size(),
        "node_comm_size": comm.node_comm.Get_size(),
        "env": {"launcher": env.launcher, "rank": env.rank, "size": env.size,
                "local_rank": env.local_rank, "local_size": env.local_size},
    }
    reports = comm.gather(report, root=0)
    if comm.rank == 0:
        print(json.dumps(reports), flush=True)


def sigkill() -> None:
    """Rank 1 kills itself with SIGKILL while the others wait for it in a receive."""
    import numpy as np

    import mpicomm

    comm = mpicomm.Comm()
    comm.Barrier()
    if comm.rank == 1:
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    comm.recv_array(np.empty(1), source=1)


def uncaught() -> None:
    """Rank 1 raises while the others wait for it; run through mpicomm.runtime.main."""
    import numpy as np

    import mpicomm
    from mpicomm.runtime import main

    def body() -> None:
        comm = mpicomm.Comm()
        comm.Barrier()
        if comm.rank == 1:
            raise RuntimeError("rank 1 fails on purpose")
        comm.recv_array(np.empty(1), source=1)

    main(body)


def exits() -> None:
    """Rank 2 calls sys.exit(3) while the others wait; run through mpicomm.runtime.main."""
    import numpy as np

    import mpicomm
    from mpicomm.runtime import main

    def body() -> None:
        comm = mpicomm.Comm()
        comm.Barrier()
        if comm.rank == 2:
            sys.exit(3)
        comm.recv_array(np.empty(1), source=2)

    main(body)


def stuck() -> None:
    """Rank 1 skips an allreduce the others enter (run with MPICOMM_TIMEOUT set: the watchdog ends it)."""
    import numpy as np

    import mpicomm

    comm = mpicomm.Comm()
    x = np.ones(10)
    comm.Allreduce(x.copy(), x, algorithm="recursive_doubling")  # one that completes: sequence number 1
    if comm.rank != 1:
        comm.Allreduce(x.copy(), x, algorithm="recursive_doubling")
    time.sleep(60)


def stuck_nonblocking() -> None:
    """Rank 2 never joins an Igather that rank 0, the root, waits on."""
    import numpy as np

    import mpicomm

    comm = mpicomm.Comm()
    x = np.ones(10)
    if comm.rank != 2:
        comm.Igather(x, np.empty(10 * comm.size), root=0, algorithm="linear").Wait()
    time.sleep(60)


PROGRAMS = {f.__name__: f for f in (topology, sigkill, uncaught, exits, stuck, stuck_nonblocking)}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in PROGRAMS:
        sys.exit(f"usage: python -m tests.programs {{{','.join(PROGRAMS)}}}")
    PROGRAMS[sys.argv[1]]()
