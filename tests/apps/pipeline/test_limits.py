"""apps.pipeline refuses, before it allocates and on every rank alike, a run that cannot fit in memory, and a
checkpoint directory it could not write at the first checkpoint.

``--batch 10**12`` used to die in NumPy with a MemoryError traceback while making the global batch.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest
from mpi4py import MPI

import mpicomm
from apps import memory
from apps.checkpoint import CheckpointError
from apps.pipeline.config import Config, memory_need
from apps.pipeline.model import ModelSpec
from apps.pipeline.train import train
from tests import mpirun

SPEC = ModelSpec(features=5, width=6, hidden=8, blocks=12, classes=3)
BASE = Config(spec=SPEC, batch=24, steps=2, progress=False)
GiB = 1 << 30


def _config() -> Config:
    """S = this pass's rank count (T = D = 1)."""
    return replace(BASE, stages=MPI.COMM_WORLD.Get_size())


def _everywhere(cfg: Config) -> tuple[str, str]:
    """(error type, message) that every rank raised for *cfg* (asserts all raised the same)."""
    try:
        train(mpicomm.Comm(), cfg)
        got = ("ran", "")
    except (ValueError, CheckpointError) as exc:
        got = (type(exc).__name__, str(exc))
    everyone = MPI.COMM_WORLD.allgather(got)
    assert all(kind != "ran" for kind, _ in everyone) and len(set(everyone)) == 1, everyone
    return got


@pytest.mark.mpi
def test_a_batch_that_cannot_fit_is_refused_on_every_rank():
    kind, message = _everywhere(replace(_config(), batch=10 ** 12))
    assert kind == "MemoryNeedError"
    assert message.startswith("--batch 1000000000000: needs about "), message
    assert " of memory per rank, but this machine has " in message and " available" in message, message
    assert "use --batch <= " in message and message.endswith("or spread the run over more nodes"), message


@pytest.mark.mpi
def test_the_advice_fits_and_more_micro_batches_are_offered_where_they_help():
    """At 64 GiB a rank, the batch advised fits and one more sample does not; 1F1B holds S micro-batches
    whatever M, so more of them shrink what it keeps, while GPipe keeps all M: no --micro advice there."""
    comm = mpicomm.Comm()
    cfg = replace(_config(), spec=replace(SPEC, width=4096, hidden=4096), batch=4 << 20, micro=4)
    budget = 64 * GiB
    ranks = comm.Get_size()
    try:  # (have: this node's memory, shared by its ranks)
        memory.check(comm, lambda v: memory_need(cfg, cfg.check(ranks), batch=v["--batch"], micro=v["--micro"]),
                     [memory.Knob("--batch", cfg.batch), memory.Knob("--micro", cfg.micro, high=cfg.batch)],
                     have=budget * comm.local_size)
        message = ""
    except memory.MemoryNeedError as exc:
        message = str(exc)
    best = int(message.split("use --batch <= ")[1].split(" ")[0])
    topo = cfg.check(ranks)
    assert memory_need(cfg, topo, batch=best) <= budget < memory_need(cfg, topo, batch=best + 1)
    assert " or --micro >= " in message, message
    from apps.pipeline.config import check_memory

    with pytest.raises(memory.MemoryNeedError) as refused:
        check_memory(comm, replace(cfg, schedule="gpipe", batch=10 ** 9), topo)
    assert "--micro" not in str(refused.value)


@pytest.mark.mpi
def test_an_unwritable_checkpoint_directory_is_refused_at_start(blocked):
    steps = []
    cfg = replace(_config(), steps=20, checkpoint_every=20, checkpoint_dir=blocked)
    try:
        train(mpicomm.Comm(), cfg, on_step=lambda *a: steps.append(a))
        got = ("ran", "")
    except CheckpointError as exc:
        got = ("CheckpointError", str(exc))
    everyone = MPI.COMM_WORLD.allgather(got)
    assert all(kind == "CheckpointError" for kind, _ in everyone) and len(set(everyone)) == 1, everyone
    assert got[1].startswith(f"--checkpoint-dir {blocked}: checkpoints cannot be written there: "), got
    assert "cannot create it (Not a directory)" in got[1], got
    assert steps == []  # before the first step, not at step 20


PIPELINE = [sys.executable, "-m", "apps.pipeline", "train"]


@pytest.mark.launches
def test_the_command_line_exits_2_with_the_message_once_per_job():
    n = 3
    out = mpirun.run(n, PIPELINE + ["--stages", "3", "--batch", str(10 ** 12)], timeout=60,
                     env={"OMP_NUM_THREADS": "1"})
    assert not out.timed_out, out.stderr
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    lines = [line for line in out.stderr.splitlines() if "error:" in line]
    assert len(lines) == 1, out.stderr  # every rank found it: said once, every rank exits with status 2
    assert lines[0].startswith("python -m apps.pipeline train: error: --batch 1000000000000: needs about "), out.stderr
