"""apps.stencil refuses a grid that cannot fit in memory before it allocates, on every rank alike, with the size
that does fit; and an unwritable checkpoint directory is refused by every rank, also when only one rank cannot
write there (every rank writes the field with MPI-IO).

``--size 1e7`` used to die in NumPy with a MemoryError traceback (364 TiB for one rank's block).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import pytest
from mpi4py import MPI

from apps import checkpoint as ck
from apps.stencil.solver import Config, memory_need, solve
from tests import mpirun

SMALL = dict(stream=False, progress=False, kernel="numpy")


def _everywhere(**kw) -> tuple[str, str]:
    try:
        solve(MPI.COMM_WORLD, Config(**(SMALL | kw)))
        got = ("ran", "")
    except (ValueError, ck.CheckpointError) as exc:
        got = (type(exc).__name__, str(exc))
    everyone = MPI.COMM_WORLD.allgather(got)
    assert all(kind != "ran" for kind, _ in everyone) and len(set(everyone)) == 1, everyone
    return got


@pytest.mark.mpi
@pytest.mark.parametrize("dims,size", [(2, 10 ** 7), (3, 10 ** 5)])
def test_a_grid_that_cannot_fit_is_refused_on_every_rank_with_the_size_that_fits(dims, size):
    kind, message = _everywhere(dims=dims, size=size, iters=1)
    assert kind == "MemoryNeedError"
    assert message.startswith(f"--size {size}: needs about "), message
    assert "use --size <= " in message and message.endswith("or use --dtype float32"), message
    best = int(message.split("use --size <= ")[1].split(",")[0])
    assert 100 < best < size  # this machine holds a few hundred cells per side, at least
    rank_dims = list(MPI.Compute_dims(MPI.COMM_WORLD.Get_size(), [0] * dims))
    cfg = Config(**(SMALL | dict(dims=dims, size=size)))
    assert memory_need(cfg, best, rank_dims, 8) < memory_need(cfg, size, rank_dims, 8)


@pytest.fixture
def shared():
    comm = MPI.COMM_WORLD
    root = comm.bcast(tempfile.mkdtemp(prefix="stencil-limits-") if comm.Get_rank() == 0 else None, root=0)
    if comm.Get_rank() == 0:
        open(os.path.join(root, "a-file"), "w").close()
    comm.Barrier()
    yield root
    comm.Barrier()
    if comm.Get_rank() == 0:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.mpi
def test_an_unwritable_checkpoint_directory_is_refused_by_every_rank(shared):
    target = os.path.join(shared, "a-file", "ckpt")
    kind, message = _everywhere(size=16, iters=4, checkpoint_every=2, checkpoint_dir=target)
    assert kind == "CheckpointError"
    assert message.startswith(f"--checkpoint-dir {target}: checkpoints cannot be written there: "), message
    assert "cannot create it (Not a directory)" in message, message


@pytest.mark.mpi
def test_a_directory_one_rank_cannot_write_stops_every_rank(shared, monkeypatch):
    """The stencil used to check on rank 0 only: a directory another rank could not write failed mid-run."""
    comm = MPI.COMM_WORLD
    last = comm.Get_size() - 1
    if comm.Get_rank() == last:
        monkeypatch.setattr(ck, "unwritable", lambda directory: "cannot create a file in it (Read-only file system)")
    kind, message = _everywhere(size=16, iters=4, checkpoint_every=2, checkpoint_dir=os.path.join(shared, "ckpt"))
    assert kind == "CheckpointError"
    assert "cannot create a file in it (Read-only file system)" in message, message
    if comm.Get_size() > 1:
        assert f"rank {last} cannot create a file in it" in message, message


@pytest.mark.launches
def test_the_command_line_exits_2_with_the_message_once_per_job():
    n = 3
    out = mpirun.run(n, [sys.executable, "-m", "apps.stencil", "--quiet", "--size", "1e7", "--iters", "1"],
                     timeout=60, env={"OMP_NUM_THREADS": "1"})
    assert not out.timed_out, out.stderr
    assert out.returncode == 2 and "Traceback" not in out.stderr and "MemoryError" not in out.stderr, out.stderr
    lines = [line for line in out.stderr.splitlines() if "error" in line]
    assert len(lines) == 1, out.stderr  # every rank found it: said once, every rank exits with status 2
    assert lines[0].startswith("python -m apps.stencil: error: --size 10000000: needs about "), out.stderr
    assert out.stdout == "", out.stdout  # refused before the first line of output
