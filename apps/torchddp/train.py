"""The training loop: DistributedDataParallel on the default process group, as a PyTorch user writes it.

Per step s (every rank)::

    x, y = teacher.batch(s, B)[slice(*block(B, p, rank))]     # the same global batch everywhere, this rank's block
    loss = cross_entropy(ddp(x), y, reduction="sum") * p / B
    loss.backward()                                   # DDP all-reduces gradient buckets (sum / p) as they fill
    optimizer.step()

Why ``sum · p / B`` and not the mean over the rank's block: DDP averages the
ranks' gradients, so each rank's loss must be its block's share of the global
batch's mean, times p. Then the update is exactly (up to summation order) the
one a single process makes on the whole batch with ``cross_entropy(..., "mean")``
— also when B is not a multiple of p and the blocks differ by one sample.
``--check`` trains that single process on rank 0 (float64, same seed, same
batches) and compares the parameters.

Metrics: each rank sums its samples' losses and correct predictions; every
``--progress-every`` steps one small all-reduce turns them into the global batch's
loss and accuracy for the progress line (rank 0, stderr). At the end the model
is evaluated on a held-out stream of the same teacher.

Checkpoints (``--checkpoint-every K``): rank 0 writes model and optimizer state
(:mod:`apps.torchddp.checkpoint`) into ``--checkpoint-dir`` every K steps and
at the end, keeping the newest ``--keep``; on ``--restart`` it reads the newest
one that verifies, and broadcasts it; every verdict is broadcast too
(:func:`apps.agree.from_root`), so a foreign or unwritable checkpoint stops
every rank with the same message. Batches depend on the step alone and the models have no
dropout, so a resumed run repeats the interrupted one's arithmetic exactly.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from apps.blocks import block
from mpicomm import cli

from . import checkpoint
from .checkpoint import CheckpointError
from .data import Teacher
from .models import ModelSpec, build, count_parameters

__all__ = ["Config", "Report", "OPTIMIZERS", "DTYPES", "DEFAULT_LR", "RTOL", "ATOL", "make_optimizer", "train_step",
           "train", "reference_parameters", "compare", "digest"]

OPTIMIZERS = ("adamw", "sgd")
DTYPES = {"float32": torch.float32, "float64": torch.float64}
#: The learning rate when ``--lr`` is not given.
DEFAULT_LR = {"adamw": 1e-3, "sgd": 0.05}
#: ``--check``'s tolerance (float64), per tensor: max |distributed − single| ≤ ATOL + RTOL · max |single|.
#: Summing in another order changes float64 results by ~1e-16 relative per operation, and training carries
#: that along (2.5e-12 after 200 AdamW steps of the default transformer, whose tensors are of order 0.1-1);
#: a real fault - a sample lost or counted twice, a wrong average - moves parameters by 1e-4 and more.
RTOL, ATOL = 1e-8, 1e-12


@dataclass
class Config:
    """One training run (the ``train`` options)."""

    spec: ModelSpec = field(default_factory=ModelSpec)
    backend: str = "mpicomm"
    steps: int = 200
    batch: int = 64
    optimizer: str = "adamw"
    lr: float | None = None  # None: DEFAULT_LR[optimizer]
    momentum: float = 0.9
    weight_decay: float = 0.0
    bucket_mb: float = 25.0
    dtype: str = "float32"
    seed: int = 0
    eval_samples: int = 1024
    check: bool = False
    checkpoint_dir: str = "checkpoints/torchddp"
    checkpoint_every: int = 0  # 0: never
    keep: int = 2
    restart: bool = False
    log_every: int | None = None  # None: about ten progress lines
    progress: bool = True

    @property
    def learning_rate(self) -> float:
        return DEFAULT_LR[self.optimizer] if self.lr is None else self.lr

    def identity(self) -> dict[str, Any]:
        """What a checkpoint must agree on to continue this run (sizes, data, optimizer, precision)."""
        out = {**self.spec.identity(), "batch": self.batch, "seed": self.seed, "dtype": self.dtype,
               "optimizer": self.optimizer, "lr": self.learning_rate, "weight_decay": self.weight_decay}
        if self.optimizer == "sgd":
            out["momentum"] = self.momentum
        return out


@dataclass
class Report:
    """What a run did (rank 0's numbers are the global ones)."""

    parameters: int
    start_step: int
    steps: int
    seconds: float
    steps_per_s: float
    samples_per_s: float
    train_loss: float
    train_accuracy: float
    eval_loss: float
    eval_accuracy: float
    digest: str
    checkpoint: str | None = None
    check: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    #: one row per progress line: step, seconds (training only), train_loss and train_accuracy of the interval
    history: list[dict[str, float]] = field(default_factory=list)


def make_optimizer(params: Any, cfg: Config) -> torch.optim.Optimizer:
    """``--optimizer``: AdamW, or SGD with momentum (PyTorch's own)."""
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.learning_rate, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    return torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)


def digest(model: torch.nn.Module) -> str:
    """SHA-256 of the parameters' bytes, in order (equal digests: bit-identical models)."""
    sha = hashlib.sha256()
    for p in model.parameters():
        sha.update(p.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return sha.hexdigest()[:32]


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
          scale: float) -> tuple[float, int]:
    """One optimizer step on ``scale · Σ cross-entropy``; this block's loss sum and correct count."""
    opt.zero_grad(set_to_none=True)
    out = model(x)
    total = F.cross_entropy(out, y, reduction="sum")
    (total * scale).backward()
    opt.step()
    return total.item(), int((out.detach().argmax(dim=1) == y).sum())


def _global(values: list[float]) -> list[float]:
    """Sums over every rank (one all-reduce on the default group)."""
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t)
    return t.tolist()


@torch.no_grad()
def _evaluate(model: torch.nn.Module, teacher: Teacher, n: int, dtype: torch.dtype, rank: int,
              p: int) -> tuple[float, float]:
    """Loss and accuracy on *n* held-out samples, each rank scoring its block."""
    x, y = teacher.batch("eval", n, dtype)
    mine = slice(*block(n, p, rank))
    out = model(x[mine])
    loss, correct, count = _global([F.cross_entropy(out, y[mine], reduction="sum").item(),
                                    float((out.argmax(dim=1) == y[mine]).sum()), float(y[mine].numel())])
    return loss / count, correct / count


def _share(make: Callable[[], Any], where: str) -> Any:
    """``make()`` on rank 0, its value on every rank - or the error it raised, on every rank: one broadcast."""
    from mpi4py import MPI

    from apps.agree import from_root

    return from_root(MPI.COMM_WORLD, make, CheckpointError, (OSError,), where)


def _checkpointing(cfg: Config) -> bool:
    return bool(cfg.checkpoint_every or cfg.restart)


def _prepare_directory(directory: str) -> None:
    """Every rank can create and write files in *directory*, checked when the run starts, not at its first
    checkpoint; CheckpointError on every rank otherwise (collective over the MPI job, which is the group's)."""
    from mpi4py import MPI

    from apps import checkpoint as shared

    try:
        shared.prepare_directory(MPI.COMM_WORLD, directory)
    except shared.CheckpointError as exc:
        raise CheckpointError(str(exc)) from None


def _open_checkpoint(cfg: Config) -> tuple[tuple[dict, bytes, str] | None, list[str]]:
    """The checkpoint to resume (header, payload, path), or None for a fresh start, and why newer ones were refused
    (damaged); a foreign checkpoint, or a fresh run in a directory that holds checkpoints, raises on every rank."""
    directory = cfg.checkpoint_dir

    def look() -> tuple[tuple[dict, bytes, str] | None, list[str]]:
        os.makedirs(directory, exist_ok=True)
        if not cfg.restart:
            found = checkpoint.steps(directory)
            if found:
                raise CheckpointError(f"--checkpoint-dir {directory} already holds checkpoints (newest: step "
                                      f"{found[0]}); add --restart to continue them, or choose another directory")
            return None, []
        resumed, refused = checkpoint.newest(directory)
        if resumed is not None:
            header, _, path = resumed
            why = checkpoint.mismatch(path, header.get("identity", {}), cfg.identity())
            if why:
                raise CheckpointError(why)
        return resumed, refused

    return _share(look, f"--checkpoint-dir {directory}")


def _save(cfg: Config, p: int, model: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> str:
    """Rank 0 writes the checkpoint of *step* (and prunes to ``--keep``); every rank learns its path (or the error)."""
    def write() -> str:
        payload = checkpoint.dump_payload({"model": model.state_dict(), "optimizer": opt.state_dict()})
        header = {"step": step, "ranks": p, "backend": cfg.backend, "identity": cfg.identity(),
                  "torch": torch.__version__}
        return checkpoint.write(cfg.checkpoint_dir, header, payload, keep=cfg.keep)

    return _share(write, f"--checkpoint-dir {cfg.checkpoint_dir}: writing the checkpoint of step {step}")


def train(cfg: Config, say: Callable[[str], None]) -> Report:
    """Train on the default process group (already initialised); every rank returns the same report."""
    rank, p = dist.get_rank(), dist.get_world_size()
    dtype = DTYPES[cfg.dtype]
    model = build(cfg.spec, cfg.seed, dtype)
    notes: list[str] = []
    start = 0
    if _checkpointing(cfg):
        _prepare_directory(cfg.checkpoint_dir)
    resume, refused = _open_checkpoint(cfg) if _checkpointing(cfg) else (None, [])
    notes += [f"refused checkpoint: {why}" for why in refused]
    state = None
    if resume is not None:
        header, payload, path = resume
        state = checkpoint.load_payload(payload)
        model.load_state_dict(state["model"])
        start = header["step"]
        if start > cfg.steps:
            raise ValueError(f"--steps {cfg.steps}: the checkpoint in {cfg.checkpoint_dir} is already at step {start}; "
                             f"ask for --steps {start} or more")
        notes.append(f"resumed from step {start} ({path})")
        if header.get("ranks") != p:
            notes.append(f"the checkpoint was written on {header.get('ranks')} ranks, this run has {p}: the result "
                         f"equals the uninterrupted run's up to summation order, not bit for bit")
    elif cfg.restart:
        notes.append(f"no checkpoint in {cfg.checkpoint_dir} yet: starting at step 0")
    for note in notes:
        say(note)

    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cfg.bucket_mb)
    opt = make_optimizer(ddp.parameters(), cfg)
    if state is not None:
        opt.load_state_dict(state["optimizer"])
    teacher = Teacher(cfg.spec, cfg.seed)
    mine = slice(*block(cfg.batch, p, rank))
    scale = p / cfg.batch
    todo = cfg.steps - start
    every = cfg.log_every or max(1, todo // 10)
    every_ck = cfg.checkpoint_every
    progress = cli.Progress(todo, "torchddp train", show=rank == 0 and cfg.progress)
    window = [0.0, 0.0, 0.0]  # loss sum, correct, samples since the last progress line
    last = (float("nan"), float("nan"))
    saved: str | None = None
    paused = 0.0  # seconds spent writing checkpoints (not training)
    begin = time.perf_counter()
    mark, marked = begin, start
    history: list[dict[str, float]] = []
    for step in range(start, cfg.steps):
        x, y = teacher.batch(step, cfg.batch, dtype)
        loss, correct = train_step(ddp, opt, x[mine], y[mine], scale)
        window = [window[0] + loss, window[1] + correct, window[2] + len(y[mine])]
        done = step + 1
        if done % every == 0 or done == cfg.steps:
            total, right, count = _global(window)
            last = (total / count, right / count)
            now = time.perf_counter()
            rate = (done - marked) * cfg.batch / max(now - mark, 1e-12)
            where = f"step {done}  " if start else ""  # a resumed run's [i/N] counts this run's steps
            progress.step(f"{where}loss {last[0]:.4f}  acc {last[1]:.3f}  {rate:,.0f} samples/s", steps=done - marked)
            history.append({"step": done, "seconds": now - begin - paused, "train_loss": last[0],
                            "train_accuracy": last[1]})
            window, mark, marked = [0.0, 0.0, 0.0], now, done
        if every_ck and (done % every_ck == 0 or done == cfg.steps):
            t = time.perf_counter()
            saved = _save(cfg, p, model, opt, done)
            paused += time.perf_counter() - t
    seconds = max(time.perf_counter() - begin - paused, 1e-12)
    if resume is not None and saved is None:  # nothing left to train: the checkpoint is already the final state
        saved = resume[2]
    eval_loss, eval_accuracy = _evaluate(model, teacher, cfg.eval_samples, dtype, rank, p)
    report = Report(parameters=count_parameters(model), start_step=start, steps=cfg.steps, seconds=seconds,
                    steps_per_s=todo / seconds, samples_per_s=todo * cfg.batch / seconds, train_loss=last[0],
                    train_accuracy=last[1], eval_loss=eval_loss, eval_accuracy=eval_accuracy, digest=digest(model),
                    checkpoint=saved, notes=notes, history=history)
    if cfg.check:
        report.check = _check(cfg, model, rank)
    return report


def reference_parameters(cfg: Config) -> list[torch.Tensor]:
    """One process, the whole global batch each step, the mean loss, float64: the parameters after ``cfg.steps``."""
    model = build(cfg.spec, cfg.seed, torch.float64)
    opt = make_optimizer(model.parameters(), cfg)
    teacher = Teacher(cfg.spec, cfg.seed)
    for step in range(cfg.steps):
        x, y = teacher.batch(step, cfg.batch, torch.float64)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return [q.detach() for q in model.parameters()]


def compare(got: list[torch.Tensor], expected: list[torch.Tensor], rtol: float = RTOL,
            atol: float = ATOL) -> dict[str, Any]:
    """``passed`` when, tensor by tensor, max |got − expected| ≤ atol + rtol · max |expected|; the largest gaps.

    The bound scales with each tensor's magnitude, not each element's: an element
    that happens to be near zero carries the rounding of its whole tensor's sums.
    """
    if len(got) != len(expected) or any(a.shape != b.shape for a, b in zip(got, expected)):
        return {"passed": False, "reason": "different parameter shapes", "tensors": len(expected)}
    max_abs, worst = 0.0, 0.0
    for a, b in zip(got, expected):
        if not b.numel():
            continue
        diff = float((a.detach().to(torch.float64) - b.detach().to(torch.float64)).abs().max())
        max_abs = max(max_abs, diff)
        worst = max(worst, diff / (atol + rtol * float(b.detach().abs().max())))
    return {"passed": worst <= 1.0, "max_abs_diff": max_abs, "worst_vs_tolerance": worst, "tensors": len(expected),
            "rtol": rtol, "atol": atol}


def _check(cfg: Config, model: torch.nn.Module, rank: int) -> dict[str, Any]:
    """Rank 0 trains the single-process reference and compares; every rank gets the verdict."""
    verdict: list[Any] = [None]
    if rank == 0:
        verdict[0] = compare(list(model.parameters()), reference_parameters(cfg))
    dist.broadcast_object_list(verdict, src=0)
    return verdict[0]
