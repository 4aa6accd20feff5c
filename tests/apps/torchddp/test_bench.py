"""apps.torchddp.bench without MPI: the parameter agreement test and the configurations."""

from __future__ import annotations

import pytest

from tests.apps.torchddp import NO_TORCH

torch = pytest.importorskip("torch", reason=NO_TORCH)

from apps.torchddp.bench import PRESETS, TARGET, TOLERANCE, agreement  # noqa: E402
from apps.torchddp.models import build, count_parameters  # noqa: E402

pytestmark = pytest.mark.serial


def _models():
    g = torch.Generator().manual_seed(0)
    start = [torch.randn(64, 32, generator=g), torch.randn(32, generator=g)]
    update = [0.01 * torch.randn(t.shape, generator=g) for t in start]
    after = [s + u for s, u in zip(start, update)]
    return start, update, after


def test_agreement_passes_identical_and_rounding_level_updates():
    start, update, after = _models()
    rtol, atol = TOLERANCE[torch.float32]
    same = agreement([t.clone() for t in after], after, start, rtol, atol)
    assert same == {"passed": True, "max_abs_diff": 0.0, "worst_vs_tolerance": 0.0}
    rounded = [s + u * (1 + 1e-6) for s, u in zip(start, update)]  # the update summed in another order
    assert agreement(rounded, after, start, rtol, atol)["passed"]
    flipped = [t.clone() for t in after]
    flipped[0][5] += 0.01 * update[0][5]  # a ReLU that flipped: one row moved by a step's worth
    assert agreement(flipped, after, start, rtol, atol)["passed"]


@pytest.mark.parametrize("fault", ["no reduction", "wrong divisor", "stale bucket"])
def test_agreement_fails_what_a_broken_all_reduce_does(fault):
    start, update, after = _models()
    g = torch.Generator().manual_seed(1)
    if fault == "no reduction":  # this rank kept its own gradient: the update differs by the same order
        wrong = [s + u + 0.01 * torch.randn(u.shape, generator=g) for s, u in zip(start, update)]
    elif fault == "wrong divisor":  # summed, not averaged, over 2 ranks
        wrong = [s + 2 * u for s, u in zip(start, update)]
    else:  # the last tensor's bucket never arrived
        wrong = [after[0], start[1]]
    verdict = agreement(wrong, after, start, *TOLERANCE[torch.float32])
    assert not verdict["passed"] and verdict["worst_vs_tolerance"] > 5


def test_presets_are_what_the_report_says():
    assert list(PRESETS) == ["mlp", "wide-mlp", "transformer"] and TARGET == ("wide-mlp", 1.5)
    wide = PRESETS["wide-mlp"]
    assert wide.batch == 8 and wide.spec.describe() == "MLP 256→2048→2048→2048→10"
    assert count_parameters(build(wide.spec, 0)) == 8_939_530  # Ψ ≈ 8.9 M: 36 MiB of float32 gradients
    assert PRESETS["mlp"].spec.describe() == "MLP 256→1024→1024→10" and PRESETS["mlp"].batch == 256
    assert PRESETS["transformer"].spec.kind == "transformer" and PRESETS["transformer"].batch == 16
