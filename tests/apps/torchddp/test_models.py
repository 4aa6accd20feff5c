"""apps.torchddp.models: the same seed gives the same parameters anywhere; sizes are checked with a fix."""

from __future__ import annotations

import pytest

from tests.apps.torchddp import NO_TORCH

torch = pytest.importorskip("torch", reason=NO_TORCH)

from apps.torchddp.models import ModelSpec, build, count_parameters  # noqa: E402

pytestmark = pytest.mark.serial

SPECS = [ModelSpec("mlp", features=8, hidden=(16, 12), classes=3),
         ModelSpec("transformer", vocab=30, seq=5, d_model=8, heads=2, layers=2, ff=16, classes=4)]


@pytest.mark.parametrize("spec", SPECS, ids=["mlp", "transformer"])
def test_same_seed_same_parameters_in_both_dtypes_and_the_caller_rng_is_untouched(spec):
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = build(spec, 7)
    after = torch.rand(1)
    assert torch.equal(before, after)  # build() left the global generator alone
    b = build(spec, 7, torch.float64)
    c = build(spec, 8)
    pa, pb, pc = list(a.parameters()), list(b.parameters()), list(c.parameters())
    assert all(torch.equal(x.double(), y) for x, y in zip(pa, pb))
    assert not all(torch.equal(x, y) for x, y in zip(pa, pc))
    assert all(y.dtype == torch.float64 for y in pb)


@pytest.mark.parametrize("spec", SPECS, ids=["mlp", "transformer"])
def test_outputs_have_one_logit_per_class(spec):
    model = build(spec, 0)
    x = torch.randn(3, spec.features) if spec.kind == "mlp" else torch.randint(0, spec.vocab, (3, spec.seq))
    assert model(x).shape == (3, spec.classes)
    assert count_parameters(model) == sum(p.numel() for p in model.parameters()) > 0


def test_descriptions():
    assert SPECS[0].describe() == "MLP 8→16→12→3"
    assert SPECS[1].describe() == "Transformer 2 layers (d 8, 2 heads, ff 16), seq 5, vocab 30, 4 classes"
    assert ModelSpec("transformer", layers=1).describe().startswith("Transformer 1 layer (")


@pytest.mark.parametrize("kw,text", [
    (dict(kind="cnn"), "model 'cnn': choose one of mlp, transformer"),
    (dict(kind="transformer", d_model=30, heads=4), "--d-model 30 is not a multiple of --heads 4"),
    (dict(classes=1), "--classes 1: a classifier needs at least 2 classes"),
    (dict(hidden=(8, 0)), "--hidden 8,0: give at least one width, each >= 1"),
    (dict(seq=0), "--seq 0: must be >= 1"),
])
def test_bad_sizes_say_what_and_how_to_fix(kw, text):
    with pytest.raises(ValueError, match="^" + text.replace("(", r"\(").replace(")", r"\)")):
        ModelSpec(**kw)
