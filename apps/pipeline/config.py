"""What a pipeline run depends on (the command line's options), checked once, and the rank layout T × S × D.

:meth:`Config.check` refuses, with a :class:`ConfigError` naming the options and
the fix, every combination that cannot run - before any rank communicates, so
every rank raises the same error. :class:`Topology` places a rank::

    rank = (d · S + s) · T + t        t: tensor rank, s: pipeline rank, d: replica

(tensor-parallel ranks adjacent, as Megatron places them on a node).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .model import ModelError, ModelSpec, block_ranges
from .schedules import SCHEDULES, ScheduleError, check_shape
from .stage import STRATEGIES

__all__ = ["Config", "ConfigError", "Topology"]


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
    checkpoint_dir: str = "checkpoints"
    keep: int = 2
    restart: bool = False
    progress: bool = True

    def check(self, world: int) -> "Topology":
        """The rank layout; ConfigError naming the option and the fix when the options cannot run on *world* ranks."""
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"--schedule {self.schedule!r}: choose one of {', '.join(SCHEDULES)}")
        if self.activations not in STRATEGIES:
            raise ConfigError(f"--activations {self.activations!r}: choose one of {', '.join(STRATEGIES)}")
        if self.balance not in ("params", "time"):
            raise ConfigError(f"--balance {self.balance!r}: choose params or time")
        for name in ("stages", "micro", "chunks", "tensor", "batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"--{name} {value!r}: must be an integer >= 1")
        if self.steps < 0 or self.checkpoint_every < 0 or self.keep < 1:
            raise ConfigError(f"--steps {self.steps}, --checkpoint-every {self.checkpoint_every}, --keep {self.keep}: "
                              f"steps and checkpoint-every must be >= 0, keep >= 1")
        if np.dtype(self.dtype).kind != "f":
            raise ConfigError(f"--dtype {self.dtype}: use float32 or float64")
        try:
            check_shape(self.schedule, self.stages, self.micro, self.chunks)
            self.spec.check()
            block_ranges(self.spec, self.stages * self.chunks, equal=self.schedule == "interleaved")
        except (ScheduleError, ModelError) as exc:
            raise ConfigError(str(exc)) from None
        if self.balance == "time" and self.schedule == "interleaved":
            raise ConfigError("--balance time does not apply to --schedule interleaved: its chunks must hold equal "
                              "numbers of blocks; drop --balance or use another schedule")
        if self.schedule == "zb-h1" and self.activations == "recompute":
            raise ConfigError("--schedule zb-h1 with --activations recompute is not supported: the deferred weight "
                              "gradient (W) needs the activations again after the input gradient, so recomputing "
                              "them saves nothing; use --activations store or offload with zb-h1")
        if self.spec.hidden % self.tensor:
            raise ConfigError(f"--hidden {self.spec.hidden} is not divisible by --tensor {self.tensor}; "
                              f"use a multiple of {self.tensor}")
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
