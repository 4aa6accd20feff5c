"""Data sets and the distributed sampler (pure: no MPI; ranks are plain integers).

Two data sets:

* :func:`load_digits` - scikit-learn's bundled handwritten digits (1797 8x8 images,
  10 classes), shipped inside the package: nothing is downloaded. Pixels are scaled
  to [0, 1]; a fixed permutation puts the last :data:`DIGITS_TEST` samples in the
  test set, the same split on every machine and every run.
* :class:`Teacher` - a synthetic task of any size for benchmarks: a fixed random
  two-layer tanh network labels Gaussian inputs. Sample ``i`` is a function of
  ``(seed, i)`` alone, so each rank generates only its own shard, and never the
  whole data set.

And :class:`Sampler`, which decides which global sample indices each rank trains
on at every step, such that N ranks together see exactly the batches one rank
would (see its docstring); the split of a batch over the ranks is
:func:`apps.blocks.block`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from apps.blocks import block, grouped

__all__ = [
    "DataError",
    "Dataset",
    "DIGITS_SAMPLES",
    "DIGITS_TEST",
    "split_indices",
    "load_digits",
    "Teacher",
    "TEACHER_BLOCK",
    "teacher_dataset",
    "Sampler",
]

#: Number of samples in scikit-learn's digits data set.
DIGITS_SAMPLES = 1797
#: Size of the digits test set: the last 360 samples of the fixed permutation (about 20 %).
DIGITS_TEST = 360
#: Samples per generated block of the teacher data set (sample i lives in block i // TEACHER_BLOCK).
TEACHER_BLOCK = 1024


class DataError(ValueError):
    """A data set cannot be provided (a missing optional dependency, impossible sizes)."""


@dataclass
class Dataset:
    """Train and test arrays of a classification task: ``x`` is (samples, features), ``y`` int64 labels."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: int
    name: str

    @property
    def features(self) -> int:
        """Number of input features (columns of ``x_train``)."""
        return int(self.x_train.shape[1])

    @property
    def n_train(self) -> int:
        return int(self.x_train.shape[0])

    @property
    def n_test(self) -> int:
        return int(self.x_test.shape[0])


# ----------------------------------------------------------------------------- digits


def split_indices(n: int, n_test: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The deterministic train/test split: ``perm = default_rng(seed).permutation(n)``;
    the test set is ``perm[-n_test:]``, the training set ``perm[:-n_test]`` (both in permuted order)."""
    if not 0 < n_test < n:
        raise DataError(f"a test set of {n_test} samples does not fit in {n} samples; use 0 < n_test < {n}")
    perm = np.random.default_rng(seed).permutation(n)
    return perm[: n - n_test], perm[n - n_test :]


def load_digits(dtype=np.float32) -> Dataset:
    """scikit-learn's digits: 1797 8x8 images (64 features in [0, 1]), 10 classes.

    Pixels (0..16 in the original) are divided by 16 and cast to ``dtype``; labels
    are int64. The split is fixed: ``np.random.default_rng(0).permutation(1797)``,
    whose last :data:`DIGITS_TEST` (360) samples form the test set and the first
    1437 the training set - identical on every rank, machine and run.

    Raises :class:`DataError` if scikit-learn is not installed.
    """
    try:
        from sklearn import datasets
    except ImportError as exc:
        raise DataError(
            "the digits data set comes with scikit-learn, which is not installed: "
            "pip install -e '.[digits]' (or pip install 'scikit-learn>=1.3'), or use the synthetic teacher data set"
        ) from exc
    if not np.issubdtype(np.dtype(dtype), np.floating):
        raise DataError(f"dtype {np.dtype(dtype)} is not a floating-point type; use float32 or float64")
    bunch = datasets.load_digits()
    x = (np.asarray(bunch.data, dtype=np.float64) / 16.0).astype(dtype, copy=False)
    y = np.asarray(bunch.target, dtype=np.int64)
    train, test = split_indices(len(y), DIGITS_TEST, seed=0)
    return Dataset(
        x_train=np.ascontiguousarray(x[train]),
        y_train=y[train],
        x_test=np.ascontiguousarray(x[test]),
        y_test=y[test],
        classes=10,
        name="digits",
    )


# ----------------------------------------------------------------------------- teacher


class Teacher:
    """A synthetic classification task of any size: a fixed random tanh network labels Gaussian inputs.

    ``x ~ N(0, I)`` with ``features`` components; the label is
    ``argmax(tanh(x @ w1 + b1) @ w2 + b2 + noise * eps)`` with ``eps ~ N(0, I)`` per sample.
    The weights depend on ``seed`` only; ``b2`` centres the logits over a fixed
    calibration sample so that the classes are roughly balanced.

    Sample ``i`` depends on ``(seed, i)`` alone: samples are generated in blocks of
    :data:`TEACHER_BLOCK`, block ``k`` from ``SeedSequence([seed, 1, k])``, and
    :meth:`samples` generates only the blocks its indices fall in. So any rank can
    produce any subset, and an index always yields the same sample whatever else is
    requested with it.
    """

    def __init__(self, features: int = 64, classes: int = 10, hidden: int = 128, seed: int = 0, noise: float = 0.0):
        for name, value, least in (("features", features, 1), ("classes", classes, 2), ("hidden", hidden, 1)):
            if int(value) != value or value < least:
                raise DataError(f"teacher {name}={value} is invalid; use an integer >= {least}")
        if int(seed) != seed or seed < 0:
            raise DataError(f"teacher seed={seed} is invalid; use an integer >= 0")
        if not noise >= 0.0:
            raise DataError(f"teacher noise={noise} is invalid; use a value >= 0")
        self.features, self.classes, self.hidden = int(features), int(classes), int(hidden)
        self.seed, self.noise = int(seed), float(noise)
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, 0]))
        self.w1 = rng.standard_normal((self.features, self.hidden)) / np.sqrt(self.features)
        self.b1 = 0.1 * rng.standard_normal(self.hidden)
        self.w2 = rng.standard_normal((self.hidden, self.classes)) * (3.0 / np.sqrt(self.hidden))
        calibration = rng.standard_normal((4096, self.features))
        self.b2 = -np.tanh(calibration @ self.w1 + self.b1).dot(self.w2).mean(axis=0)

    def __repr__(self) -> str:
        return (
            f"Teacher(features={self.features}, classes={self.classes}, hidden={self.hidden}, "
            f"seed={self.seed}, noise={self.noise})"
        )

    def logits(self, x: np.ndarray) -> np.ndarray:
        """The teacher's noise-free logits (float64) for inputs ``x`` of shape (m, features)."""
        return np.tanh(np.asarray(x, dtype=np.float64) @ self.w1 + self.b1) @ self.w2 + self.b2

    def _block(self, block: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, 1, int(block)]))
        x = rng.standard_normal((TEACHER_BLOCK, self.features))
        z = self.logits(x)
        if self.noise > 0.0:
            z = z + self.noise * rng.standard_normal((TEACHER_BLOCK, self.classes))
        return x, np.argmax(z, axis=1).astype(np.int64)

    def samples(self, indices, dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
        """The samples with these global indices: ``x`` (len, features) of ``dtype``, ``y`` int64 labels.

        Order and repetitions of ``indices`` are kept; only the blocks they touch are generated.
        """
        idx = np.asarray(indices)
        if idx.ndim != 1:
            raise DataError(f"teacher indices must be one-dimensional, got shape {idx.shape}")
        if idx.size and not np.issubdtype(idx.dtype, np.integer):
            raise DataError(f"teacher indices must be integers, got dtype {idx.dtype}")
        idx = idx.astype(np.int64, copy=False)
        if idx.size and idx.min() < 0:
            raise DataError(f"teacher index {int(idx.min())} is negative; indices are global sample numbers >= 0")
        dtype = np.dtype(dtype)
        if not np.issubdtype(dtype, np.floating):
            raise DataError(f"dtype {dtype} is not a floating-point type; use float32 or float64")
        x = np.empty((idx.size, self.features), dtype=dtype)
        y = np.empty(idx.size, dtype=np.int64)
        if idx.size == 0:
            return x, y
        blocks = idx // TEACHER_BLOCK
        order = np.argsort(blocks, kind="stable")
        sorted_blocks = blocks[order]
        starts = np.flatnonzero(np.r_[True, sorted_blocks[1:] != sorted_blocks[:-1]])
        stops = np.r_[starts[1:], idx.size]
        for start, stop in zip(starts, stops):
            positions = order[start:stop]
            bx, by = self._block(int(sorted_blocks[start]))
            rows = idx[positions] - int(sorted_blocks[start]) * TEACHER_BLOCK
            x[positions] = bx[rows]
            y[positions] = by[rows]
        return x, y


def teacher_dataset(
    n_train: int,
    n_test: int,
    features: int = 64,
    classes: int = 10,
    hidden: int = 128,
    seed: int = 0,
    noise: float = 0.0,
    dtype=np.float32,
) -> Dataset:
    """A small teacher data set held in memory: training samples are indices ``0 .. n_train-1``,
    test samples ``n_train .. n_train+n_test-1``. For large sizes use :meth:`Teacher.samples` per shard."""
    if n_train < 1 or n_test < 0:
        raise DataError(
            f"teacher data set of n_train={n_train}, n_test={n_test} is invalid; use n_train >= 1, n_test >= 0"
        )
    teacher = Teacher(features=features, classes=classes, hidden=hidden, seed=seed, noise=noise)
    x_train, y_train = teacher.samples(np.arange(n_train), dtype=dtype)
    x_test, y_test = teacher.samples(np.arange(n_train, n_train + n_test), dtype=dtype)
    return Dataset(x_train, y_train, x_test, y_test, classes=teacher.classes, name="teacher")


# ----------------------------------------------------------------------------- sampler


class Sampler:
    """Which global samples each rank uses at each step - ``torch``'s DistributedSampler, made exact.

    Epoch ``e`` visits the samples in the order ``order(e)``:
    ``np.random.default_rng([seed, e]).permutation(n)`` (``arange(n)`` without
    ``shuffle``), computed identically on every rank - no communication needed.
    Step ``s`` of the epoch takes the global batch ``order(e)[s*B:(s+1)*B]`` and
    splits it over the ranks in contiguous chunks with :func:`apps.blocks.block`: rank ``r``
    gets chunk ``r``, and the first ``b % world_size`` ranks one more sample. So the
    concatenation of the ranks' chunks, in rank order, *is* the batch a single rank
    would use - N ranks train on exactly the same batches as one rank.

    An epoch has ``ceil(n / B)`` steps; its last batch may be smaller than ``B``
    (with ``drop_last`` the incomplete batch is skipped: ``floor(n / B)`` steps), and
    then a rank may even get **zero** samples. Every rank still takes part in the
    step's collectives. To make the all-reduced *average* of the ranks' gradients
    equal the single-rank mean over the ``global_count`` samples, each rank computes
    the *sum* of its samples' loss gradients and scales it by
    ``world_size / global_count``: ``(1/N) * sum_r (N/G) * sum_{i in r} g_i = (1/G) * sum_i g_i``.
    A rank with no samples contributes zeros.

    :meth:`batches` can start at any step, so a restarted run resumes mid-epoch with
    exactly the batches it would have had.

    *micro_batches* (``--reproducible``): the global batch is cut into that many
    fixed micro-batches, and rank ``r`` gets the samples of micro-batches
    ``block(M, world_size, r)`` (:func:`apps.sgd.ddp.micro_ranges`).
    """

    def __init__(
        self,
        n: int,
        global_batch: int,
        world_size: int,
        rank: int,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
        micro_batches: int | None = None,
    ):
        if n < 1:
            raise ValueError(f"the data set has {n} samples; the sampler needs at least 1")
        if world_size < 1:
            raise ValueError(f"world size {world_size} is invalid; it must be at least 1")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is out of range for {world_size} ranks; use 0 <= rank < {world_size}")
        if global_batch < 1:
            raise ValueError(f"global batch {global_batch} is invalid; use --batch >= {max(1, world_size)}")
        if global_batch < world_size:
            raise ValueError(
                f"global batch {global_batch} is smaller than the {world_size} ranks: "
                f"every rank needs at least one sample; use --batch >= {world_size}"
            )
        if seed < 0:
            raise ValueError(f"sampler seed {seed} is invalid; use a seed >= 0")
        if drop_last and n < global_batch:
            raise ValueError(
                f"with drop_last, {n} samples make no full batch of {global_batch}: "
                f"use --batch <= {n} or keep the last, smaller batch"
            )
        self.n, self.global_batch = int(n), int(global_batch)
        self.world_size, self.rank = int(world_size), int(rank)
        self.seed, self.shuffle, self.drop_last = int(seed), bool(shuffle), bool(drop_last)
        if micro_batches is not None and not world_size <= micro_batches <= global_batch:
            raise ValueError(f"{micro_batches} micro-batches: use {world_size} (the ranks) <= M <= {global_batch} "
                             f"(the global batch)")
        self.micro_batches = micro_batches
        full, rest = divmod(self.n, self.global_batch)
        self.steps_per_epoch = full if (self.drop_last or rest == 0) else full + 1
        self._cached: tuple[int, np.ndarray] | None = None

    def __repr__(self) -> str:
        return (
            f"Sampler(n={self.n}, global_batch={self.global_batch}, world_size={self.world_size}, "
            f"rank={self.rank}, seed={self.seed}, shuffle={self.shuffle}, drop_last={self.drop_last})"
        )

    def __len__(self) -> int:
        return self.steps_per_epoch

    def order(self, epoch: int) -> np.ndarray:
        """The global visiting order of epoch ``epoch`` (the same on every rank); a fresh array."""
        return self._order(epoch).copy()

    def _order(self, epoch: int) -> np.ndarray:
        if int(epoch) != epoch or epoch < 0:
            raise ValueError(f"epoch {epoch} is invalid; epochs are numbered from 0")
        epoch = int(epoch)
        if self._cached is None or self._cached[0] != epoch:
            if self.shuffle:
                perm = np.random.default_rng([self.seed, epoch]).permutation(self.n)
            else:
                perm = np.arange(self.n)
            perm.flags.writeable = False
            self._cached = (epoch, perm)
        return self._cached[1]

    def global_count(self, step: int) -> int:
        """Number of samples in step ``step``'s global batch (``B``, or fewer for the last one)."""
        self._check_step(step)
        return min(self.global_batch, self.n - int(step) * self.global_batch)

    def _check_step(self, step: int) -> None:
        if int(step) != step or not 0 <= step < self.steps_per_epoch:
            raise ValueError(
                f"step {step} is out of range: an epoch has {self.steps_per_epoch} steps; "
                f"use 0 <= step < {self.steps_per_epoch}"
            )

    def batch(self, epoch: int, step: int) -> tuple[np.ndarray, int]:
        """``(indices, global_count)``: this rank's global sample indices at that step (possibly
        empty), and the size of the whole step's global batch."""
        self._check_step(step)
        step = int(step)
        count = self.global_count(step)
        if self.micro_batches is None:
            start, stop = block(count, self.world_size, self.rank)
        else:  # the samples of this rank's micro-batches (their blocks: apps.sgd.ddp.micro_ranges)
            start, stop = grouped(count, self.micro_batches, self.world_size, self.rank)[0]
        base = step * self.global_batch
        return self._order(epoch)[base + start : base + stop].copy(), count

    def batches(self, epoch: int, start: int = 0) -> Iterator[tuple[int, np.ndarray, int]]:
        """``(step, indices, global_count)`` for the steps ``start .. steps_per_epoch-1`` of the epoch."""
        if int(start) != start or not 0 <= start <= self.steps_per_epoch:
            raise ValueError(
                f"start step {start} is out of range: an epoch has {self.steps_per_epoch} steps; "
                f"use 0 <= start <= {self.steps_per_epoch}"
            )
        self._order(epoch)  # validate the epoch now, not at the first next()
        return self._iterate(int(epoch), int(start))

    def _iterate(self, epoch: int, start: int) -> Iterator[tuple[int, np.ndarray, int]]:
        for step in range(start, self.steps_per_epoch):
            indices, count = self.batch(epoch, step)
            yield step, indices, count
