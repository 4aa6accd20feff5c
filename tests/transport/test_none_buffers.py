"""``None`` as a buffer: mpi4py's empty buffer (``[None, MPI.INT]``, ``[None, 0, MPI.INT]``).

Zero elements of the datatype, in point-to-point and collective calls alike; asking a None buffer
for elements (``[None, 3, MPI.INT]``) is an error that says so. A bare None (no datatype) is still
``MPI.IN_PLACE`` where a collective allows it, and otherwise an error naming the missing datatype.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

from mpicomm.transport.specs import block, simple, vector

from ..coll.reference import assert_matches, data, expect_everywhere

WORLD = MPI.COMM_WORLD
NONE = [None, MPI.INT]


# ---------------------------------------------------------------- specs (no communication)


@pytest.mark.parametrize("spec", [[None, MPI.INT], (None, MPI.INT), [None, 0, MPI.INT], [None, "i"]],
                         ids=["[None, INT]", "(None, INT)", "[None, 0, INT]", "[None, 'i']"])
def test_none_with_a_datatype_is_an_empty_buffer_of_it(spec):
    b = simple(spec, "sendbuf")
    assert b.xp is np and b.count == 0 and b.dtype == np.int32 and b.array.flags.writeable
    assert block(spec, "recvbuf", 3)[1] == 0
    v = vector(spec, "recvbuf", 3)
    assert v.count == 0 and v.counts == (0, 0, 0) and v.displs == (0, 0, 0)
    v = vector([None, [0, 0], [0, 0], MPI.DOUBLE], "recvbuf", 2)
    assert v.dtype == np.float64 and v.counts == (0, 0)


def test_a_none_buffer_asked_for_elements_says_so():
    with pytest.raises(ValueError, match=r"recvbuf is None, an empty buffer, but its count is 3"):
        simple([None, 3, MPI.INT], "recvbuf")
    with pytest.raises(ValueError, match=r"recvbuf is None, an empty buffer, but its count is 4"):
        block([None, 2, MPI.INT], "recvbuf", 2)
    with pytest.raises(ValueError, match=r"recvbuf is None, an empty buffer, but its count is 1"):
        vector([None, [0, 1], [0, 0], MPI.INT], "recvbuf", 2)
    with pytest.raises(ValueError, match=r"recvbuf is None, an empty buffer, but its count is 2"):
        vector([None, 1, MPI.INT], "recvbuf", 2)


def test_none_without_a_datatype_names_what_is_missing():
    for read in (lambda: simple([None, 0], "sendbuf"), lambda: block([None, 0], "sendbuf", 2),
                 lambda: vector([None, [0, 0]], "sendbuf", 2)):
        with pytest.raises(TypeError, match=r"sendbuf is None with no datatype.*\[None, MPI.INT\]"):
            read()
    with pytest.raises(TypeError, match="got NoneType"):  # a bare None is not a buffer spec at all
        simple(None, "sendbuf")


# ---------------------------------------------------------------- point-to-point


@pytest.mark.mpi
def test_zero_size_messages_with_none_buffers(comm):
    rank, p = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % p, (rank - 1) % p
    status = MPI.Status()
    comm.Sendrecv(NONE, right, 1, recvbuf=[None, 0, MPI.INT], source=left, recvtag=1, status=status)
    assert status.Get_count(MPI.INT) == 0 and status.Get_source() == left
    request = comm.Irecv([None, 0, MPI.INT], left, 2)
    comm.Send([None, MPI.INT], right, 2)
    request.Wait(status)
    assert status.Get_count(MPI.INT) == 0
    with pytest.raises(ValueError, match="None"):
        comm.Send([None, 3, MPI.INT], right, 3)


# ---------------------------------------------------------------- collectives


def _calls(comm: Any, spec: Callable[[], Any], p: int) -> dict[str, Callable[[], Any]]:
    """Every collective with zero-element None buffers (a fresh spec per argument)."""
    root = p - 1
    zeros = [0] * p
    return {
        "bcast": lambda: comm.Bcast(spec(), root),
        "reduce": lambda: comm.Reduce(spec(), spec(), MPI.SUM, root),
        "allreduce": lambda: comm.Allreduce(spec(), spec()),
        "gather": lambda: comm.Gather(spec(), spec(), root),
        "gatherv": lambda: comm.Gatherv(spec(), [None, zeros, zeros, MPI.INT], root),
        "scatter": lambda: comm.Scatter(spec(), spec(), root),
        "scatterv": lambda: comm.Scatterv([None, (zeros, zeros), MPI.INT], spec(), root),
        "allgather": lambda: comm.Allgather(spec(), spec()),
        "allgatherv": lambda: comm.Allgatherv(spec(), [None, zeros, MPI.INT]),
        "alltoall": lambda: comm.Alltoall(spec(), spec()),
        "alltoallv": lambda: comm.Alltoallv([None, zeros, zeros, MPI.INT], spec()),
        "reduce_scatter_block": lambda: comm.Reduce_scatter_block(spec(), spec()),
        "reduce_scatter": lambda: comm.Reduce_scatter(spec(), spec(), zeros),
        "scan": lambda: comm.Scan(spec(), spec()),
        "exscan": lambda: comm.Exscan(spec(), spec()),
        "iallreduce": lambda: comm.Iallreduce(spec(), spec()).wait(),
        "allreduce_init": lambda: _start_twice(comm.Allreduce_init(spec(), spec())),
    }


def _start_twice(request: Any) -> None:
    for _ in range(2):
        request.Start()
        request.Wait()
    request.Free()


COLLECTIVES = sorted(_calls(None, list, 1))


@pytest.mark.mpi
@pytest.mark.parametrize("collective", COLLECTIVES)
@pytest.mark.parametrize("form", ["[None, INT]", "[None, 0, INT]"])
def test_every_collective_takes_none_as_an_empty_buffer(comm, collective, form):
    spec = (lambda: [None, MPI.INT]) if form == "[None, INT]" else (lambda: [None, 0, MPI.INT])
    _calls(comm, spec, comm.Get_size())[collective]()
    x = data(comm.Get_rank(), 3, np.int32)  # the communicator goes on as before
    out, expected = np.empty_like(x), np.empty_like(x)
    comm.Allreduce(x, out)
    WORLD.Allreduce(x, expected)
    assert_matches(out, expected, f"allreduce after a zero-size {collective}")


@pytest.mark.mpi
def test_none_and_an_empty_array_meet_in_one_collective(comm):
    comm.Allreduce(np.empty(0, np.int32), [None, MPI.INT])
    comm.Allreduce([None, 0, MPI.INT], np.empty(0, np.int32))
    comm.Allgather([None, MPI.INT], np.empty(0, np.int32))


@pytest.mark.mpi
def test_a_none_buffer_with_a_count_is_refused_everywhere(comm):
    expect_everywhere(comm, lambda: comm.Allreduce(np.zeros(3, np.int32), [None, 3, MPI.INT]),
                      "recvbuf is None, an empty buffer, but its count is 3")
    expect_everywhere(comm, lambda: comm.Bcast([None, 3, MPI.INT], 0),
                      "buf is None, an empty buffer, but its count is 3")
    expect_everywhere(comm, lambda: comm.Allgather([None, 1, MPI.INT], np.zeros(comm.Get_size(), np.int32)),
                      "sendbuf is None, an empty buffer, but its count is 1")
    expect_everywhere(comm, lambda: comm.Allreduce([None, 0], [None, 0]), "is None with no datatype")
