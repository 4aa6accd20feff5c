"""mpicomm.coll.allreduce: every allreduce algorithm against the MPI library's own Allreduce."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from mpicomm import registry, selection
from mpicomm.coll import allreduce
from mpicomm.coll.patterns import block_partition
from mpicomm.facts import Facts

from ..conftest import host
from . import reference as R

ALGORITHMS = mpicomm.algorithms("allreduce")
ORDERED = [a for a in ALGORITHMS if not registry.lookup("allreduce", a).commutative_only]
COMMUTATIVE_ONLY = [a for a in ALGORITHMS if registry.lookup("allreduce", a).commutative_only]



def expected(x, op):
    """The MPI library's Allreduce of every rank's *x* (on the host)."""
    x = host(x)
    out = np.empty_like(x)
    R.native().Allreduce(x, out, op=op)
    return out


def allreduce_(comm, x, op, algorithm: str | None, in_place: bool, xp=np):
    """mpicomm's Allreduce of *x* into a new buffer (in place: a copy of *x* with MPI.IN_PLACE)."""
    if in_place:
        recv = x.copy()
        comm.Allreduce(MPI.IN_PLACE, recv, op=op, algorithm=algorithm)
    else:
        recv = xp.asarray(R.data(97, x.size, x.dtype))  # rank 97: unlike any result
        comm.Allreduce(x, recv, op=op, algorithm=algorithm)
    return recv


def test_every_algorithm_is_registered():
    assert {"naive", "tree", "recursive_doubling", "ring", "rabenseifner"} <= set(ALGORITHMS)
    assert {"ring", "rabenseifner"} <= set(COMMUTATIVE_ONLY)
    assert {"naive", "tree", "recursive_doubling"} <= set(ORDERED)


def test_ring_pieces_literal_table():
    # p = 3, 10 elements: blocks 0-3, 4-6, 7-9; segments of at most 2 elements, so a block of 4
    # elements takes two full segments and one of 3 takes (2, 1). Rank 0's reduce-scatter sends
    # block 2 then 1 and reduces block 1 then 0; its allgather sends block 0 then 2, receives 2 then 1.
    pieces = [tuple(piece) for piece in allreduce._ring_pieces(0, 3, 10, 2)]
    assert pieces == [
        ((7, 9), (4, 6), True), ((9, 10), (6, 7), True),  # reduce-scatter step 0: block 2 out, block 1 in
        ((4, 6), (0, 2), True), ((6, 7), (2, 4), True),  # step 1: block 1 out, block 0 in
        ((0, 2), (7, 9), False), ((2, 4), (9, 10), False),  # allgather step 0: block 0 out, block 2 in
        ((7, 9), (4, 6), False), ((9, 10), (6, 7), False),  # step 1: block 2 out, block 1 in
    ]
    # count < p: p = 4, 2 elements, blocks [0:1], [1:2], [], []; empty blocks move nothing
    assert [tuple(piece) for piece in allreduce._ring_pieces(1, 4, 2, 8)] == [
        ((0, 1), None, True),  # reduce-scatter step 0: block 0 out, block 3 (empty) in
        (None, (1, 2), True),  # step 2: block 2 (empty) out, block 1 in (step 1 moves two empty blocks)
        ((1, 2), (0, 1), False),  # allgather step 0: block 1 out, block 0 in
        ((0, 1), None, False),  # step 1: block 0 out, block 3 (empty) in
    ]


@pytest.mark.parametrize("p", range(1, 9))
@pytest.mark.parametrize("count", [0, 1, 5, 17, 64])
@pytest.mark.parametrize("segment", [1, 3, 64])
def test_ring_pieces_match_between_neighbours(p, count, segment):
    counts, displs = block_partition(count, p)
    for rank in range(p):
        pieces = list(allreduce._ring_pieces(rank, p, count, segment))
        # every segment a rank sends right is one its right neighbour receives, in the same order
        right = allreduce._ring_pieces((rank + 1) % p, p, count, segment)
        assert [piece.send for piece in pieces if piece.send] == [piece.recv for piece in right if piece.recv]
        assert all(b - a <= segment for piece in pieces for a, b in filter(None, (piece.send, piece.recv)))
        # the reduce-scatter receives every block but r - 1, the allgather every block but r
        covered = np.zeros(count, int)
        for piece in pieces:
            if piece.recv:
                covered[piece.recv[0] : piece.recv[1]] += 1
        want = np.full(count, 2 if p > 1 else 0)
        for b in {rank, (rank - 1) % p} if p > 1 else ():
            want[displs[b] : displs[b] + counts[b]] = 1
        assert covered.tolist() == want.tolist()


@pytest.mark.mpi
@pytest.mark.parametrize("in_place", [False, True], ids=["out_of_place", "in_place"])
@pytest.mark.parametrize("dtype, op", R.DTYPE_OPS, ids=R.DTYPE_OP_IDS)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_matches_library(comm, xp, algorithm, dtype, op, in_place):
    for count in R.counts(comm.size):
        x = R.data(comm.rank, count, dtype, xp)
        before = host(x).copy()
        got = allreduce_(comm, x, op, algorithm, in_place, xp)
        context = f"{algorithm} count={count} in_place={in_place}"
        assert type(got) is type(x)
        R.assert_matches(got, expected(before, R.mpi_op(op)), context)
        R.assert_matches(x, before, context + ": the send buffer changed")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ORDERED)
def test_non_commutative_op_keeps_rank_order(comm, algorithm):
    p = comm.size
    for nmat in sorted({0, 1, p - 1, p + 1, 250}):  # counts in units of 4 elements (one 2×2 matrix)
        for in_place in (False, True):
            x = R.matrices(comm.rank, nmat)
            got = allreduce_(comm, x, R.MATMUL, algorithm, in_place)
            R.assert_matches(got, expected(x, R.native_matmul()), f"{algorithm} matrices={nmat} in_place={in_place}")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", COMMUTATIVE_ONLY)
def test_commutative_only_refuses_non_commutative_op(comm, algorithm):
    x = R.matrices(comm.rank, comm.size + 1)
    with pytest.raises(ValueError, match=f"'{algorithm}'.*matmul2x2") as info:
        comm.Allreduce(x, np.empty_like(x), op=R.MATMUL, algorithm=algorithm)
    for name in ORDERED:
        if comm.nodes == 1 or not registry.lookup("allreduce", name).single_node:  # those that can run here
            assert name in str(info.value)  # the message names the algorithms that keep rank order


@pytest.mark.mpi
@pytest.mark.parametrize("nmat", [1, 3000, 70_000])  # 32 B, 96 KB, 2.2 MB: each size rule of the table
def test_auto_picks_an_order_keeping_algorithm_for_a_non_commutative_op(comm, nmat):
    x = R.matrices(comm.rank, nmat)
    facts = Facts(p=comm.size, bytes=x.nbytes, count=x.size, commutative=False)
    assert selection.select("allreduce", None, facts=facts).name in ORDERED
    got = allreduce_(comm, x, R.MATMUL, None, in_place=False)
    R.assert_matches(got, expected(x, R.native_matmul()), f"auto matrices={nmat}")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_large(comm, algorithm):
    x = R.data(comm.rank, R.LARGE, np.int64)
    got = allreduce_(comm, x, "sum", algorithm, in_place=False)
    R.assert_matches(got, expected(x, MPI.SUM), f"{algorithm} count={R.LARGE}")


@pytest.mark.mpi
def test_ring_with_many_uneven_segments(comm, monkeypatch):
    # 3 int64 per segment: blocks of different sizes take different numbers of segments
    monkeypatch.setattr(allreduce, "SEGMENT_BYTES", 24)
    p = comm.size
    for count in sorted({0, 1, p - 1, p + 1, 3 * p - 1, 3 * p + 1, 7 * p + 2, 1000}):
        for in_place in (False, True):
            x = R.data(comm.rank, count, np.int64)
            got = allreduce_(comm, x, "sum", "ring", in_place)
            R.assert_matches(got, expected(x, MPI.SUM), f"ring count={count} in_place={in_place}")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_two_in_flight(comm, path, algorithm):
    # same count and op: only the calls' tags keep the two apart
    count = 1000
    a = R.data(comm.rank, count, np.int64)
    b = R.data(comm.rank + comm.size, count, np.int64)
    ra, rb = np.zeros(count, np.int64), b.copy()
    first = comm.Iallreduce(a, ra, op=MPI.SUM, algorithm=algorithm)
    second = comm.Iallreduce(MPI.IN_PLACE, rb, op=MPI.SUM, algorithm=algorithm)
    assert isinstance(first, mpicomm.Request) and isinstance(second, mpicomm.Request)
    second.Wait()
    first.Wait()
    R.assert_matches(ra, expected(a, MPI.SUM), f"{algorithm}: first")
    R.assert_matches(rb, expected(b, MPI.SUM), f"{algorithm}: second")


# ---------------------------------------------------------------- more than 2 GiB (slow tier)

#: Bytes of the slow test's vector: a byte more than 2 GiB would do; 12345 more also makes blocks uneven.
HUGE = (1 << 31) + 12345
_ROW = 256
_CHUNK = 1 << 26  # bytes generated or checked at once


def _pattern(start: int, stop: int) -> np.ndarray:
    """Bytes start … stop of a vector that differs from any shifted copy of itself: the xor of the index's bytes.

    Computed by rows of 256 (within a row the low byte is the column), so a
    chunk costs one small arange and one broadcast xor.
    """
    first, last = start // _ROW, -(-stop // _ROW)
    rows = np.arange(first, last, dtype=np.uint32)
    high = (rows ^ (rows >> 8) ^ (rows >> 16)).astype(np.uint8)
    table = high[:, None] ^ np.arange(_ROW, dtype=np.uint8)[None, :]
    return table.reshape(-1)[start - first * _ROW : stop - first * _ROW]


def _shift(rank: int) -> int:
    return (37 * rank + 11) % 256


def _memory_available() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("algorithm", ["recursive_doubling", "ring"])
def test_more_than_2_gib(comm, algorithm):
    # one uint8 vector of 2 GiB + 12345 bytes per rank, op sum (wrapping): at p = 2 recursive doubling
    # sends it whole, so the message's byte count does not fit MPI's int; the ring sends 1 MiB pieces.
    # Rank r holds pattern + shift(r), so the result is p·pattern + Σ shift(r) (mod 256), checked chunk-wise.
    p = comm.size
    need = comm.local_size * 2 * HUGE * 1.15  # the vector and recursive doubling's scratch vector, per rank on the node
    enough = R.native().allreduce(int(_memory_available() >= need), op=MPI.MIN)
    if not enough:
        pytest.skip(f"needs about {need / 2**30:.1f} GiB free on a node for {comm.local_size} ranks")
    x = np.empty(HUGE, np.uint8)
    for start in range(0, HUGE, _CHUNK):
        stop = min(start + _CHUNK, HUGE)
        np.add(_pattern(start, stop), np.uint8(_shift(comm.rank)), out=x[start:stop])
    began = time.perf_counter()
    comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM, algorithm=algorithm)
    seconds = time.perf_counter() - began
    total = np.uint8(sum(_shift(r) for r in range(p)) % 256)
    bad = 0
    for start in range(0, HUGE, _CHUNK):
        stop = min(start + _CHUNK, HUGE)
        want = _pattern(start, stop) * np.uint8(p) + total
        wrong = np.flatnonzero(x[start:stop] != want)
        if wrong.size and not bad:
            i = start + int(wrong[0])
            first = f"first at byte {i}: got {x[i]}, expected {want[wrong[0]]}"
        bad += wrong.size
    assert bad == 0, f"{algorithm}: {bad} of {HUGE} bytes differ ({first})"
    if os.environ.get("MPICOMM_TEST_VERBOSE") == "1":
        print(f"\n{algorithm} p={p}: {HUGE / 2**30:.2f} GiB in {seconds:.2f} s")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["hierarchical", "shm"])
def test_first_call_sets_up_while_another_call_is_in_flight(comm, algorithm):
    # the first shm / hierarchical call on a communicator builds its windows or levels (collective set-ups,
    # blocking) from inside its step generator; a nonblocking call in flight meanwhile must not re-enter it
    if algorithm == "shm" and comm.nodes != 1:
        pytest.skip("shm needs one node")
    fresh = mpicomm.Comm(MPI.COMM_WORLD.Dup())
    try:
        a, b = R.data(comm.rank, 1000, np.int64), R.data(comm.rank + 7, 999, np.int64)
        ra, rb = np.zeros_like(a), np.zeros_like(b)
        pending = fresh.Iallreduce(a, ra, op=MPI.SUM, algorithm="recursive_doubling")
        fresh.Allreduce(b, rb, op=MPI.SUM, algorithm=algorithm)
        pending.Wait()
        R.assert_matches(ra, expected(a, MPI.SUM), "in flight")
        R.assert_matches(rb, expected(b, MPI.SUM), algorithm)
    finally:
        fresh.Barrier()
