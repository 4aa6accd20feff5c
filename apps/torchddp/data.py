"""Synthetic data labelled by a fixed random teacher, and the split of a global batch over ranks.

Every batch is a pure function of ``(seed, stream)``: step s of training reads
stream s, the held-out evaluation set reads stream ``"eval"``. So every rank
makes the same global batch and takes its own block of it (:func:`apps.blocks.block`), the
single-process reference of ``--check`` makes the same batch whole, and a
resumed run reads exactly the batches the interrupted one would have: there is
no data-loader state to save.

The teacher is a random network drawn once from :data:`TEACHER_SEED`, the same
for every run, so a student's accuracy says how much of it was learned:

* ``mlp``: x ~ N(0, 1)^features; label = argmax(tanh(x·W₁)·W₂), W₁ features×64;
* ``transformer``: tokens uniform in [0, vocab)^seq; label = argmax(mean over
  positions of E[token]·W), E vocab×16 (a bag-of-tokens teacher: the order of
  tokens does not matter, their counts do).

Labels are computed in float64 from float64 inputs; the inputs are then cast to
the training dtype, so float32 and float64 runs see the same labels.
"""

from __future__ import annotations

import hashlib

import torch

from .models import ModelSpec

__all__ = ["TEACHER_SEED", "Teacher", "stream_seed"]

#: The teacher's weights come from this seed in every run (``--seed`` moves the samples, not the teacher).
TEACHER_SEED = 20240611
_TEACHER_WIDTH = 64
_EMBEDDING_WIDTH = 16


def stream_seed(seed: int, stream: int | str) -> int:
    """A 63-bit generator seed for one stream of one run (a hash: streams of different seeds never collide)."""
    digest = hashlib.sha256(f"apps.torchddp/{seed}/{stream}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


class Teacher:
    """Labelled batches for *spec*'s kind of model: ``teacher.batch(stream, n, dtype) -> (inputs, labels)``."""

    def __init__(self, spec: ModelSpec, seed: int):
        self.spec, self.seed = spec, seed
        g = torch.Generator().manual_seed(TEACHER_SEED)
        if spec.kind == "mlp":
            w1 = torch.randn(spec.features, _TEACHER_WIDTH, generator=g, dtype=torch.float64)
            self.w1 = w1 / spec.features ** 0.5
            self.w2 = torch.randn(_TEACHER_WIDTH, spec.classes, generator=g, dtype=torch.float64)
        else:
            self.embedding = torch.randn(spec.vocab, _EMBEDDING_WIDTH, generator=g, dtype=torch.float64)
            self.w = torch.randn(_EMBEDDING_WIDTH, spec.classes, generator=g, dtype=torch.float64)

    def batch(self, stream: int | str, n: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """*n* samples of stream *stream*: float inputs in *dtype* (mlp) or int64 tokens (transformer), int64 labels."""
        g = torch.Generator().manual_seed(stream_seed(self.seed, stream))
        spec = self.spec
        if spec.kind == "mlp":
            x = torch.randn(n, spec.features, generator=g, dtype=torch.float64)
            y = (torch.tanh(x @ self.w1) @ self.w2).argmax(dim=1)
            return x.to(dtype), y
        tokens = torch.randint(0, spec.vocab, (n, spec.seq), generator=g)
        y = (self.embedding[tokens].mean(dim=1) @ self.w).argmax(dim=1)
        return tokens, y
