"""The training loop shared by every mode: data, steps, evaluation, progress, metrics and checkpoints.

``train(comm, cfg)`` builds the model (:func:`apps.nn.mlp`, the same seed on every
rank), the optimizer, the data source and the mode's strategy
(:class:`apps.sgd.ddp.DDP`, :class:`apps.sgd.zero.Zero`,
:class:`apps.sgd.zero3.Zero3`, :class:`apps.sgd.ps.ParameterServer`), then runs ``steps`` optimizer steps:

* step ``s`` is step ``s % steps_per_epoch`` of epoch ``s // steps_per_epoch``;
  the :class:`apps.sgd.data.Sampler` gives each worker its contiguous share of
  that global batch, so N workers see exactly the samples one rank would;
* with ``uneven``, worker r stops r steps early and the others go on (PyTorch's
  Join semantics, see :mod:`apps.sgd.ddp`);
* rank 0 (always a worker) evaluates on the test set at the end of every epoch,
  prints a progress line, and appends a row to the metrics CSV;
* every ``checkpoint_every`` steps the whole state - parameters, optimizer state
  (gathered where it is sharded; the parameter servers' shards at the step's
  version), step (which fixes the sampler position and the dropout keys, so no
  RNG state is needed) - goes to one checkpoint through
  :mod:`apps.checkpoint` (atomic, checksummed, no pickle). ``restart`` resumes
  from the newest valid one, at the same or another rank count.
"""

from __future__ import annotations

import csv
import os
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from apps import checkpoint as ck
from apps import memory
from apps.agree import agree, from_root, verdict
from apps.blocks import block
from apps.nn import correct, mlp, softmax_cross_entropy
from apps.nn.optim import make as make_optimizer
from apps.nn.xp import to_host
from apps.options import bind_device
from apps.sgd.buckets import DEFAULT_CAP_MB
from apps.sgd.data import TEACHER_BLOCK, DataError, Sampler, Teacher, load_digits
from apps.sgd.ddp import DDP, compression_dtype
from apps.sgd.ps import ParameterServer, layout
from apps.sgd.zero import Zero
from apps.sgd.zero3 import Zero3
from mpicomm import cli

__all__ = ["Config", "Report", "MODES", "train", "check_settings", "validate", "preflight", "samples_processed", "memory_need", "PREFIX"]

MODES = ("ddp", "zero1", "zero2", "zero3", "ps-sync", "ps-async")
PREFIX = "sgd"  # checkpoint series name


@dataclass
class Config:
    """Everything a run depends on (the command line's options)."""

    mode: str = "ddp"
    data: str = "digits"  # digits | teacher | file
    data_file: str | None = None  # data "file": an .npz with x_train, y_train, x_test, y_test
    samples: int = 16384  # teacher: training samples
    features: int = 64  # teacher: input features
    classes: int = 10  # teacher: classes
    hidden: tuple[int, ...] = (128,)
    activation: str = "relu"
    layernorm: bool = False
    dropout: float = 0.0
    dtype: str = "float32"
    backend: str = "numpy"
    batch: int = 64  # global batch
    epochs: int = 12
    steps: int | None = None  # overrides epochs
    optimizer: str = "adam"
    lr: float = 3e-3
    momentum: float = 0.9
    weight_decay: float = 0.0
    seed: int = 0
    algorithm: str = "auto"
    bucket_mb: float = DEFAULT_CAP_MB
    overlap: bool = True
    per_parameter: bool = False
    compress: str | None = None
    accumulate: int = 1
    uneven: bool = False
    reproducible: bool = False  # fixed micro-batches, summed reproducibly: the same parameters at any rank count
    micro_batches: int = 8  # with reproducible: micro-batches per global batch
    servers: int = 1  # ps: the last K ranks serve; 0: every rank serves one shard (apps.sgd.ps.layout)
    staleness: int | None = 0
    checkpoint_every: int = 0
    checkpoint_dir: str = "checkpoints/sgd"
    keep: int = 2
    restart: bool = False
    log: str | None = None
    eval_every: int = 0  # 0: once per epoch
    progress: bool = True
    timeline_step: int | None = None  # record this step's timeline (layers, buckets, waits)

    def model_signature(self, features: int, classes: int) -> dict[str, Any]:
        """What a checkpoint must match to be resumed by this run."""
        return {"sizes": [features, *self.hidden, classes], "activation": self.activation,
                "layernorm": self.layernorm, "dropout": self.dropout, "dtype": self.dtype, "data": self.data,
                "optimizer": self.optimizer, "seed": self.seed}


@dataclass
class Report:
    """What a run measured (rank 0's view; samples and samples/s count every worker's samples).

    ``samples`` is the number of training samples the run's steps processed
    (every worker's share, the smaller last batch of an epoch as it is);
    ``samples_per_s`` is ``samples / step_s``.
    """

    mode: str
    ranks: int
    workers: int
    steps: int
    start_step: int
    seconds: float
    samples_per_s: float
    train_loss: float
    test_loss: float
    test_accuracy: float
    params: int
    memory: dict[str, int]
    memory_formula: tuple[str, str, int] | None = None  # memory's total: (formula, its symbols, bytes); not ps
    step_s: float = 0.0  # time in optimizer steps (no evaluation, logging or checkpoints)
    compute_s: float = 0.0  # forward + backward, summed over steps
    exposed_s: float = 0.0  # waiting for communication after backward
    comm_s: float = 0.0  # every bucket's launch→completion, summed
    bytes_per_step: float = 0.0
    samples: int = 0  # training samples processed by this run's steps, all workers together
    history: list[dict[str, float]] = field(default_factory=list)
    timeline: list[Any] | None = None
    model: Any = field(default=None, repr=False, compare=False)  # the trained model (not serialized)

    @property
    def hidden_fraction(self) -> float | None:
        """Share of the bucket all-reduce time hidden behind backward."""
        if self.comm_s <= 0:
            return None
        return max(0.0, 1.0 - self.exposed_s / self.comm_s)


class Source:
    """Training samples by global index, and the test set."""

    def __init__(self, cfg: Config, dtype: Any):
        if cfg.data == "digits":
            data = load_digits(dtype)
            self._x, self._y = data.x_train, data.y_train
            self.n_train, self.features, self.classes = data.n_train, data.features, data.classes
            self.test = (data.x_test, data.y_test)
            self.shuffle = True
            self._teacher = None
        elif cfg.data == "teacher":
            self._teacher = Teacher(cfg.features, cfg.classes, seed=cfg.seed)
            self.n_train, self.features, self.classes = cfg.samples, cfg.features, cfg.classes
            xt, yt = self._teacher.samples(np.arange(cfg.samples, cfg.samples + 2048), dtype)
            self.test = (xt, yt)
            # i.i.d. synthetic samples need no shuffling; in order, a worker's share of a batch is
            # one contiguous run of indices, generated from one or two blocks.
            self.shuffle = False
            self._dtype = dtype
            self._blocks: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        elif cfg.data == "file":
            self._x, self._y, xt, yt = _read_npz(cfg.data_file, dtype)
            self.n_train, self.features = self._x.shape
            self.classes = int(max(self._y.max(initial=0), yt.max(initial=0))) + 1
            self.test = (xt, yt)
            self.shuffle = True
            self._teacher = None
        else:
            raise DataError(f"--data {cfg.data!r}: choose digits, teacher or file")

    def get(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self._teacher is not None:
            return self._teacher_rows(indices)
        return self._x[indices], self._y[indices]

    def _teacher_rows(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Teacher samples through a two-block cache: in order, consecutive steps of a worker read one block."""
        blocks = indices // TEACHER_BLOCK
        if len(indices) == 0 or blocks.min() != blocks.max() or len(indices) > TEACHER_BLOCK:
            return self._teacher.samples(indices, self._dtype)
        block = int(blocks[0])
        if block not in self._blocks:
            start = block * TEACHER_BLOCK
            self._blocks[block] = self._teacher.samples(np.arange(start, start + TEACHER_BLOCK), self._dtype)
            while len(self._blocks) > 2:
                self._blocks.pop(next(iter(self._blocks)))
        x, y = self._blocks[block]
        rows = indices - block * TEACHER_BLOCK
        return x[rows], y[rows]


def _read_npz(path: str | None, dtype: Any) -> tuple[np.ndarray, ...]:
    """x_train, y_train, x_test, y_test from a NumPy .npz file (no pickles), checked."""
    if not path:
        raise DataError("--data file needs --data-file PATH (an .npz with x_train, y_train, x_test, y_test)")
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = [np.asarray(f[k]) for k in ("x_train", "y_train", "x_test", "y_test")]
    except KeyError as exc:
        raise DataError(f"--data-file {path}: missing array {exc}; it needs x_train, y_train, x_test, y_test") from None
    except (OSError, ValueError) as exc:
        raise DataError(f"--data-file {path}: cannot read it ({exc})") from None
    x, y, xt, yt = arrays
    if x.ndim != 2 or xt.ndim != 2 or x.shape[1] != xt.shape[1] or y.shape != (len(x),) or yt.shape != (len(xt),) \
            or y.dtype.kind not in "iu" or yt.dtype.kind not in "iu" or len(x) == 0:
        raise DataError(f"--data-file {path}: need x_train (n, f), y_train (n,) integers, x_test (m, f), y_test (m,); "
                        f"got {x.shape}, {y.shape} {y.dtype}, {xt.shape}, {yt.shape} {yt.dtype}")
    return x.astype(dtype), y.astype(np.int64), xt.astype(dtype), yt.astype(np.int64)


def _data_name(cfg: Config) -> str:
    """How the messages name the data set."""
    if cfg.data == "teacher":
        return "the teacher data set (--samples)"
    if cfg.data == "file":
        return f"--data-file {cfg.data_file}"
    return cfg.data


def check_batch(cfg: Config, n_train: int) -> None:
    """Refuse a global batch larger than the training set (the same on every rank: n_train is agreed first).

    One step would then process the whole data set and the batch would count
    samples that do not exist (the sampler draws without replacement).
    """
    if cfg.batch > n_train:
        more = " or more --samples" if cfg.data == "teacher" else ""
        raise ValueError(f"--batch {cfg.batch}: larger than the {n_train:,} training samples of {_data_name(cfg)}; "
                         f"use --batch <= {n_train}{more}")


def samples_processed(n: int, batch: int, workers: int, start: int, stop: int, uneven: bool = False) -> int:
    """Training samples that steps ``start .. stop-1`` process, all workers together (arithmetic, no loop over steps).

    Step ``s`` is step ``s % P`` of its epoch (``P = ceil(n / batch)`` steps);
    every step's global batch holds *batch* samples except an epoch's last,
    which holds ``n - (P-1)·batch``, and worker ``w`` takes its share of it
    (:func:`apps.blocks.block`). With *uneven*, worker ``w`` stops ``w``
    steps early (``--uneven``) and its shares of the steps it skips are not
    processed.
    """
    if stop <= start:
        return 0
    per_epoch = -(-n // batch)
    last = n - (per_epoch - 1) * batch
    total = 0
    for w in range(workers):
        end = stop - (w if uneven else 0)
        if end <= start:
            continue
        lasts = end // per_epoch - start // per_epoch  # steps s in [start, end) with s % P == P - 1
        full_share = block(batch, workers, w)
        last_share = block(last, workers, w)
        total += (end - start - lasts) * (full_share[1] - full_share[0]) + lasts * (last_share[1] - last_share[0])
    return total


def check_settings(cfg: Config) -> None:
    """Refuse settings that are wrong at any rank count, with a message stating the rule and the value.

    The command line calls it before MPI starts (a usage error);
    :func:`validate` adds what depends on the number of ranks.
    """
    if cfg.mode not in MODES:
        raise ValueError(f"--mode {cfg.mode!r}: choose one of {', '.join(MODES)}")
    if cfg.bucket_mb <= 0:
        raise ValueError(f"--bucket-mb must be > 0, got {cfg.bucket_mb:g} (DDP's default is {DEFAULT_CAP_MB:g})")
    if cfg.accumulate < 1:
        raise ValueError(f"--accumulate must be >= 1, got {cfg.accumulate} (1 synchronizes every step)")
    if cfg.staleness is not None and cfg.staleness < 0:
        raise ValueError(f"--staleness must be >= 0, got {cfg.staleness} (0 is synchronous)")
    if cfg.batch < 1:
        raise ValueError(f"--batch must be >= 1, got {cfg.batch}")
    if cfg.mode.startswith("ps"):
        if cfg.servers < 0:
            raise ValueError(f"--servers must be >= 0, got {cfg.servers} (K dedicated servers, or 0: every rank "
                             f"a worker and the server of one shard)")
        if cfg.uneven:
            raise ValueError("--uneven applies to ddp and the zero modes (Join semantics), not to parameter servers")
    if cfg.epochs < 1 and cfg.steps is None:
        raise ValueError(f"--epochs must be >= 1, got {cfg.epochs}")
    if cfg.steps is not None and cfg.steps < 0:
        raise ValueError(f"--steps must be >= 0, got {cfg.steps}")
    if cfg.checkpoint_every < 0:
        raise ValueError(f"--checkpoint-every must be >= 0, got {cfg.checkpoint_every} (0: never)")
    if cfg.keep < 1:
        raise ValueError(f"--keep must be >= 1, got {cfg.keep}")
    if not 0.0 <= cfg.dropout < 1.0:
        raise ValueError(f"--dropout must be in [0, 1), got {cfg.dropout:g}")
    if cfg.lr <= 0:
        raise ValueError(f"--lr must be > 0, got {cfg.lr:g}")
    if any(h < 1 for h in cfg.hidden):
        raise ValueError(f"--hidden: each width must be >= 1, got {','.join(map(str, cfg.hidden))}")
    compression_dtype(cfg.compress)
    if cfg.compress and cfg.mode != "ddp":
        raise ValueError(f"--compress {cfg.compress}: applies to --mode ddp's all-reduce only")
    if cfg.reproducible:
        if cfg.mode.startswith("ps"):
            raise ValueError(f"--reproducible applies to ddp and the zero modes, not to --mode {cfg.mode}")
        if cfg.accumulate != 1 or cfg.compress or cfg.uneven:
            raise ValueError("--reproducible cuts the global batch into --micro-batches itself and sums them "
                             "exactly: drop --accumulate, --compress and --uneven")
        if cfg.micro_batches < 1 or cfg.micro_batches > cfg.batch:
            raise ValueError(f"--micro-batches {cfg.micro_batches}: use 1 <= M <= --batch {cfg.batch}")


def validate(cfg: Config, size: int) -> None:
    """Refuse bad settings for a run on *size* ranks with a message naming the value and the fix (the same on every
    rank): :func:`check_settings`, then the servers and the batch against the ranks."""
    check_settings(cfg)
    workers = _workers(cfg, size)
    if cfg.batch < workers:
        raise ValueError(f"--batch {cfg.batch}: the global batch is smaller than the {workers} workers; "
                         f"every worker needs at least one sample: use --batch >= {workers}")
    if cfg.reproducible and cfg.micro_batches < workers:
        raise ValueError(f"--micro-batches {cfg.micro_batches}: fewer than the {workers} workers; every worker "
                         f"computes at least one micro-batch: use --micro-batches >= {workers}")
    if cfg.batch < workers * cfg.accumulate:
        raise ValueError(f"--batch {cfg.batch} with --accumulate {cfg.accumulate}: each of the {workers} workers "
                         f"needs at least one sample per micro-batch; use --batch >= {workers * cfg.accumulate}")


def _workers(cfg: Config, size: int) -> int:
    """The workers of a run on *size* ranks: every rank, but for dedicated parameter servers (ValueError for a
    --servers that does not fit; :func:`apps.sgd.ps.layout`)."""
    return layout(size, cfg.servers)[0] if cfg.mode.startswith("ps") else size


def _array_module(backend: str, comm: Any) -> Any:
    """The array module of *backend*; for cupy, with this rank's GPU bound (:func:`apps.options.bind_device`)."""
    if backend == "numpy":
        return np
    if backend == "cupy":
        try:
            import cupy
        except ImportError:
            raise ValueError("--backend cupy needs CuPy: pip install -e '.[cuda12]' (or cuda13)") from None
        bind_device(comm)
        return cupy
    raise ValueError(f"--backend {backend!r}: choose numpy or cupy")


def memory_need(cfg: Config, n: int, features: int, classes: int, workers: int) -> int:
    """About the bytes the busiest rank allocates for a run of *cfg* (see :mod:`apps.memory`).

    The model: parameters, gradients, the all-reduce's buckets and the
    optimizer's state. A step: this worker's share of the batch (inputs,
    labels, indices), then either the teacher's float64 samples being made or
    the activations of one micro-batch (each hidden unit about three values
    per sample - the Linear's input, the activation's output, the gradient -
    plus a mask byte; measured within a few per cent for MLPs on the teacher
    data). The sampler's visiting order (8 bytes per training sample), rank
    0's evaluation batches, and the teacher data set's fixed arrays (weights,
    calibration and test samples, two cached blocks), which grow with
    ``--features``.
    """
    itemsize = np.dtype(cfg.dtype).itemsize
    hidden = [int(h) for h in cfg.hidden]
    widths = [features, *hidden, classes]
    params = sum(a * b + b for a, b in zip(widths, widths[1:])) + (2 * sum(hidden) if cfg.layernorm else 0)
    states = 2 if cfg.optimizer in ("adam", "adamw") else (1 if cfg.momentum > 0 else 0)
    model = params * itemsize * (3 + states) + (params * 2 if cfg.compress else 0)
    units = 3 * sum(hidden) + 3 * classes + (2 * sum(hidden) if cfg.layernorm else 0) + (sum(hidden) if cfg.dropout else 0)
    per_row = itemsize * units + sum(hidden)
    share = -(-max(cfg.batch, 1) // max(workers, 1))
    rows = -(-share // max(cfg.accumulate, 1))
    teacher = cfg.data == "teacher"
    step = share * (features * itemsize + 16) + max(rows * per_row, share * features * 8 if teacher else 0)
    evaluate = min(1024, 2048 if teacher else n) * (per_row + features * itemsize)
    order = 8 * max(n, 0)
    fixed = features * (8 * (128 + 4096 + 2048 + TEACHER_BLOCK) + itemsize * (2048 + 2 * TEACHER_BLOCK)) if teacher \
        else 0
    return model + step + evaluate + order + fixed


def _check_memory(comm: Any, cfg: Config, n: int, features: int, classes: int, workers: int) -> None:
    """Refuse, on every rank, a run whose arrays cannot fit the memory available (collective)."""
    teacher = cfg.data == "teacher"
    knobs = [memory.Knob("--batch", cfg.batch, low=workers * cfg.accumulate)]
    if teacher:
        knobs += [memory.Knob("--samples", n), memory.Knob("--features", features)]
    if cfg.hidden:
        knobs.append(memory.Knob("--hidden", max(cfg.hidden), shown=",".join(map(str, cfg.hidden)),
                                 template="--hidden widths <= {value}"))
    share = cfg.batch // max(workers, 1)
    if share > cfg.accumulate:
        knobs.append(memory.Knob("--accumulate", cfg.accumulate, high=share))

    def need(v: dict[str, int]) -> int:
        hidden = tuple(min(h, v["--hidden"]) for h in cfg.hidden) if cfg.hidden else cfg.hidden
        c = replace(cfg, batch=v["--batch"], hidden=hidden, accumulate=v.get("--accumulate", cfg.accumulate))
        samples = max(v.get("--samples", n), v["--batch"])  # the batch check keeps --samples >= --batch
        return memory_need(c, samples, v.get("--features", features), classes, workers)

    memory.check(comm, need, knobs, otherwise="spread the run over more nodes")


def _source(comm: Any, cfg: Config) -> Source:
    """The data source, built on every rank; data one rank cannot read (a missing package, an unreadable
    file) is a ValueError on every rank (collective)."""
    source, problem = None, None
    try:
        source = Source(cfg, np.dtype(cfg.dtype))
    except (DataError, OSError) as exc:
        problem = str(exc)
    agree(comm, problem)
    return source


def preflight(comm: Any, cfg: Config) -> Source:
    """Every check a run can make before it allocates, with the same verdict on every rank (collective).

    The settings (:func:`validate`), the checkpoint directory (created and
    probed by every rank, :func:`apps.checkpoint.prepare_directory`), the data
    set (readable by every rank, the same size everywhere), the global batch
    against the data set (:func:`check_batch`) and the memory the run needs
    against what the machine has (:func:`memory_need`). Returns the data source.
    """
    size = comm.Get_size()
    validate(cfg, size)
    if cfg.checkpoint_every:
        ck.prepare_directory(comm, cfg.checkpoint_dir)
    workers = _workers(cfg, size)
    teacher = cfg.data == "teacher"
    if teacher:  # known without building the data set, whose arrays grow with --features
        for option, value in (("--samples", cfg.samples), ("--features", cfg.features)):
            if value < 1:
                raise ValueError(f"{option} {value}: the teacher data set needs {option} >= 1")
        shape = (cfg.samples, cfg.features, cfg.classes)
        source = None
    else:
        source = _source(comm, cfg)
        shape = (source.n_train, source.features, source.classes)
    shapes = comm.allgather(shape)
    if any(s != shapes[0] for s in shapes):
        raise ValueError(f"{_data_name(cfg)}: the ranks read data sets of different sizes "
                         f"({', '.join(f'rank {r}: {s[0]} samples of {s[1]} features' for r, s in enumerate(shapes))}); "
                         f"give every rank the same data")
    n, features, classes = shape
    check_batch(cfg, n)
    _check_memory(comm, cfg, n, features, classes, workers)
    return source if source is not None else _source(comm, cfg)


def build(comm: Any, cfg: Config, model: Any, optimizer: Any, total_steps: int, start_step: int = 0) -> Any:
    """The mode's strategy object (*start_step*: where a restarted run resumes; the parameter servers' first
    version)."""
    options = dict(algorithm=cfg.algorithm, cap_mb=cfg.bucket_mb, per_parameter=cfg.per_parameter,
                   overlap=cfg.overlap, accumulate=cfg.accumulate,
                   micro_batches=cfg.micro_batches if cfg.reproducible else None)
    if cfg.mode == "ddp":
        return DDP(comm, model, optimizer, compress=cfg.compress, **options)
    if cfg.mode in ("zero1", "zero2"):
        return Zero(comm, model, optimizer, stage=int(cfg.mode[-1]), **options)
    if cfg.mode == "zero3":
        return Zero3(comm, model, optimizer, **options)
    staleness = 0 if cfg.mode == "ps-sync" else cfg.staleness
    return ParameterServer(comm, model, optimizer, servers=cfg.servers, staleness=staleness,
                           total_steps=total_steps, start=start_step)


def evaluate(model: Any, x: np.ndarray, y: np.ndarray, batch: int = 1024) -> tuple[float, float]:
    """(mean loss, accuracy) of *model* on (x, y), in eval mode."""
    xp = _module_of(model)
    loss_sum, right = 0.0, 0
    for a in range(0, len(y), batch):
        xb, yb = xp.asarray(x[a:a + batch]), xp.asarray(y[a:a + batch])
        logits = model.forward(xb, train=False)
        loss, _ = softmax_cross_entropy(logits, yb)
        loss_sum += loss * len(yb)
        right += correct(logits, yb)
    return loss_sum / max(1, len(y)), right / max(1, len(y))


def _module_of(model: Any) -> Any:
    from apps.nn.xp import array_module

    return array_module(model.params)


# ---------------------------------------------------------------- checkpoints


def save_checkpoint(comm: Any, cfg: Config, strategy: Any, step: int, signature: dict[str, Any]) -> None:
    """The whole state at *step* (collective: sharded optimizer state is gathered first).

    Rank 0 writes; a write that fails (a full disk, a directory removed
    meanwhile) raises the same :class:`apps.checkpoint.CheckpointError` on
    every rank, naming the file and the system's reason, so the whole run
    stops alike (the command line exits with status 2 on every rank).
    """
    state = strategy.full_state()
    full_params = getattr(strategy, "full_params", None)  # ps: the servers' shards at version *step*, gathered
    params = full_params() if full_params is not None else strategy.model.params

    def write() -> None:
        arrays = {"params": to_host(params)}
        arrays.update({f"optimizer.{k}": np.asarray(to_host(v)) for k, v in state.items()})
        path = ck.data_path(cfg.checkpoint_dir, PREFIX, step)
        try:
            record, entries = ck.write_arrays(path, arrays)
            ck.save_manifest(ck.manifest_path(cfg.checkpoint_dir, PREFIX, step), step, [record], arrays=entries,
                             model=signature, mode=cfg.mode, ranks=comm.Get_size(), batch=cfg.batch)
            ck.prune(cfg.checkpoint_dir, PREFIX, cfg.keep)
        except OSError as exc:
            where = os.fsdecode(exc.filename) if exc.filename is not None else cfg.checkpoint_dir
            raise ck.CheckpointError(f"--checkpoint-dir {cfg.checkpoint_dir}: the checkpoint of step {step} cannot "
                                     f"be written: {where}: {exc.strerror or exc}; make room there or pass another "
                                     f"--checkpoint-dir") from None

    from_root(comm, write, ck.CheckpointError, ())


def _check_manifest(body: dict[str, Any]) -> None:
    """The training loop's own manifest fields: one data file whose arrays lie inside it, ``params`` among them."""
    if len(body["files"]) != 1:
        raise ck.CheckpointError(f"{body['path']}: names {len(body['files'])} data files, an sgd checkpoint has one")
    arrays = ck.check_entries(body.get("arrays"), body["files"][0]["bytes"], body["path"])
    names = [e["name"] for e in arrays]
    if "params" not in names or any(n != "params" and not n.startswith("optimizer.") for n in names):
        raise ck.CheckpointError(f"{body['path']}: arrays {names}: expected 'params' and 'optimizer.*' only")


def check_state(path: str, arrays: dict[str, np.ndarray], num_params: int, state: Iterable[str]) -> None:
    """Refuse a checkpoint whose arrays do not fit this model and optimizer, before anything is loaded.

    *state* names the optimizer's state (``step``, a 0-d integer counter, and
    per-parameter vectors); :class:`apps.checkpoint.CheckpointError` otherwise.
    """
    state = set(state)
    params = arrays["params"]
    if params.ndim != 1 or params.size != num_params or params.dtype.kind != "f":
        raise ck.CheckpointError(f"{path}: params {params.dtype.str} {list(params.shape)}, this model has "
                                 f"{num_params} floating-point parameters; use the checkpoint's settings or drop "
                                 f"--restart")
    saved = {k.split(".", 1)[1]: v for k, v in arrays.items() if k.startswith("optimizer.")}
    if set(saved) != set(state):
        raise ck.CheckpointError(f"{path}: optimizer state {sorted(saved)}, this optimizer keeps {sorted(state)}")
    for key, value in saved.items():
        want = [(), (1,)] if key == "step" else [(num_params,)]  # the 0-d counter is stored with shape (1,)
        if value.shape not in want or value.dtype.kind not in ("i" if key == "step" else "f"):
            raise ck.CheckpointError(f"{path}: optimizer.{key} is {value.dtype.str} {list(value.shape)}, expected "
                                     f"shape {list(want[-1])} of {'integers' if key == 'step' else 'floats'}")


def load_checkpoint(comm: Any, cfg: Config, signature: dict[str, Any], num_params: int | None = None,
                    state_names: Iterable[str] = ()) -> tuple[int, dict[str, np.ndarray] | None]:
    """(step, arrays) of the newest valid checkpoint matching this run (every rank), or (0, None).

    With *num_params*, the arrays must also fit a model of that many
    parameters and an optimizer keeping *state_names* (see :func:`check_state`).

    Rank 0 reads and verifies; the outcome - or the error - reaches every rank.
    """
    outcome: Any = None
    if comm.Get_rank() == 0:
        try:
            os.makedirs(cfg.checkpoint_dir, exist_ok=True)
            body, refused = ck.newest_valid(cfg.checkpoint_dir, PREFIX, check=_check_manifest)
            if body is None:
                if refused:
                    raise ck.CheckpointError("no valid checkpoint in " + cfg.checkpoint_dir + ": " + "; ".join(refused))
                outcome = ("fresh", 0, None)
            else:
                theirs = body.get("model")
                if theirs != signature:
                    diff = {k: (theirs.get(k) if isinstance(theirs, dict) else None, v)
                            for k, v in signature.items() if not isinstance(theirs, dict) or theirs.get(k) != v}
                    raise ck.CheckpointError(
                        f"{body['path']}: a checkpoint of another model or run "
                        + ", ".join(f"{k} {a!r} there, {b!r} here" for k, (a, b) in diff.items())
                        + "; point --checkpoint-dir elsewhere or drop --restart")
                if body.get("batch") != cfg.batch:
                    raise ck.CheckpointError(f"{body['path']}: written with --batch {body.get('batch')}, this run "
                                             f"has --batch {cfg.batch} (the sampler position would not match)")
                data = os.path.join(cfg.checkpoint_dir, body["files"][0]["file"])
                arrays = ck.read_arrays(data, body["arrays"])
                if num_params is not None:
                    check_state(body["path"], arrays, num_params, state_names)
                outcome = ("resume", body["step"], arrays)
        except (ck.CheckpointError, OSError, KeyError, ValueError, TypeError) as exc:
            outcome = ("error", str(exc), None)
    kind, value, arrays = comm.bcast(outcome, root=0)
    if kind == "error":
        raise ck.CheckpointError(value)
    return (value, arrays) if kind == "resume" else (0, None)


def _fresh_directory(comm: Any, cfg: Config) -> None:
    """A fresh run refuses a directory that already holds this series' checkpoints (every rank)."""
    problem = None
    if comm.Get_rank() == 0:
        try:
            os.makedirs(cfg.checkpoint_dir, exist_ok=True)
            if ck.steps(cfg.checkpoint_dir, PREFIX):
                problem = (f"--checkpoint-dir {cfg.checkpoint_dir} already holds checkpoints; pass --restart to "
                           f"resume from them, or choose an empty directory")
        except OSError as exc:
            problem = f"--checkpoint-dir {cfg.checkpoint_dir}: {exc}"
    verdict(comm, problem, ck.CheckpointError)


# ---------------------------------------------------------------- the loop


class _Timeline:
    """Timestamps of one step on this rank: layers' backward, buckets' collectives, waits."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, float, float]] = []  # (kind, label, start, end)
        self._last = 0.0

    def wrap(self, strategy: Any) -> Callable[[], None]:
        reducer = getattr(strategy, "reducer", None)
        if reducer is None:
            return lambda: None
        model = strategy.model
        backward = model.backward
        timeline = self

        def timed_backward(dy: Any, hook: Any = None) -> None:
            timeline._last = time.perf_counter()

            def layer_hook(i: int) -> None:
                now = time.perf_counter()
                timeline.events.append(("backward", f"layer {i}", timeline._last, now))
                if hook is not None:
                    hook(i)
                timeline._last = time.perf_counter()

            backward(dy, hook=layer_hook)

        model.backward = timed_backward

        def restore() -> None:
            model.backward = backward
            for index, start, end in reducer.timings:
                timeline.events.append(("bucket", f"bucket {index}", start, end))

        return restore


def _saving(cfg: Config, done: int, total: int) -> bool:
    """Whether a checkpoint follows step *done*: every ``checkpoint_every`` steps and after the last."""
    return bool(cfg.checkpoint_every) and (done % cfg.checkpoint_every == 0 or done == total)


def _whole(strategy: Any, root: int, needed: bool) -> AbstractContextManager[Any]:
    """zero3 keeps a shard of the parameters: the whole vector in the model on *root* for a block that reads
    it (evaluation, a checkpoint) - a collective every rank enters when *needed*; nothing for the other modes."""
    whole = getattr(strategy, "whole", None)
    return whole(root) if needed and whole is not None else nullcontext()


def train(comm: Any, cfg: Config, say: Callable[[str], None] = print, source: Source | None = None) -> Report:
    """Run *cfg* on *comm* (every rank); rank 0's :class:`Report`, a partial one elsewhere.

    *source*: the data source :func:`preflight` returned for this *cfg* (its
    checks then are not repeated); None runs them first.
    """
    size, rank = comm.Get_size(), comm.Get_rank()
    if source is None:
        source = preflight(comm, cfg)
    xp = _array_module(cfg.backend, comm)
    dtype = np.dtype(cfg.dtype)
    model = mlp([source.features, *cfg.hidden, source.classes], activation=cfg.activation, layernorm=cfg.layernorm,
                dropout=cfg.dropout, dtype=dtype, xp=xp, seed=cfg.seed)
    kwargs: dict[str, Any] = {"lr": cfg.lr, "weight_decay": cfg.weight_decay}
    if cfg.optimizer == "sgd":
        kwargs["momentum"] = cfg.momentum
    optimizer = make_optimizer(cfg.optimizer, **kwargs)
    workers = _workers(cfg, size)
    probe = Sampler(source.n_train, cfg.batch, workers, 0, cfg.seed, shuffle=source.shuffle)
    per_epoch = probe.steps_per_epoch
    total = cfg.steps if cfg.steps is not None else cfg.epochs * per_epoch
    signature = cfg.model_signature(source.features, source.classes)

    if cfg.checkpoint_every and not cfg.restart:
        _fresh_directory(comm, cfg)
    state_names = (*optimizer.state_names, "step")
    start_step, arrays = (load_checkpoint(comm, cfg, signature, model.num_params, state_names) if cfg.restart
                          else (0, None))

    num_params = model.num_params  # zero3 keeps only a shard of model.params
    strategy = build(comm, cfg, model, optimizer, total, start_step)
    if arrays is not None:
        getattr(strategy, "load_params", model.load_params)(arrays["params"])
        strategy.load_full_state({k.split(".", 1)[1]: v for k, v in arrays.items() if k.startswith("optimizer.")})
        say(f"resumed from step {start_step} in {cfg.checkpoint_dir}")
    is_worker = getattr(strategy, "is_worker", True)
    index = getattr(strategy, "worker_index", rank)
    report = Report(cfg.mode, size, workers, total, start_step, 0.0, 0.0, float("nan"), float("nan"),
                    float("nan"), num_params, strategy.memory())

    logf = _open_log(cfg.log) if rank == 0 and cfg.log else None
    progress = cli.Progress(total - start_step, "train", show=rank == 0 and cfg.progress)
    t_start = time.perf_counter()
    if not is_worker:  # a dedicated parameter server: serves, stopping at each checkpoint to join it
        for done in range(start_step + 1, total + 1):
            if _saving(cfg, done, total):
                strategy.serve(until=done)
                save_checkpoint(comm, cfg, strategy, done, signature)
        strategy.serve()
    else:
        sampler = Sampler(source.n_train, cfg.batch, workers, index, cfg.seed, shuffle=source.shuffle,
                          micro_batches=cfg.micro_batches if cfg.reproducible else None)
        last_step = total - (index if cfg.uneven else 0)
        interval = [0.0, 0, 0]  # loss sum, correct, samples of rank 0's shares since the last log
        eval_every = cfg.eval_every or per_epoch
        for step in range(start_step, total):
            epoch, s = divmod(step, per_epoch)
            model.rng_key = (step, rank)
            have = step < last_step
            divisor = strategy.active_ranks(have) if cfg.uneven else None
            timeline = _Timeline() if cfg.timeline_step == step else None
            restore = timeline.wrap(strategy) if timeline else None
            t_step = time.perf_counter()
            if have:
                indices, count = sampler.batch(epoch, s)
                x, y = source.get(indices)
                res = strategy.step(xp.asarray(x), xp.asarray(y), count, divisor) if cfg.uneven \
                    else strategy.step(xp.asarray(x), xp.asarray(y), count)
                interval[0] += res.loss_sum
                interval[1] += res.correct
                interval[2] += res.samples
                report.compute_s += res.compute
                report.exposed_s += res.exposed
                report.comm_s += res.comm_total
            else:
                strategy.idle_step(divisor)
            report.step_s += time.perf_counter() - t_step
            if restore is not None:
                restore()
                report.timeline = [(kind, label, a - t_step, b - t_step) for kind, label, a, b in timeline.events]
            done = step + 1
            saving = _saving(cfg, done, total)
            evaluating = done % eval_every == 0 or done == total
            with _whole(strategy, 0, bool(saving or evaluating)):
                if saving:
                    save_checkpoint(comm, cfg, strategy, done, signature)
                if rank == 0 and evaluating:
                    elapsed = time.perf_counter() - t_start
                    test_loss, test_acc = evaluate(model, *source.test)
                    train_loss = interval[0] / max(1, interval[2])
                    train_acc = interval[1] / max(1, interval[2])
                    counted = samples_processed(source.n_train, cfg.batch, workers, start_step, done, cfg.uneven)
                    rate = counted / elapsed if elapsed > 0 else 0.0
                    row = {"step": done, "epoch": done / per_epoch, "seconds": elapsed, "train_loss": train_loss,
                           "train_accuracy": train_acc, "test_loss": test_loss, "test_accuracy": test_acc,
                           "samples_per_s": rate}
                    report.history.append(row)
                    if logf is not None:
                        _log_row(logf, row)
                    progress.step(f"epoch {done / per_epoch:.2f}  loss {train_loss:.4f}  acc {train_acc:.3f}  "
                                  f"test loss {test_loss:.4f}  test acc {test_acc:.3f}  {rate:,.0f} samples/s",
                                  steps=done - start_step - progress.done)
                    interval = [0.0, 0, 0]
    close = getattr(strategy, "close", None)
    if close is not None:
        close()
        # The parameter server's bottleneck: the busiest link's bytes per step, over every rank.
        links = comm.allgather(strategy.stats["link_bytes"] / max(1, total - start_step))
        report.bytes_per_step = max(links)
    report.seconds = time.perf_counter() - t_start
    report.samples = samples_processed(source.n_train, cfg.batch, workers, start_step, total, cfg.uneven)
    report.samples_per_s = report.samples / report.step_s if report.step_s > 0 else 0.0
    report.memory = strategy.memory()
    formula = getattr(strategy, "memory_formula", None)
    report.memory_formula = formula() if formula is not None else None
    gather = getattr(strategy, "gather_params", None)
    if gather is not None:  # zero3: the trained model whole on every rank, from here on
        gather()
    report.model = model
    if rank == 0:
        report.test_loss, report.test_accuracy = evaluate(model, *source.test)
        if report.history:
            report.train_loss = report.history[-1]["train_loss"]
    if logf is not None:
        logf.close()
    return report


_COLUMNS = ("step", "epoch", "seconds", "train_loss", "train_accuracy", "test_loss", "test_accuracy", "samples_per_s")


def _open_log(path: str) -> Any:
    f = open(path, "w", newline="")
    csv.writer(f).writerow(_COLUMNS)
    return f


def _log_row(f: Any, row: dict[str, float]) -> None:
    csv.writer(f).writerow([f"{row[c]:.6g}" if isinstance(row[c], float) else row[c] for c in _COLUMNS])
    f.flush()


def config_dict(cfg: Config) -> dict[str, Any]:
    return asdict(cfg)
