"""mpicomm.plan.agreement: the words every rank combines, and the message that names a disagreement."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import mpicomm
from mpicomm.plan import agreement
from mpicomm.plan.args import Args

pytestmark = pytest.mark.serial


def _args(**changes: Any) -> Args:
    fields = dict(xp=np, dtype=np.dtype(np.float64), count=8, root=0, op=mpicomm.ops.resolve("sum"))
    fields.update(changes)
    return Args(fields.pop("collective", "allreduce"), **fields)


def _d(args: Args, algorithm: str = "ring", p: int = 4, rank: int = 0, persistent: int | None = None) -> int:
    return int(agreement.digest(args, algorithm, p, rank, persistent)[0])


def test_the_digest_changes_with_everything_the_ranks_must_agree_on():
    reference = _d(_args())
    assert _d(_args()) == reference, "the same call, the same digest"
    variants = {
        "collective": _d(_args(collective="reduce")),
        "algorithm": _d(_args(), algorithm="tree"),
        "dtype": _d(_args(dtype=np.dtype(np.float32))),
        "dtype-byte-order": _d(_args(dtype=np.dtype(">f8"))),
        "count": _d(_args(count=9)),
        "root": _d(_args(root=1)),
        "op": _d(_args(op=mpicomm.ops.resolve("max"))),
        "commutativity": _d(_args(op=mpicomm.ops.create(np.add, commutative=False, name="sum"))),
        "native": _d(_args(unsupported="a derived datatype")),
        "can-native": _d(_args(native=lambda: None)),
        "persistent request": _d(_args(), persistent=3),
    }
    for name, d in variants.items():
        assert d != reference, f"the digest ignores the {name}"
    assert _d(_args(), persistent=3) != _d(_args(), persistent=4), "two persistent requests differ"
    counts = _d(_args(collective="reduce_scatter", recvcounts=(1, 2, 3, 4), count=-1))
    other = _d(_args(collective="reduce_scatter", recvcounts=(1, 2, 4, 3), count=-1))
    assert counts != other, "the digest ignores the v-counts"


def test_words_agree_only_when_nothing_differs():
    words = agreement.digest(_args(), "ring", 4, 0)
    assert agreement.agrees(words)
    assert not agreement.agrees(agreement.digest(_args(), "ring", 4, 0, suspect=True))
    assert not agreement.agrees(agreement.digest(_args(problem=ValueError("x")), "ring", 4, 0))
    other = agreement.digest(_args(count=9), "ring", 4, 0)
    mixed = words.copy()
    flag = [False]
    agreement.combiner(mixed, other, "both", flag)(None)
    assert flag[0] and not agreement.agrees(mixed), "MIN of d and of ~d: two digests leave d != ~word 1"
    same = words.copy()
    flag = [False]
    agreement.combiner(same, words.copy(), "both", flag)(None)
    assert not flag[0] and agreement.agrees(same), "equal words change nothing"


@pytest.mark.parametrize("p", range(1, 9))
def test_cross_sums_vanish_exactly_when_v_counts_fit(p):
    send = [[(3 * r + s) % 5 for s in range(p)] for r in range(p)]  # rank r sends send[r][s] to s
    def share(rank: int, recvcounts: list[int]) -> int:
        a = _args(collective="alltoallv", sendcounts=tuple(send[rank]), recvcounts=tuple(recvcounts), count=-1)
        return agreement.cross_sum(a, p, rank)

    fits = [share(r, [send[s][r] for s in range(p)]) for r in range(p)]
    assert sum(fits) % (1 << 64) == 0
    if p > 1:
        wrong = list(fits)
        wrong[1] = share(1, [send[s][1] + (s == 0) for s in range(p)])
        assert sum(wrong) % (1 << 64) != 0


def test_gatherv_cross_sum():
    p, root = 3, 1
    counts = (2, 0, 5)
    shares = []
    for r in range(p):
        a = _args(collective="gatherv", root=root, count=-1, send=np.zeros(counts[r]),
                  recvcounts=counts if r == root else None)
        shares.append(agreement.cross_sum(a, p, r))
    assert sum(shares) % (1 << 64) == 0


@pytest.mark.parametrize("p,rank,expected", [
    (1, 0, []),
    (2, 0, [("both", 1)]),
    (2, 1, [("both", 0)]),
    (3, 0, [("send", 1), ("recv", 1)]),
    (3, 1, [("fold", 0), ("both", 2), ("send", 0)]),
    (3, 2, [("both", 1)]),
    (4, 2, [("both", 3), ("both", 0)]),
    (5, 0, [("send", 1), ("recv", 1)]),
    (5, 1, [("fold", 0), ("both", 2), ("both", 3), ("send", 0)]),
    (5, 4, [("both", 3), ("both", 2)]),
])
def test_butterfly_literal_table(p, rank, expected):
    assert agreement.butterfly(rank, p) == expected


@pytest.mark.parametrize("p", range(1, 10))
def test_butterfly_pairs_up(p):
    sent = {(r, peer) for r in range(p) for kind, peer in agreement.butterfly(r, p) if kind in ("send", "both")}
    got = {(peer, r) for r in range(p) for kind, peer in agreement.butterfly(r, p) if kind in ("recv", "fold", "both")}
    assert sent == got


def _row(**changes: Any) -> dict:
    row = agreement.describe(_args(), "ring", 2, 0, None)
    row.update(changes)
    return row


def test_disagreements_name_the_values_and_the_ranks():
    assert agreement.disagreements([_row(), _row()]) == []
    assert agreement.disagreements([_row(), _row(count=9)]) == [
        "ranks disagree on the count: 8 elements on rank(s) 0, 9 elements on rank(s) 1"]
    message = agreement.disagreements([_row(collective="bcast"), _row()])[0]
    assert "ranks disagree on the collective: bcast on rank(s) 0, allreduce on rank(s) 1" in message
    assert agreement.disagreements([_row(problem="boom"), _row()]) == ["rank 0: boom"]
    assert agreement.disagreements([_row(persistent=0), _row(persistent=1)]) == [
        "ranks disagree on which persistent request this is: request #0 on rank(s) 0, request #1 on rank(s) 1 "
        "(start persistent requests in the same order on every rank)"]
