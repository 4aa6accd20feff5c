"""apps.memory: a run that cannot fit is refused before it allocates, with the numbers and the fix, on every rank."""

from __future__ import annotations

import pytest
from mpi4py import MPI

from apps import memory

GiB = 1 << 30


def _on_node(comm):
    """The ranks of *comm* on this node: ``have`` is a node's memory, shared by them (several on a simulated node)."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_size()
    finally:
        node.Free()


def _need(per_sample: int, fixed: int = 0):
    """An estimate that grows with --batch and shrinks with --micro, like a pipeline's."""
    return lambda v: fixed + per_sample * v["--batch"] // v.get("--micro", 1)


def _outcome(fn) -> tuple[str, str]:
    try:
        fn()
    except memory.MemoryNeedError as exc:
        return "refused", str(exc)
    return "ran", ""


@pytest.mark.mpi
def test_a_run_that_cannot_fit_is_refused_on_every_rank_with_the_same_message():
    comm = MPI.COMM_WORLD
    knobs = [memory.Knob("--batch", 10**12)]
    got = comm.allgather(_outcome(lambda: memory.check(comm, _need(1024), knobs, have=22 * GiB)))
    assert all(kind == "refused" for kind, _ in got), got
    assert len({message for _, message in got}) == 1, got
    message = got[0][1]
    ranks = _on_node(comm)  # the node's memory is shared by its ranks
    budget = 22 * GiB // ranks
    best = budget // 1024
    assert message.startswith("--batch 1000000000000: needs about 931 TiB of memory per rank, but this machine has "
                              "22 GiB available"), message
    assert f"use --batch <= {best}" in message, message
    if ranks > 1:
        assert f"for {ranks} ranks ({memory.describe(budget)} each)" in message, message


@pytest.mark.mpi
def test_the_smallest_share_decides_when_one_rank_has_less_memory():
    """A node with less memory than the others (here: the last rank says so) stops every rank, not only itself."""
    comm = MPI.COMM_WORLD
    last = comm.Get_rank() == comm.Get_size() - 1
    have = 1 * GiB if last else 1000 * GiB
    knobs = [memory.Knob("--batch", 4 << 20)]
    got = comm.allgather(_outcome(lambda: memory.check(comm, _need(1024), knobs, have=have)))
    assert all(kind == "refused" for kind, _ in got), got
    assert len({message for _, message in got}) == 1, got
    assert "has 1 GiB available" in got[0][1], got


@pytest.mark.mpi
def test_a_run_that_fits_goes_on_and_advice_names_every_option_that_alone_fits():
    comm = MPI.COMM_WORLD
    knobs = [memory.Knob("--batch", 1000), memory.Knob("--micro", 8, high=1000)]
    assert _outcome(lambda: memory.check(comm, _need(1 << 20), knobs, have=1000 * GiB)) == ("ran", "")
    kind, message = _outcome(lambda: memory.check(comm, _need(1 << 30), knobs, have=64 * GiB * _on_node(comm)))
    assert kind == "refused"
    # 2^30 per sample, 1000 samples in 8 micro-batches: 125 GiB; 64 GiB each fits 512 samples, or --micro 16
    assert message.startswith("--batch 1000, --micro 8: needs about 125 GiB"), message
    assert message.endswith("use --batch <= 512 or --micro >= 16"), message


@pytest.mark.mpi
def test_when_no_option_alone_fits_the_ones_that_together_do_are_named():
    comm = MPI.COMM_WORLD
    knobs = [memory.Knob("--batch", 10**6), memory.Knob("--samples", 10**9), memory.Knob("--hidden", 64)]

    def need(v):
        return 8 * v["--samples"] + 4096 * v["--batch"] + v["--hidden"]

    kind, message = _outcome(lambda: memory.check(comm, need, knobs, have=1 * GiB * _on_node(comm),
                                                  otherwise="spread the run over more nodes"))
    assert kind == "refused"
    assert message.startswith("--samples 1000000000, --batch 1000000: needs about"), message
    assert message.endswith("use smaller --samples and --batch, or spread the run over more nodes"), message


@pytest.mark.serial
def test_without_mpi_a_serial_command_is_checked_alone():
    kind, message = _outcome(lambda: memory.check(None, lambda v: 240 * v["--vocabulary"],
                                                  [memory.Knob("--vocabulary", 10**12)], have=10 * GiB))
    assert kind == "refused"
    assert message == ("--vocabulary 1000000000000: needs about 218 TiB of memory, but this machine has 10 GiB "
                       "available: use --vocabulary <= 44739242")


@pytest.mark.serial
def test_sizes_and_search():
    assert [memory.describe(n) for n in (900, 1536, 22 * GiB, int(7.3 * (1 << 40)), 5 << 60)] == \
        ["900 B", "1.5 KiB", "22 GiB", "7.3 TiB", "5 EiB"]
    assert memory.largest(lambda n: n * n <= 1000, 1, 10**9) == 31
    assert memory.largest(lambda n: False, 1, 100) is None
    assert memory.available() is None or memory.available() > 0
