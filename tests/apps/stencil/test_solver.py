"""apps.stencil.solver: verified answers, bit-identical fields for every rank count and halo mode, restart.

Each test runs the problem on the pass's COMM_WORLD (1, 2, 3 or 4 ranks: 3 is a
non-square 3 x 1 split with uneven blocks) and compares the field digest with
the same problem solved by every rank alone on COMM_SELF.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from mpi4py import MPI

import kernels
from apps.checkpoint import CheckpointError
from apps.stencil.solver import Config, solve

SMALL = dict(stream=False, progress=False, kernel="numpy")


def _solve(comm, **kw):
    return solve(comm, Config(**(SMALL | kw)))


@pytest.mark.mpi
@pytest.mark.parametrize("problem,dims,size,iters", [("heat", 2, 23, 40), ("heat", 3, 9, 12), ("star", 2, 21, 9)])
def test_verified_and_identical_for_every_mode_and_rank_count(problem, dims, size, iters):
    comm = MPI.COMM_WORLD
    alone = _solve(MPI.COMM_SELF, problem=problem, dims=dims, size=size, iters=iters, halo="blocking")
    assert alone.verdict.passed, alone.verdict
    for mode in ("blocking", "overlap", "neighbor"):
        res = _solve(comm, problem=problem, dims=dims, size=size, iters=iters, halo=mode)
        assert res.verdict.passed, (mode, res.verdict)
        assert res.iterations == iters and res.ranks == comm.Get_size()
        assert res.digest == alone.digest, f"{mode} at {comm.Get_size()} ranks differs from 1 rank"


@pytest.mark.mpi
def test_heat_closed_form_catches_a_wrong_field():
    comm = MPI.COMM_WORLD
    res = _solve(comm, size=15, iters=10)
    assert res.verdict.passed and res.verdict.error < 1e-13
    # the same field checked against one iteration too many must fail
    from apps.stencil.grid import Grid
    from apps.stencil.problem import make

    problem = make("heat", 2, 15)
    grid = Grid(comm, problem.layout)
    try:
        f = problem.initial(grid, kernels.select("numpy").xp, "float64")
        assert problem.verify(comm, grid, f, 0).passed
        assert not problem.verify(comm, grid, f, 5).passed
    finally:
        grid.free()


@pytest.mark.mpi
def test_compiled_path_gives_the_same_bits():
    if not kernels.available("compiled")[0]:
        pytest.skip(kernels.available("compiled")[1])
    comm = MPI.COMM_WORLD
    a = _solve(comm, size=19, iters=15, kernel="numpy")
    b = _solve(comm, size=19, iters=15, kernel="compiled")
    assert a.digest == b.digest and b.verdict.passed


@pytest.mark.mpi
def test_tolerance_stops_at_the_same_iteration():
    comm = MPI.COMM_WORLD
    alone = _solve(MPI.COMM_SELF, size=8, iters=10_000, tol=1e-6, check_every=7)
    res = _solve(comm, size=8, iters=10_000, tol=1e-6, check_every=7)
    assert res.stopped.startswith("--tol") and res.iterations == alone.iterations < 10_000
    assert res.iterations % 7 == 0 and res.residual <= 1e-6 and res.digest == alone.digest
    assert res.verdict.passed


@pytest.mark.mpi
def test_restart_is_bit_identical_and_survives_damage(shared_dir):
    comm = MPI.COMM_WORLD
    d = shared_dir
    straight = _solve(comm, size=17, iters=30)
    first = _solve(comm, size=17, iters=20, checkpoint_every=5, checkpoint_dir=d, keep=3)
    assert first.iterations == 20
    resumed = _solve(comm, size=17, iters=30, checkpoint_dir=d, restart=True)
    assert resumed.start_iteration == 20 and resumed.digest == straight.digest and resumed.verdict.passed
    # the checkpoint does not depend on the decomposition: one rank alone resumes it too
    alone = _solve(MPI.COMM_SELF, size=17, iters=30, checkpoint_dir=d, restart=True)
    assert alone.start_iteration == 20 and alone.digest == straight.digest
    comm.Barrier()
    if comm.Get_rank() == 0:  # damage the newest: it is refused, the one before is used
        with open(os.path.join(d, "stencil-00000020.bin"), "r+b") as f:
            f.seek(100)
            f.write(b"\xff\xfe")
    comm.Barrier()
    older = _solve(comm, size=17, iters=30, checkpoint_dir=d, restart=True)
    assert older.start_iteration == 15 and older.digest == straight.digest
    assert any("checksum mismatch" in r for r in older.refused)
    # a checkpoint of another problem is refused, not loaded
    with pytest.raises(CheckpointError, match="another problem: size 17"):
        _solve(comm, size=18, iters=30, checkpoint_dir=d, restart=True)
    comm.Barrier()
    if comm.Get_rank() == 0:
        for name in os.listdir(d):
            if name.endswith(".bin"):
                os.truncate(os.path.join(d, name), 8)
    comm.Barrier()
    with pytest.raises(CheckpointError, match="no valid checkpoint"):
        _solve(comm, size=17, iters=30, checkpoint_dir=d, restart=True)


@pytest.mark.mpi
def test_restart_without_checkpoints_starts_fresh(shared_dir):
    comm = MPI.COMM_WORLD
    d = shared_dir
    res = _solve(comm, size=9, iters=5, checkpoint_dir=os.path.join(d, "none"), restart=True)
    assert res.start_iteration == 0 and res.iterations == 5 and res.verdict.passed


@pytest.mark.mpi
@pytest.mark.parametrize("kw,match", [
    (dict(size=0), "--size 0"),
    (dict(kernel="fortran"), "--kernel 'fortran'"),
    (dict(problem="star", dims=3, size=9), "--problem star is 2-D"),
    (dict(dims=4), "--dims 4"),
    (dict(iters=-1), "--iters -1"),
    (dict(c=0.3), "--c 0.3"),
    (dict(halo="sideways", size=9), "halo mode 'sideways'"),
    (dict(problem="star", size=9, tol=1e-3), "--tol 0.001 with --problem star"),
    (dict(size=9, rank_dims=[5, 7]), "--rank-dims 5x7 does not fit"),
])
def test_bad_settings_raise_on_every_rank(kw, match):
    with pytest.raises(ValueError, match=match):
        _solve(MPI.COMM_WORLD, **kw)


@pytest.mark.mpi
def test_grid_smaller_than_rank_grid():
    comm = MPI.COMM_WORLD
    p = comm.Get_size()
    if p == 1:
        pytest.skip("a grid smaller than the rank grid needs 2 ranks or more")
    with pytest.raises(ValueError, match=rf"{p - 1} cells per side split over {p} ranks .* use --size {p} or more"):
        _solve(comm, size=p - 1, rank_dims=[p, 1])


@pytest.mark.mpi
def test_float32_runs_verify():
    comm = MPI.COMM_WORLD
    for problem in ("heat", "star"):
        res = _solve(comm, problem=problem, size=21, iters=15, dtype="float32")
        assert res.verdict.passed, (problem, res.verdict)


@pytest.mark.mpi
def test_checkpoints_of_an_abandoned_run_give_way(shared_dir):
    """A restart from an older checkpoint replaces the newer ones; a fresh run refuses a used directory."""
    comm = MPI.COMM_WORLD
    d = shared_dir
    _solve(comm, size=12, iters=40, checkpoint_every=10, checkpoint_dir=d, keep=4)
    comm.Barrier()
    if comm.Get_rank() == 0:  # as if the run had been killed after 20, while 30 and 40 were damaged
        for step in (30, 40):
            os.truncate(os.path.join(d, f"stencil-{step:08d}.bin"), 5)
        open(os.path.join(d, "stencil-00000050.bin.tmp"), "wb").close()
        open(os.path.join(d, "stencil-00000060.bin"), "wb").close()
    comm.Barrier()
    res = _solve(comm, size=12, iters=25, checkpoint_every=5, checkpoint_dir=d, keep=1, restart=True)
    assert res.start_iteration == 20 and len(res.refused) == 2
    comm.Barrier()
    assert sorted(os.listdir(d)) == ["stencil-00000025.bin", "stencil-00000025.json"]
    with pytest.raises(CheckpointError, match="already holds checkpoints .* pass --restart"):
        _solve(comm, size=12, iters=25, checkpoint_every=5, checkpoint_dir=d)


@pytest.mark.mpi
def test_tolerance_stop_writes_a_final_checkpoint(shared_dir):
    comm = MPI.COMM_WORLD
    d = shared_dir
    res = _solve(comm, size=8, iters=10_000, tol=1e-6, check_every=7, checkpoint_every=1000, checkpoint_dir=d)
    assert res.stopped.startswith("--tol")
    again = _solve(comm, size=8, iters=10_000, tol=1e-6, check_every=7, checkpoint_dir=d, restart=True)
    assert again.start_iteration == res.iterations and again.digest == res.digest


class _Recording(kernels.Kernels):
    """The kernels of a CPU path that log each call as (kernel, dimensions, residual flag)."""

    def __init__(self, name: str, log: list):
        super().__init__(name, np)
        self.log = log

    def heat(self, u, v, c, box, residual=True):
        self.log.append(("heat", u.ndim, bool(residual)))
        return super().heat(u, v, c, box, residual)

    def star(self, inp, out, r, box):
        self.log.append(("star", inp.ndim, None))
        return super().star(inp, out, r, box)

    def pack(self, u, box, buf):
        self.log.append(("pack", u.ndim, None))
        super().pack(u, box, buf)

    def unpack(self, buf, u, box):
        self.log.append(("unpack", u.ndim, None))
        super().unpack(buf, u, box)


@pytest.mark.mpi
@pytest.mark.parametrize("halo", ["blocking", "overlap", "neighbor"])
@pytest.mark.parametrize("problem,dims", [("heat", 2), ("heat", 3), ("star", 2)])
def test_every_kernel_the_timed_loop_calls_is_warmed_up_before_it(monkeypatch, problem, dims, halo):
    """Structural: warm_up runs once, before the loop, and calls each kind of kernel call the loop makes.

    (With an empty numba cache a kernel first called inside the loop compiled there: 4.3 ms per
    iteration were reported instead of 0.21.)
    """
    from apps.stencil import solver

    comm = MPI.COMM_WORLD
    path = "compiled" if kernels.available("compiled")[0] else "numpy"
    log: list = []
    monkeypatch.setattr(solver.kernels, "select", lambda name: _Recording(name, log))
    real = solver.warm_up

    def spy(*args, **kwargs):
        log.append("warm-up")
        real(*args, **kwargs)
        log.append("warmed")

    monkeypatch.setattr(solver, "warm_up", spy)
    res = _solve(comm, problem=problem, dims=dims, size=12, iters=10, check_every=3, halo=halo, kernel=path)
    assert res.verdict.passed
    assert log.count("warm-up") == 1 and log.count("warmed") == 1
    begin, end = log.index("warm-up"), log.index("warmed")
    warmed, later = set(log[begin + 1:end]), set(log[end + 1:])
    assert later and later <= warmed, f"first called after the warm-up: {later - warmed}"
    if problem == "heat":
        assert {("heat", dims, False), ("heat", dims, True)} <= warmed  # the update, and with the residual
    if comm.Get_size() > 1:
        assert {("pack", dims, None), ("unpack", dims, None)} <= warmed  # the halo exchange's kernels


@pytest.mark.mpi
def test_warm_up_leaves_the_fields_as_they_were():
    """A run whose warm-up is skipped ends with the same field (warm_up works on copies)."""
    from apps.stencil import solver

    comm = MPI.COMM_WORLD
    for problem in ("heat", "star"):
        warm = _solve(comm, problem=problem, size=13, iters=7, halo="overlap")
        real = solver.warm_up
        solver.warm_up = lambda *args, **kwargs: None
        try:
            cold = _solve(comm, problem=problem, size=13, iters=7, halo="overlap")
        finally:
            solver.warm_up = real
        assert warm.digest == cold.digest and warm.verdict.passed
