"""mpicomm.shm: the shared-memory pool, zero-copy collectives on pool arrays, slices, and errors."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from mpicomm import shm
from mpicomm.coll.node_memory import slices
from mpicomm.transport.memory import ALIGN

from .coll import reference as R

pytestmark = pytest.mark.mpi


def one_node(comm):
    if comm.nodes != 1:
        pytest.skip("shared-memory pools need one node; this pass simulates several")


def test_slices_start_on_cache_lines_and_cover_everything():
    for count in (0, 1, 7, 8, 9, 63, 64, 65, 1000, 100003):
        for p in (1, 2, 3, 4, 7):
            for item in (1, 2, 4, 8, 16, 3):
                counts, displs = slices(count, p, item)
                assert sum(counts) == count and len(counts) == p
                assert displs == [sum(counts[:r]) for r in range(p)]
                grain = ALIGN // item if ALIGN % item == 0 else 1
                assert all(d % grain == 0 or c == 0 for d, c in zip(displs, counts)), (count, p, item, displs)
    # literal: 20 float64 (160 bytes) over 2 ranks: whole lines of 8 elements, 16 then 4
    assert slices(20, 2, 8) == ([16, 4], [0, 16])


def test_pool_arrays_live_in_the_window(comm):
    one_node(comm)
    with shm.Pool(comm, 4096) as pool:
        a = pool.empty(10)
        b = pool.zeros((3, 4), np.int32)
        assert a.dtype == np.float64 and b.shape == (3, 4) and not b.any()
        assert pool.offset(a) == 0 and pool.offset(b) == 128  # the second starts on the next cache line
        assert pool.offset(np.empty(10)) is None and pool.offset(a[::2]) is None
        assert pool.available == 4096 - 128 - 48
        with pytest.raises(MemoryError, match="create the pool larger"):
            pool.empty(10_000)
        pool.reset()
        assert pool.offset(pool.empty(1)) == 0
    with pytest.raises(ValueError, match="freed"):
        pool.empty(1)
    with pytest.raises(ValueError, match="nbytes=-1"):
        shm.Pool(comm, -1)


def test_peers_see_pool_arrays(comm):
    one_node(comm)
    with shm.Pool(comm, 1024) as pool:
        x = pool.empty(16, np.int64)
        x[:] = R.data(comm.rank, 16, np.int64)
        comm.Barrier()
        pool.window.sync()
        for r in range(comm.size):
            seen = pool.window.segments[r][:128].view(np.int64)
            assert np.array_equal(seen, R.data(r, 16, np.int64))
        comm.Barrier()


@pytest.mark.parametrize("in_place", [False, True])
def test_allreduce_on_pool_arrays_matches_the_library(comm, in_place):
    one_node(comm)
    p = comm.size
    with shm.Pool(comm, 1 << 20) as pool:
        for count in sorted({0, 1, p - 1, p + 1, 1000, 20011}):
            for op in (MPI.SUM, MPI.MAX):
                x = R.data(comm.rank, count, np.int64)
                want = np.empty_like(x)
                MPI.COMM_WORLD.Allreduce(x, want, op=op)
                pool.reset()
                a = pool.empty(count, np.int64)
                a[:] = x
                if in_place:
                    comm.Allreduce(MPI.IN_PLACE, a, op=op, algorithm="shm")
                    got = a
                else:
                    got = pool.empty(count, np.int64)
                    got[:] = -7
                    comm.Allreduce(a, got, op=op, algorithm="shm")
                    assert np.array_equal(a, x), "the input changed"
                R.assert_matches(got, want, f"count={count} op={op}")
                comm.Barrier()  # the next reset hands the same memory out again


def test_mixed_pool_and_plain_arrays(comm):
    one_node(comm)
    # even ranks use pool arrays, odd ranks plain ones: each rank's choice is its own
    count = 4099
    x = R.data(comm.rank, count, np.int64)
    want = np.empty_like(x)
    MPI.COMM_WORLD.Allreduce(x, want)
    with shm.Pool(comm, 1 << 17) as pool:
        if comm.rank % 2 == 0:
            send, recv = pool.empty(count, np.int64), pool.empty(count, np.int64)
            send[:] = x
        else:
            send, recv = x, np.zeros(count, np.int64)
        comm.Allreduce(send, recv, algorithm="shm")
        R.assert_matches(recv, want, "mixed")
        root_data = R.data(comm.rank, count, np.int64)
        buf = pool.empty(count, np.int64) if comm.rank % 2 else np.empty(count, np.int64)
        buf[:] = root_data
        comm.Bcast(buf, root=comm.size - 1, algorithm="shm")
        R.assert_matches(buf, R.data(comm.size - 1, count, np.int64), "bcast")
        comm.Barrier()


def test_non_commutative_op_on_pool_arrays_keeps_rank_order(comm):
    one_node(comm)
    nmat = 37
    x = R.matrices(comm.rank, nmat)
    with shm.Pool(comm, 1 << 16) as pool:
        a = pool.empty(x.size, x.dtype)
        a[:] = x
        out = pool.empty(x.size, x.dtype)
        comm.Allreduce(a, out, op=R.MATMUL, algorithm="shm")
        want = np.empty_like(x)
        MPI.COMM_WORLD.Allreduce(x, want, op=R.native_matmul())
        R.assert_matches(out, want, "matmul")
        comm.Barrier()


def test_scratch_grows_for_larger_calls(comm):
    one_node(comm)
    for count in (10, 300_000, 10, 600_000):  # 2.4 MiB, then 4.8 MiB: past the first scratch size twice
        x = R.data(comm.rank, count, np.int64)
        want = np.empty_like(x)
        MPI.COMM_WORLD.Allreduce(x, want)
        got = np.zeros_like(x)
        comm.Allreduce(x, got, algorithm="shm")
        R.assert_matches(got, want, f"count={count}")


def test_several_nodes_refuse_shared_memory_with_the_fix(comm):
    if comm.nodes == 1:
        pytest.skip("needs a pass of simulated nodes (python -m tests --ranks 2x2)")
    with pytest.raises(ValueError, match=f"spans {comm.nodes} nodes"):
        shm.Pool(comm, 1024)
    with pytest.raises(ValueError, match="one node"):
        comm.Allreduce(np.ones(4), np.empty(4), algorithm="shm")


@pytest.mark.parametrize("collective", ["allreduce", "bcast", "allgather"])
@pytest.mark.parametrize("algorithm", ["shm", "hierarchical"])
def test_nonblocking_and_persistent_forms_run_shared_memory_algorithms(comm, collective, algorithm):
    """DDP's bucket all-reduces are nonblocking: the shared-memory algorithms run for them too, several in
    flight at once (one after another on the communicator), and for persistent requests."""
    if algorithm == "shm" and comm.nodes != 1:
        pytest.skip("shm needs one node")
    p, rank = comm.size, comm.rank
    xs = [R.data(rank + 10 * k, 1000 + k, np.int64) for k in range(3)]
    if collective == "allreduce":
        outs = [np.zeros_like(x) for x in xs]
        requests = [comm.Iallreduce(x, out, algorithm=algorithm) for x, out in zip(xs, outs)]
        expected = [_library(lambda a, b: MPI.COMM_WORLD.Allreduce(a, b), x) for x in xs]
    elif collective == "bcast":
        outs = [x.copy() for x in xs]
        requests = [comm.Ibcast(out, root=p - 1, algorithm=algorithm) for out in outs]
        expected = [R.data(p - 1 + 10 * k, 1000 + k, np.int64) for k in range(3)]
    else:
        outs = [np.zeros(x.size * p, np.int64) for x in xs]
        requests = [comm.Iallgather(x, out, algorithm=algorithm) for x, out in zip(xs, outs)]
        expected = [_library(lambda a, b: MPI.COMM_WORLD.Allgather(a, b), x, p) for x in xs]
    mpicomm.Request.Waitall(requests)
    for out, want in zip(outs, expected):
        R.assert_matches(out, want, f"nonblocking {collective} {algorithm}")
    if collective == "allreduce":
        x, out = xs[0], np.zeros_like(xs[0])
        request = comm.Allreduce_init(x, out, algorithm=algorithm)
        for start in range(2):
            x[:] = R.data(rank, x.size, np.int64) + start
            request.Start()
            request.Wait()
            R.assert_matches(out, _library(lambda a, b: MPI.COMM_WORLD.Allreduce(a, b), x), "persistent")
        request.Free()


def _library(call, x, factor=1):
    out = np.empty(x.size * factor, x.dtype)
    call(x, out)
    return out


def test_alltoall_on_pool_arrays_and_plain_ones(comm):
    """Pool send arrays are read where they are (even ranks), plain ones copied in (odd ranks)."""
    one_node(comm)
    p, rank = comm.size, comm.rank
    with shm.Pool(comm, 1 << 20) as pool:
        for count in sorted({0, 1, p - 1, p + 1, 1000}):
            x = R.data(rank, p * count, np.int64)
            want = np.empty_like(x)
            MPI.COMM_WORLD.Alltoall(x, want)
            pool.reset()
            send = pool.empty(x.size, np.int64) if rank % 2 == 0 else x.copy()
            send[:] = x
            got = np.full_like(x, -7)
            comm.Alltoall(send, got, algorithm="shm")
            R.assert_matches(got, want, f"count={count}")
            assert np.array_equal(send, x), "the input changed"
            comm.Barrier()  # the next reset hands the same memory out again
        # alltoallv with gaps in send: rank r sends r + s + 1 elements to rank s, every other slot skipped
        sendcounts = [rank + s + 1 for s in range(p)]
        recvcounts = [s + rank + 1 for s in range(p)]
        senddispls = [sum(2 * c for c in sendcounts[:s]) for s in range(p)]
        recvdispls = [sum(recvcounts[:s]) for s in range(p)]
        x = R.data(rank, 2 * sum(sendcounts), np.int64)
        want = np.full(sum(recvcounts), -7, np.int64)
        MPI.COMM_WORLD.Alltoallv([x, (sendcounts, senddispls)], [want, (recvcounts, recvdispls)])
        pool.reset()
        send = pool.empty(x.size, np.int64) if rank % 2 else x.copy()
        send[:] = x
        got = np.full(sum(recvcounts), -7, np.int64)
        comm.Alltoallv([send, (sendcounts, senddispls)], [got, (recvcounts, recvdispls)], algorithm="shm")
        R.assert_matches(got, want, "alltoallv with gaps")
        comm.Barrier()


def test_a_peer_failing_inside_the_call_raises_everywhere_instead_of_hanging(comm):
    """Rank 1's op raises in the middle of a shm allreduce: the others raise too, naming it, and the
    communicator refuses further shm calls with the fix; other communicators are unaffected."""
    import mpicomm

    one_node(comm)
    if comm.size < 2:
        pytest.skip("needs two ranks")
    rank = comm.rank

    def add_but_fail_on_rank_1(a, b):
        # The rank is looked up when the op runs, not captured: a closure over `rank` would make the ops
        # differ between ranks, which validation refuses before the call (the same op everywhere, as MPI asks).
        if MPI.COMM_WORLD.Get_rank() == 1:
            raise ZeroDivisionError("rank 1's op fails")
        return a + b

    op = mpicomm.ops.create(add_but_fail_on_rank_1, commutative=False, name="fails_on_rank_1")
    dup = comm.Dup()
    x = R.data(rank, 1000, np.int64)
    if rank == 1:
        with pytest.raises(ZeroDivisionError):
            dup.Allreduce(x, np.empty_like(x), op=op, algorithm="shm")
    else:
        with pytest.raises(RuntimeError, match="rank 1 failed inside this shared-memory collective"):
            dup.Allreduce(x, np.empty_like(x), op=op, algorithm="shm")
    with pytest.raises(RuntimeError, match=r"failed earlier on rank 1.*comm\.Dup\(\)"):
        dup.Allreduce(x, np.empty_like(x), algorithm="shm")
    want = np.empty_like(x)
    MPI.COMM_WORLD.Allreduce(x, want)
    got = np.empty_like(x)
    dup.Allreduce(x, got, algorithm="ring")  # message passing still works on it
    R.assert_matches(got, want, "ring after the failure")
    comm.Allreduce(x, got, algorithm="shm")  # and shared memory on another communicator
    R.assert_matches(got, want, "shm on another communicator")


# ---------------------------------------------------------------- arrays that outlive their pool


def test_free_keeps_the_memory_while_arrays_of_the_pool_live(comm):
    """free() with arrays still alive retires the window; a later pool creation frees it once they are gone."""
    import gc

    one_node(comm)
    a = shm.arena(comm)
    retired = lambda: [w for w, _ in a.retired]  # noqa: E731 (the old code had no such list: it unmapped at free)
    pool = shm.Pool(comm, 4096)
    window = pool.window
    assert window not in retired()
    x = pool.empty(16, np.int64)
    x[:] = comm.rank + 1
    view = x[4:8]
    pool.free()
    assert window in retired(), "an array of the pool is alive: its memory must stay mapped"
    with pytest.raises(ValueError, match="freed"):
        pool.empty(1)
    assert pool.offset(x) is None  # no longer a pool array: collectives copy it like any other
    del x
    gc.collect()
    shm.Pool(comm, 64).free()
    assert window in retired(), "a view of the array is still alive"
    assert np.array_equal(view, np.full(4, comm.rank + 1))
    view[:] = 0  # writable too
    del view
    gc.collect()
    shm.Pool(comm, 64).free()  # collective: every rank agrees nothing uses it, then frees it
    assert window not in retired()
    with shm.Pool(comm, 64) as unused:
        unused.zeros(2)  # dropped at once: free() itself unmaps the window
        window = unused.window
    assert window not in retired()


@pytest.mark.launches
def test_reading_an_array_after_its_pool_is_freed_never_crashes():
    """Another job (the old code died of SIGSEGV here): read and write arrays after free() and after other
    pools were created and freed over the same address range, on 2 ranks."""
    import sys

    from tests import mpirun

    code = (
        "import numpy as np, mpicomm\n"
        "from mpicomm import shm\n"
        "comm = mpicomm.Comm()\n"
        "pool = shm.Pool(comm, 1 << 22)\n"
        "a = pool.empty(1 << 19)\n"
        "a[:] = comm.rank + 1\n"
        "view = a[10:20]\n"
        "pool.free()\n"
        "for _ in range(3):\n"
        "    with shm.Pool(comm, 1 << 20) as other:\n"
        "        other.zeros(10)\n"
        "assert a.sum() == (comm.rank + 1) * (1 << 19) and view.sum() == 10 * (comm.rank + 1)\n"
        "a[:] = 2\n"
        "comm.Barrier()\n"
        "print('read after free: ok', flush=True)\n"
    )
    result = mpirun.run(2, [sys.executable, "-c", code], timeout=60)
    assert not result.timed_out
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("read after free: ok") == 2
