"""apps.torchddp refuses a run that cannot fit in memory before it allocates, and an unwritable --checkpoint
directory at start, on every rank.

The estimate (apps.torchddp.sizes) needs no PyTorch and is tested everywhere; the command-line tests need it.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
from mpi4py import MPI

from apps import memory
from apps.torchddp.sizes import check, memory_need
from tests import mpirun
from tests.apps.torchddp import NO_TORCH

GiB = 1 << 30
MLP = SimpleNamespace(kind="mlp", classes=10, features=32, hidden=(256, 256), vocab=256, seq=32, d_model=64,
                      heads=4, layers=2, ff=256)
TRANSFORMER = SimpleNamespace(**{**vars(MLP), "kind": "transformer"})


def _cfg(spec=MLP, **kw) -> SimpleNamespace:
    base = dict(spec=spec, batch=64, dtype="float32", optimizer="adamw", momentum=0.9, eval_samples=1024,
                check=False)
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.serial
def test_the_estimate_grows_with_the_sizes_that_allocate():
    small = memory_need(_cfg(), 2)
    assert small < 64 << 20  # the default run: a few MiB
    assert memory_need(_cfg(batch=10 ** 6), 2) > 100 * small  # every rank makes the whole global batch
    assert memory_need(_cfg(dtype="float64"), 2) > small
    assert memory_need(_cfg(spec=SimpleNamespace(**{**vars(MLP), "hidden": (4096, 4096)})), 2) > 10 * small
    assert memory_need(_cfg(spec=TRANSFORMER), 2) < memory_need(_cfg(spec=SimpleNamespace(
        **{**vars(TRANSFORMER), "seq": 512})), 2)


@pytest.mark.mpi
@pytest.mark.parametrize("spec,option", [(MLP, "--batch"), (TRANSFORMER, "--batch")])
def test_a_batch_that_cannot_fit_is_refused_on_every_rank(spec, option):
    comm = MPI.COMM_WORLD
    try:
        check(comm, _cfg(spec=spec, batch=10 ** 12), comm.Get_size())
        got = ("ran", "")
    except memory.MemoryNeedError as exc:
        got = ("refused", str(exc))
    everyone = comm.allgather(got)
    assert all(kind == "refused" for kind, _ in everyone) and len(set(everyone)) == 1, everyone
    assert got[1].startswith(f"{option} 1000000000000: needs about "), got
    assert f"use {option} <= " in got[1], got


TORCHDDP = [sys.executable, "-m", "apps.torchddp", "train"]


def _run(args: list[str]) -> mpirun.Result:
    pytest.importorskip("torch", reason=NO_TORCH)
    out = mpirun.run(2, TORCHDDP + args, timeout=120, env={"OMP_NUM_THREADS": "1"})
    assert not out.timed_out, out.stderr
    return out


@pytest.mark.launches
def test_the_command_line_refuses_a_huge_batch_on_every_rank():
    out = _run(["--batch", str(10 ** 12)])
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.count("python -m apps.torchddp train: error: --batch 1000000000000: needs about ") == 1, \
        out.stderr


@pytest.mark.launches
def test_the_command_line_refuses_an_unwritable_checkpoint_directory_at_start(tmp_path):
    blocker = tmp_path / "a-file"  # a directory under a regular file: not writable, for root too
    blocker.write_text("")
    out = _run(["--steps", "400", "--checkpoint-every", "100", "--checkpoint-dir", str(blocker / "ck")])
    assert out.returncode == 2, out.stderr
    assert out.stderr.count(f"python -m apps.torchddp train: error: --checkpoint-dir {blocker / 'ck'}: "
                            f"checkpoints cannot be written there: ") == 1, out.stderr
    assert "parameter digest" not in out.stdout
