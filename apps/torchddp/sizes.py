"""What a ``train`` run needs in memory per rank, estimated from its options before anything is allocated.

No PyTorch here (the estimate is arithmetic on the options), so it is checked
- and tested - where PyTorch is not installed too. :func:`check` refuses a run
that cannot fit with :class:`apps.memory.MemoryNeedError` on every rank (see
:mod:`apps.memory`).

Per rank, a step allocates: the model (parameters, gradients, DDP's buckets,
the optimizer's state), the *whole* global batch - every rank makes it from
``(seed, step)`` and takes its block, so it grows with ``--batch`` whatever the
rank count: float64 inputs, the teacher's hidden layer and logits, the inputs
in the training dtype - and the activations autograd keeps for this rank's
block. The held-out evaluation makes its ``--eval`` samples the same way, and
``--check`` trains the whole batch in float64 on rank 0.
"""

from __future__ import annotations

from typing import Any

__all__ = ["memory_need", "check"]

_ITEMSIZE = {"float32": 4, "float64": 8}
_TEACHER_WIDTH = 64  # apps.torchddp.data's teacher: features → 64 → classes
_EMBEDDING_WIDTH = 16


def _model(spec: Any) -> tuple[int, int, int]:
    """(parameters, activation values kept per sample, float64 values the teacher makes per sample)."""
    c = spec.classes
    if spec.kind == "mlp":
        widths = [spec.features, *spec.hidden, c]
        params = sum(a * b + b for a, b in zip(widths, widths[1:]))
        return params, spec.features + 2 * sum(spec.hidden) + 2 * c, spec.features + 2 * _TEACHER_WIDTH + c + 1
    d, ff, seq, layers, heads = spec.d_model, spec.ff, spec.seq, spec.layers, spec.heads
    per_layer = 4 * d * d + 4 * d + 2 * d * ff + ff + d + 4 * d
    params = spec.vocab * d + seq * d + layers * per_layer + 2 * d + d * c + c
    kept = seq * (layers * (8 * d + 2 * ff + 2 * heads * seq) + 4 * d) + 3 * c
    return params, kept, seq * (1 + _EMBEDDING_WIDTH) + _EMBEDDING_WIDTH + c + 2


def memory_need(cfg: Any, ranks: int) -> int:
    """About the bytes the busiest rank allocates for a ``train`` run of *cfg* on *ranks* ranks."""
    itemsize = _ITEMSIZE.get(cfg.dtype, 8)
    params, kept, teacher = _model(cfg.spec)
    states = 1 if cfg.optimizer == "sgd" and cfg.momentum > 0 else (0 if cfg.optimizer == "sgd" else 2)
    model = params * itemsize * (3 + states)
    inputs = cfg.spec.features * itemsize if cfg.spec.kind == "mlp" else cfg.spec.seq * 8  # floats, or int64 tokens

    def batch(n: int, block: int, kept_bytes: int) -> int:
        """Making *n* samples (float64), then holding them while this rank's *block* runs."""
        return max(n * teacher * 8, n * (inputs + 8) + block * kept_bytes)

    step = batch(cfg.batch, -(-cfg.batch // max(ranks, 1)), kept * itemsize)
    evaluate = batch(cfg.eval_samples, -(-cfg.eval_samples // max(ranks, 1)), kept * itemsize // 2)  # no_grad
    check = params * 8 * (3 + states) + batch(cfg.batch, cfg.batch, kept * 8) if cfg.check else 0
    return model + max(step, evaluate) + check


def check(comm: Any, cfg: Any, ranks: int) -> None:
    """Refuse, on every rank of *comm*, a run that cannot fit the memory available (collective)."""
    from apps import memory

    spec = cfg.spec
    knobs = [memory.Knob("--batch", cfg.batch, low=ranks), memory.Knob("--eval-samples", cfg.eval_samples)]
    fields = {"--batch": "batch", "--eval-samples": "eval_samples"}
    sizes = {}
    if spec.kind == "mlp":
        knobs.append(memory.Knob("--features", spec.features))
        sizes["--features"] = "features"
        if spec.hidden:
            knobs.append(memory.Knob("--hidden", max(spec.hidden), shown=",".join(map(str, spec.hidden)),
                                     template="--hidden widths <= {value}"))
    else:
        for option, name in (("--vocab", "vocab"), ("--seq", "seq"), ("--d-model", "d_model"), ("--ff", "ff"),
                             ("--layers", "layers")):
            low = spec.heads if name == "d_model" else 1
            if getattr(spec, name) > low:
                knobs.append(memory.Knob(option, getattr(spec, name), low=low))
                sizes[option] = name

    def need(v: dict[str, int]) -> int:
        changed = {name: v[option] for option, name in sizes.items()}
        if "d_model" in changed:
            changed["d_model"] -= changed["d_model"] % spec.heads
        if "--hidden" in v:
            changed["hidden"] = tuple(min(h, v["--hidden"]) for h in spec.hidden)
        new_spec = _Spec(spec, changed)
        return memory_need(_Cfg(cfg, {f: v[o] for o, f in fields.items()}, new_spec), ranks)

    memory.check(comm, need, knobs, otherwise="spread the run over more nodes")


class _Spec:
    """*spec* with some fields replaced: a plain view (a new ModelSpec would validate every candidate size)."""

    def __init__(self, spec: Any, changed: dict[str, Any]):
        self._spec, self._changed = spec, changed

    def __getattr__(self, name: str) -> Any:
        return self._changed[name] if name in self._changed else getattr(self._spec, name)


class _Cfg(_Spec):
    """*cfg* with some fields and its spec replaced."""

    def __init__(self, cfg: Any, changed: dict[str, Any], spec: Any):
        super().__init__(cfg, {**changed, "spec": spec})

