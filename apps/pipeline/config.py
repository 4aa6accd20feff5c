"""What a pipeline run depends on (the command line's options), checked once, and the rank layout T × S × D.

:meth:`Config.check` refuses, with a :class:`ConfigError` naming the options and
the fix, every combination that cannot run - before any rank communicates, so
every rank raises the same error. :class:`Topology` places a rank::

    rank = (d · S + s) · T + t        t: tensor rank, s: pipeline rank, d: replica

(tensor-parallel ranks adjacent, as Megatron places them on a node).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from apps import memory
from apps.agree import agree
from apps.options import BACKENDS, bind_device

from .model import ModelError, ModelSpec, block_ranges
from .offload import WINDOWS
from .schedules import SCHEDULES, ScheduleError, check_shape, equal_chunks, splits_backward, stages_of
from .stage import STRATEGIES

__all__ = ["Config", "ConfigError", "Topology", "memory_need", "check_memory", "array_module"]


class ConfigError(ValueError):
    """Options that cannot run together (the message names them and the fix); exit status 2."""


@dataclass
class Config:
    """Everything a run depends on (the command line's options)."""

    stages: int = 2
    micro: int = 8
    schedule: str = "1f1b"
    chunks: int = 1
    tensor: int = 1
    activations: str = "store"
    offload_window: str = "auto"  # auto | rma | shared: where offloaded activations are parked
    backend: str = "numpy"  # numpy | cupy: the array module of parameters, activations and messages
    balance: str = "params"  # params | time
    spec: ModelSpec = field(default_factory=ModelSpec)
    batch: int = 256
    steps: int = 20
    optimizer: str = "sgd"
    lr: float = 0.05
    dtype: str = "float64"
    seed: int = 0
    log: str | None = None
    checkpoint_every: int = 0
    checkpoint_dir: str = "checkpoints/pipeline"
    keep: int = 2
    restart: bool = False
    progress: bool = True

    def check_values(self) -> None:
        """ConfigError naming the option and the fix when the options cannot run at any rank count (the command
        line's usage errors, before MPI starts)."""
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"--schedule {self.schedule!r}: choose one of {', '.join(SCHEDULES)}")
        if self.activations not in STRATEGIES:
            raise ConfigError(f"--activations {self.activations!r}: choose one of {', '.join(STRATEGIES)}")
        if self.offload_window not in WINDOWS:
            raise ConfigError(f"--offload-window {self.offload_window!r}: choose one of {', '.join(WINDOWS)}")
        if self.backend not in BACKENDS:
            raise ConfigError(f"--backend {self.backend!r}: choose one of {', '.join(BACKENDS)}")
        if self.balance not in ("params", "time"):
            raise ConfigError(f"--balance {self.balance!r}: choose params or time")
        for name in ("stages", "micro", "chunks", "tensor", "batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"--{name} must be an integer >= 1, got {value!r}")
        for name, value, low in (("steps", self.steps, 0), ("checkpoint-every", self.checkpoint_every, 0),
                                 ("keep", self.keep, 1)):
            if value < low:
                raise ConfigError(f"--{name} must be >= {low}, got {value}")
        if not self.lr > 0:
            raise ConfigError(f"--lr must be > 0, got {self.lr:g}")
        if np.dtype(self.dtype).kind != "f":
            raise ConfigError(f"--dtype {self.dtype}: use float32 or float64")
        try:
            check_shape(self.schedule, self.stages, self.micro, self.chunks)
            self.spec.check()
            block_ranges(self.spec, self.stages * self.chunks, equal=equal_chunks(self.schedule))
        except (ScheduleError, ModelError) as exc:
            raise ConfigError(str(exc)) from None
        if self.balance == "time" and equal_chunks(self.schedule):
            raise ConfigError(f"--balance time does not apply to --schedule {self.schedule}: its chunks must hold "
                              f"equal numbers of blocks; drop --balance or use another schedule")
        if self.spec.hidden % self.tensor:
            raise ConfigError(f"--hidden {self.spec.hidden} is not divisible by --tensor {self.tensor}; "
                              f"use a multiple of {self.tensor}")
        if self.batch < self.micro:
            raise ConfigError(f"--batch {self.batch} is smaller than --micro {self.micro}: every micro-batch needs "
                              f"at least one sample; raise --batch or lower --micro")

    def check(self, world: int) -> Topology:
        """The rank layout; ConfigError naming the option and the fix when the options cannot run on *world* ranks."""
        self.check_values()
        ts = self.tensor * self.stages
        if world % ts:
            raise ConfigError(f"{world} ranks cannot be split into --tensor {self.tensor} x --stages {self.stages} x D "
                              f"replicas: N must equal T x S x D; run with a multiple of {ts} ranks")
        replicas = world // ts
        per_replica = self.batch // replicas
        if per_replica < self.micro:
            raise ConfigError(f"--batch {self.batch} over {replicas} replica(s) gives {per_replica} samples each, "
                              f"fewer than --micro {self.micro}; raise --batch or lower --micro")
        return Topology(self.tensor, self.stages, replicas)


@dataclass(frozen=True)
class Topology:
    """T × S × D and where a rank sits in it."""

    T: int
    S: int
    D: int

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(t, s, d) of *rank*."""
        rest, t = divmod(rank, self.T)
        d, s = divmod(rest, self.S)
        return t, s, d


# ---------------------------------------------------------------- memory


def _peak_in_flight(schedule: str, stages: int, micro: int, chunks: int) -> tuple[list[int], list[int]]:
    """Micro-batches (of one chunk-stage each) whose activations each pipeline rank holds at most at once, and
    of those, the most waiting for their W (input gradient done, weight gradient not).

    The planned timetable's counts; beyond a few micro-batches per stage they no
    longer grow (except GPipe's and looped BFS's, which hold all M), so long
    schedules are planned at ``4·S·V`` micro-batches.
    """
    from .timeline import plan

    if schedule == "gpipe":
        return [micro] * stages, [0] * stages
    if schedule == "looped-bfs":
        return [micro * chunks] * stages, [0] * stages
    cap = 4 * stages * chunks
    tt = plan(schedule, stages, min(micro, cap), chunks)
    return [tt.peak_in_flight(r) for r in range(stages)], [tt.peak_waiting(r) for r in range(stages)]


def memory_need(cfg: Config, topo: Topology, batch: int | None = None, micro: int | None = None,
                bounds: list[tuple[int, int]] | None = None) -> int:
    """About the bytes the busiest rank allocates for a run of *cfg* on *topo* (*batch*, *micro* replace cfg's).

    *bounds*: the blocks of each chunk-stage (default: balanced by parameters,
    as :func:`apps.pipeline.model.block_ranges` splits them).

    Per pipeline rank (its V chunk-stages; tensor ranks hold 1/T of each
    block): parameters, gradients and optimizer state (plus the data-parallel
    all-reduce's buckets when D > 1); the activations the schedule keeps -
    the planned peak of micro-batches in flight times what one micro-batch
    leaves on the rank's largest stage (each Linear's input, each activation's
    mask or values; with ``recompute`` only the stage input, plus one
    micro-batch rebuilt; with a split backward (zero bubble, DualPipeV) also the output gradients kept for W, and
    with recompute or offload the layer inputs W needs, rebuilt or fetched back at I;
    with ``offload`` they sit in this rank's window for its neighbour
    instead, plus two micro-batches fetched back); one micro-batch's working arrays and messages; and on the
    first and last stage's ranks the whole global batch each step makes
    (float64 inputs, teacher logits, labels).
    """
    batch = cfg.batch if batch is None else batch
    micro = cfg.micro if micro is None else micro
    spec, S, V, T, D = cfg.spec, topo.S, cfg.chunks, topo.T, topo.D
    itemsize = np.dtype(cfg.dtype).itemsize
    w, h, f, c = spec.width, -(-spec.hidden // T), spec.features, spec.classes
    gelu = spec.activation == "gelu"
    act = (lambda n: 2 * n * itemsize) if gelu else (lambda n: n)  # bytes per row an activation keeps
    if bounds is None:
        bounds = block_ranges(spec, S * V, equal=equal_chunks(cfg.schedule))
    states = {"sgd": 0, "adam": 2, "adamw": 2}.get(cfg.optimizer, 2)  # the pipeline's SGD has no momentum
    per_replica = -(-batch // D)  # the largest replica's share
    rows = -(-per_replica // micro)  # its largest micro-batch
    peaks, waiting = _peak_in_flight(cfg.schedule, S, micro, V)
    worst = 0
    for s in range(S):
        params = keep = keep_input = grads_out = 0  # keep*: bytes per row of one micro-batch on one chunk-stage
        first = last = False
        for stage in stages_of(cfg.schedule, S, V, s):
            lo, hi = bounds[stage]
            blocks = hi - lo
            p = blocks * (2 * w * h + h + w)
            k = blocks * ((w + h) * itemsize + act(h) + act(w))
            g = blocks * (h + w) * itemsize
            width_in = w
            if lo == 0:
                first, width_in = True, f
                p += f * w + w
                k += f * itemsize + act(w)
                g += w * itemsize
            if hi == spec.blocks:
                last = True
                p += w * c + c
                k += w * itemsize
                g += c * itemsize
            params += p
            keep, keep_input, grads_out = max(keep, k), max(keep_input, width_in * itemsize), max(grads_out, g)
        model = params * itemsize * (2 + states + (1 if D > 1 else 0))
        if cfg.activations == "recompute":
            held = peaks[s] * rows * keep_input + rows * keep
        elif cfg.activations == "offload":  # a neighbour's, parked here; one fetched back and one prefetched
            held = peaks[(s - 1) % S] * rows * keep + 2 * rows * keep
        else:
            held = peaks[s] * rows * keep
        if splits_backward(cfg.schedule):
            held += peaks[s] * rows * grads_out
            if cfg.activations != "store":  # between I and W, each parameter layer's input is back here
                held += waiting[s] * rows * keep
        working = rows * itemsize * (4 * max(w, h, f) + 3 * c)  # one pass's outputs, gradients and messages
        data = batch * ((f + c) * 8 + 16) + rows * f * itemsize if first or last else 0
        worst = max(worst, model + held + working + data)
    return worst


def check_memory(comm: Any, cfg: Config, topo: Topology) -> None:
    """Refuse, on every rank, a run whose arrays cannot fit the memory available (collective)."""
    per_replica = cfg.batch // topo.D
    knobs = [memory.Knob("--batch", cfg.batch, low=topo.D * cfg.micro)]
    more = []
    m = cfg.micro
    while 2 * m <= per_replica and len(more) < 64:
        m *= 2
        more.append(m)
    if more and cfg.schedule != "gpipe":  # GPipe keeps every micro-batch: more of them do not help
        knobs.append(memory.Knob("--micro", cfg.micro, high=more[-1], candidates=more))
    spec = cfg.spec
    bounds = block_ranges(spec, topo.S * cfg.chunks, equal=equal_chunks(cfg.schedule))
    sizes = [("--hidden", spec.hidden, cfg.tensor), ("--width", spec.width, 1), ("--features", spec.features, 1)]
    for option, value, step in sizes:
        if value > step:
            knobs.append(memory.Knob(option, value, low=step))

    def need(v: dict[str, int]) -> int:
        hidden = v.get("--hidden", spec.hidden)
        hidden -= hidden % cfg.tensor
        changed = replace(cfg, spec=replace(spec, hidden=hidden, width=v.get("--width", spec.width),
                                            features=v.get("--features", spec.features)))
        return memory_need(changed, topo, batch=v["--batch"], micro=v.get("--micro", cfg.micro), bounds=bounds)

    memory.check(comm, need, knobs, otherwise="spread the run over more nodes")


def array_module(comm: Any, backend: str) -> Any:
    """The array module of ``--backend`` on every rank (collective): ConfigError naming the fix on every rank when
    any rank cannot import it (or bind its GPU: :func:`apps.options.bind_device`)."""
    module, problem = None, None
    if backend == "numpy":
        module = np
    elif backend == "cupy":
        try:
            import cupy

            module = cupy
        except ImportError:
            problem = "--backend cupy needs CuPy: pip install -e '.[cuda12]' (or cuda13), or use --backend numpy"
        else:
            try:
                bind_device(comm)
            except ValueError as exc:  # a bad MPICOMM_DEVICE: refused on every rank below
                problem = str(exc)
    else:
        problem = f"--backend {backend!r}: choose one of {', '.join(BACKENDS)}"
    agree(comm, problem, ConfigError)
    return module
