"""Push: typed point-to-point (send_array / recv_array and their nonblocking forms)."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from mpicomm.engine.requests import outstanding
from mpicomm.transport.buffers import DTYPES

from .conftest import host, rank_data

DTYPE_IDS = [str(d) for d in DTYPES]


def neighbours(comm):
    return (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size


def counts(p):
    return sorted({0, 1, max(p - 1, 0), p + 1, 1000})


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_ring_every_dtype(comm, xp, dtype):
    right, left = neighbours(comm)
    for n in counts(comm.size):
        send = comm.isend_array(rank_data(comm.rank, n, dtype, xp), right, tag=7)
        got = comm.recv_array(source=left, tag=7, xp=xp)
        send.Wait()
        assert type(got) is type(rank_data(left, n, dtype, xp))
        assert got.dtype == np.dtype(dtype) and got.shape == (n,)
        assert np.array_equal(host(got), host(rank_data(left, n, dtype, xp)))


@pytest.mark.mpi
def test_shapes_travel_with_the_data(comm, xp):
    right, left = neighbours(comm)
    for shape in [(), (0,), (3, 0, 2), (2, 3), (4, 1, 5), (1,) * 10]:
        n = int(np.prod(shape))
        x = rank_data(comm.rank, n, np.int32, xp).reshape(shape)
        got = comm.sendrecv_array(x, right, left, sendtag=1, recvtag=1)
        assert got.shape == shape
        assert np.array_equal(host(got), host(rank_data(left, n, np.int32, xp).reshape(shape)))


@pytest.mark.mpi
def test_into_a_given_buffer(comm, xp):
    right, left = neighbours(comm)
    n = comm.size + 1
    buf = xp.zeros((n,), np.float64)
    status = MPI.Status()
    send = comm.isend_array(rank_data(comm.rank, n, np.float64, xp).reshape(1, n), right, tag=3)
    out = comm.recv_array(buf, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status)
    send.Wait()
    assert out is buf  # same count, any shape: the buffer keeps its own shape
    assert np.array_equal(host(buf), host(rank_data(left, n, np.float64, xp)))
    assert (status.Get_source(), status.Get_tag(), status.Get_count(MPI.DOUBLE)) == (left, 3, n)


@pytest.mark.mpi
def test_large_message(comm):
    right, left = neighbours(comm)
    n = 1_000_000
    got = comm.sendrecv_array(rank_data(comm.rank, n, np.float64), right, left)
    assert np.array_equal(got, rank_data(left, n, np.float64))


@pytest.mark.mpi
def test_nonblocking_receives_keep_mpi_order(comm):
    """Several irecv_array from one source and tag, waited in reverse: message k goes to receive k."""
    right, left = neighbours(comm)
    sizes = [5, 0, 300_000, 1, 17]  # one large enough for MPI's rendezvous protocol
    receives = [comm.irecv_array(source=left, tag=4) for _ in sizes]
    sends = [comm.isend_array(rank_data(comm.rank, n, np.int64) + k, right, tag=4) for k, n in enumerate(sizes)]
    got = [r.wait() for r in reversed(receives)][::-1]
    mpicomm.Request.Waitall(sends)
    for k, (n, arr) in enumerate(zip(sizes, got)):
        assert np.array_equal(arr, rank_data(left, n, np.int64) + k)


@pytest.mark.mpi
def test_any_source_gathers_from_everyone(comm):
    if comm.rank != 0:
        comm.send_array(rank_data(comm.rank, comm.rank, np.int64), 0, tag=comm.rank)
        return
    seen = {}
    for _ in range(comm.size - 1):
        status = MPI.Status()
        arr = comm.recv_array(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status)
        assert status.Get_tag() == status.Get_source()
        seen[status.Get_source()] = arr
    assert sorted(seen) == list(range(1, comm.size))
    for r, arr in seen.items():
        assert np.array_equal(arr, rank_data(r, r, np.int64))


@pytest.mark.mpi
def test_user_messages_never_match_library_traffic(comm):
    """A plain mpi4py message and a typed message with the same tag stay apart."""
    right, left = neighbours(comm)
    plain = np.full(3, comm.rank, np.int64)
    reqs = [comm.Isend(plain, right, tag=9), comm.isend_array(rank_data(comm.rank, 4, np.int64), right, tag=9)]
    typed = comm.recv_array(source=left, tag=9)
    raw = np.empty(3, np.int64)
    comm.Recv(raw, source=left, tag=9)
    mpicomm.Request.Waitall(reqs)
    assert np.array_equal(raw, np.full(3, left))
    assert np.array_equal(typed, rank_data(left, 4, np.int64))


@pytest.mark.mpi
def test_proc_null(comm):
    buf = np.arange(3.0)
    comm.send_array(buf, MPI.PROC_NULL)
    assert comm.isend_array(buf, MPI.PROC_NULL).done
    assert comm.recv_array(buf, source=MPI.PROC_NULL) is buf
    assert np.array_equal(buf, np.arange(3.0))
    assert comm.recv_array(source=MPI.PROC_NULL) is None


@pytest.mark.mpi
def test_staged_path(comm, staged):
    right, left = neighbours(comm)
    for dtype in (np.float16, np.complex128, np.bool_):
        got = comm.sendrecv_array(rank_data(comm.rank, 1000, dtype), right, left, buf=np.empty(1000, dtype))
        assert np.array_equal(got, rank_data(left, 1000, dtype))


# ---------------------------------------------------------------- mismatches found by the receiver


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize(
    "buf, message",
    [
        (np.empty(10, np.float32), "holds int64 of shape \\(10,\\).*buf is float32"),
        (np.empty(11, np.int64), "\\(10 elements\\) but buf is int64 of shape \\(11,\\) \\(11 elements\\)"),
        (np.empty(9, np.int64), "pass a int64 buffer of 10 elements"),
    ],
    ids=["dtype", "too-large", "too-small"],
)
def test_mismatch_raises_on_the_receiver_and_releases_the_sender(comm, buf, message):
    if comm.rank == 1:
        comm.send_array(np.arange(10, dtype=np.int64), 0, tag=5)  # returns: the payload was drained
        comm.send_array(np.arange(3, dtype=np.int64), 0, tag=6)
    elif comm.rank == 0:
        with pytest.raises(ValueError, match=message):
            comm.recv_array(buf, source=1, tag=5)
        assert np.array_equal(comm.recv_array(source=1, tag=6), np.arange(3))  # the channel still works


@pytest.mark.mpi(min_size=2)
def test_mismatch_of_a_large_message_does_not_hang_the_sender(comm):
    if comm.rank == 1:
        comm.send_array(np.zeros(2_000_000), 0)  # 16 MB: MPI's rendezvous protocol
    elif comm.rank == 0:
        with pytest.raises(ValueError, match="float64"):
            comm.recv_array(np.empty(2_000_000, np.float32), source=1)


@pytest.mark.mpi(min_size=2)
def test_mismatch_in_a_nonblocking_receive(comm):
    if comm.rank == 1:
        comm.send_array(np.arange(4.0), 0)
    elif comm.rank == 0:
        request = comm.irecv_array(np.empty(4, np.int8), source=1)
        with pytest.raises(ValueError, match="holds float64"):
            request.wait()
        assert request.done


# ---------------------------------------------------------------- bad input, refused before anything is sent


@pytest.mark.mpi
@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda c: c.send_array(np.zeros(2), c.size), ValueError, "dest=.* not a rank"),
        (lambda c: c.send_array(np.zeros(2), -5), ValueError, "dest=-5"),
        (lambda c: c.send_array(np.zeros(2), 0.0), TypeError, "dest must be an integer"),
        (lambda c: c.send_array(np.zeros(2), True), TypeError, "dest must be an integer"),
        (lambda c: c.send_array(np.zeros(2), MPI.ANY_SOURCE), ValueError, "dest="),
        (lambda c: c.send_array(np.zeros(2), 0, tag=-1), ValueError, "tag=-1 is not a valid tag"),
        (lambda c: c.send_array(np.zeros(2), 0, tag=MPI.ANY_TAG), ValueError, "tag="),
        (lambda c: c.send_array(np.zeros(2), 0, tag=1 << 40), ValueError, "TAG_UB"),
        (lambda c: c.send_array([1, 2], 0), TypeError, "x must be an array or a buffer .* got list"),
        (lambda c: c.send_array(np.zeros((4, 4))[:, 1], 0), ValueError, "x is not C-contiguous"),
        (lambda c: c.send_array(np.zeros(3, dtype=object), 0), TypeError, "dtype object"),
        (lambda c: c.send_array(np.zeros(3, dtype=">f8"), 0), TypeError, "byte order"),
        (lambda c: c.send_array(np.zeros((1,) * 33), 0), ValueError, "at most 32"),
        (lambda c: c.isend_array(np.zeros(2), c.size + 3), ValueError, "dest="),
        (lambda c: c.recv_array(source=c.size), ValueError, "source=.* not a rank"),
        (lambda c: c.recv_array(source="0"), TypeError, "source must be an integer"),
        (lambda c: c.recv_array(tag=-7), ValueError, "tag=-7"),
        (lambda c: c.recv_array(np.zeros(3)[::2]), ValueError, "buf is not C-contiguous"),
        (lambda c: c.recv_array(np.frombuffer(b"abcdefgh", np.uint8)), ValueError, "buf is read-only"),
        (lambda c: c.recv_array({}), TypeError, "buf must be an array or a buffer"),
        (lambda c: c.irecv_array(source=-3), ValueError, "source=-3"),
        (lambda c: c.sendrecv_array(np.zeros(2), 0, c.size), ValueError, "source="),
    ],
)
def test_bad_input_is_refused_before_sending(comm, call, error, message):
    before = len(outstanding())
    with pytest.raises(error, match=message):
        call(comm)
    assert len(outstanding()) == before  # nothing was posted


@pytest.mark.mpi(min_size=2)
def test_small_nonblocking_receive_completes_while_blocked_in_plain_mpi(comm):
    """Inline messages need no mpicomm progress: a plain mpi4py Recv in between cannot starve them."""
    plain = MPI.COMM_WORLD.Dup()
    try:
        if comm.rank == 0:
            r = comm.irecv_array(source=1, tag=11)
            token = np.empty(1)
            plain.Recv(token, source=1)  # rank 1 sends this only after its send_array returned
            assert np.array_equal(r.wait(), rank_data(1, 2000, np.float64))  # 16 000 bytes: inline
        elif comm.rank == 1:
            comm.send_array(rank_data(1, 2000, np.float64), 0, tag=11)
            plain.Send(np.ones(1), dest=0)
    finally:
        plain.Free()


@pytest.mark.mpi(min_size=2)
def test_large_pending_receive_does_not_block_collective_setup(comm):
    """A two-part receive waits for this rank's progress; mpicomm's own set-up collectives provide it."""
    n = 1_000_000
    if comm.rank == 0:
        r = comm.irecv_array(source=1, tag=12)
    if comm.rank == 1:
        comm.send_array(rank_data(1, n, np.float64), 0, tag=12)  # returns once rank 0 posted the payload
    with comm.expose(np.zeros(3)) as win:  # collective: rank 0 serves its receive while waiting here
        assert win.sizes == [3] * comm.size
    if comm.rank == 0:
        assert np.array_equal(r.wait(), rank_data(1, n, np.float64))


@pytest.mark.mpi
def test_xp_must_be_an_array_module(comm):
    with pytest.raises(TypeError, match="xp='cupy': pass the numpy or cupy module"):
        comm.recv_array(source=comm.rank, xp="cupy")
    with pytest.raises(TypeError, match="xp=None"):
        comm.irecv_array(source=comm.rank, xp=None)
