"""apps.torchddp.data: batches that depend on (seed, stream) alone."""

from __future__ import annotations

import pytest

from tests.apps.torchddp import NO_TORCH

torch = pytest.importorskip("torch", reason=NO_TORCH)

from apps.torchddp.data import Teacher, stream_seed  # noqa: E402
from apps.torchddp.models import ModelSpec  # noqa: E402

pytestmark = pytest.mark.serial


@pytest.mark.parametrize("kind", ["mlp", "transformer"])
def test_a_stream_is_the_same_batch_every_time_and_streams_differ(kind):
    spec = ModelSpec(kind, features=8, vocab=50, seq=6)
    a, b = Teacher(spec, 0), Teacher(spec, 0)
    x1, y1 = a.batch(3, 16)
    x2, y2 = b.batch(3, 16)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    x3, _ = a.batch(4, 16)
    x4, _ = Teacher(spec, 1).batch(3, 16)
    assert not torch.equal(x1, x3) and not torch.equal(x1, x4)
    assert y1.dtype == torch.int64 and int(y1.min()) >= 0 and int(y1.max()) < spec.classes


@pytest.mark.parametrize("kind", ["mlp", "transformer"])
def test_labels_use_many_classes_and_do_not_depend_on_the_dtype(kind):
    spec = ModelSpec(kind, features=16, vocab=100, seq=12)
    teacher = Teacher(spec, 0)
    x32, y32 = teacher.batch("eval", 2000, torch.float32)
    x64, y64 = teacher.batch("eval", 2000, torch.float64)
    assert torch.equal(y32, y64)
    counts = torch.bincount(y32, minlength=spec.classes)
    assert int((counts > 0).sum()) >= spec.classes // 2, counts  # the teacher is not degenerate
    if kind == "mlp":
        assert x32.dtype == torch.float32 and x64.dtype == torch.float64
    else:
        assert x32.dtype == torch.int64 and int(x32.max()) < spec.vocab


def test_stream_seeds_are_distinct_and_fit_a_generator():
    seeds = {stream_seed(s, i) for s in range(3) for i in [*range(50), "eval"]}
    assert len(seeds) == 3 * 51
    assert all(0 <= s < 2 ** 63 for s in seeds)
