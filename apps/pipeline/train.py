"""Pipeline training: N = T × S × D ranks, each running its row of a schedule on its stages.

Rank layout (tensor-parallel ranks adjacent, as Megatron places them on a node)::

    rank = (d · S + s) · T + t        t: tensor rank, s: pipeline rank, d: replica

Three sub-communicators come from ``comm.Split``: *tensor* (same d, s: the T
ranks that split each block), *pipe* (same d, t: the S ranks of one pipeline,
ordered by s) and *data* (same s, t: the D replicas of one stage, which sum
their gradients with mpicomm's all-reduce through :class:`apps.sgd.ddp.Reducer`,
bucketed, launched from the last gradient pass of each stage so the buckets
overlap the other stages' work, and waited before the optimizer step).

A step: every rank makes the same global batch of ``batch`` samples from the
step number (a teacher network labels Gaussian inputs; no data moves), replica d
takes its contiguous share and cuts it into ``micro`` micro-batches; the
schedule runs; the loss gradient is taken with denominator ``batch`` so the
summed gradients are those of the global mean. The optimizer steps each stage's
flat parameters. :func:`reference` trains the unsplit model in one process on
the same micro-batches - the check that every split computes the same thing.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np

import mpicomm
from mpicomm import cli
from apps import checkpoint as ck
from apps.nn import Sequential, correct, softmax_cross_entropy
from apps.nn.optim import make as make_optimizer
from apps.sgd.data import divide
from apps.sgd.ddp import Reducer

from .engine import Executor, StepRecord, wait_sleeping
from .model import ModelError, ModelSpec, block_ranges, initial_values, layers, stage_layers
from .schedules import SCHEDULES, ScheduleError, actions, check_shape, splits_backward
from .stage import STRATEGIES, Offload, Stage
from .timeline import formula, plan

__all__ = ["Config", "Topology", "train", "reference", "batch", "PREFIX", "ConfigError", "RunResult"]

PREFIX = "pipeline"  # checkpoint series name


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


@dataclass
class RunResult:
    """What :func:`train` returns on every rank (the gathered measurements on rank 0 only)."""

    losses: list[float] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)
    params: dict[int, np.ndarray] = field(default_factory=dict)  # stage -> flat parameters of this rank's stages
    full: np.ndarray | None = None  # world rank 0: the whole model's flat parameters (unsplit layout)
    records: list[StepRecord] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    ranks: list[dict[str, Any]] = field(default_factory=list)  # rank 0: every rank's measurements
    start_step: int = 0


# ---------------------------------------------------------------- data


def _teacher(spec: ModelSpec, seed: int) -> np.ndarray:
    return np.random.default_rng([seed, 7]).standard_normal((spec.features, spec.classes))


def batch(spec: ModelSpec, size: int, step: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The global batch of step *step*: Gaussian inputs and the teacher's labels (the same on every rank)."""
    x = np.random.default_rng([seed, 11, step]).standard_normal((size, spec.features))
    y = np.argmax(x @ _teacher(spec, seed), axis=1).astype(np.int64)
    return x, y


def micro_slices(size: int, replicas: int, replica: int, micro: int) -> list[tuple[int, int]]:
    """Rows [lo, hi) of the global batch in each of replica *replica*'s micro-batches."""
    lo, hi = divide(size, replicas, replica)
    out = []
    for k in range(micro):
        a, b = divide(hi - lo, micro, k)
        out.append((lo + a, lo + b))
    return out


# ---------------------------------------------------------------- the single-process reference


def reference(cfg: Config, replicas: int = 1, steps: int | None = None) -> tuple[list[float], np.ndarray]:
    """Train the unsplit model in this process on the same micro-batches: (losses per step, final flat params).

    Micro-batch k of replica d runs with the same randomness key (step, d, k) as
    in the pipeline; gradients are summed over all micro-batches of all
    replicas, with the global batch as the loss denominator.
    """
    spec = cfg.spec
    all_layers = [layer for u in range(spec.blocks + 2) for layer in layers(spec, u)]
    model = Sequential(all_layers, dtype=np.dtype(cfg.dtype), seed=cfg.seed)
    opt = make_optimizer(cfg.optimizer, lr=cfg.lr)
    state = opt.init_state(model.num_params, np, model.dtype)
    losses = []
    for step in range(cfg.steps if steps is None else steps):
        x, y = batch(spec, cfg.batch, step, cfg.seed)
        model.zero_grad()
        total = 0.0
        for d in range(replicas):
            for k, (lo, hi) in enumerate(micro_slices(cfg.batch, replicas, d, cfg.micro)):
                model.rng_key = (step, d, k)
                logits = model.forward(x[lo:hi].astype(model.dtype))
                loss, dlogits = softmax_cross_entropy(logits, y[lo:hi], denominator=cfg.batch)
                total += loss * (hi - lo)
                model.backward(dlogits)
        losses.append(total / cfg.batch)
        opt.step(model.params, model.grads, state)
    return losses, model.params.copy()


# ---------------------------------------------------------------- the pipeline


class _Run:
    """This rank's part of the run: sub-communicators, stages, executor, optimizer, reducers (a plan object)."""

    def __init__(self, comm: Any, cfg: Config, topo: Topology, costs: list[float] | None) -> None:
        self.cfg, self.topo = cfg, topo
        rank = comm.Get_rank()
        self.t, self.s, self.d = topo.coords(rank)
        self.tensor = mpicomm.Comm(comm.Split(self.d * topo.S + self.s, self.t))
        self.pipe = mpicomm.Comm(comm.Split(topo.S * topo.T * topo.D + self.d * topo.T + self.t, self.s))
        self.data = mpicomm.Comm(comm.Split(2 * topo.S * topo.T * topo.D + self.s * topo.T + self.t, self.d))
        spec, S, V = cfg.spec, topo.S, cfg.chunks
        self.P = S * V
        self.bounds = block_ranges(spec, self.P, equal=cfg.schedule == "interleaved", costs=costs)
        self.dtype = np.dtype(cfg.dtype)
        mine = [c * S + self.s for c in range(V)]
        built = {}
        for st in mine:
            lo, hi = self.bounds[st]
            built[st] = stage_layers(spec, lo, hi, self.tensor)
        wanted = {n for _, numbers in built.values() for n in numbers}
        values = initial_values(spec, wanted, cfg.seed, self.tensor)
        self.stages = {st: Stage(st, lay, numbers, values, dtype=self.dtype, seed=cfg.seed, strategy=cfg.activations)
                       for st, (lay, numbers) in built.items()}
        self.widths = {}  # stage -> (in, out) features
        for st in range(self.P):
            lo, hi = self.bounds[st]
            self.widths[st] = (spec.features if lo == 0 else spec.width, spec.classes if hi == spec.blocks else spec.width)
        self.slices = micro_slices(cfg.batch, topo.D, self.d, cfg.micro)
        self.row = list(actions(cfg.schedule, S, cfg.micro, V, self.s))
        self.plan = plan(cfg.schedule, S, cfg.micro, V)
        self.opt = make_optimizer(cfg.optimizer, lr=cfg.lr)
        self.state = {st: self.opt.init_state(stage.model.num_params, np, self.dtype) for st, stage in self.stages.items()}
        self.reducers = {st: Reducer(self.data, stage.model) for st, stage in self.stages.items()} if topo.D > 1 else {}
        hooks = {st: r.hook for st, r in self.reducers.items()}
        self.executor = Executor(self.pipe, self.row, self.stages, self.P - 1, self._shape, self.dtype,
                                 split=splits_backward(cfg.schedule), hooks=hooks)
        self.offload_window = None
        if cfg.activations == "offload":
            self._setup_offload()

    def _shape(self, kind: str, stage: int, mb: int) -> tuple[int, int]:
        lo, hi = self.slices[mb]
        if kind == "F":  # the input of *stage*, from stage-1
            return hi - lo, self.widths[stage][0]
        return hi - lo, self.widths[stage][1]  # the gradient of *stage*'s output, from stage+1

    def _setup_offload(self) -> None:
        """Windows for parked activations: slots = the planned peak in flight here, slot = the largest stash."""
        rows = max(hi - lo for lo, hi in self.slices)
        slot = max(stage.stash_bytes(rows) for stage in self.stages.values())
        slots = max(1, self.plan.peak_in_flight(self.s))
        need = self.pipe.allgather(slot * slots)
        S = self.topo.S
        hosted = need[(self.s - 1) % S]  # what the previous rank parks here
        self.hosted_bytes = hosted
        self.offload_window = self.pipe.expose(np.zeros(max(hosted, 1), np.uint8))
        off = Offload(self.offload_window, (self.s + 1) % S, slot, slots)
        for stage in self.stages.values():
            stage.offload = off
        self.offload = off

    def step(self, step: int) -> tuple[StepRecord, float, int]:
        cfg = self.cfg
        for stage in self.stages.values():
            stage.model.zero_grad()
        for r in self.reducers.values():
            r.begin(1)  # the loss denominator is the global batch: sum, do not average
            r.backward_starts()
        need_x = 0 in self.stages
        need_y = self.P - 1 in self.stages
        x = y = None
        if need_x or need_y:
            x, y = batch(cfg.spec, cfg.batch, step, cfg.seed)
        dt = self.dtype

        def inputs(mb: int) -> Any:
            lo, hi = self.slices[mb]
            return np.ascontiguousarray(x[lo:hi], dtype=dt)

        def loss(mb: int, logits: Any) -> tuple[float, int, Any]:
            lo, hi = self.slices[mb]
            value, dlogits = softmax_cross_entropy(logits, y[lo:hi], denominator=cfg.batch)
            return value * (hi - lo), correct(logits, y[lo:hi]), dlogits

        rec = self.executor.step(inputs, loss, lambda mb: (step, self.d, mb))
        for r in self.reducers.values():
            r.finish()
        for st, stage in self.stages.items():
            self.opt.step(stage.model.params, stage.model.grads, self.state[st])
        return rec, rec.loss_sum, rec.correct

    def assemble(self) -> np.ndarray | None:
        """The whole model's flat parameters in global layer order, on world rank 0 (collective; None elsewhere).

        Tensor-parallel slices are joined along their split axis (columns of a
        column-parallel weight and bias, rows of a row-parallel weight), then the
        stages are put in order: the layout of the unsplit ``Sequential``.
        """
        mine = {}
        if self.d == 0:
            for stage in self.stages.values():
                for n, layer in zip(stage.numbers, stage.layers):
                    mine[n] = (type(layer).__name__, {k: np.asarray(v) for k, v in layer.params.items()})
        pieces = self.tensor.gather(mine, root=0)
        whole = None
        if self.t == 0 and self.d == 0:
            whole = {}
            for n, (kind, params) in mine.items():
                joined = {}
                for k in params:
                    parts = [p[n][1][k] for p in pieces]
                    if kind == "ColumnParallelLinear":
                        joined[k] = np.concatenate(parts, axis=-1)
                    elif kind == "RowParallelLinear" and k == "W":
                        joined[k] = np.concatenate(parts, axis=0)
                    else:
                        joined[k] = parts[0]
                whole[n] = joined
        stages = self.pipe.gather(whole, root=0) if self.t == 0 else None
        if self.s != 0 or self.t != 0 or self.d != 0:
            return None
        merged = {n: v for part in stages for n, v in (part or {}).items()}
        return np.concatenate([a.reshape(-1) for n in sorted(merged) for a in merged[n].values()] or [np.empty(0)])

    def free(self) -> None:
        if self.offload_window is not None:
            self.offload_window.Free()
        for c in (self.tensor, self.pipe, self.data):
            c.Free()


def measure_costs(comm: Any, cfg: Config, rows: int, repeat: int = 3) -> list[float]:
    """Seconds of forward + backward of each block on one micro-batch (rank 0 measures, every rank gets them)."""
    costs = None
    if comm.Get_rank() == 0:
        spec = cfg.spec
        costs = []
        for u in range(1, spec.blocks + 1):
            lay, numbers = stage_layers(spec, u - 1, u)
            values = initial_values(spec, set(numbers), cfg.seed)
            st = Stage(u, lay, numbers, values, dtype=np.dtype(cfg.dtype), seed=cfg.seed)
            x = np.random.default_rng(0).standard_normal((rows, st.in_features)).astype(cfg.dtype)
            best = float("inf")
            for _ in range(repeat):
                t0 = time.perf_counter()
                y = st.forward(0, x, (0,))
                st.backward(0, np.ones_like(y))
                best = min(best, time.perf_counter() - t0)
            costs.append(best)
    return comm.bcast(costs, root=0)


def _signature(cfg: Config, bounds: list[tuple[int, int]]) -> dict[str, Any]:
    return {"spec": asdict(cfg.spec), "stages": cfg.stages, "chunks": cfg.chunks, "tensor": cfg.tensor,
            "bounds": [list(b) for b in bounds], "optimizer": cfg.optimizer, "dtype": cfg.dtype, "batch": cfg.batch}


def _part(stage: int, t: int) -> str:
    return f"stage{stage}-t{t}"


def save_checkpoint(comm: Any, run: _Run, step: int) -> None:
    """Every replica-0 rank writes its stages (parameters and optimizer state); rank 0 writes the manifest (collective)."""
    cfg = run.cfg
    records = []
    if run.d == 0:
        for st, stage in run.stages.items():
            arrays = {"params": np.asarray(stage.model.params)}
            arrays.update({f"optimizer.{k}": np.asarray(v) for k, v in run.state[st].items()})
            path = ck.data_path(cfg.checkpoint_dir, PREFIX, step, _part(st, run.t))
            record, entries = ck.write_arrays(path, arrays)
            records.append((_part(st, run.t), record, entries))
    gathered = comm.gather(records, root=0)
    if comm.Get_rank() == 0:
        flat = [item for part in gathered for item in part]
        ck.save_manifest(ck.manifest_path(cfg.checkpoint_dir, PREFIX, step), step, [r for _, r, _ in flat],
                         parts={name: {"file": r["file"], "arrays": e} for name, r, e in flat},
                         model=_signature(cfg, run.bounds))
        ck.prune(cfg.checkpoint_dir, PREFIX, cfg.keep)
    comm.Barrier()


def load_checkpoint(comm: Any, run: _Run) -> int:
    """Resume from the newest valid checkpoint of this split (every rank), or refuse with CheckpointError everywhere."""
    cfg = run.cfg
    outcome: Any = None
    if comm.Get_rank() == 0:
        try:
            os.makedirs(cfg.checkpoint_dir, exist_ok=True)
            body, refused = ck.newest_valid(cfg.checkpoint_dir, PREFIX)
            if body is None:
                raise ck.CheckpointError(f"no valid checkpoint in {cfg.checkpoint_dir}"
                                         + (": " + "; ".join(refused) if refused else "")
                                         + "; drop --restart to start afresh")
            if body.get("model") != _signature(cfg, run.bounds):
                raise ck.CheckpointError(f"{body['path']}: written by another model or split ({body.get('model')}); "
                                         f"use the same --stages/--chunks/--tensor/--balance and model options")
            parts = body.get("parts")
            if not isinstance(parts, dict):
                raise ck.CheckpointError(f"{body['path']}: no 'parts' table")
            outcome = ("ok", body["step"], parts)
        except (ck.CheckpointError, OSError) as exc:
            outcome = ("error", str(exc), None)
    outcome = comm.bcast(outcome, root=0)
    if outcome[0] == "error":
        raise ck.CheckpointError(outcome[1])
    step, parts = outcome[1], outcome[2]
    problem = None
    try:
        for st, stage in run.stages.items():
            entry = parts.get(_part(st, run.t))
            if not isinstance(entry, dict) or not isinstance(entry.get("file"), str):
                raise ck.CheckpointError(f"checkpoint step {step} has no part {_part(st, run.t)}")
            path = os.path.join(cfg.checkpoint_dir, os.path.basename(entry["file"]))
            if path != ck.data_path(cfg.checkpoint_dir, PREFIX, step, _part(st, run.t)):
                raise ck.CheckpointError(f"checkpoint step {step}: part {_part(st, run.t)} names {entry['file']!r}")
            arrays = ck.read_arrays(path, ck.check_entries(entry.get("arrays"), None, path))
            params = arrays.get("params")
            if params is None or params.shape != stage.model.params.shape:
                raise ck.CheckpointError(f"{path}: params do not fit stage {st}")
            stage.model.load_params(params)
            for k in run.state[st]:
                saved = arrays.get(f"optimizer.{k}")
                if saved is None or saved.size != np.size(run.state[st][k]):
                    raise ck.CheckpointError(f"{path}: optimizer.{k} missing or of the wrong size")
                run.state[st][k][...] = saved.reshape(np.shape(run.state[st][k]))
    except (ck.CheckpointError, OSError) as exc:
        problem = str(exc)
    problems = [p for p in comm.allgather(problem) if p]
    if problems:
        raise ck.CheckpointError(problems[0])
    return int(step)


def train(comm: Any, cfg: Config, *, on_step: Callable[[int, float, float], None] | None = None,
          keep_records: bool = True) -> RunResult:
    """Run *cfg* on the ranks of *comm* (collective); ConfigError on every rank for options that cannot run."""
    topo = cfg.check(comm.Get_size())
    costs = None
    if cfg.balance == "time":
        rows = max(1, cfg.batch // topo.D // cfg.micro)
        costs = measure_costs(comm, cfg, rows)
    run = _Run(comm, cfg, topo, costs)
    result = RunResult()
    rank = comm.Get_rank()
    try:
        start = 0
        if cfg.restart:
            start = load_checkpoint(comm, run)
        result.start_step = start
        progress = cli.Progress(cfg.steps - start, "pipeline", show=rank == 0 and cfg.progress)
        logf = open(cfg.log, "w") if rank == 0 and cfg.log else None
        if logf is not None:
            logf.write("step,loss,accuracy,seconds\n")
        last = (run.s == topo.S - 1 and run.t == 0)
        for step in range(start, cfg.steps):
            wait_sleeping(comm.Ibarrier())  # the step starts together; early ranks sleep, not spin
            t0 = time.perf_counter()
            rec, loss_sum, right = run.step(step)
            seconds = time.perf_counter() - t0
            summed = np.array([loss_sum if last else 0.0, float(right) if last else 0.0])
            wait_sleeping(mpicomm.iallreduce(summed, comm=comm, out=summed))
            loss_value, accuracy = float(summed[0]) / cfg.batch, float(summed[1]) / cfg.batch
            result.losses.append(loss_value)
            result.accuracy.append(accuracy)
            if keep_records:
                result.records.append(rec)
            if logf is not None:
                logf.write(f"{step},{loss_value:.10g},{accuracy:.6g},{seconds:.6g}\n")
            if on_step is not None:
                on_step(step, loss_value, seconds)
            progress.step(f"step {step + 1}/{cfg.steps}  loss {loss_value:.4f}  {seconds * 1e3:.1f} ms")
            if cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0:
                save_checkpoint(comm, run, step + 1)

        if logf is not None:
            logf.close()
        result.params = {st: stage.model.params.copy() for st, stage in run.stages.items()}
        result.full = run.assemble()
        result.stats = _local_stats(run, result.records)
        result.ranks = comm.gather(result.stats, root=0) or []
    finally:
        run.free()
    return result


def _local_stats(run: _Run, records: list[StepRecord]) -> dict[str, Any]:
    """This rank's measurements over the steps after the first (warm-up): busy, elapsed, peaks."""
    use = records[1:] if len(records) > 1 else records
    busy = sum(r.busy for r in use)
    waits = sum(e.end - e.start for r in use for e in r.events if e.op == "wait")
    return {
        "t": run.t, "s": run.s, "d": run.d, "stages": sorted(run.stages),
        "steps": len(use), "busy": busy, "wait": waits, "elapsed": [r.elapsed for r in use],
        "peak_bytes": max((r.peak_bytes for r in use), default=0),
        "peak_micro": max((r.peak_micro for r in use), default=0),
        "planned_bubble": run.plan.bubble(run.s), "planned_peak": run.plan.peak_in_flight(run.s),
        "offload_bytes": getattr(getattr(run, "offload", None), "bytes_moved", 0),
        "hosted_bytes": getattr(run, "hosted_bytes", 0),
        "events": [[e.op, e.mb, e.stage, e.start, e.end] for e in (use[-1].events if use else [])],
    }


def summary(cfg: Config, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """Per pipeline rank (replica 0, tensor rank 0): busy, bubble measured and planned, memory; and the totals."""
    rows = sorted((r for r in ranks if r["d"] == 0 and r["t"] == 0), key=lambda r: r["s"])
    if not rows:
        return {}
    steps = rows[0]["steps"]
    makespans = [max(r["elapsed"][i] for r in rows) for i in range(steps)]
    total = sum(makespans)
    per = []
    for r in rows:
        per.append({
            "rank": r["s"], "stages": r["stages"], "busy_s": r["busy"],
            "bubble": 1.0 - r["busy"] / total if total else 0.0, "planned": r["planned_bubble"],
            "peak_bytes": r["peak_bytes"], "peak_micro": r["peak_micro"], "planned_peak": r["planned_peak"],
            "offload_bytes": r["offload_bytes"] / max(steps, 1),
        })
    topo_d = max(r["d"] for r in ranks) + 1
    step_s = total / steps if steps else 0.0
    return {
        "schedule": cfg.schedule, "stages": cfg.stages, "micro": cfg.micro, "chunks": cfg.chunks,
        "tensor": cfg.tensor, "replicas": topo_d, "activations": cfg.activations,
        "formula": formula(cfg.schedule, cfg.stages, cfg.micro, cfg.chunks),
        "bubble": sum(p["bubble"] for p in per) / len(per),
        "planned": sum(p["planned"] for p in per) / len(per),
        "steps": steps, "step_s": step_s, "samples_per_s": cfg.batch / step_s if step_s else 0.0, "per_rank": per,
    }
