"""apps.torchddp.train without MPI: the --check comparison, the reference, the checkpoint identity."""

from __future__ import annotations

import pytest

from tests.apps.torchddp import NO_TORCH

torch = pytest.importorskip("torch", reason=NO_TORCH)

from apps.torchddp.models import ModelSpec  # noqa: E402
from apps.torchddp.train import RTOL, Config, compare, reference_parameters  # noqa: E402

pytestmark = pytest.mark.serial


def test_compare_passes_rounding_and_fails_a_real_difference():
    b = [torch.tensor([1.0, -0.5, 1e-12], dtype=torch.float64), torch.tensor([[2.0]], dtype=torch.float64)]
    rounding = [b[0] + torch.tensor([1e-15, 0, 3e-12], dtype=torch.float64), b[1].clone()]
    verdict = compare(rounding, b)
    assert verdict["passed"] and verdict["max_abs_diff"] == pytest.approx(3e-12) and verdict["tensors"] == 2
    fault = [b[0] * (1 + 1e-4), b[1]]  # e.g. one sample of 10 000 counted twice
    verdict = compare(fault, b)
    assert not verdict["passed"] and verdict["worst_vs_tolerance"] > 1e3
    assert compare([b[0]], b) == {"passed": False, "reason": "different parameter shapes", "tensors": 2}
    assert RTOL <= 1e-7  # far below what a fault does, far above float64 summation-order noise


def _cfg(**kw) -> Config:
    settings = {"spec": ModelSpec("mlp", features=6, hidden=(12,), classes=3), "steps": 3, "batch": 10,
                "dtype": "float64", **kw}
    return Config(**settings)


def test_the_reference_is_deterministic_and_depends_on_the_data():
    a, b = reference_parameters(_cfg()), reference_parameters(_cfg())
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    c = reference_parameters(_cfg(seed=1))
    assert not all(torch.equal(x, y) for x, y in zip(a, c))
    assert not compare(a, c)["passed"]


def test_the_checkpoint_identity_holds_what_changes_the_arithmetic():
    base = _cfg().identity()
    assert base == {"model": "mlp", "classes": 3, "features": 6, "hidden": "12", "batch": 10, "seed": 0,
                    "dtype": "float64", "optimizer": "adamw", "lr": 1e-3, "weight_decay": 0.0}
    assert _cfg(optimizer="sgd").identity()["momentum"] == 0.9
    # what does not change the arithmetic may change between runs
    assert _cfg(steps=99, bucket_mb=1, backend="gloo", log_every=3).identity() == base
