"""mpicomm.rendezvous: publish / pull / ipull, deferred requests, errors from the owner, collective close.

Every test closes its rendezvous on every rank (``with`` or ``try/finally``).
Where a library bug could leave a pull unanswered, the test waits for it with a
deadline (``within``), so such a bug fails the test instead of hanging the job.
"""

from __future__ import annotations

import gc
import re
import sys
import textwrap
import time
import weakref

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from mpicomm.transport.buffers import mpi_datatype
from tests import mpirun
from tests.conftest import SOME_DTYPE_IDS, SOME_DTYPES, host, rank_data

DTYPES, DTYPE_IDS = SOME_DTYPES, SOME_DTYPE_IDS

TIMED_OUT = "timed out"




def within(request, seconds: float = 10.0):
    """*request*'s result; TIMED_OUT (after cancelling it) if it has not completed in *seconds*.

    Errors the request completed with are raised, as ``wait()`` does.
    """
    deadline = time.monotonic() + seconds
    while not request.Test():
        if time.monotonic() > deadline:
            request.Cancel()
            return TIMED_OUT
        time.sleep(0.0005)
    return request.wait()


def size_of(owner: int, size: int) -> int:
    """Elements *owner* publishes under "v": uneven per rank, and none on the last of several ranks."""
    return 0 if size > 1 and owner == size - 1 else 3 * owner + size + 2


def counts(size: int) -> list[int]:
    """The edge counts 0, 1, p-1, p+1 (deduplicated)."""
    return sorted({0, 1, size - 1, size + 1})


def slices(n: int, size: int) -> list[tuple[int, int | None]]:
    """(offset, count) pairs inside an array of *n* elements; count None means "to the end"."""
    out: list[tuple[int, int | None]] = []
    for c in counts(size):
        if c <= n:
            out += [(o, c) for o in sorted({0, (n - c) // 2, n - c})]
    out += [(o, None) for o in sorted({0, min(1, n), n})]
    return out


def expected(owner: int, size: int, dtype, offset: int = 0, count: int | None = None) -> np.ndarray:
    full = rank_data(owner, size_of(owner, size), dtype)
    return full[offset:] if count is None else full[offset : offset + count]


# ---------------------------------------------------------------- pulling data


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_every_rank_pulls_whole_arrays_and_slices_from_every_rank(comm, xp, path, dtype):
    r, p = comm.rank, comm.size
    got, want = [], []
    with comm.rendezvous() as rdv:
        rdv.publish("v", rank_data(r, size_of(r, p), dtype, xp))
        rdv.publish("empty", xp.empty(0, dtype))
        for owner in range(p):  # itself included
            got.append(rdv.pull("v", owner, xp=xp))
            want.append(expected(owner, p, dtype))
            got.append(rdv.pull("empty", owner, xp=xp))
            want.append(np.empty(0, dtype))
            for offset, count in slices(size_of(owner, p), p):
                got.append(rdv.pull("v", owner, offset, count, xp=xp))
                want.append(expected(owner, p, dtype, offset, count))
        as_numpy = rdv.pull("v", r)  # NumPy unless told otherwise
        keys = rdv.keys
    assert keys == ["empty", "v"]
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert isinstance(g, xp.ndarray) and g.dtype == w.dtype and g.shape == w.shape, i
        assert np.array_equal(host(g), w), i
    assert isinstance(as_numpy, np.ndarray) and np.array_equal(as_numpy, expected(r, p, dtype))


@pytest.mark.mpi
def test_ipull_many_at_once_then_waitall(comm, path):
    r, p = comm.rank, comm.size
    requests, want, outs = [], [], []
    rdv = comm.rendezvous()
    try:
        rdv.publish("v", rank_data(r, size_of(r, p), np.int64))
        rdv.publish("w", rank_data(r + p, 5, np.complex128))
        for owner in range(p):
            for offset, count in slices(size_of(owner, p), p):
                requests.append(rdv.ipull("v", owner, offset, count))
                want.append((owner, expected(owner, p, np.int64, offset, count)))
            out = np.zeros(3, np.complex128)
            outs.append((len(requests), out))
            requests.append(rdv.ipull("w", owner, 2, out=out))
            want.append((owner, rank_data(owner + p, 5, np.complex128)[2:]))
        statuses = [MPI.Status() for _ in requests]
        mpicomm.Request.Waitall(requests, statuses)
        values = [q.wait() for q in requests]
        again = mpicomm.Request.waitall([rdv.ipull("w", owner) for owner in range(p)])
    finally:
        rdv.close()
    for i, (value, status, (owner, w)) in enumerate(zip(values, statuses, want)):
        assert status.Get_source() == owner, i
        assert status.Get_elements(mpi_datatype(w.dtype)) == w.size, i
        assert value.dtype == w.dtype and np.array_equal(value, w), i
    assert all(values[i] is out for i, out in outs)  # results delivered into the caller's out
    for owner, value in enumerate(again):
        assert np.array_equal(value, rank_data(owner + p, 5, np.complex128))


@pytest.mark.mpi
def test_pull_before_the_owner_publishes(comm):
    """Rank 0 publishes late; requests wait at rank 0 (its own included) and are answered on publish."""
    r = comm.rank
    rdv = comm.rendezvous()
    try:
        comm.Barrier()
        requests = [rdv.ipull("late", 0), rdv.ipull("late", 0, 2, 5), rdv.ipull("late", 0, 9)]
        keys_before = rdv.keys
        if r == 0:  # busy for 0.2 s, serving now and then: the requests wait at rank 0 until it publishes
            deadline = time.monotonic() + 0.2
            while time.monotonic() < deadline:
                rdv.progress()
                time.sleep(0.005)
            rdv.publish("late", rank_data(0, 9, np.float32))
        results = [within(q) for q in requests]
        comm.Barrier()  # answered on publish, not at close: everyone has its data before anyone closes
    finally:
        rdv.close()
    assert keys_before == []
    assert not any(v is TIMED_OUT for v in results), "a pull waiting for the late publish was never answered"
    assert np.array_equal(results[0], rank_data(0, 9, np.float32))
    assert np.array_equal(results[1], rank_data(0, 9, np.float32)[2:7])
    assert results[2].shape == (0,) and results[2].dtype == np.float32


@pytest.mark.mpi(min_size=2)
def test_two_ranks_pulling_from_each_other_serve_each_other(comm, path):
    """Pairs (0,1), (2,3)... pull large arrays from each other at once (an odd last rank pulls its own)."""
    r, p = comm.rank, comm.size
    partner = r ^ 1 if (r ^ 1) < p else r
    n = 300_000  # 2.4 MB: beyond any eager limit, so the answer needs the puller to receive
    rdv = comm.rendezvous()
    try:
        rdv.publish("big", rank_data(r, n, np.float64))
        comm.Barrier()
        whole = rdv.pull("big", partner)
        tail = rdv.pull("big", partner, n - 1000)
        comm.Barrier()
        ring = [rdv.ipull("big", (r - 1) % p, 7, 100_000), rdv.ipull("big", (r + 1) % p)]
        ring_values = [within(q) for q in ring]
    finally:
        rdv.close()
    full = rank_data(partner, n, np.float64)
    assert np.array_equal(whole, full)
    assert np.array_equal(tail, full[n - 1000 :])
    assert np.array_equal(ring_values[0], rank_data((r - 1) % p, n, np.float64)[7:100_007])
    assert np.array_equal(ring_values[1], rank_data((r + 1) % p, n, np.float64))


@pytest.mark.mpi
def test_pull_into_a_matching_out(comm, path):
    r, p = comm.rank, comm.size
    rdv = comm.rendezvous()
    try:
        rdv.publish("v", rank_data(r, 12, np.int64))
        checks = []
        for owner in range(p):
            out = np.full(12, -1, np.int64)
            checks.append((rdv.pull("v", owner, out=out) is out, out, rank_data(owner, 12, np.int64)))
            grid = np.full((2, 2), -1, np.int64)  # a slice into any array with the right number of elements
            same = rdv.pull("v", owner, 3, 4, out=grid) is grid
            checks.append((same, grid.reshape(-1), rank_data(owner, 12, np.int64)[3:7]))
            empty = np.empty(0, np.int64)
            checks.append((rdv.pull("v", owner, 12, out=empty) is empty, empty, np.empty(0, np.int64)))
    finally:
        rdv.close()
    for i, (same, value, want) in enumerate(checks):
        assert same, f"pull {i} did not return out itself"
        assert np.array_equal(value, want), i


@pytest.mark.mpi
def test_pull_into_a_mismatching_out_raises_and_the_rendezvous_stays_usable(comm):
    r, p = comm.rank, comm.size
    owner = (r + 1) % p
    rdv = comm.rendezvous()
    try:
        rdv.publish("v", rank_data(r, 12, np.int64))
        text = f"pull: the message from rank {owner} (tag 0) holds int64 of shape (12,) (12 elements) but buf is float"
        with pytest.raises(ValueError, match=re.escape(text)):
            rdv.pull("v", owner, out=np.zeros(12, np.float64))
        with pytest.raises(ValueError, match=r"of shape \(4,\) \(4 elements\) but buf is int64 of shape \(5,\)"):
            rdv.pull("v", owner, 2, 4, out=np.zeros(5, np.int64))
        failed = rdv.ipull("v", owner, 0, 0, out=np.zeros(1, np.int64))
        with pytest.raises(ValueError, match=r"holds int64 of shape \(0,\)"):
            failed.wait()
        # checked before anything is sent
        with pytest.raises(ValueError, match="out is not C-contiguous"):
            rdv.pull("v", owner, out=np.zeros(24, np.int64)[::2])
        readonly = np.zeros(12, np.int64)
        readonly.flags.writeable = False
        with pytest.raises(ValueError, match="out is read-only"):
            rdv.ipull("v", owner, out=readonly)
        with pytest.raises(TypeError, match=r"out must\ be\ an\ array\ or\ a\ buffer\ \(NumPy,\ CuPy,\ DLPack,\ __cuda_array_interface__,\ bytearray\.\.\.\),\ got\ list"):
            rdv.pull("v", owner, out=[0] * 12)
        # still usable: the payloads were drained, and the next answers match their pulls
        after = [rdv.pull("v", owner, 5, 2), rdv.pull("v", owner, out=np.zeros(12, np.int64))]
    finally:
        rdv.close()  # the errors above were caught: closing must not raise them again
    assert np.array_equal(after[0], rank_data(owner, 12, np.int64)[5:7])
    assert np.array_equal(after[1], rank_data(owner, 12, np.int64))


# ---------------------------------------------------------------- errors from the owner


@pytest.mark.mpi(min_size=2)
def test_never_published_key_raises_remote_error_once_the_owner_closes(comm):
    r = comm.rank
    rdv = comm.rendezvous()
    if r == 0:
        rdv.publish("real", rank_data(0, 4, np.int64))
        rdv.close()  # answers the pending request for "ghost" with an error, then waits for everyone
        return
    try:
        real = rdv.pull("real", 0)
        text = "rank 0 answered with an error: rank 0 never published 'ghost' (it offers: 'real')"
        with pytest.raises(mpicomm.RemoteError, match=re.escape(text)):
            within(rdv.ipull("ghost", 0))  # what pull("ghost", 0) waits for, with a deadline
    finally:
        rdv.close()  # the puller caught the error; its close must not raise it again
    assert np.array_equal(real, rank_data(0, 4, np.int64))


@pytest.mark.mpi
def test_range_outside_the_owner_array_raises_remote_error(comm):
    r, p = comm.rank, comm.size
    owner = (r + 1) % p  # itself on one rank
    n = size_of(owner, p)
    rdv = comm.rendezvous()
    try:
        rdv.publish("v", rank_data(r, size_of(r, p), np.int64))
        for offset, count in ((max(n - 1, 0), 2), (n + 1, 0), (0, n + 1), (n, 1)):
            text = f"'v' on rank {owner} has {n} elements; asked for [{offset}, {offset + count})"
            with pytest.raises(mpicomm.RemoteError, match=re.escape(text)):
                rdv.pull("v", owner, offset, count)
        after = rdv.pull("v", owner)  # the owner still serves
    finally:
        rdv.close()  # the errors above were caught: closing must not raise them again
    assert np.array_equal(after, expected(owner, p, np.int64))


@pytest.mark.mpi
def test_offset_past_the_end_without_count_raises_remote_error(comm):
    """count omitted and offset > size: the owner must answer with an error (not die serving it)."""
    r, p = comm.rank, comm.size
    owner = (r + 1) % p
    rdv = comm.rendezvous()
    outcome = None
    try:
        rdv.publish("v", rank_data(r, 4, np.int64))
        try:
            outcome = within(rdv.ipull("v", owner, 6), seconds=2.0)
        except mpicomm.RemoteError as exc:
            outcome = exc
        answered = None if outcome is TIMED_OUT else within(rdv.ipull("v", owner, 1), seconds=2.0)  # still serving
    finally:
        rdv.close()
    assert outcome is not TIMED_OUT, f"rank {owner} never answered a pull of [6, end) of its 4 elements"
    assert isinstance(outcome, mpicomm.RemoteError) and f"'v' on rank {owner} has 4 elements" in str(outcome)
    assert answered is not TIMED_OUT and np.array_equal(answered, rank_data(owner, 4, np.int64)[1:])


# ---------------------------------------------------------------- local argument checks


@pytest.mark.mpi
def test_bad_arguments_raise_locally(comm):
    r, p = comm.rank, comm.size
    other = (r + 1) % p  # another rank where there is one
    rdv = comm.rendezvous()
    try:
        rdv.publish("v", rank_data(r, 4, np.int64))
        for pull in (rdv.ipull, rdv.pull) if other != r else (rdv.ipull,):
            with pytest.raises(TypeError, match="key must be a str, got int"):
                pull(42, other)
            with pytest.raises(TypeError, match="key must be a str, got bytes"):
                pull(b"v", other)
            with pytest.raises(ValueError, match="is 1025 bytes in UTF-8; keys are at most 1024"):
                pull("k" * 1025, other)
            with pytest.raises(ValueError, match="is 1026 bytes in UTF-8; keys are at most 1024"):
                pull("é" * 513, other)  # 513 characters, 1026 bytes
        for pull in (rdv.ipull, rdv.pull):
            with pytest.raises(ValueError, match="owner=MPI.PROC_NULL: a pull needs a real rank to answer it"):
                pull("v", MPI.PROC_NULL)
            with pytest.raises(ValueError, match=f"owner={p} is not a rank of this communicator of size {p}"):
                pull("v", p)
            with pytest.raises(ValueError, match="owner=-5 is not a rank"):
                pull("v", -5)
            with pytest.raises(ValueError, match=f"owner={MPI.ANY_SOURCE} is not a rank"):
                pull("v", MPI.ANY_SOURCE)  # a pull names its owner
            with pytest.raises(TypeError, match="owner must be an integer, got 1.0"):
                pull("v", 1.0)
            with pytest.raises(ValueError, match=r"offset=-1, count=(None|-1): both must be >= 0"):
                pull("v", r, -1)
            with pytest.raises(ValueError, match=re.escape("offset=0, count=-2: both must be >= 0")):
                pull("v", r, 0, -2)
            with pytest.raises(TypeError, match="offset must be an integer, got 0.5"):
                pull("v", r, 0.5)
            with pytest.raises(TypeError, match="count must be an integer, got True"):
                pull("v", r, 0, True)
        with pytest.raises(TypeError, match="key must be a str, got NoneType"):
            rdv.publish(None, np.zeros(1))
        with pytest.raises(ValueError, match="keys are at most 1024"):
            rdv.publish("k" * 1025, np.zeros(1))
        with pytest.raises(TypeError, match=r"array must\ be\ an\ array\ or\ a\ buffer\ \(NumPy,\ CuPy,\ DLPack,\ __cuda_array_interface__,\ bytearray\.\.\.\),\ got\ list"):
            rdv.publish("list", [1, 2])
        with pytest.raises(ValueError, match="array is not C-contiguous"):
            rdv.publish("strided", np.zeros(4)[::2])
        with pytest.raises(TypeError, match="array has dtype object, which mpicomm does not move"):
            rdv.publish("objects", np.zeros(2, object))
        keys = rdv.keys
        still = rdv.pull("v", other, 1, 2)
    finally:
        rdv.close()  # nothing was sent by the failed calls, so nothing is left to answer
    assert keys == ["v"]
    assert np.array_equal(still, rank_data(other, 4, np.int64)[1:3])


@pytest.mark.mpi
def test_pull_from_itself_checks_the_key_before_looking_it_up(comm):
    """A bad key is a TypeError/ValueError whoever the owner is - not the KeyError of an unpublished key."""
    r = comm.rank
    rdv = comm.rendezvous()
    try:
        with pytest.raises(TypeError, match="key must be a str, got int"):
            rdv.pull(42, r)
        with pytest.raises(ValueError, match="keys are at most 1024"):
            rdv.pull("k" * 1025, r)
    finally:
        rdv.close()


@pytest.mark.mpi
def test_count_minus_one_is_rejected_not_read_as_to_the_end(comm):
    """None means "to the end"; an explicit negative count is an error (the message says both must be >= 0)."""
    r, p = comm.rank, comm.size
    rdv = comm.rendezvous()
    try:
        rdv.publish("v", rank_data(r, 6, np.int64))
        with pytest.raises(ValueError, match=re.escape("offset=2, count=-1: both must be >= 0")):
            rdv.pull("v", (r + 1) % p, 2, -1)
    finally:
        rdv.close()


@pytest.mark.mpi
def test_pull_from_itself_of_an_unpublished_key_raises_key_error(comm):
    r = comm.rank
    rdv = comm.rendezvous()
    try:
        with pytest.raises(KeyError, match=f"rank {r} pulls 'never' from itself but has not published it"):
            rdv.pull("never", r)
        rdv.publish("gone", rank_data(r, 3, np.float32))
        first = rdv.pull("gone", r)
        rdv.unpublish("gone")
        rdv.unpublish("not there either")  # unpublishing an unknown key is a no-op
        keys = rdv.keys
        with pytest.raises(KeyError, match=f"rank {r} pulls 'gone' from itself"):
            rdv.pull("gone", r)
    finally:
        rdv.close()
    assert keys == []
    assert np.array_equal(first, rank_data(r, 3, np.float32))


@pytest.mark.mpi
def test_publish_and_pull_after_close_raise_runtime_error(comm):
    r, p = comm.rank, comm.size
    rdv = comm.rendezvous()
    rdv.publish("v", rank_data(r, 3, np.int64))
    rdv.close()
    rdv.close()  # a second close is a no-op (and not collective)
    with pytest.raises(RuntimeError, match=re.escape("publish('w') after close(); publish before closing")):
        rdv.publish("w", rank_data(r, 3, np.int64))
    with pytest.raises(RuntimeError, match=re.escape("pull after close(); pull before closing")):
        rdv.pull("v", (r + 1) % p)
    with pytest.raises(RuntimeError, match="pull after close"):
        rdv.ipull("v", r, 1, 1)
    with pytest.raises(RuntimeError, match="pull after close"):
        rdv.pull("v", r)  # its own published key


# ---------------------------------------------------------------- shapes


@pytest.mark.mpi
def test_slices_of_multidimensional_arrays_come_back_flat(comm, path):
    r, p = comm.rank, comm.size
    shape = (2, 3, r + 1)
    rdv = comm.rendezvous()
    try:
        rdv.publish("m", rank_data(r, 6 * (r + 1), np.int64).reshape(shape))
        got = [(o, rdv.pull("m", o, 1, 5), rdv.pull("m", o, 4)) for o in range(p)]
    finally:
        rdv.close()
    for owner, middle, tail in got:
        flat = rank_data(owner, 6 * (owner + 1), np.int64)
        assert middle.shape == (5,) and np.array_equal(middle, flat[1:6])
        assert tail.shape == (flat.size - 4,) and np.array_equal(tail, flat[4:])


@pytest.mark.mpi
def test_multidimensional_arrays_keep_their_shape_when_pulled_whole(comm):
    r, p = comm.rank, comm.size
    rdv = comm.rendezvous()
    try:
        rdv.publish("m", rank_data(r, 6 * (r + 1), np.float32).reshape(2, 3, r + 1))
        rdv.publish("scalar", np.array(r + 0.5))
        got = [(o, rdv.pull("m", o), rdv.pull("scalar", o)) for o in range(p)]
    finally:
        rdv.close()
    for owner, whole, scalar in got:
        assert whole.shape == (2, 3, owner + 1), f"pulled {owner}'s (2, 3, {owner + 1}) array whole, got {whole.shape}"
        assert np.array_equal(whole, rank_data(owner, 6 * (owner + 1), np.float32).reshape(2, 3, owner + 1))
        assert scalar.shape == () and scalar == owner + 0.5


# ---------------------------------------------------------------- keys, republishing, closing


@pytest.mark.mpi
def test_unusual_keys_and_the_longest_key(comm):
    r, p = comm.rank, comm.size
    keys = ["", "κλειδί/γ", "é" * 512, "k" * 1024]  # the last two are exactly MAX_KEY_BYTES in UTF-8
    assert all(len(k.encode()) <= mpicomm.Rendezvous.MAX_KEY_BYTES for k in keys)
    with comm.rendezvous() as rdv:
        for i, key in enumerate(keys):
            rdv.publish(key, rank_data(r, 2 + i, np.int64))
        got = [[rdv.pull(key, o) for key in keys] for o in range(p)]
        offered = rdv.keys
    assert offered == sorted(keys)
    for owner in range(p):
        for i, value in enumerate(got[owner]):
            assert np.array_equal(value, rank_data(owner, 2 + i, np.int64)), (owner, i)


@pytest.mark.mpi
def test_republishing_a_key_serves_the_new_array(comm):
    r, p = comm.rank, comm.size
    rdv = comm.rendezvous()
    try:
        rdv.publish("v", rank_data(r, 4, np.int64))
        first = [rdv.pull("v", o) for o in range(p)]
        comm.Barrier()  # every first pull has been answered
        rdv.unpublish("v")
        rdv.publish("v", rank_data(r + p, 6, np.int64))
        comm.Barrier()
        second = [rdv.pull("v", o) for o in range(p)]
    finally:
        rdv.close()
    for o in range(p):
        assert np.array_equal(first[o], rank_data(o, 4, np.int64))
        assert np.array_equal(second[o], rank_data(o + p, 6, np.int64))


@pytest.mark.mpi
def test_close_is_collective_and_serves_until_everyone_is_done(comm):
    """Rank 0 closes at once; the others pull from it (and from each other) afterwards, and get their data."""
    r, p = comm.rank, comm.size
    rdv = comm.rendezvous()
    try:
        rdv.publish("v", rank_data(r, 5, np.complex128))
        got = []
        if r != 0:
            time.sleep(0.1)  # rank 0 is inside close() by now
            got = [within(rdv.ipull("v", o)) for o in range(p)]
    finally:
        rdv.close()
    if r != 0:
        for o in range(p):
            assert got[o] is not TIMED_OUT, f"no answer from rank {o}"
            assert np.array_equal(got[o], rank_data(o, 5, np.complex128))


@pytest.mark.mpi
def test_pulled_arrays_are_not_kept_alive_by_the_rendezvous(comm):
    """Memory does not grow with the number of pulls: arrays the caller dropped are freed before close().

    (The most recent pull is allowed to linger, for an implementation that tidies up on the next call.)
    """
    r, p = comm.rank, comm.size
    rdv = comm.rendezvous()
    try:
        rdv.publish("v", rank_data(r, 1000, np.float64))
        refs, values_ok = [], []
        for i in range(6):
            owner = (r + i) % p
            full = rank_data(owner, 1000, np.float64)
            if i % 2 == 0:
                got, want = rdv.pull("v", owner), full
            else:
                got, want = rdv.ipull("v", owner, 10, 20).wait(), full[10:30]
            values_ok.append(np.array_equal(got, want))
            refs.append(weakref.ref(got))
            del got
        gc.collect()
        alive = [i for i, ref in enumerate(refs[:-1]) if ref() is not None]
        comm.Barrier()
    finally:
        rdv.close()
    assert values_ok == [True] * 6
    assert alive == [], f"the rendezvous still references the arrays of pulls {alive} (of 0..5), dropped by the caller"


@pytest.mark.mpi
def test_rendezvous_is_exported(comm):
    with comm.rendezvous() as rdv:
        assert isinstance(rdv, mpicomm.Rendezvous)
        assert rdv.progress() >= 0


_UNANSWERED_AT_CLOSE = textwrap.dedent(
    """
    import mpicomm
    comm = mpicomm.Comm()
    rdv = comm.rendezvous()
    # keys nobody ever publishes: one from this rank itself, one from the next rank (each rank has both)
    requests = {"ghost-self": rdv.ipull("ghost-self", comm.rank),
                "ghost-next": rdv.ipull("ghost-next", (comm.rank + 1) % comm.size)}
    try:
        rdv.close()
    except mpicomm.RemoteError:
        pass  # close may report a failed pull that nobody waited for
    for key, request in requests.items():
        try:
            request.wait()
            print(f"rank {comm.rank} {key}: no error", flush=True)
        except mpicomm.RemoteError as exc:
            print(f"rank {comm.rank} {key}: RemoteError: {exc}", flush=True)
    """
)


@pytest.mark.launches
def test_close_answers_unpublished_pulls_even_when_every_rank_waits_for_one():
    """Two ranks each ipull a key from itself and one from the other that nobody publishes, then close.

    close() promises that "requests for keys an owner never published are answered with an error then,
    so nobody waits forever" - also when every rank is itself waiting for such an answer. Runs as its
    own 2-rank job, so that a deadlock costs this test its time limit, not the whole test run.
    """
    result = mpirun.run(2, [sys.executable, "-c", _UNANSWERED_AT_CLOSE], timeout=15)
    assert not result.timed_out and result.returncode == 0, (
        f"close() did not return within 15 s (rc {result.returncode}): {result.stdout[-2000:]}{result.stderr[-2000:]}"
    )
    for rank in (0, 1):
        for key, owner in (("ghost-self", rank), ("ghost-next", 1 - rank)):
            assert f"rank {rank} {key}: RemoteError: rank {owner} answered with an error: " in result.stdout
            assert f"rank {owner} never published '{key}'" in result.stdout


@pytest.mark.mpi(min_size=2)
def test_unpublish_waits_for_answers_in_flight(comm):
    """After unpublish returns, the owner may overwrite the array: pullers still get the old values."""
    n = 400_000  # a two-part answer: it leaves only when the puller posts its receive
    with comm.rendezvous() as rdv:
        if comm.rank == 0:
            data = rank_data(0, n)
            rdv.publish("big", data)
            comm.Barrier()  # pullers ask after this
            deadline = time.monotonic() + 30
            while rdv.served["big"] < comm.size - 1 and time.monotonic() < deadline:
                rdv.progress()  # take every request in (the answers' payloads wait for the pullers)
            assert rdv.served["big"] == comm.size - 1
            rdv.unpublish("big")
            data[:] = -1
        else:
            comm.Barrier()
            r = rdv.ipull("big", 0)
            time.sleep(0.1)  # the owner unpublishes while this answer is still on its way
            assert np.array_equal(r.wait(), rank_data(0, n))
