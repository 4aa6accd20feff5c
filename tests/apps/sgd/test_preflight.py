"""apps.sgd.train's checks before a run allocates, and the samples a run counts.

* A global batch larger than the data set is refused on every rank with the
  value, the data set's size and the fix (it used to run, one step per epoch,
  counting samples that do not exist: 172 trillion samples/s with --batch 10**12,
  39 % too many at --batch 1000 on digits' 1,437 training samples).
* Throughput counts the samples processed: an epoch's last, smaller batch as it
  is, and with --uneven the shares a worker skips are not counted.
* A run that cannot fit in memory is refused before anything is allocated, and
  an unusable checkpoint directory at start, not at the first checkpoint.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from mpi4py import MPI

import mpicomm
from apps.checkpoint import CheckpointError
from apps.sgd.data import Sampler
from apps.sgd.train import Config, samples_processed, train

BASE = Config(data="digits", hidden=(16,), progress=False, eval_every=10 ** 9)
DIGITS = 1437  # training samples of scikit-learn's digits in apps.sgd's fixed split


def _outcome(cfg: Config, comm=None) -> tuple[str, str]:
    comm = comm or mpicomm.Comm()
    try:
        train(comm, cfg, lambda s: None)
    except (ValueError, CheckpointError) as exc:
        return type(exc).__name__, str(exc)
    return "ran", ""


def _everywhere(cfg: Config) -> str:
    """The one message every rank raised for *cfg* (asserts every rank raised it)."""
    got = MPI.COMM_WORLD.allgather(_outcome(cfg))
    assert all(kind != "ran" for kind, _ in got), got
    assert len(set(got)) == 1, got
    return got[0][1]


@pytest.mark.mpi
@pytest.mark.parametrize("batch", [DIGITS + 1, 10 ** 12])
def test_a_batch_larger_than_the_data_set_is_refused_on_every_rank(batch):
    message = _everywhere(replace(BASE, batch=batch, epochs=1))
    assert message == (f"--batch {batch}: larger than the 1,437 training samples of digits; "
                       f"use --batch <= {DIGITS}")


@pytest.mark.mpi
def test_teacher_data_names_its_option_too():
    message = _everywhere(replace(BASE, data="teacher", samples=500, batch=1000, steps=1))
    assert message == ("--batch 1000: larger than the 500 training samples of the teacher data set (--samples); "
                       "use --batch <= 500 or more --samples")


@pytest.mark.mpi
def test_throughput_counts_the_samples_processed():
    """--batch 1000 on 1,437 samples: an epoch is a batch of 1000 and one of 437 (counted as 2000 before)."""
    comm = mpicomm.Comm()
    report = train(comm, replace(BASE, batch=1000, epochs=2, eval_every=0), lambda s: None)  # a row per epoch
    if comm.Get_rank() == 0:
        assert report.steps == 4 and report.samples == 2 * DIGITS
        assert report.samples_per_s * report.step_s == pytest.approx(report.samples, rel=1e-12)
        assert [row["step"] for row in report.history] == [2, 4]
        for epoch, row in enumerate(report.history, start=1):  # the progress lines' rate, since the start
            assert row["samples_per_s"] * row["seconds"] == pytest.approx(epoch * DIGITS, rel=1e-12)


@pytest.mark.serial
@pytest.mark.parametrize("n,batch,workers,start,stop,uneven", [
    (1437, 1000, 1, 0, 4, False), (1437, 1000, 3, 1, 6, False), (1437, 64, 2, 0, 23 * 3, False),
    (100, 7, 3, 5, 40, True), (10, 10, 4, 0, 9, True), (1437, 1437, 2, 3, 5, False), (50, 8, 3, 0, 0, False),
])
def test_samples_processed_equals_the_sampler_s_shares(n, batch, workers, start, stop, uneven):
    samplers = [Sampler(n, batch, workers, w, shuffle=False) for w in range(workers)]
    per_epoch = samplers[0].steps_per_epoch
    expected = sum(len(samplers[w].batch(*divmod(step, per_epoch))[0])
                   for w in range(workers) for step in range(start, stop - (w if uneven else 0)))
    assert samples_processed(n, batch, workers, start, stop, uneven) == expected


@pytest.mark.mpi
def test_a_run_that_cannot_fit_in_memory_is_refused_before_it_allocates():
    # The sampler's order alone would be 8 bytes x 10^13 samples = 72.8 TiB on every rank.
    message = _everywhere(replace(BASE, data="teacher", samples=10 ** 13, batch=64, steps=1))
    assert message.startswith("--samples 10000000000000: needs about 72.8 TiB of memory per rank, but "), message
    assert "use --samples <= " in message and message.endswith("or spread the run over more nodes"), message


@pytest.mark.mpi
def test_an_unwritable_checkpoint_directory_is_refused_at_start(blocked):
    said = []
    cfg = replace(BASE, batch=64, epochs=1, checkpoint_every=10 ** 6, checkpoint_dir=blocked)  # only at the end
    comm = mpicomm.Comm()
    try:
        train(comm, cfg, said.append)
        got = ("ran", "")
    except CheckpointError as exc:
        got = ("CheckpointError", str(exc))
    got = comm.allgather(got)
    assert all(kind == "CheckpointError" for kind, _ in got) and len(set(got)) == 1, got
    assert got[0][1].startswith(f"--checkpoint-dir {blocked}: checkpoints cannot be written there: "), got
    assert "cannot create it (Not a directory" in got[0][1], got
    assert said == []  # refused before the first step: nothing trained, nothing said
