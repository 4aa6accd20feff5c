"""Pipeline training: N = T × S × D ranks, each running its row of a schedule on its stages.

Three sub-communicators come from ``comm.Split`` (layout in
:class:`apps.pipeline.config.Topology`): *tensor* (same d, s: the T ranks that
split each block), *pipe* (same d, t: the S ranks of one pipeline, ordered by s)
and *data* (same s, t: the D replicas of one stage, which sum their gradients
with mpicomm's all-reduce through :class:`apps.sgd.ddp.Reducer`, bucketed,
launched from the last gradient pass of each stage so the buckets overlap the
other stages' work, and waited for - sleeping - before the optimizer step).

With T > 1 the stages exchange activations and gradients by Megatron's
scatter-gather (:class:`apps.pipeline.tensor.ScatterGather`): each tensor rank
sends 1/T of them, and the receiving stage all-gathers over *tensor*.
``--backend cupy`` puts parameters, activations and messages on the GPU: the
same code, with the array module ``xp``.

A step: every rank makes the same global batch from the step number
(:mod:`apps.pipeline.data`), replica d takes its share in M micro-batches, the
schedule runs (:class:`apps.pipeline.engine.Executor`), the loss gradient is
taken with denominator ``batch`` so the summed gradients are those of the
global mean, and the optimizer steps each stage's flat parameters.

Failures: an error every rank meets together (options, a checkpoint that does
not fit) frees the communicators and windows collectively and reaches every
rank; an error on one rank alone leaves them (freeing is collective and the
others are inside the step) and propagates, so ``mpicomm.runtime.main`` ends
the whole job instead of leaving it hung.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from mpi4py import MPI

import mpicomm
from apps import checkpoint as ck
from apps.agree import agree, verdict
from apps.nn import correct, softmax_cross_entropy
from apps.nn.optim import make as make_optimizer
from apps.nn.xp import to_host
from apps.sgd.ddp import Reducer
from mpicomm import cli

from . import checkpoints
from .config import Config, ConfigError, Topology, array_module, check_memory
from .data import batch, micro_slices
from .engine import Executor, StepRecord, wait_sleeping
from .measure import local_stats
from .model import block_ranges, initial_values, stage_layers
from .offload import Offload, RmaSlots, SharedSlots
from .schedules import actions, equal_chunks, stages_of
from .stage import Meter, Stage
from .tensor import ScatterGather
from .timeline import plan

__all__ = ["train", "RunResult", "measure_costs"]


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


class _Run:
    """This rank's part of the run: sub-communicators, stages, executor, optimizer, reducers (a plan object)."""

    def __init__(self, comm: Any, cfg: Config, topo: Topology, costs: list[float] | None,
                 bounds: list[tuple[int, int]] | None = None, xp: Any = np) -> None:
        self.cfg, self.topo, self.xp = cfg, topo, xp
        rank = comm.Get_rank()
        self.t, self.s, self.d = topo.coords(rank)
        self.tensor = mpicomm.Comm(comm.Split(self.d * topo.S + self.s, self.t))
        self.pipe = mpicomm.Comm(comm.Split(topo.S * topo.T * topo.D + self.d * topo.T + self.t, self.s))
        self.data = mpicomm.Comm(comm.Split(2 * topo.S * topo.T * topo.D + self.s * topo.T + self.t, self.d))
        spec, S, V = cfg.spec, topo.S, cfg.chunks
        self.P = S * V
        self.bounds = bounds or block_ranges(spec, self.P, equal=equal_chunks(cfg.schedule), costs=costs)
        self.dtype = np.dtype(cfg.dtype)
        mine = stages_of(cfg.schedule, S, V, self.s)
        built = {}
        for st in mine:
            lo, hi = self.bounds[st]
            built[st] = stage_layers(spec, lo, hi, self.tensor)
        wanted = {n for _, numbers in built.values() for n in numbers}
        values = initial_values(spec, wanted, cfg.seed, self.tensor)
        self.meter = Meter()
        self.stages = {st: Stage(st, lay, numbers, values, dtype=self.dtype, seed=cfg.seed, strategy=cfg.activations,
                                 meter=self.meter, xp=xp) for st, (lay, numbers) in built.items()}
        self.widths = {}  # stage -> (in, out) features
        for st in range(self.P):
            lo, hi = self.bounds[st]
            self.widths[st] = (spec.features if lo == 0 else spec.width, spec.classes if hi == spec.blocks else spec.width)
        self.slices = micro_slices(cfg.batch, topo.D, self.d, cfg.micro)
        self.row = list(actions(cfg.schedule, S, cfg.micro, V, self.s))
        self.plan = plan(cfg.schedule, S, cfg.micro, V)
        self.opt = make_optimizer(cfg.optimizer, lr=cfg.lr)
        self.state = {st: self.opt.init_state(stage.model.num_params, xp, self.dtype) for st, stage in self.stages.items()}
        self.reducers = {st: Reducer(self.data, stage.model) for st, stage in self.stages.items()} if topo.D > 1 else {}
        hooks = {st: r.hook for st, r in self.reducers.items()}
        self.executor = Executor(self.pipe, self.row, self.stages, self.P - 1, self._shape, self.dtype, hooks=hooks,
                                 link=ScatterGather(self.tensor) if topo.T > 1 else None, xp=xp)
        self.offload_window: Any = None
        self.shared_window: Any = None
        self.node: Any = None
        self.offload: Any = None
        self.hosted_bytes = 0
        if cfg.activations == "offload":
            try:
                self._setup_offload()
            except ConfigError:  # every rank together (agreed): free collectively
                self.free()
                raise

    def _shape(self, kind: str, stage: int, mb: int) -> tuple[int, int]:
        lo, hi = self.slices[mb]
        if kind == "F":  # the input of *stage*, from stage-1
            return hi - lo, self.widths[stage][0]
        return hi - lo, self.widths[stage][1]  # the gradient of *stage*'s output, from stage+1

    def _setup_offload(self) -> None:
        """Slots for parked activations: slots = the planned peak in flight here, slot = the largest stash.

        The next pipeline rank hosts them: in its piece of a node-shared window
        when it shares this rank's node (``--offload-window auto`` or
        ``shared``), else in its RMA window. Both windows are created on every
        rank (collective), the unused one with one byte.
        """
        rows = max(hi - lo for lo, hi in self.slices)
        slot = max(stage.stash_bytes(rows) for stage in self.stages.values())
        slots = max(1, self.plan.peak_in_flight(self.s))
        need = self.pipe.allgather(slot * slots)
        S, where = self.topo.S, self.cfg.offload_window
        partner, parker = (self.s + 1) % S, (self.s - 1) % S
        self.node = mpicomm.Comm(self.pipe.Split_type(MPI.COMM_TYPE_SHARED, self.s))
        members = self.node.allgather(self.s)  # the pipeline ranks on this node, in node order
        problem = None
        if where == "shared" and partner not in members:
            problem = (f"--offload-window shared: pipeline rank {self.s} parks on rank {partner}, which is on another "
                       f"node; use --offload-window auto (shared memory where ranks share a node) or rma")
        agree(self.pipe, problem, ConfigError)
        shared_out = where != "rma" and partner in members
        shared_in = where != "rma" and parker in members
        hosted = need[parker]  # what the previous rank parks here
        self.hosted_bytes = hosted
        self.shared_window = MPI.Win.Allocate_shared(max(hosted, 1) if shared_in else 1, 1, comm=self.node)
        self.offload_window = self.pipe.expose(np.zeros(1 if shared_in else max(hosted, 1), np.uint8))
        if shared_out:
            buf, _ = self.shared_window.Shared_query(members.index(partner))
            target: RmaSlots | SharedSlots = SharedSlots(np.frombuffer(buf, np.uint8))
        else:
            target = RmaSlots(self.offload_window, partner, wait_sleeping)
        off = Offload(target, slot, slots, self.xp)
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

        xp = self.xp

        def inputs(mb: int) -> Any:
            lo, hi = self.slices[mb]
            return xp.asarray(np.ascontiguousarray(x[lo:hi], dtype=dt))

        def loss(mb: int, logits: Any) -> tuple[float, int, Any]:
            lo, hi = self.slices[mb]
            labels = xp.asarray(y[lo:hi])
            value, dlogits = softmax_cross_entropy(logits, labels, denominator=cfg.batch)
            return value * (hi - lo), correct(logits, labels), dlogits

        rec = self.executor.step(inputs, loss, lambda mb: (step, self.d, mb))
        for r in self.reducers.values():
            r.finish(wait=wait_sleeping)
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
                    mine[n] = (type(layer).__name__, {k: to_host(v) for k, v in layer.params.items()})
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
        self.offload = None  # drop every view of the shared window before freeing it
        for stage in self.stages.values():
            stage.offload = None
        if self.offload_window is not None:
            self.offload_window.Free()
        if self.shared_window is not None:
            self.shared_window.Free()
        for c in (self.node, self.tensor, self.pipe, self.data):
            if c is not None:
                c.Free()


def measure_costs(comm: Any, cfg: Config, rows: int, repeat: int = 3, xp: Any = np) -> list[float]:
    """Seconds of forward + backward of each block on one micro-batch (rank 0 measures, every rank gets them)."""
    costs = None
    if comm.Get_rank() == 0:
        spec = cfg.spec
        costs = []
        for u in range(1, spec.blocks + 1):
            lay, numbers = stage_layers(spec, u - 1, u)
            values = initial_values(spec, set(numbers), cfg.seed)
            st = Stage(u, lay, numbers, values, dtype=np.dtype(cfg.dtype), seed=cfg.seed, xp=xp)
            x = xp.asarray(np.random.default_rng(0).standard_normal((rows, st.in_features)).astype(cfg.dtype))
            best = float("inf")
            for _ in range(repeat):
                t0 = time.perf_counter()
                y = st.forward(0, x, (0,))
                st.backward(0, np.ones_like(y))
                best = min(best, time.perf_counter() - t0)
            costs.append(best)
    return comm.bcast(costs, root=0)


def _open_log(comm: Any, cfg: Config, append: bool) -> Any:
    """Rank 0 opens ``--log`` (appending on a restart); a failure is a ConfigError on every rank."""
    f, problem = None, None
    if comm.Get_rank() == 0 and cfg.log:
        try:
            f = open(cfg.log, "a" if append else "w")
            if not append or f.tell() == 0:
                f.write("step,loss,accuracy,seconds\n")
        except OSError as exc:
            problem = f"--log {cfg.log}: {exc.strerror or exc}"
    verdict(comm, problem, ConfigError)
    return f


def train(comm: Any, cfg: Config, *, on_step: Callable[[int, float, float], None] | None = None,
          keep_records: bool = True) -> RunResult:
    """Run *cfg* on the ranks of *comm* (collective); ConfigError on every rank for options that cannot run.

    Before anything is allocated, every rank agrees that the run fits in
    memory (:func:`apps.pipeline.config.check_memory`) and, with
    ``checkpoint_every``, that every rank can write the checkpoint directory
    (:func:`apps.checkpoint.prepare_directory`): a ValueError or
    CheckpointError on every rank otherwise.
    """
    topo = cfg.check(comm.Get_size())
    xp = array_module(comm, cfg.backend)
    check_memory(comm, cfg, topo)
    if cfg.checkpoint_every:
        ck.prepare_directory(comm, cfg.checkpoint_dir)
    bounds = checkpoints.saved_bounds(comm, cfg) if cfg.restart and cfg.balance == "time" else None
    costs = None
    if cfg.balance == "time" and bounds is None:
        costs = measure_costs(comm, cfg, max(1, cfg.batch // topo.D // cfg.micro), xp=xp)
    logf = _open_log(comm, cfg, append=cfg.restart)
    run = _Run(comm, cfg, topo, costs, bounds, xp)
    result = RunResult()
    rank = comm.Get_rank()
    finished = False
    try:
        start = checkpoints.load(comm, run) if cfg.restart else 0
        result.start_step = start
        progress = cli.Progress(cfg.steps - start, "pipeline", show=rank == 0 and cfg.progress)
        last = run.P - 1 in run.stages and run.t == 0  # the loss's rank (rank 0 in a V)
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
                logf.flush()
            if on_step is not None:
                on_step(step, loss_value, seconds)
            progress.step(f"step {step + 1}/{cfg.steps}  loss {loss_value:.4f}  {seconds * 1e3:.1f} ms")
            if cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0:
                checkpoints.save(comm, run, step + 1)
        result.params = {st: np.array(to_host(stage.model.params)) for st, stage in run.stages.items()}
        result.full = run.assemble()
        result.stats = local_stats(run, result.records)
        result.ranks = comm.gather(result.stats, root=0) or []
        finished = True
    except ck.CheckpointError:
        run.free()  # raised on every rank together (checkpoints agree first): free collectively
        raise
    finally:
        if logf is not None:
            logf.close()
        if finished:
            run.free()
    return result
