"""The two models: an MLP, and a small ``torch.nn.TransformerEncoder`` classifier over token sequences.

:class:`ModelSpec` names one model and its sizes; :func:`build` makes it with
every parameter drawn from ``torch.manual_seed(seed)``, so any rank (and the
single-process reference of ``--check``) that builds the same spec with the
same seed holds the same initial parameters, bit for bit, in float32 and in
float64 (the float32 initial values, widened).

Neither model has dropout or buffers: a step is a pure function of the
parameters, the optimizer state and the batch, which is what makes ``--check``
and a bit-identical ``--restart`` possible.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["MODELS", "ModelSpec", "MLP", "TransformerClassifier", "build", "count_parameters"]

#: The ``--model`` choices.
MODELS = ("mlp", "transformer")


@dataclass(frozen=True)
class ModelSpec:
    """A model and its sizes (the fields of the other kind are ignored)."""

    kind: str = "mlp"
    classes: int = 10
    # mlp: input features and hidden widths
    features: int = 32
    hidden: tuple[int, ...] = (256, 256)
    # transformer: vocabulary, sequence length, width, heads, layers, feed-forward width
    vocab: int = 256
    seq: int = 32
    d_model: int = 64
    heads: int = 4
    layers: int = 2
    ff: int = 256

    def __post_init__(self) -> None:
        if self.kind not in MODELS:
            raise ValueError(f"model {self.kind!r}: choose one of {', '.join(MODELS)}")
        sizes = {"classes": self.classes, "features": self.features, "vocab": self.vocab, "seq": self.seq,
                 "d-model": self.d_model, "heads": self.heads, "layers": self.layers, "ff": self.ff}
        for name, value in sizes.items():
            if value < 1:
                raise ValueError(f"--{name} {value}: must be >= 1")
        if self.classes < 2:
            raise ValueError(f"--classes {self.classes}: a classifier needs at least 2 classes")
        if not self.hidden or min(self.hidden) < 1:
            widths = ",".join(map(str, self.hidden)) or "(none)"
            raise ValueError(f"--hidden {widths}: give at least one width, each >= 1")
        if self.kind == "transformer" and self.d_model % self.heads:
            raise ValueError(f"--d-model {self.d_model} is not a multiple of --heads {self.heads}: each head gets "
                             f"d_model / heads features; pick, e.g., --heads {_divisor(self.d_model, self.heads)}")

    def describe(self) -> str:
        """One line: ``MLP 32→256→256→10``, or ``Transformer 2 layers (d 64, 4 heads, ff 256), seq 32, …``."""
        if self.kind == "mlp":
            return "MLP " + "→".join(map(str, (self.features, *self.hidden, self.classes)))
        layers = f"{self.layers} layer{'s' if self.layers != 1 else ''}"
        return (f"Transformer {layers} (d {self.d_model}, {self.heads} heads, ff {self.ff}), seq {self.seq}, "
                f"vocab {self.vocab}, {self.classes} classes")

    def identity(self) -> dict:
        """The fields that define this kind of model (what a checkpoint must agree on)."""
        common = {"model": self.kind, "classes": self.classes}
        if self.kind == "mlp":
            return {**common, "features": self.features, "hidden": ",".join(map(str, self.hidden))}
        return {**common, "vocab": self.vocab, "seq": self.seq, "d_model": self.d_model, "heads": self.heads,
                "layers": self.layers, "ff": self.ff}


def _divisor(n: int, near: int) -> int:
    """The divisor of *n* closest to *near* (for the error message's suggestion)."""
    return min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: (abs(d - near), d))


class MLP(nn.Sequential):
    """Linear layers with ReLUs between them: features → hidden… → classes."""

    def __init__(self, features: int, hidden: tuple[int, ...], classes: int):
        widths = (features, *hidden, classes)
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(widths, widths[1:])):
            layers.append(nn.Linear(a, b))
            if i < len(widths) - 2:
                layers.append(nn.ReLU())
        super().__init__(*layers)


class TransformerClassifier(nn.Module):
    """Token and position embeddings, a pre-norm ``TransformerEncoder`` (no dropout), mean pooling, a linear head."""

    def __init__(self, vocab: int, seq: int, d_model: int, heads: int, layers: int, ff: int, classes: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.position = nn.Parameter(torch.randn(seq, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(d_model, heads, ff, dropout=0.0, batch_first=True, norm_first=True)
        # enable_nested_tensor=False: the nested-tensor fast path needs post-norm layers, and only runs in inference.
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.position[: tokens.shape[1]]
        return self.head(self.norm(self.encoder(h).mean(dim=1)))


def build(spec: ModelSpec, seed: int, dtype: torch.dtype = torch.float32) -> nn.Module:
    """*spec*'s model, initialised from ``torch.manual_seed(seed)`` (the same on every process), in *dtype*."""
    with torch.random.fork_rng(devices=[]):  # leave the caller's random state as it was
        torch.manual_seed(seed)
        if spec.kind == "mlp":
            model: nn.Module = MLP(spec.features, spec.hidden, spec.classes)
        else:
            model = TransformerClassifier(spec.vocab, spec.seq, spec.d_model, spec.heads, spec.layers, spec.ff,
                                          spec.classes)
    return model.to(dtype)


def count_parameters(model: nn.Module) -> int:
    """Ψ: the number of parameter elements (what DDP all-reduces every step)."""
    return sum(p.numel() for p in model.parameters())
