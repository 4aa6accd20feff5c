"""apps.blocks: the one block split of the applications - in order, covering n exactly, sizes within one."""

from __future__ import annotations

import numpy as np
import pytest

from apps.blocks import block, blocks, grouped

pytestmark = pytest.mark.serial


@pytest.mark.parametrize("n", [0, 1, 7, 10, 31, 100, 4096])
@pytest.mark.parametrize("parts", [1, 2, 3, 4, 7])
def test_blocks_tile_in_order_the_larger_first(n, parts):
    spans = [block(n, parts, i) for i in range(parts)]
    assert spans[0][0] == 0 and spans[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    sizes = [stop - start for start, stop in spans]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    covered = np.zeros(n, int)
    for start, stop in spans:
        covered[start:stop] += 1
    assert (covered == 1).all()


def test_literal_blocks():
    assert [block(31, 3, r) for r in range(3)] == [(0, 11), (11, 21), (21, 31)]
    assert [block(10, 4, r) for r in range(4)] == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert [block(2, 4, r) for r in range(4)] == [(0, 1), (1, 2), (2, 2), (2, 2)]  # empty blocks at the end
    assert blocks(10, 4) == ([3, 3, 2, 2], [0, 3, 6, 8])
    assert blocks(0, 2) == ([0, 0], [0, 0])


@pytest.mark.parametrize("args,message", [
    ((-1, 2, 0), "cannot split -1 items into blocks; the count must be >= 0"),
    ((10, 0, 0), "cannot split 10 items into 0 blocks; use at least 1"),
    ((10, 4, 4), r"block 4 is out of range for 4 blocks; use 0 <= index < 4"),
    ((10, 4, -1), r"block -1 is out of range"),
])
def test_bad_arguments_are_refused_naming_them(args, message):
    with pytest.raises(ValueError, match=message):
        block(*args)


def test_numpy_integers_are_accepted_and_floats_refused():
    assert block(np.int64(10), np.int32(4), np.int64(1)) == (3, 6)
    with pytest.raises(TypeError):
        block(10.0, 4, 1)  # type: ignore[arg-type]


@pytest.mark.parametrize("n,parts,groups", [(0, 3, 3), (7, 3, 2), (10, 4, 3), (100, 8, 3), (5, 5, 5), (9, 9, 4),
                                            (3, 8, 3)])
def test_grouped_blocks_are_a_groups_blocks_and_the_groups_tile_in_order(n, parts, groups):
    spans = []
    for g in range(groups):
        (start, stop), inner = grouped(n, parts, groups, g)
        first, last = block(parts, groups, g)
        assert [(start + a, start + b) for a, b in inner] == [block(n, parts, i) for i in range(first, last)]
        assert sum(b - a for a, b in inner) == stop - start
        spans.append((start, stop))
    assert spans[0][0] == 0 and spans[-1][1] == n
    assert all(spans[g][1] == spans[g + 1][0] for g in range(groups - 1)), spans


def test_grouped_literal():
    assert grouped(10, 4, 3, 0) == ((0, 6), [(0, 3), (3, 6)])  # blocks 0-1 of 3, 3, 2, 2
    assert grouped(10, 4, 3, 1) == ((6, 8), [(0, 2)])
    assert grouped(10, 4, 3, 2) == ((8, 10), [(0, 2)])
    assert grouped(3, 8, 3, 2) == ((3, 3), [(0, 0), (0, 0)])  # more blocks than items: empty ones at the end
