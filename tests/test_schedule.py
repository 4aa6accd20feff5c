"""mpicomm.schedule: the data an algorithm describes, checked without MPI.

Every registered algorithm is described for every rank of p = 1…7 at counts 0, 1, p−1, p+1 and 1000 (and
per-rank counts for the v-forms): every message a rank sends must meet a receive of the same size on its
peer, in order (shared-memory schedules wait on counters instead, hierarchical ones nest whole calls: they
are checked to describe themselves, and run under MPI in the collective tests). A few schedules are compared
with literal tables.
"""

from __future__ import annotations

import numpy as np
import pytest

from mpicomm import registry, schedule
from mpicomm.catalogue import CATALOGUE
from mpicomm.ops import BUILTIN
from mpicomm.plan.preview import schedule_for, schedules_for
from mpicomm.schedule import RECV, SEND, Builder, Combine, Copy, Local, Round, View, check_pairs, describe, early

pytestmark = pytest.mark.serial


# ---------------------------------------------------------------- views and rounds


def test_views_slice_like_flat_arrays():
    v = View(RECV, 10, 20)
    assert v.size == len(v) == 10
    assert v[2:5] == View(RECV, 12, 15)
    assert v[:3] == View(RECV, 10, 13) and v[7:] == View(RECV, 17, 20)
    assert v[-2:] == View(RECV, 18, 20)
    assert v[5:2] == View(RECV, 15, 15), "an empty slice stays empty, not negative"
    assert v[2:5][1:2] == View(RECV, 13, 14)
    assert v.reshape(-1) is v
    with pytest.raises(TypeError, match="contiguous slices"):
        v[::2]
    with pytest.raises(TypeError, match="contiguous slices"):
        v[3]
    assert repr(View(2, 0, 4)) == "t0[0:4]" and repr(View(SEND, 1, 2)) == "send[1:2]"


def test_a_round_per_exchange_and_ops_after_the_current_one():
    b = Builder("allreduce", "demo", 0, 2, np.float64, op=BUILTIN["sum"], count=4, send_count=4, recv_count=4)
    t = b.empty(4)
    b.copy(b.output, b.input)  # round 0: local
    b.sendrecv(1, b.output, 1, t)
    b.combine(t, b.output, b.output)
    b.send(1, b.output[:2])
    s = b.schedule()
    assert len(s.rounds) == 3
    assert s.rounds[0].ops == [Copy(View(RECV, 0, 4), View(SEND, 0, 4))] and not s.rounds[0].communicates
    assert s.rounds[1].sends == [(1, View(RECV, 0, 4))] and s.rounds[1].recvs == [(1, t)]
    assert s.rounds[1].ops == [Combine(t, View(RECV, 0, 4), View(RECV, 0, 4))]
    assert s.buffers[2] == (4, np.dtype(np.float64))
    assert s.scratch_bytes() == 32


def test_empty_rounds_vanish_and_copies_onto_themselves_are_dropped():
    b = Builder("bcast", "demo", 0, 2, np.int32, send_count=3, recv_count=3)
    b.copy(b.output, b.output)
    b.step()
    assert b.schedule().rounds == []
    with pytest.raises(ValueError, match="copy of 3 elements into 2"):
        b.copy(b.output[:2], b.input)
    with pytest.raises(TypeError, match="views of the call's buffers"):
        b.send(1, np.zeros(3))


def test_early_posting_only_when_nothing_is_shared():
    ops = [Combine(View(2, 0, 4), View(RECV, 0, 4), View(RECV, 0, 4))]
    current = Round(ops=ops)
    assert early(current, Round(recvs=[(1, View(3, 0, 4))]))  # another buffer: in flight while combining
    assert not early(current, Round(recvs=[(1, View(2, 0, 4))])), "would overwrite what the combine reads"
    assert not early(current, Round(sends=[(1, View(RECV, 2, 3))])), "would send what the combine writes"
    assert early(current, Round(sends=[(1, View(RECV, 4, 8))]))
    assert not early(Round(), Round(recvs=[(1, View(3, 0, 4))])), "nothing to overlap"
    opaque = Round(ops=[Local(lambda run: None, "something")])
    assert not early(opaque, Round(recvs=[(1, View(3, 0, 4))])), "a local step may touch anything"
    known = Round(ops=[Local(lambda run: None, "reads t0", reads=(View(2, 0, 4),), writes=())])
    assert early(known, Round(sends=[(1, View(2, 0, 4))])) and not early(known, Round(recvs=[(1, View(2, 0, 1))]))


def test_check_pairs_names_what_does_not_meet():
    def sched(rank: int, sends: list, recvs: list) -> schedule.Schedule:
        b = Builder("allreduce", "demo", rank, 2, np.float64, send_count=8, recv_count=8)
        b.exchange(sends=[(peer, b.input[:n]) for peer, n in sends], recvs=[(peer, b.output[:n]) for peer, n in recvs])
        return b.schedule()

    assert check_pairs([sched(0, [(1, 4)], [(1, 2)]), sched(1, [(0, 2)], [(0, 4)])]) == []
    problems = check_pairs([sched(0, [(1, 4)], []), sched(1, [], [(0, 3)])])
    assert problems == ["rank 0 sends messages of [32] bytes to rank 1, which receives [24]"]
    assert check_pairs([sched(0, [(1, 1)], []), sched(1, [], [])]) == [
        "rank 0 sends 1 message(s) to rank 1, which receives 0"]


# ---------------------------------------------------------------- literal tables


def _describe(collective: str, algorithm: str, p: int, count: int, rank: int, root: int = 0) -> list[str]:
    return describe(schedule_for(collective, algorithm, p, rank, count, root=root))


def test_recursive_doubling_allreduce_literal_table():
    assert _describe("allreduce", "recursive_doubling", 3, 4, 1) == [
        "rank 1 of 3: allreduce (recursive_doubling), send 4, recv 4 x float64; scratch t0: 4 x float64",
        "    0  recv t0[0:4] <- 0",
        "         then recv[0:4] = t0[0:4] (+) send[0:4]",
        "    1  recv t0[0:4] <- 2; send recv[0:4] -> 2",
        "         then recv[0:4] = recv[0:4] (+) t0[0:4]",
        "    2  send recv[0:4] -> 0",
    ]
    assert _describe("allreduce", "recursive_doubling", 3, 4, 0)[1:] == [
        "    0  send send[0:4] -> 1", "    1  recv recv[0:4] <- 1"]


def test_ring_allreduce_literal_table():
    # p = 3, 6 elements: blocks of 2; rank 0 reduce-scatters blocks 2 then 1 in, allgathers 0 and 2 out
    assert _describe("allreduce", "ring", 3, 6, 0)[1:] == [
        "    0  local",
        "         then copy send[0:6] -> recv[0:6]",
        "    1  recv t0[0:2] <- 2; send recv[4:6] -> 1",
        "         then recv[2:4] = t0[0:2] (+) recv[2:4]",
        "    2  recv t1[0:2] <- 2; send recv[2:4] -> 1",
        "         then recv[0:2] = t1[0:2] (+) recv[0:2]",
        "    3  recv recv[4:6] <- 2; send recv[0:2] -> 1",
        "    4  recv recv[2:4] <- 2; send recv[4:6] -> 1",
    ]


# ---------------------------------------------------------------- every algorithm, every rank


def _cases() -> list[tuple[str, str]]:
    table = registry.table()
    return [(c, a) for c in CATALOGUE if c in table for a in sorted(table[c])]


@pytest.mark.parametrize("collective,algorithm", _cases(), ids=[f"{c}-{a}" for c, a in _cases()])
@pytest.mark.parametrize("p", range(1, 8))
def test_every_rank_meets_its_peers(collective, algorithm, p):
    roots = sorted({0, p - 1, p // 2}) if CATALOGUE[collective].rooted else [0]
    counts = sorted({0, 1, max(p - 1, 0), p + 1, 1000})
    for root in roots:
        for count in counts:
            if CATALOGUE[collective].vector:
                per_rank = [(count + 3 * r) % 7 for r in range(p)]  # uneven, with zeros
                scheds = schedules_for(collective, algorithm, p, -1, root=root, counts=per_rank)
            else:
                scheds = schedules_for(collective, algorithm, p, count, root=root)
            if any(s.then is not None for s in scheds):
                continue  # sizes known at run time only: checked under MPI
            assert check_pairs(scheds) == [], f"{collective}/{algorithm} p={p} count={count} root={root}"
