"""The summary's lines that explain a figure: which kernel runs nearer the memory bound where the NumPy one ran, and
why a parallel efficiency can read above 100 %."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import kernels
from apps.stencil import __main__ as stencil
from apps.stencil.solver import Result

pytestmark = pytest.mark.serial  # no MPI: the serial pass runs it


def _result(kernel: str, efficiency: float | None) -> SimpleNamespace:
    verdict = SimpleNamespace(passed=True, what="exact", error=0.0, tolerance=1e-12)
    fields = dict.fromkeys(Result.__dataclass_fields__)
    fields.update(iterations=10, start_iteration=0, stopped="--iters", residual=None, seconds=1.0,
                  checkpoint_seconds=0.0, mlups=100.0, flops_per_point=7, gbs=2.4, bytes_per_point=24,
                  stream_gbs=24.0, bound_fraction=0.1, efficiency=efficiency, ranks=2, verdict=verdict,
                  digest="0" * 16, kernel=kernel)
    return SimpleNamespace(**fields)


def _lines(res) -> list[str]:
    lines: list[str] = []
    stencil.report(res, lines.append)
    return lines


@pytest.mark.parametrize("compiled", [False, True])
def test_the_numpy_kernel_says_which_kernel_is_faster_and_how_to_get_it(monkeypatch, compiled):
    reason = "numba is not installed: pip install -e '.[compiled]' (or pip install numba)"
    monkeypatch.setattr(kernels, "available", lambda path: (True, "numba") if compiled else (False, reason))
    lines = _lines(_result("numpy", None))
    hint = lines[lines.index(next(x for x in lines if x.startswith("memory bound"))) + 1].strip()
    if compiled:
        assert hint == "kernel numpy: --kernel compiled (numba, one pass over memory) runs nearer the bound"
    else:
        assert hint.startswith("kernel numpy (several passes over memory)") and hint.endswith(reason)


def test_the_compiled_kernel_needs_no_hint():
    assert not any("kernel numpy" in line for line in _lines(_result("compiled", 0.9)))


@pytest.mark.parametrize("efficiency, explained", [(0.8, False), (1.0, False), (1.14, True)])
def test_an_efficiency_above_100_percent_is_explained(efficiency, explained):
    lines = _lines(_result("compiled", efficiency))
    at = next(i for i, line in enumerate(lines) if line.startswith("parallel eff."))
    assert lines[at].startswith(f"parallel eff.   {efficiency:.0%} ")
    assert lines[at + 1].strip().startswith("above 100 %: the loop ran faster than the update alone") == explained
