"""mpicomm.coll.alltoall: every alltoall(v) algorithm against the MPI library's own Alltoall(v)."""

from __future__ import annotations

import resource
import time

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from mpicomm import registry

from .reference import LARGE, LAYOUTS, assert_matches, counts, data, layout, native, unfilled

ALGORITHMS = mpicomm.algorithms("alltoall")
DTYPES = [np.int64, np.float16, np.complex128, np.bool_]  # item sizes 8, 2, 16, 1


def library_alltoall(p: int, count: int, dtype) -> np.ndarray:
    """What MPI's Alltoall of every rank's ``data(rank, p · count)`` delivers."""
    out = np.empty(p * count, dtype)
    native().Alltoall(data(native().Get_rank(), p * count, dtype), out)
    return out


# ---------------------------------------------------------------- alltoallv layouts

#: Count matrices for alltoallv: entry [r][s] is what rank r sends to rank s.
MATRICES = {
    "uneven": lambda p: [[(0, 1, 5, 0, 300, 2, 7)[(3 * r + s) % 7] for s in range(p)] for r in range(p)],
    "one-pair": lambda p: [[p + 1 if (r, s) == (p - 1, 0) else 0 for s in range(p)] for r in range(p)],
    "empty": lambda p: [[0] * p for _ in range(p)],
}
#: A symmetric matrix (what r sends to s equals what s sends to r), as in place needs.
SYMMETRIC = lambda p: [[(0, 1, 5, 3)[(r + s) % 4] for s in range(p)] for r in range(p)]  # noqa: E731


class VLayout:
    """One rank's alltoallv buffers for count matrix *matrix*, send and receive blocks laid out by *how*."""

    def __init__(self, matrix: list[list[int]], rank: int, send_how: str, recv_how: str):
        p = len(matrix)
        self.sendcounts = matrix[rank]
        self.recvcounts = [matrix[s][rank] for s in range(p)]
        self.senddispls, self.send_size = layout(self.sendcounts, send_how)
        self.recvdispls, self.recv_size = layout(self.recvcounts, recv_how)

    def send(self, rank: int, dtype, xp=np):
        return [data(rank, self.send_size, dtype, xp), (self.sendcounts, self.senddispls)]

    def recv(self, buf):
        return [buf, (self.recvcounts, self.recvdispls)]

    def library(self, rank: int, dtype) -> np.ndarray:
        """What MPI's Alltoallv delivers (gaps: SENTINEL)."""
        out = unfilled(self.recv_size, dtype)
        native().Alltoallv(self.send(rank, dtype), self.recv(out))
        return out


# ---------------------------------------------------------------- tests


def test_registered_names():
    assert ALGORITHMS == ["bruck", "linear", "pairwise", "shm"]
    assert mpicomm.algorithms("alltoallv") == ALGORITHMS == mpicomm.algorithms("alltoallw")
    for name in ALGORITHMS:
        assert registry.lookup("alltoallv", name).steps is registry.lookup("alltoall", name).steps
        assert registry.lookup("alltoallw", name).steps is registry.lookup("alltoall", name).steps
        assert not registry.lookup("alltoall", name).in_place
        assert not registry.lookup("alltoallv", name).in_place


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_alltoall_matches_library(comm, xp, algorithm, dtype):
    p = comm.size
    for count in counts(p):
        recv = xp.zeros(p * count, dtype)
        comm.Alltoall(data(comm.rank, p * count, dtype, xp), recv, algorithm=algorithm)
        assert_matches(recv, library_alltoall(p, count, dtype), f"{algorithm} count {count}")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_alltoall_in_place(comm, algorithm):
    p = comm.size
    for count in counts(p):
        recv = data(comm.rank, p * count)
        comm.Alltoall(MPI.IN_PLACE, recv, algorithm=algorithm)
        assert_matches(recv, library_alltoall(p, count, np.int64), f"{algorithm} in place, count {count}")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_alltoallv_uneven_counts_and_displacements(comm, xp, algorithm):
    p, rank = comm.size, comm.rank
    for name, make in MATRICES.items():
        for send_how, recv_how in zip(LAYOUTS, [*LAYOUTS[1:], LAYOUTS[0]]):
            v = VLayout(make(p), rank, send_how, recv_how)
            recv = unfilled(v.recv_size, np.int64, xp)
            comm.Alltoallv(v.send(rank, np.int64, xp), v.recv(recv), algorithm=algorithm)
            assert_matches(recv, v.library(rank, np.int64),
                           f"{algorithm} {name} send {send_how} {v.senddispls} recv {recv_how} {v.recvdispls}")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_alltoallv_other_dtypes(comm, algorithm):
    rank = comm.rank
    v = VLayout(MATRICES["uneven"](comm.size), rank, "interleaved", "reversed")
    for dtype in (np.complex128, np.uint8, np.bool_):
        recv = unfilled(v.recv_size, dtype)
        comm.Alltoallv(v.send(rank, dtype), v.recv(recv), algorithm=algorithm)
        assert_matches(recv, v.library(rank, dtype), f"{algorithm} {np.dtype(dtype)}")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_alltoallv_in_place(comm, algorithm):
    rank = comm.rank
    for how in LAYOUTS:
        v = VLayout(SYMMETRIC(comm.size), rank, how, how)
        recv = unfilled(v.recv_size, np.int64)
        sent = v.send(rank, np.int64)[0]
        for c, d in zip(v.recvcounts, v.recvdispls):  # in place, recv holds the outgoing blocks
            recv[d : d + c] = sent[d : d + c]
        expected = unfilled(v.recv_size, np.int64)
        native().Alltoallv([recv.copy(), (v.recvcounts, v.recvdispls)], v.recv(expected))
        comm.Alltoallv(MPI.IN_PLACE, v.recv(recv), algorithm=algorithm)
        assert_matches(recv, expected, f"{algorithm} in place, {how}")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_alltoall_large(comm, algorithm):
    p = comm.size
    count = LARGE // (p * p)  # 10⁶ elements sent by each rank in all
    recv = np.empty(p * count, np.int64)
    comm.Alltoall(data(comm.rank, p * count), recv, algorithm=algorithm)
    assert_matches(recv, library_alltoall(p, count, np.int64), f"{algorithm} at {p} × {count}")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_alltoall_both_paths(comm, path, algorithm):
    p, rank = comm.size, comm.rank
    for count in (p + 1, 1000):
        recv = np.zeros(p * count, np.float32)
        comm.Alltoall(data(rank, p * count, np.float32), recv, algorithm=algorithm)
        assert_matches(recv, library_alltoall(p, count, np.float32), f"{algorithm} ({path}) count {count}")
    v = VLayout(MATRICES["uneven"](p), rank, "reversed", "interleaved")
    recv = unfilled(v.recv_size, np.int64)
    comm.Alltoallv(v.send(rank, np.int64), v.recv(recv), algorithm=algorithm)
    assert_matches(recv, v.library(rank, np.int64), f"{algorithm} ({path}) v")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_ialltoall_and_ialltoallv_in_flight(comm, algorithm):
    p, rank = comm.size, comm.rank
    v = VLayout(MATRICES["uneven"](p), rank, "interleaved", "reversed")
    first = np.zeros(p * 333, np.int64)
    second = unfilled(v.recv_size, np.int64)
    requests = [
        comm.Ialltoall(data(rank, p * 333), first, algorithm=algorithm),
        comm.Ialltoallv(v.send(rank, np.int64), v.recv(second), algorithm=algorithm),
    ]
    assert all(isinstance(r, mpicomm.Request) for r in requests)
    mpicomm.Request.Waitall(requests)
    assert_matches(first, library_alltoall(p, 333, np.int64), "Ialltoall")
    assert_matches(second, v.library(rank, np.int64), "Ialltoallv")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["bruck", "shm"])
def test_mismatched_counts_are_reported_by_the_receiver(comm, monkeypatch, algorithm):
    """Without validation, a sender's count that differs from recvcounts raises on the receiver only, and the
    communicator stays usable (for shm: its shared-memory arena is still in step on every rank)."""
    p, rank = comm.size, comm.rank
    if p < 2:
        pytest.skip("needs two ranks")
    monkeypatch.setenv("MPICOMM_VALIDATE", "0")
    sendcounts = [2 if (rank, s) == (0, 1) else 1 for s in range(p)]  # rank 1 expects 1 from rank 0
    recv = np.zeros(p, np.int64)
    send = [data(rank, sum(sendcounts)), (sendcounts, None)]
    if rank == 1:
        with pytest.raises(ValueError, match=r"rank 0 sent 2 elements, recvcounts\[0\] = 1"):
            comm.Alltoallv(send, [recv, ([1] * p, None)], algorithm=algorithm)
    else:
        comm.Alltoallv(send, [recv, ([1] * p, None)], algorithm=algorithm)
    x = data(rank, p * 3)
    want = np.empty_like(x)
    MPI.COMM_WORLD.Alltoall(x, want)
    got = np.empty_like(x)
    comm.Alltoall(x, got, algorithm=algorithm)
    assert_matches(got, want, f"{algorithm} after the mismatch")


# ---------------------------------------------------------------- alltoallw: a datatype per block, bytes moved

#: The datatypes the blocks cycle through (sender and receiver of a block use the same one): element sizes 4, 8,
#: 1, 16 and a derived contiguous type of three int16s (6 bytes).
W_TYPES = [MPI.INT32_T, MPI.DOUBLE, MPI.SIGNED_CHAR, MPI.C_DOUBLE_COMPLEX, MPI.INT16_T.Create_contiguous(3).Commit()]


def _wspec(buf: np.ndarray, peer_counts: list[int], peer_types: list, how: str) -> list:
    """``[buf, (counts, byte displacements), datatypes]`` with the blocks laid out by *how* (gaps, reversed...)."""
    sizes = [c * t.Get_size() for c, t in zip(peer_counts, peer_types)]
    displs, _ = layout(sizes, how)
    return [buf, (peer_counts, displs), peer_types]


def _wsize(peer_counts: list[int], peer_types: list, how: str) -> int:
    return layout([c * t.Get_size() for c, t in zip(peer_counts, peer_types)], how)[1]


def _wcase(rank: int, p: int, n: int) -> tuple[list[int], list, list[int], list]:
    """What rank sends each peer (counts, types) and receives from each: block r→s has count f(r, s) of type
    W_TYPES[(r + s) % 5], so every pair differs and 0 appears."""
    def f(r: int, s: int) -> int:
        return (n + 3 * r + 5 * s) % (n + 3) if n else 0

    return ([f(rank, s) for s in range(p)], [W_TYPES[(rank + s) % len(W_TYPES)] for s in range(p)],
            [f(r, rank) for r in range(p)], [W_TYPES[(r + rank) % len(W_TYPES)] for r in range(p)])


def _bytes(rank: int, size: int) -> np.ndarray:
    return ((np.arange(size, dtype=np.int64) * 7 + rank * 31) % 251).astype(np.uint8)


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_alltoallw_moves_every_blocks_datatype_as_the_library(comm, algorithm):
    p, rank = comm.size, comm.rank
    for n in counts(p):
        scounts, stypes, rcounts, rtypes = _wcase(rank, p, n)
        send = _bytes(rank, _wsize(scounts, stypes, "interleaved"))
        size = _wsize(rcounts, rtypes, "reversed")
        want = np.full(size, 249, np.uint8)
        native().Alltoallw(_wspec(send, scounts, stypes, "interleaved"), _wspec(want, rcounts, rtypes, "reversed"))
        for form in ("blocking", "nonblocking", "persistent"):
            got = np.full(size, 249, np.uint8)
            sspec, rspec = _wspec(send, scounts, stypes, "interleaved"), _wspec(got, rcounts, rtypes, "reversed")
            if form == "blocking":
                comm.Alltoallw(sspec, rspec, algorithm=algorithm)
            elif form == "nonblocking":
                comm.Ialltoallw(sspec, rspec, algorithm=algorithm).Wait()
            else:
                request = comm.Alltoallw_init(sspec, rspec, algorithm=algorithm)
                request.Start()
                request.Wait()
                request.Free()
            assert_matches(got, want, f"alltoallw {algorithm} {form} n={n}")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_alltoallw_in_place(comm, algorithm):
    p, rank = comm.size, comm.rank
    counts_ = [(r + rank) % 3 + 1 for r in range(p)]  # symmetric: what r sends s equals what s sends r
    types = [W_TYPES[(r + rank) % len(W_TYPES)] for r in range(p)]
    size = _wsize(counts_, types, "reversed")
    got, want = _bytes(rank, size), _bytes(rank, size)
    native().Alltoallw(MPI.IN_PLACE, _wspec(want, counts_, types, "reversed"))
    comm.Alltoallw(MPI.IN_PLACE, _wspec(got, counts_, types, "reversed"), algorithm=algorithm)
    assert_matches(got, want, f"alltoallw {algorithm} in place")


@pytest.mark.mpi
def test_alltoallw_with_a_datatype_that_has_gaps_goes_to_the_library(comm):
    p, rank = comm.size, comm.rank
    strided = MPI.INT32_T.Create_vector(2, 1, 2).Commit()  # 2 ints, one skipped between: not contiguous
    send = np.arange(4 * p, dtype=np.int32) + 100 * rank
    got, want = np.full(4 * p, -1, np.int32), np.full(4 * p, -1, np.int32)
    displs = [16 * r for r in range(p)]
    native().Alltoallw([send, ([1] * p, displs), [strided] * p], [want, ([1] * p, displs), [strided] * p])
    comm.Alltoallw([send, ([1] * p, displs), [strided] * p], [got, ([1] * p, displs), [strided] * p])
    assert_matches(got, want, "alltoallw of a strided datatype")
    strided.Free()


@pytest.mark.mpi
def test_alltoallw_byte_counts_that_do_not_fit_raise_on_every_rank(comm):
    from .reference import expect_everywhere

    p, rank = comm.size, comm.rank
    if p < 2:
        pytest.skip("needs two ranks")
    types = [MPI.INT32_T] * p
    rcounts = [2 if (rank, r) == (1, 0) else 1 for r in range(p)]  # rank 1 expects 8 bytes from rank 0, gets 4
    send, recv = np.zeros(p, np.int32), np.zeros(p + 1, np.int32)
    displs = [4 * r for r in range(p)]
    rdispls = [4 * r + (4 if r > 0 and rank == 1 else 0) for r in range(p)]
    message = expect_everywhere(comm, lambda: comm.Alltoallw([send, ([1] * p, displs), types],
                                                             [recv, (rcounts, rdispls), types]),
                                "rank 0 sends 4 bytes to rank 1, which expects 8")
    assert "alltoallw" in message


@pytest.mark.mpi
def test_table_choice_runs(comm):
    """No algorithm named: the selection table's choice (by size) exchanges correctly."""
    p = comm.size
    for count in (1, 64, 5000):  # around the table's size thresholds
        recv = np.zeros(p * count, np.int64)
        comm.Alltoall(data(comm.rank, p * count), recv)
        assert_matches(recv, library_alltoall(p, count, np.int64), f"auto count {count}")


# ---------------------------------------------------------------- the slower tier: > 2 GiB

#: Pattern period of the big test's blocks: a prime, so a block shifted by anything
#: but a multiple of it, or another pair's block, never looks right.
PERIOD = 4093


def _pattern(source: int, dest: int) -> np.ndarray:
    return ((np.arange(PERIOD, dtype=np.int64) * 31 + source * 7 + dest * 13) % 256).astype(np.uint8)


def _fill(block: np.ndarray, pattern: np.ndarray) -> None:
    whole = block.size // PERIOD * PERIOD
    block[:whole].reshape(-1, PERIOD)[...] = pattern
    block[whole:] = pattern[: block.size - whole]


def _holds(block: np.ndarray, pattern: np.ndarray, rows: int = (64 << 20) // PERIOD) -> bool:
    """Whether *block* is *pattern* repeated, compared 64 MiB at a time (no full-size reference)."""
    whole = block.size // PERIOD * PERIOD
    grid = block[:whole].reshape(-1, PERIOD)
    for start in range(0, grid.shape[0], rows):
        if not (grid[start : start + rows] == pattern).all():
            return False
    return bool((block[whole:] == pattern[: block.size - whole]).all())


def _available_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


@pytest.mark.slow
@pytest.mark.mpi
def test_alltoall_over_2_gib(comm):
    """Each rank sends more than 2 GiB of uint8 through comm.Alltoall (table's choice, then linear).

    Blocks of 2^31/p + 4099 bytes (odd, so nothing lines up by luck); every
    block is checked against its (source, destination) pattern in 64 MiB
    pieces. Needs 2·p·block bytes per rank (send and receive), all ranks of
    the node together - skipped where that much memory is not available.
    """
    p, rank = comm.size, comm.rank
    block = (1 << 31) // p + 4099
    need = 2 * p * block * comm.local_size
    enough = comm.bcast(_available_bytes() > need * 1.1 if comm.local_rank == 0 else None, root=0)
    if not enough:
        pytest.skip(f"needs {need / 2**30:.1f} GiB of free memory on the node")
    send = np.empty(p * block, np.uint8)
    for dest in range(p):
        _fill(send[dest * block : (dest + 1) * block], _pattern(rank, dest))
    recv = np.empty(p * block, np.uint8)
    for algorithm in (None, "linear"):
        recv[...] = 0
        comm.Barrier()
        start = time.perf_counter()
        comm.Alltoall(send, recv, algorithm=algorithm)
        seconds = time.perf_counter() - start
        bad = [s for s in range(p) if not _holds(recv[s * block : (s + 1) * block], _pattern(s, rank))]
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB → GiB
        print(f"\nrank {rank}: Alltoall ({algorithm or 'auto'}) of {send.nbytes} bytes per rank in {seconds:.2f} s, "
              f"checked in {time.perf_counter() - start - seconds:.2f} s; peak RSS {peak:.2f} GiB", flush=True)
        assert not bad, f"{algorithm or 'auto'}: blocks from ranks {bad} differ from their pattern"
