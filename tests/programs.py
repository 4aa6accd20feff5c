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

def traced() -> None:
    """A known sequence of traced calls (run with MPICOMM_TRACE set; tests/test_trace.py checks the file).

    Rank r, with left = r-1 and right = r+1 (mod p), in this order:

    * p2p: isend_array of 10+r float64 to right (tag 11) / recv_array from left;
      isend_array of 6000+r float32 to right (tag 12: two-part) / irecv_array from left;
    * rendezvous: publish "part<r>" (20+r float64), pull "part<right>" from right at offset 2
      (and answer left's pull);
    * window of 8 float64: Barrier (dissemination), get 3 elements at offset 2 from right,
      Allreduce of 1000 float64 (ring), Bcast of 300 float64 from root 1 (binomial),
      put 2 elements at offset 5 into left, Barrier (dissemination).

    Every rank checks the data it received; rank 0 prints {"ok": true, "ranks": p}.
    """
    import numpy as np

    import mpicomm

    comm = mpicomm.Comm()
    rank, p = comm.rank, comm.size
    left, right = (rank - 1) % p, (rank + 1) % p

    small = rank * 1000.0 + np.arange(10 + rank, dtype=np.float64)
    send = comm.isend_array(small, right, tag=11)
    got = comm.recv_array(source=left, tag=11)
    send.Wait()
    if not np.array_equal(got, left * 1000.0 + np.arange(10 + left)):
        raise RuntimeError(f"rank {rank}: wrong small message from {left}")
    big = rank + np.arange(6000 + rank, dtype=np.float32)
    requests = [comm.isend_array(big, right, tag=12), comm.irecv_array(source=left, tag=12)]
    _, got = mpicomm.Request.waitall(requests)
    if not np.array_equal(got, left + np.arange(6000 + left, dtype=np.float32)):
        raise RuntimeError(f"rank {rank}: wrong large message from {left}")

    with comm.rendezvous() as rv:
        rv.publish(f"part{rank}", rank * 10.0 + np.arange(20 + rank, dtype=np.float64))
        got = rv.pull(f"part{right}", right, offset=2)
        if not np.array_equal(got, right * 10.0 + np.arange(2, 20 + right)):
            raise RuntimeError(f"rank {rank}: wrong pull from {right}")

    local = rank * 100.0 + np.arange(8, dtype=np.float64)
    win = comm.expose(local)
    win.publish()
    comm.Barrier(algorithm="dissemination")
    got = win.get(right, offset=2, count=3)
    if not np.array_equal(got, right * 100.0 + np.arange(2, 5)):
        raise RuntimeError(f"rank {rank}: wrong get from {right}")
    x = rank + np.arange(1000, dtype=np.float64)
    total = np.empty_like(x)
    comm.Allreduce(x, total, algorithm="ring")
    if not np.array_equal(total, sum(range(p)) + p * np.arange(1000)):
        raise RuntimeError(f"rank {rank}: wrong allreduce")
    buf = np.arange(300, dtype=np.float64) + (7.0 if rank == 1 % p else -1.0)
    comm.Bcast(buf, root=1 % p, algorithm="binomial")
    if not np.array_equal(buf, np.arange(300) + 7.0):
        raise RuntimeError(f"rank {rank}: wrong bcast")
    win.put(np.full(2, rank + 0.5), left, offset=5)
    comm.Barrier(algorithm="dissemination")
    win.collect()
    if not np.array_equal(local[5:7], np.full(2, right + 0.5)):
        raise RuntimeError(f"rank {rank}: the put from {right} did not land")
    win.Free()
    if rank == 0:
        print(json.dumps({"ok": True, "ranks": p}), flush=True)


def traced_finalized() -> None:
    """Traced calls after ``chdir(argv[2])``, then MPI_Finalize before exit: each rank writes its own file.

    MPICOMM_TRACE is a relative path: it names a file in argv[2] even though the
    program leaves that directory before the trace is written. Each rank sends
    one array of 5+r int64 to itself (tag 3) and receives it.
    """
    os.chdir(sys.argv[2])
    import numpy as np
    from mpi4py import MPI

    import mpicomm

    comm = mpicomm.Comm()
    x = np.arange(5 + comm.rank, dtype=np.int64)
    send = comm.isend_array(x, comm.rank, tag=3)
    if not np.array_equal(comm.recv_array(source=comm.rank, tag=3), x):
        raise RuntimeError("wrong message to self")
    send.Wait()
    os.chdir(os.path.dirname(os.path.abspath(sys.argv[2])))
    MPI.COMM_WORLD.Barrier()
    MPI.Finalize()


def stuck_persistent() -> None:
    """Rank 1 never starts a persistent allreduce the others start and wait on (MPICOMM_TIMEOUT set)."""
    import numpy as np

    import mpicomm

    comm = mpicomm.Comm()
    x = np.ones(10)
    y = np.empty(10)
    request = comm.Allreduce_init(x, y, algorithm="recursive_doubling")
    if comm.rank != 1:
        request.Start()
        request.Wait()
    time.sleep(60)


def two_threads() -> None:
    """Thread A starts and waits a persistent allreduce over and over while the main thread runs blocking
    allreduces of the same size on the same communicator. Rank 0 prints one JSON line: per rank, the errors
    each thread met (by type) and how many results were wrong."""
    import threading

    import numpy as np

    import mpicomm

    comm = mpicomm.Comm()
    rank, p = comm.rank, comm.size
    n, rounds = 4, 30
    x, y = np.full(n, rank + 1.0), np.empty(n)
    request = comm.Allreduce_init(x, y)
    report = {"A": [], "B": [], "wrong": 0}
    expected = p * (p + 1) / 2

    def persistent_loop() -> None:
        for _ in range(rounds):
            try:
                request.Start()
                request.Wait()
                if not np.all(y == expected):
                    report["wrong"] += 1
            except Exception as exc:  # noqa: BLE001 - reported
                report["A"].append(type(exc).__name__)
                return

    thread = threading.Thread(target=persistent_loop)
    thread.start()
    a, b = np.full(n, 2.0 * (rank + 1)), np.empty(n)
    for _ in range(rounds):
        try:
            comm.Allreduce(a, b)
            if not np.all(b == 2 * expected):
                report["wrong"] += 1
        except Exception as exc:  # noqa: BLE001 - reported
            report["B"].append(type(exc).__name__)
            break
    thread.join()
    reports = mpicomm.Comm(comm.Dup()).gather(report, root=0) if False else comm.library_comm.gather(report, 0)
    if rank == 0:
        print(json.dumps(reports), flush=True)


PROGRAMS.update({f.__name__: f for f in (traced, traced_finalized, stuck_persistent, two_threads)})

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in PROGRAMS:
        sys.exit(f"usage: python -m tests.programs {{{','.join(PROGRAMS)}}}")
    PROGRAMS[sys.argv[1]]()
