"""mpicomm.coll.patterns: the pure communication patterns (rings, trees, folds), against literal tables (no MPI).

Each pattern gets a table written out by hand for one or two sizes, and a
property check over p = 1 … 17 that simulates what it moves (with sets of
ranks or block indices) and checks the end state the algorithms rely on.
"""

from __future__ import annotations

import pytest

from mpicomm.coll.patterns import (
    BinomialNode,
    Fold,
    binomial,
    block_partition,
    bruck_allgather,
    dissemination,
    doubling_partners,
    fold,
    pairwise,
    ring_allgather,
    ring_reduce_scatter,
    unfold,
)

SIZES = range(1, 18)

# ---------------------------------------------------------------- block_partition


def test_block_partition_literal():
    assert block_partition(10, 4) == ([3, 3, 2, 2], [0, 3, 6, 8])
    assert block_partition(8, 4) == ([2, 2, 2, 2], [0, 2, 4, 6])
    assert block_partition(2, 4) == ([1, 1, 0, 0], [0, 1, 2, 2])  # fewer elements than blocks
    assert block_partition(0, 3) == ([0, 0, 0], [0, 0, 0])
    assert block_partition(7, 1) == ([7], [0])


def test_block_partition_tiles_the_vector():
    for p in SIZES:
        for count in (0, 1, p - 1, p, p + 1, 3 * p + 2, 1000):
            counts, displs = block_partition(count, p)
            assert len(counts) == len(displs) == p
            assert sum(counts) == count, f"p={p} count={count}"
            assert displs == [sum(counts[:i]) for i in range(p)]  # packed, in order
            assert max(counts) - min(counts) <= 1 and counts == sorted(counts, reverse=True)  # larger blocks first


# ---------------------------------------------------------------- dissemination


def test_dissemination_literal_p6():
    table = {rank: list(dissemination(rank, 6)) for rank in range(6)}
    assert table == {
        0: [(1, 5), (2, 4), (4, 2)],
        1: [(2, 0), (3, 5), (5, 3)],
        2: [(3, 1), (4, 0), (0, 4)],
        3: [(4, 2), (5, 1), (1, 5)],
        4: [(5, 3), (0, 2), (2, 0)],
        5: [(0, 4), (1, 3), (3, 1)],
    }
    assert list(dissemination(0, 1)) == []


# ---------------------------------------------------------------- binomial tree


def test_binomial_literal_p5():
    assert {v: binomial(v, 5) for v in range(5)} == {
        0: BinomialNode(None, [(4, 1), (2, 2), (1, 1)], 5),
        1: BinomialNode(0, [], 1),
        2: BinomialNode(0, [(3, 1)], 2),
        3: BinomialNode(2, [], 1),
        4: BinomialNode(0, [], 1),
    }


def test_binomial_literal_p8():
    assert {v: binomial(v, 8) for v in range(8)} == {
        0: BinomialNode(None, [(4, 4), (2, 2), (1, 1)], 8),
        1: BinomialNode(0, [], 1),
        2: BinomialNode(0, [(3, 1)], 2),
        3: BinomialNode(2, [], 1),
        4: BinomialNode(0, [(6, 2), (5, 1)], 4),
        5: BinomialNode(4, [], 1),
        6: BinomialNode(4, [(7, 1)], 2),
        7: BinomialNode(6, [], 1),
    }


def test_binomial_single_rank():
    assert binomial(0, 1) == BinomialNode(None, [], 1)


def test_binomial_is_a_tree_of_contiguous_subtrees():
    for p in SIZES:
        nodes = {v: binomial(v, p) for v in range(p)}
        assert nodes[0].parent is None and nodes[0].subtree == p, f"p={p}"
        for v, node in nodes.items():
            if v:
                assert node.parent < v and (v, nodes[v].subtree) in nodes[node.parent].children
            # farthest child first, at distances that are decreasing powers of two (sizes need not decrease)
            distances = [child - v for child, _ in node.children]
            assert distances == sorted(distances, reverse=True) and all(d & (d - 1) == 0 for d in distances)
            # the subtrees of the children tile v+1 … v+subtree−1, in order
            start = v + 1
            for child, size in reversed(node.children):
                assert child == start and nodes[child].subtree == size
                start += size
            assert start == v + node.subtree
        # depth: ⌈lg p⌉ at most
        for v in range(p):
            depth, node = 0, nodes[v]
            while node.parent is not None:
                depth, node = depth + 1, nodes[node.parent]
            assert depth <= (p - 1).bit_length(), f"p={p}: rank {v} is {depth} levels deep"


# ---------------------------------------------------------------- fold / unfold


@pytest.mark.parametrize("p, table", [
    (5, [Fold(None, 1, 4, 1), Fold(0, 0, 4, 1), Fold(1, None, 4, 1), Fold(2, None, 4, 1), Fold(3, None, 4, 1)]),
    (6, [Fold(None, 1, 4, 2), Fold(0, 0, 4, 2), Fold(None, 3, 4, 2), Fold(1, 2, 4, 2), Fold(2, None, 4, 2),
         Fold(3, None, 4, 2)]),
    (7, [Fold(None, 1, 4, 3), Fold(0, 0, 4, 3), Fold(None, 3, 4, 3), Fold(1, 2, 4, 3), Fold(None, 5, 4, 3),
         Fold(2, 4, 4, 3), Fold(3, None, 4, 3)]),
])
def test_fold_literal(p, table):
    assert [fold(rank, p) for rank in range(p)] == table


@pytest.mark.parametrize("p, real", [(5, [1, 2, 3, 4]), (6, [1, 3, 4, 5]), (7, [1, 3, 5, 6]), (8, list(range(8)))])
def test_unfold_literal(p, real):
    rem = fold(0, p).rem
    assert [unfold(newrank, rem) for newrank in range(len(real))] == real


def test_fold_pairs_ranks_and_unfold_inverts_it():
    for p in SIZES:
        folds = [fold(rank, p) for rank in range(p)]
        pof2, rem = folds[0].pof2, folds[0].rem
        assert pof2 & (pof2 - 1) == 0 and pof2 <= p < 2 * pof2 and rem == p - pof2
        newranks = [f.newrank for f in folds if f.newrank is not None]
        assert newranks == list(range(pof2)), f"p={p}"  # in rank order
        for rank, f in enumerate(folds):
            if f.newrank is None:
                assert folds[f.partner].partner == rank and folds[f.partner].newrank is not None
            else:
                assert unfold(f.newrank, rem) == rank


# ---------------------------------------------------------------- recursive doubling


def test_doubling_partners_literal():
    # p = 6: newranks 0..3 are ranks 1, 3, 4, 5
    assert list(doubling_partners(0, 4, 2)) == [(1, 3), (2, 4)]
    assert list(doubling_partners(3, 4, 2)) == [(1, 4), (2, 3)]
    # p = 8: no fold
    assert list(doubling_partners(5, 8, 0)) == [(1, 4), (2, 7), (4, 1)]
    assert list(doubling_partners(0, 1, 0)) == []


def test_doubling_partners_are_mutual_and_reach_everyone():
    for p in SIZES:
        f0 = fold(0, p)
        pof2, rem = f0.pof2, f0.rem
        rounds = {unfold(v, rem): list(doubling_partners(v, pof2, rem)) for v in range(pof2)}
        for rank, steps in rounds.items():
            assert [mask for mask, _ in steps] == [1 << k for k in range(pof2.bit_length() - 1)]
            for k, (_, partner) in enumerate(steps):
                assert rounds[partner][k][1] == rank
        has = {rank: {rank} for rank in rounds}
        for k in range(pof2.bit_length() - 1):
            has = {rank: has[rank] | has[rounds[rank][k][1]] for rank in rounds}
        assert all(h == set(rounds) for h in has.values()), f"p={p}"


# ---------------------------------------------------------------- rings


def test_ring_reduce_scatter_literal_p4():
    assert {rank: list(ring_reduce_scatter(rank, 4)) for rank in range(4)} == {
        0: [(3, 2), (2, 1), (1, 0)],
        1: [(0, 3), (3, 2), (2, 1)],
        2: [(1, 0), (0, 3), (3, 2)],
        3: [(2, 1), (1, 0), (0, 3)],
    }


def test_ring_allgather_literal_p4():
    assert {rank: list(ring_allgather(rank, 4)) for rank in range(4)} == {
        0: [(0, 3), (3, 2), (2, 1)],
        1: [(1, 0), (0, 3), (3, 2)],
        2: [(2, 1), (1, 0), (0, 3)],
        3: [(3, 2), (2, 1), (1, 0)],
    }


def test_ring_reduce_scatter_leaves_each_rank_its_reduced_block():
    for p in SIZES:
        # held[r][b]: the ranks whose contribution to block b rank r's copy includes
        held = [[{r} for _ in range(p)] for r in range(p)]
        steps = [list(ring_reduce_scatter(r, p)) for r in range(p)]
        assert all(len(s) == p - 1 for s in steps)
        for k in range(p - 1):
            sent = [(steps[r][k][0], set(held[r][steps[r][k][0]])) for r in range(p)]  # all send at once
            for r in range(p):
                block, contribution = sent[(r - 1) % p]  # from the left neighbour
                assert steps[r][k][1] == block, f"p={p} step {k}: rank {r} expects block {steps[r][k][1]}, gets {block}"
                assert not held[r][block] & contribution  # nothing counted twice
                held[r][block] |= contribution
        assert all(held[r][r] == set(range(p)) for r in range(p)), f"p={p}"


def test_ring_allgather_leaves_every_rank_every_block():
    for p in SIZES:
        has = [{r} for r in range(p)]
        steps = [list(ring_allgather(r, p)) for r in range(p)]
        for k in range(p - 1):
            sent = [steps[r][k][0] for r in range(p)]
            for r in range(p):
                assert sent[r] in has[r]  # a rank forwards only what it has
            for r in range(p):
                block = sent[(r - 1) % p]
                assert steps[r][k][1] == block and block not in has[r]
                has[r].add(block)
        assert all(h == set(range(p)) for h in has), f"p={p}"


# ---------------------------------------------------------------- pairwise


def test_pairwise_literal_p4():
    assert {rank: list(pairwise(rank, 4)) for rank in range(4)} == {
        0: [(1, 3), (2, 2), (3, 1)],
        1: [(2, 0), (3, 3), (0, 2)],
        2: [(3, 1), (0, 0), (1, 3)],
        3: [(0, 2), (1, 1), (2, 0)],
    }


def test_pairwise_meets_every_rank_once():
    for p in SIZES:
        steps = [list(pairwise(r, p)) for r in range(p)]
        for r in range(p):
            assert sorted(to for to, _ in steps[r]) == [q for q in range(p) if q != r]
            assert sorted(frm for _, frm in steps[r]) == [q for q in range(p) if q != r]
            for k, (to, _) in enumerate(steps[r]):
                assert steps[to][k][1] == r  # the receiver expects this rank in the same step


# ---------------------------------------------------------------- Bruck allgather


def test_bruck_allgather_literal_p5():
    assert {rank: list(bruck_allgather(rank, 5)) for rank in range(5)} == {
        0: [(4, 1, 1), (3, 2, 2), (1, 4, 1)],
        1: [(0, 2, 1), (4, 3, 2), (2, 0, 1)],
        2: [(1, 3, 1), (0, 4, 2), (3, 1, 1)],
        3: [(2, 4, 1), (1, 0, 2), (4, 2, 1)],
        4: [(3, 0, 1), (2, 1, 2), (0, 3, 1)],
    }


def test_bruck_allgather_builds_the_rotated_buffer():
    for p in SIZES:
        buf = [[r] for r in range(p)]  # rank r's buffer holds blocks r, r+1, … (mod p) in this order
        steps = [list(bruck_allgather(r, p)) for r in range(p)]
        for k in range(len(steps[0])):
            sent = [buf[r][: steps[r][k][2]] for r in range(p)]
            for r in range(p):
                to, frm, blocks = steps[r][k]
                assert steps[to][k][1] == r and steps[frm][k][0] == r and len(sent[frm]) == blocks
                buf[r] = buf[r] + sent[frm]
        assert all(buf[r] == [(r + i) % p for i in range(p)] for r in range(p)), f"p={p}"
