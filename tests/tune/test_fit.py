"""mpicomm.tune.fit: the two regimes of a fit, the knee, the cache threshold (deterministic, no MPI job)."""

from __future__ import annotations

import pytest

from mpicomm.tune import fit as fitting

#: Exact two-regime samples: 5 µs + 0.1 ns/B up to 1 MiB, 5 µs + 0.4 ns/B from 2 MiB on.
TWO_SIZES = [8 << (2 * i) for i in range(9)] + [2 << 20, 8 << 20, 32 << 20]  # 8 B .. 512 KiB, then 2 .. 32 MiB


TWO_TIMES = [5e-6 + (1e-10 if n <= 1 << 20 else 4e-10) * n for n in TWO_SIZES]


def test_fit_regimes_recovers_both_slopes():
    alpha, beta, beta_mem = fitting.fit_regimes(TWO_SIZES, TWO_TIMES, 1 << 20)
    assert alpha == pytest.approx(5e-6, rel=1e-9)
    assert beta == pytest.approx(1e-10, rel=1e-9) and beta_mem == pytest.approx(4e-10, rel=1e-9)
    # nothing at ≥ 2·cache_bytes: one regime
    assert fitting.fit_regimes(TWO_SIZES[:9], TWO_TIMES[:9], 1 << 20)[2] == pytest.approx(1e-10, rel=1e-9)


def test_fit_knee_finds_the_switch():
    assert fitting.fit_knee(TWO_SIZES, TWO_TIMES) == 512 << 10  # the largest size on the cache line
    assert fitting.fit_knee([8, 16], [1e-6, 2e-6]) == 16  # too few sizes to split


def test_cache_threshold_and_last_level_cache(tmp_path):
    assert fitting.cache_threshold(32 << 20, 2) == (32 << 20) // 6
    with pytest.raises(ValueError):
        fitting.cache_threshold(0, 2)
    for i, size in enumerate(["32K", "1024K", "32768K"]):
        (tmp_path / f"index{i}").mkdir()
        (tmp_path / f"index{i}" / "size").write_text(size + "\n")
    assert fitting.last_level_cache(str(tmp_path)) == 32 << 20
    assert fitting.last_level_cache(str(tmp_path / "missing")) is None
