"""Bad collective arguments: the same ArgumentError on every rank, never a hang, and the communicator still works.

Each case gives every rank its (possibly wrong) arguments to one collective.
With validation on (the default), the ranks agree before any data moves: a
local problem on one rank, or a disagreement between ranks, raises
:class:`mpicomm.ArgumentError` (a ValueError and a TypeError) on every rank,
naming the problem. ``MPICOMM_VALIDATE=0`` raises the local exception instead
(only tried where every rank has it). Specs mpicomm does not run itself go to
the MPI library.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from mpicomm import registry
from mpicomm.catalogue import REDUCING

from . import reference
from .reference import body, expect_everywhere, outcome, still_works

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(120)]

P = MPI.COMM_WORLD.Get_size()


def data(rank: int, n: int, dtype=np.float64) -> np.ndarray:
    return reference.data(rank, n, dtype)


# ---------------------------------------------------------------- the cases

#: name → (minimum p, function(comm) returning (call, message fragments))
CASES: dict[str, tuple[int, Callable]] = {}


def case(name: str, min_p: int = 1) -> Callable:
    def register(fn: Callable) -> Callable:
        CASES[name] = (min_p, fn)
        return fn

    return register


@case("allreduce-count-mismatch", 2)
def _(c):
    x = data(c.rank, 5 if c.rank == 1 else 4)
    return (lambda: c.Allreduce(x, np.empty_like(x)),
            ["allreduce #", "ranks disagree on the count", "4 elements on rank(s) 0", "5 elements on rank(s) 1"])


@case("bcast-count-mismatch", 2)
def _(c):
    buf = data(c.rank, 3 + (c.rank == c.size - 1))
    return lambda: c.Bcast(buf, root=0), ["bcast #", "ranks disagree on the count", f"4 elements on rank(s) {c.size - 1}"]


@case("allgather-count-mismatch", 2)
def _(c):
    n = 3 if c.rank == 1 else 2
    x = data(c.rank, n)
    return (lambda: c.Allgather(x, np.empty(n * c.size)),
            ["allgather #", "ranks disagree on the count", "3 elements on rank(s) 1"])


@case("alltoall-count-mismatch", 2)
def _(c):
    n = 3 if c.rank == 1 else 2
    x = data(c.rank, n * c.size)
    return lambda: c.Alltoall(x, np.empty_like(x)), ["alltoall #", "ranks disagree on the count", "3 elements on rank(s) 1"]


@case("reduce_scatter_block-count-mismatch", 2)
def _(c):
    n = 3 if c.rank == 1 else 2
    x = data(c.rank, n * c.size)
    return (lambda: c.Reduce_scatter_block(x, np.empty(n)),
            ["reduce_scatter_block #", "ranks disagree on the count", "3 elements on rank(s) 1"])


@case("dtype-mismatch", 2)
def _(c):
    x = data(c.rank, 4, np.float32 if c.rank == 1 else np.float64)
    return (lambda: c.Allreduce(x, np.empty_like(x)),
            ["ranks disagree on the element type", "float64 on rank(s) 0", "float32 on rank(s) 1"])


@case("op-mismatch", 2)
def _(c):
    x = data(c.rank, 4)
    op = MPI.MAX if c.rank == 0 else "sum"
    return lambda: c.Allreduce(x, np.empty_like(x), op), ["ranks disagree on the op", "max on rank(s) 0", "sum on rank(s) 1"]


@case("op-commutativity-mismatch", 2)
def _(c):
    x = data(c.rank, 4)
    op = mpicomm.ops.create(lambda a, b: a + b, commutative=c.rank == 0, name="plus")
    return (lambda: c.Allreduce(x, np.empty_like(x), op),
            ["ranks disagree on the op's commutativity", "commutative on rank(s) 0", "non-commutative on rank(s) 1"])


@case("root-mismatch-bcast", 2)
def _(c):
    buf = data(c.rank, 4)
    root = 0 if c.rank == 0 else c.size - 1
    return lambda: c.Bcast(buf, root), ["ranks disagree on the root", "root 0 on rank(s) 0", f"root {c.size - 1} on rank(s) 1"]


@case("root-mismatch-reduce", 2)
def _(c):
    x = data(c.rank, 4)
    root = 1 if c.rank == 1 else 0
    return (lambda: c.Reduce(x, np.empty_like(x), MPI.SUM, root),
            ["reduce #", "ranks disagree on the root", "root 1 on rank(s) 1"])


@case("root-out-of-range-on-one-rank")
def _(c):
    buf = data(c.rank, 4)
    root = c.size if c.rank == 0 else 0
    return (lambda: c.Bcast(buf, root),
            [f"rank 0: root={c.size} is not a rank of this communicator of size {c.size}; use 0..{c.size - 1}"])


@case("root-out-of-range-on-all-ranks")
def _(c):
    x = data(c.rank, 4)
    return lambda: c.Reduce(x, np.empty_like(x), MPI.SUM, c.size + 3), [f"root={c.size + 3} is not a rank", "rank 0: "]


@case("root-negative")
def _(c):
    x = data(c.rank, 4)
    return lambda: c.Gather(x, np.empty(4 * c.size), -7), ["root=-7 is not a rank"]


@case("root-proc-null")
def _(c):
    buf = data(c.rank, 4)
    return lambda: c.Bcast(buf, MPI.PROC_NULL), ["root=MPI.PROC_NULL is for intercommunicators"]


@case("root-is-a-float")
def _(c):
    buf = data(c.rank, 4)
    return lambda: c.Bcast(buf, 0.0), ["root must be an integer, got 0.0 (float)"]


@case("root-is-a-string")
def _(c):
    x = data(c.rank, 4)
    return lambda: c.Scatter(np.zeros(4 * c.size), x, "0"), ["root must be an integer, got '0'"]


@case("unknown-op-string")
def _(c):
    x = data(c.rank, 4)
    return lambda: c.Allreduce(x, np.empty_like(x), "summ"), ["unknown op 'summ'; use one of sum, prod"]


@case("unknown-op-on-one-rank")
def _(c):
    x = data(c.rank, 4)
    op = "avg" if c.rank == c.size - 1 else "sum"
    return lambda: c.Scan(x, np.empty_like(x), op), [f"rank {c.size - 1}: unknown op 'avg'"]


@case("bad-op-type")
def _(c):
    x = data(c.rank, 4)
    return (lambda: c.Allreduce(x, np.empty_like(x), 42),
            ["op must be a name ('sum'...), an MPI.Op, a ufunc or a callable, got 42"])


@case("op-for-one-sided-only")
def _(c):
    x = data(c.rank, 4)
    return lambda: c.Reduce(x, np.empty_like(x), MPI.REPLACE), ["one-sided accumulate only"]


@case("band-on-float")
def _(c):
    x = data(c.rank, 4)
    return (lambda: c.Allreduce(x, np.empty_like(x), "band"),
            ["op band is not defined on dtype float64; it takes bool, signed integers, unsigned integers"])


@case("maxloc-on-plain-values")
def _(c):
    x = data(c.rank, 4)
    return lambda: c.Allreduce(x, np.empty_like(x), MPI.MAXLOC), ["op maxloc reduces (value, index) pairs, not float64"]


@case("unknown-algorithm")
def _(c):
    x = data(c.rank, 4)
    registered = ", ".join(mpicomm.algorithms("allreduce"))
    return (lambda: c.Allreduce(x, np.empty_like(x), algorithm="tornado"),
            [f"unknown allreduce algorithm 'tornado'; registered: {registered} (or 'auto')"])


@case("unknown-algorithm-on-one-rank", 2)
def _(c):
    buf = data(c.rank, 4)
    algorithm = "tornado" if c.rank == 1 else "binomial"
    return lambda: c.Bcast(buf, 0, algorithm=algorithm), ["rank 1: unknown bcast algorithm 'tornado'; registered: "]


@case("different-algorithms", 2)
def _(c):
    buf = data(c.rank, 4)
    algorithm = "linear" if c.rank == 0 else "binomial"
    return (lambda: c.Bcast(buf, 0, algorithm=algorithm),
            ["ranks disagree on the algorithm", "'linear' on rank(s) 0", "'binomial' on rank(s) 1"])


@case("different-collectives", 2)
def _(c):
    x = data(c.rank, 4)
    call = (lambda: c.Bcast(x, 0)) if c.rank == 0 else (lambda: c.Allreduce(x, np.empty_like(x)))
    return call, ["ranks disagree on the collective", "bcast on rank(s) 0", "allreduce on rank(s) 1",
                  "every rank must call the same collectives in the same order"]


@case("non-contiguous-on-one-rank")
def _(c):
    x = data(c.rank, 8)
    send = x[::2] if c.rank == 0 else x[:4].copy()
    return lambda: c.Allreduce(send, np.empty(4)), ["rank 0: sendbuf is not C-contiguous (shape (4,), strides (16,))"]


@case("non-contiguous-2d-receive")
def _(c):
    x = data(c.rank, 4)
    recv = np.empty((4, 2))[:, 0] if c.rank == c.size - 1 else np.empty(4)
    return lambda: c.Allreduce(x, recv), [f"rank {c.size - 1}: recvbuf is not C-contiguous"]


@case("read-only-receive-buffer")
def _(c):
    x = data(c.rank, 4)
    recv = np.empty(4)
    recv.flags.writeable = c.rank != c.size - 1
    return lambda: c.Allreduce(x, recv), [f"rank {c.size - 1}: recvbuf is read-only; a receive buffer must be writable"]


@case("read-only-bcast-buffer-off-the-root", 2)
def _(c):
    buf = data(c.rank, 4)
    buf.flags.writeable = c.rank == 0  # only the root's may be read-only
    return lambda: c.Bcast(buf, 0), ["rank 1: buf is read-only"]


@case("send-recv-dtype-mismatch-on-one-rank")
def _(c):
    x = data(c.rank, 4)
    recv = np.empty(4, np.float32 if c.rank == 0 else np.float64)
    return (lambda: c.Allreduce(x, recv),
            ["rank 0: send and receive element types differ (float32 and float64)", ".astype()"])


@case("recv-too-small-on-one-rank")
def _(c):
    x = data(c.rank, 6)
    recv = np.empty(5 if c.rank == 0 else 6)
    return lambda: c.Allreduce(x, recv), ["rank 0: allreduce: send count 6 and receive count 5 differ"]


@case("gather-recv-too-small")
def _(c):
    x = data(c.rank, 3)
    recv = np.empty(3 * c.size - 1)
    return (lambda: c.Gather(x, [recv, 3], root=0),
            [f"rank 0: recvbuf holds {3 * c.size - 1} elements, fewer than {c.size} ranks × 3"])


@case("gatherv-counts-disagree-with-a-send", 2)
def _(c):
    last = c.size - 1
    x = data(c.rank, 3 if c.rank == last else 2)
    recv = [np.empty(2 * c.size), [2] * c.size] if c.rank == 0 else None
    return (lambda: c.Gatherv(x, recv, root=0),
            ["gatherv #", f"rank {last} sends 3 elements but the root's receive counts say 2"])


@case("scatterv-counts-disagree-with-a-receive", 2)
def _(c):
    recv = np.empty(2 if c.rank == 1 else 1)
    send = [np.zeros(c.size), [1] * c.size] if c.rank == 0 else None
    return lambda: c.Scatterv(send, recv, root=0), ["rank 1 receives 2 elements but the root's send counts say 1"]


@case("allgatherv-recvcounts-differ", 2)
def _(c):
    counts = [1] * c.size
    if c.rank == 1:
        counts[0] = 2
    x = data(c.rank, 1)
    return (lambda: c.Allgatherv(x, [np.empty(sum(counts)), counts]),
            ["allgatherv #", "rank 1's receive counts ", "differ from rank 0's "])


@case("alltoallv-count-matrix-mismatch", 2)
def _(c):
    sendcounts, recvcounts = [1] * c.size, [1] * c.size
    if c.rank == 0:
        sendcounts[1] = 2
    x = data(c.rank, sum(sendcounts))
    return (lambda: c.Alltoallv([x, sendcounts], [np.empty(sum(recvcounts)), recvcounts]),
            ["alltoallv #", "rank 0 sends 2 elements to rank 1, which expects 1"])


@case("reduce_scatter-recvcounts-differ", 2)
def _(c):
    counts = [1] * c.size
    if c.rank == 1:
        counts[0] = 2
    x = data(c.rank, sum(counts))
    return (lambda: c.Reduce_scatter(x, np.empty(counts[c.rank]), counts),
            ["reduce_scatter #", "rank 1's receive counts ", "differ from rank 0's "])


@case("reduce_scatter-sendbuf-vs-recvcounts")
def _(c):
    x = data(c.rank, c.size + 1)
    return (lambda: c.Reduce_scatter(x, np.empty(1), [1] * c.size),
            [f"reduce_scatter: sendbuf has {c.size + 1} elements but sum(recvcounts) = {c.size}"])


@case("reduce_scatter-recvcounts-length")
def _(c):
    x = data(c.rank, c.size + 1)
    return (lambda: c.Reduce_scatter(x, np.empty(1), [1] * (c.size + 1)),
            [f"recvcounts has {c.size + 1} entries for {c.size} ranks; give one per rank"])


@case("reduce_scatter-in-place-without-recvcounts")
def _(c):
    return (lambda: c.Reduce_scatter(MPI.IN_PLACE, data(c.rank, c.size)),
            ["reduce_scatter in place needs recvcounts"])


@case("reduce_scatter_block-sendbuf-size")
def _(c):
    x = data(c.rank, 2 * c.size + 1)
    return (lambda: c.Reduce_scatter_block(x, np.empty(2)),
            [f"sendbuf has {2 * c.size + 1} elements; it needs p × receive count = {c.size} × 2 = {2 * c.size}"])


@case("alltoall-send-recv-blocks-differ")
def _(c):
    x = data(c.rank, 2 * c.size)
    return lambda: c.Alltoall(x, np.empty(3 * c.size)), ["alltoall (per rank): send count 2 and receive count 3 differ"]


@case("scatter-sendbuf-not-divisible", 2)
def _(c):
    send = np.zeros(2 * c.size + 1) if c.rank == 0 else None
    return (lambda: c.Scatter(send, np.empty(2), root=0),
            [f"rank 0: sendbuf has {2 * c.size + 1} elements, not divisible among {c.size} ranks"])


@case("reduce-in-place-off-the-root", 2)
def _(c):
    x = data(c.rank, 4)
    send = MPI.IN_PLACE if c.rank == 1 else x
    return (lambda: c.Reduce(send, x.copy(), MPI.SUM, 0),
            ["rank 1: sendbuf is MPI.IN_PLACE on a rank that is not the root; only the root may reduce in place"])


@case("gather-in-place-off-the-root", 2)
def _(c):
    recv = np.empty(2 * c.size)
    send = MPI.IN_PLACE if c.rank != 0 else data(0, 2)
    return (lambda: c.Gather(send, recv, root=0),
            ["rank 1: sendbuf is MPI.IN_PLACE on a rank that is not the root; only the root gathers in place"])


@case("scatter-in-place-off-the-root", 2)
def _(c):
    recv = MPI.IN_PLACE if c.rank == c.size - 1 else np.empty(2)
    return (lambda: c.Scatter(np.zeros(2 * c.size), recv, root=0),
            [f"rank {c.size - 1}: recvbuf is MPI.IN_PLACE on a rank that is not the root"])


@case("list-as-buffer")
def _(c):
    return (lambda: c.Allreduce([1.0, 2.0, 3.0], np.empty(3)),
            ["sendbuf must be an array or a buffer (NumPy, CuPy, DLPack, __cuda_array_interface__, bytearray...), got float",
             "numpy.asarray(sendbuf)"])


@case("dict-as-buffer")
def _(c):
    x = data(c.rank, 3)
    recv = {"data": 0} if c.rank == 0 else np.empty(3)
    return lambda: c.Allreduce(x, recv), ["rank 0: recvbuf must be an array or a buffer", "got dict"]


@case("spec-with-too-many-items")
def _(c):
    x = data(c.rank, 3)
    return lambda: c.Bcast([x, 3, MPI.DOUBLE, 0], 0), ["buf spec must be buf, [buf, count], [buf, datatype]"]


@case("negative-count")
def _(c):
    x = data(c.rank, 3)
    return lambda: c.Allreduce([x, -1], np.empty(3)), ["sendbuf count is -1; counts are >= 0"]


@case("count-beyond-the-buffer")
def _(c):
    x = data(c.rank, 3)
    return lambda: c.Bcast([x, 4], 0), ["buf count 4 is more than the buffer's 3 elements of float64"]


@case("vspec-wrong-number-of-counts")
def _(c):
    x = data(c.rank, 1)
    recv = [np.empty(c.size + 1), [1] * (c.size + 1)] if c.rank == 0 else None
    return lambda: c.Gatherv(x, recv, 0), [f"rank 0: recvbuf has {c.size + 1} counts for {c.size} ranks; give one per rank"]


@case("vspec-wrong-number-of-displacements")
def _(c):
    x = data(c.rank, 1)
    return (lambda: c.Allgatherv(x, [np.empty(c.size), [1] * c.size, list(range(c.size + 1))]),
            [f"recvbuf has {c.size + 1} displacements for {c.size} ranks"])


@case("displacement-outside-the-buffer")
def _(c):
    p = c.size
    x = data(c.rank, 1)
    displs = list(range(p - 1)) + [p]  # the last block starts at the end
    return (lambda: c.Allgatherv(x, [np.empty(p), [1] * p, displs]),
            [f"recvbuf block of rank {p - 1} (elements [{p}, {p + 1})) lies outside the buffer's {p} elements"])


@case("unknown-datatype-code")
def _(c):
    x = data(c.rank, 3)
    return lambda: c.Allreduce([x, "zz"], np.empty(3)), ["datatype 'zz' is not a NumPy type code"]


@case("byte-count-not-whole-elements")
def _(c):
    return lambda: c.Bcast([bytearray(12), MPI.DOUBLE], 0), ["buf has 12 bytes, not a whole number of float64 elements"]


@pytest.mark.parametrize("name", list(CASES))
def test_bad_arguments_raise_on_every_rank(comm, name):
    min_p, make = CASES[name]
    if comm.Get_size() < min_p:
        pytest.skip(f"needs p >= {min_p}")
    call, fragments = make(comm)
    expect_everywhere(comm, call, *fragments)


@pytest.mark.skipif(P < 2, reason="needs p >= 2")
def test_count_lists_in_messages_read_as_plain_numbers(comm):
    counts = [1] * comm.Get_size()
    if comm.Get_rank() == 1:
        counts[0] = 2
    x = data(comm.Get_rank(), 1)
    expect_everywhere(comm, lambda: comm.Allgatherv(x, [np.empty(sum(counts)), counts]),
                      "rank 1's receive counts [2, 1", "differ from rank 0's [1, 1")


def test_there_are_enough_cases():
    assert len(CASES) >= 25


def test_argument_error_is_a_value_error_and_a_type_error(comm):
    assert issubclass(mpicomm.ArgumentError, ValueError) and issubclass(mpicomm.ArgumentError, TypeError)
    x = data(comm.Get_rank(), 2)
    for kind in (ValueError, TypeError, mpicomm.ArgumentError):
        with pytest.raises(kind):
            comm.Allreduce(x, np.empty(2), "no-such-op")
    still_works(comm)


@pytest.mark.skipif(P < 2, reason="needs p >= 2: with one rank every choice is its own")
def test_the_whole_message_is_the_same_on_every_rank_when_algorithms_differ(comm):
    buf = data(comm.Get_rank(), 4)
    algorithm = "linear" if comm.Get_rank() == 0 else "binomial"
    _, _, message = outcome(lambda: comm.Bcast(buf, 0, algorithm=algorithm))
    messages = MPI.COMM_WORLD.allgather(message)
    still_works(comm)
    assert len(set(messages)) == 1, messages


@pytest.mark.skipif(P < 2, reason="needs p >= 2")
def test_the_whole_message_is_the_same_on_every_rank(comm):
    x = data(comm.Get_rank(), 4 + (comm.Get_rank() == comm.Get_size() - 1))
    _, _, message = outcome(lambda: comm.Allreduce(x, np.empty_like(x), algorithm="recursive_doubling"))
    messages = MPI.COMM_WORLD.allgather(message)
    assert len(set(messages)) == 1, messages
    assert message.startswith("allreduce #") and "ranks disagree on the count" in message


def test_algorithm_from_the_environment_unknown(comm, monkeypatch):
    monkeypatch.setenv("MPICOMM_ALLREDUCE_ALGORITHM", "nope")
    x = data(comm.Get_rank(), 4)
    expect_everywhere(comm, lambda: comm.Allreduce(x, np.empty(4)),
                      "unknown allreduce algorithm 'nope'; registered: " + ", ".join(mpicomm.algorithms("allreduce")))


# ---------------------------------------------------------------- commutative-only algorithms and MATMUL


def _matmul_call(comm, collective: str, algorithm: str) -> Callable[[], Any]:
    rank, p = comm.Get_rank(), comm.Get_size()
    op = reference.MATMUL
    m = reference.matrices(rank, 2)
    if collective == "allreduce":
        return lambda: comm.Allreduce(m, np.empty_like(m), op, algorithm=algorithm)
    if collective == "reduce":
        return lambda: comm.Reduce(m, np.empty_like(m), op, p - 1, algorithm=algorithm)
    if collective in ("scan", "exscan"):
        method = comm.Scan if collective == "scan" else comm.Exscan
        return lambda: method(m, np.empty_like(m), op, algorithm=algorithm)
    big = reference.matrices(rank, 2 * p)
    if collective == "reduce_scatter_block":
        return lambda: comm.Reduce_scatter_block(big, np.empty(8, np.int64), op, algorithm=algorithm)
    return lambda: comm.Reduce_scatter(big, np.empty(8, np.int64), [8] * p, op, algorithm=algorithm)


def commutative_only() -> list[tuple[str, str]]:
    return [(c, a.name) for c, algorithms in sorted(registry.table().items()) if c in REDUCING
            for a in algorithms.values() if a.commutative_only]


@pytest.mark.parametrize("collective,algorithm", commutative_only(), ids=lambda v: v)
def test_commutative_only_algorithm_refuses_a_non_commutative_op(comm, collective, algorithm):
    keep = [n for n in mpicomm.algorithms(collective) if not registry.lookup(collective, n).commutative_only
            and (comm.nodes == 1 or not registry.lookup(collective, n).single_node)]  # those that can run here
    expect_everywhere(comm, _matmul_call(comm, collective, algorithm),
                      f"{collective} algorithm {algorithm!r} (from the call) reorders operands and needs a commutative op",
                      "op matmul2x2 is not commutative", "use one that keeps rank order: " + ", ".join(keep))


def test_commutative_only_default_of_the_communicator_refuses_matmul(comm):
    names = [a for c, a in commutative_only() if c == "allreduce"]
    if not names:
        pytest.skip("no commutative-only allreduce algorithm is registered")
    m = reference.matrices(comm.Get_rank(), 300)
    comm.set_algorithm("allreduce", names[0])
    try:
        for algorithm in (None, "auto"):  # "auto" on the call defers to the communicator's default
            expect_everywhere(comm, lambda a=algorithm: comm.Allreduce(m, np.empty_like(m), reference.MATMUL, algorithm=a),
                              f"allreduce algorithm {names[0]!r} (from the communicator) reorders operands")
    finally:
        comm.set_algorithm("allreduce", None)
    expected = np.empty_like(m)
    reference.native().Allreduce(m, expected, op=reference.native_matmul())
    out = np.empty_like(m)
    comm.Allreduce(m, out, reference.MATMUL)  # the table's choice keeps rank order
    reference.assert_matches(out, expected, "allreduce matmul, auto")


# ---------------------------------------------------------------- nonblocking: the error comes at Wait


@pytest.mark.skipif(P < 2, reason="needs p >= 2")
def test_nonblocking_mismatch_raises_at_wait_on_every_rank(comm):
    rank = comm.Get_rank()
    x = data(rank, 5 if rank == 1 else 4)
    request = comm.Iallreduce(x, np.empty_like(x))  # no error yet: the ranks have not compared
    expect_everywhere(comm, request.Wait, "allreduce #", "ranks disagree on the count", "5 elements on rank(s) 1")


def test_nonblocking_local_problem_raises_at_wait_on_every_rank(comm):
    x = data(comm.Get_rank(), 4)
    request = comm.Ibcast(x, root=0.5)
    expect_everywhere(comm, request.Wait, "root must be an integer, got 0.5")
    request = comm.Iallreduce(x, np.empty(4), "band")
    expect_everywhere(comm, request.wait, "op band is not defined on dtype float64")


@pytest.mark.skipif(P < 2, reason="needs p >= 2")
def test_a_failed_request_does_not_disturb_one_in_flight(comm):
    rank = comm.Get_rank()
    good = data(rank, 50, np.int64)
    out, expected = np.empty_like(good), np.empty_like(good)
    reference.native().Allreduce(good, expected)
    fine = comm.Iallreduce(good, out, algorithm="recursive_doubling")
    bad_x = data(rank, 4)
    bad = comm.Iallreduce(bad_x, np.empty(4), MPI.MAX if rank == 0 else MPI.MIN)
    expect_everywhere(comm, bad.Wait, "ranks disagree on the op")
    fine.Wait()
    reference.assert_matches(out, expected, "the good request")


# ---------------------------------------------------------------- MPICOMM_VALIDATE=0: the local exception


LOCAL = {
    "unknown-op": (lambda c, x: c.Allreduce(x, np.empty_like(x), "summ"), ValueError, "unknown op 'summ'"),
    "band-on-float": (lambda c, x: c.Allreduce(x, np.empty_like(x), "band"), TypeError,
                      "op band is not defined on dtype float64"),
    "bad-op-type": (lambda c, x: c.Reduce(x, np.empty_like(x), 42), TypeError, "op must be a name"),
    "unknown-algorithm": (lambda c, x: c.Allreduce(x, np.empty_like(x), algorithm="tornado"), ValueError,
                          "unknown allreduce algorithm 'tornado'; registered: "),
    "non-contiguous": (lambda c, x: c.Bcast(np.repeat(x, 2)[::2], 0), ValueError, "buf is not C-contiguous"),
    "read-only": (lambda c, x: c.Allreduce(x, np.frombuffer(x.tobytes(), x.dtype)), ValueError, "read-only"),
    "root-float": (lambda c, x: c.Bcast(x, 1.0), TypeError, "root must be an integer"),
    "list-buffer": (lambda c, x: c.Allgather([1.0, 2.0], np.empty(c.size)), TypeError, "must be an array or a buffer"),
    "recv-too-small": (lambda c, x: c.Allreduce(x, np.empty(x.size - 1)), ValueError, "send count 4 and receive count 3"),
}


@pytest.mark.parametrize("name", list(LOCAL))
def test_validation_off_raises_the_local_exception(comm, monkeypatch, name):
    call, kind, fragment = LOCAL[name]
    monkeypatch.setenv("MPICOMM_VALIDATE", "0")
    x = data(comm.Get_rank(), 4)
    with pytest.raises(kind) as info:
        call(comm, x)
    assert not isinstance(info.value, mpicomm.ArgumentError)
    assert fragment in str(info.value)
    # a correct call still works without validation, and with it once more
    out = np.empty_like(x)
    comm.Allreduce(x, out, algorithm="recursive_doubling")
    expected = np.empty_like(x)
    reference.native().Allreduce(x, expected)
    reference.assert_matches(out, expected, "allreduce without validation")
    monkeypatch.undo()
    still_works(comm)


def test_the_validation_setting_is_read_at_every_call(comm, monkeypatch):
    x = data(comm.Get_rank(), 4)
    for setting, agreed in (("0", False), ("1", True), ("off", False), ("", True), ("no", False), ("on", True)):
        monkeypatch.setenv("MPICOMM_VALIDATE", setting)
        with pytest.raises(TypeError, match="op band is not defined on dtype float64") as info:
            comm.Allreduce(x, np.empty(4), "band")  # wrong on every rank: each raises, agreed or not
        assert isinstance(info.value, mpicomm.ArgumentError) == agreed, setting
    monkeypatch.undo()
    still_works(comm)


def test_validation_setting_is_checked(comm, monkeypatch):
    monkeypatch.setenv("MPICOMM_VALIDATE", "maybe")
    x = data(comm.Get_rank(), 4)
    with pytest.raises(ValueError, match="MPICOMM_VALIDATE='maybe' is not one of"):
        comm.Allreduce(x, np.empty(4))
    monkeypatch.undo()
    still_works(comm)


# ---------------------------------------------------------------- specs the MPI library runs


@pytest.fixture
def vector_type():
    """Two doubles at a stride of two: elements 0 and 2 of a buffer (not contiguous: mpicomm hands it on)."""
    datatype = MPI.DOUBLE.Create_vector(2, 1, 2)
    datatype.Commit()
    yield datatype
    datatype.Free()


@pytest.mark.parametrize("validate", ["1", "0"])
def test_derived_type_on_every_rank_runs_in_the_library(comm, monkeypatch, vector_type, validate):
    monkeypatch.setenv("MPICOMM_VALIDATE", validate)
    rank, p = comm.Get_rank(), comm.Get_size()
    root = p - 1
    buf = data(rank, 4)
    comm.Bcast([buf, 1, vector_type], root)
    expected = data(rank, 4)
    reference.native().Bcast([expected, 1, vector_type], root)
    reference.assert_matches(buf, expected, "bcast of a vector type")
    assert buf[1] == data(rank, 4)[1]  # elements between the vector's blocks are untouched
    # a gather of two-element vectors into a plain buffer
    send = data(rank, 4)
    out, ref = np.zeros(2 * p), np.zeros(2 * p)
    comm.Allgather([send, 1, vector_type], [out, 2, MPI.DOUBLE])
    reference.native().Allgather([send, 1, vector_type], [ref, 2, MPI.DOUBLE])
    reference.assert_matches(out, ref, "allgather of a vector type")
    assert out.tolist() == np.concatenate([data(r, 4)[[0, 2]] for r in range(p)]).tolist()
    # nonblocking too
    out2 = np.zeros(2 * p)
    comm.Iallgather([send, 1, vector_type], out2).Wait()
    reference.assert_matches(out2, ref, "iallgather of a vector type")
    monkeypatch.undo()
    still_works(comm)


def test_derived_type_on_one_rank_allgather(comm, vector_type):
    """One rank sends a vector type, the others plain arrays of the same signature: all go to the library."""
    rank, p = comm.Get_rank(), comm.Get_size()
    odd = p - 1
    full = data(rank, 4)
    send = [full, 1, vector_type] if rank == odd else full[[0, 2]].copy()
    expected = np.concatenate([data(r, 4)[[0, 2]] for r in range(p)])
    out = np.zeros(2 * p)
    comm.Allgather(send, out)
    reference.assert_matches(out, expected, "allgather, one rank with a vector type")
    out = np.zeros(2 * p)
    comm.Iallgather(send, out).Wait()
    reference.assert_matches(out, expected, "iallgather, one rank with a vector type")
    still_works(comm)




@pytest.mark.parametrize("who", ["root", "non-root"])
def test_derived_type_on_one_rank_bcast(comm, vector_type, who):
    rank, p = comm.Get_rank(), comm.Get_size()
    root = 0
    odd = root if who == "root" else p - 1
    if rank == odd:
        buf = data(rank, 4)
        spec = [buf, 1, vector_type]
    else:
        buf = data(rank, 2)
        spec = buf
    _, _, message = outcome(lambda: comm.Bcast(spec, root))
    assert not any(MPI.COMM_WORLD.allgather(message)), message  # no rank raised
    sent = data(root, 4)[[0, 2]] if odd == root else data(root, 2)
    got = buf[[0, 2]] if rank == odd else buf
    reference.assert_matches(got, sent, "bcast, one rank with a vector type")
    still_works(comm)


def test_derived_type_on_the_root_only_scatter(comm, vector_type):
    """The root scatters one vector (elements 3i and 3i + 2: the type's extent is 3) to each rank's plain array."""
    rank, p = comm.Get_rank(), comm.Get_size()
    root = p // 2
    source = data(root, 3 * p)
    send = [source, 1, vector_type] if rank == root else None
    out = np.zeros(2)
    _, _, message = outcome(lambda: comm.Scatter(send, out, root))
    assert not any(MPI.COMM_WORLD.allgather(message)), message
    reference.assert_matches(out, source[[3 * rank, 3 * rank + 2]], "scatter of a vector type from the root")
    still_works(comm)


def pairs(rank: int, n: int) -> np.ndarray:
    """(value, index) pairs laid out as MPI.DOUBLE_INT, with ties in value across ranks."""
    out = np.empty(n, mpicomm.ops.pair_dtype(np.float64))
    out["value"] = (np.arange(n) + rank) % 3
    out["index"] = (rank * 5 + np.arange(n)) % 11
    return out


def maxloc_expected(n: int) -> np.ndarray:
    send = pairs(MPI.COMM_WORLD.Get_rank(), n)
    expected = np.empty_like(send)
    reference.native().Allreduce([send, MPI.DOUBLE_INT], [expected, MPI.DOUBLE_INT], op=MPI.MAXLOC)
    return expected


def test_pair_datatype_spec_everywhere_runs_in_the_library(comm):
    """``[buf, MPI.DOUBLE_INT]`` (padded: mpicomm hands it on) with an MPI.Op, on every rank."""
    expected = maxloc_expected(9)
    send, out = pairs(comm.Get_rank(), 9), np.zeros(9, mpicomm.ops.pair_dtype(np.float64))
    comm.Allreduce([send, MPI.DOUBLE_INT], [out, MPI.DOUBLE_INT], MPI.MAXLOC)
    assert out.tolist() == expected.tolist()
    out[...] = send
    comm.Iallreduce(MPI.IN_PLACE, [out, MPI.DOUBLE_INT], MPI.MAXLOC).Wait()
    assert out.tolist() == expected.tolist()


def test_library_spec_with_a_string_op(comm):
    expected = maxloc_expected(9)
    send, out = pairs(comm.Get_rank(), 9), np.zeros(9, mpicomm.ops.pair_dtype(np.float64))
    _, _, message = outcome(lambda: comm.Allreduce([send, MPI.DOUBLE_INT], [out, MPI.DOUBLE_INT], "maxloc"))
    messages = MPI.COMM_WORLD.allgather(message)
    still_works(comm)
    assert not any(messages), messages
    assert out.tolist() == expected.tolist()


def waits_in_library(request) -> bool:
    """Whether *request* waits in the MPI library's own collective (its step says so: ``("library", -1)``)."""
    return any(kind == "library" for kind, _ in getattr(request._reqs, "peers", ()))


@pytest.mark.skipif(P < 2, reason="needs p >= 2")
def test_array_function_and_library_spec_fail_together(comm, vector_type):
    """A rank whose spec needs the library and ranks in an array function (no library form): all raise."""
    rank, p = comm.Get_rank(), comm.Get_size()
    full = data(rank, 4)
    # Should rank 0 wrongly enter the library's allgather alone, the others complete it (so a regression
    # fails instead of hanging): rank 0 uses the nonblocking form to tell them whether it did.
    if rank == 0:
        kind, is_argument_error, message = "", False, ""
        try:
            request = comm.Iallgather([full, 1, vector_type], np.zeros(2 * p))
            while not request.Test() and not waits_in_library(request):  # first the agreement, then the library call
                pass
        except Exception as exc:  # noqa: BLE001
            kind, is_argument_error, message = type(exc).__name__, isinstance(exc, mpicomm.ArgumentError), str(exc)
        in_library = kind == "" and not request.done
        MPI.COMM_WORLD.bcast(in_library, root=0)
        if in_library:
            request.Wait()  # completed by the others below
    else:
        kind, is_argument_error, message = outcome(lambda: mpicomm.allgather(full[[0, 2]].copy(), comm=comm))
        if MPI.COMM_WORLD.bcast(None, root=0):  # rank 0 is alone in the library's allgather: complete it
            MPI.Intracomm.Iallgather(comm, full[[0, 2]].copy(), np.zeros(2 * p)).Wait()  # (nonblocking meets nonblocking)
    everyone = MPI.COMM_WORLD.allgather((is_argument_error, message))
    still_works(comm)
    assert all(e for e, _ in everyone), everyone
    assert len({body(m) for _, m in everyone}) == 1, everyone
    assert "rank(s) 0 passed buffer specs only the MPI library runs" in message
    assert "called an array function, which cannot hand the call to the library" in message
