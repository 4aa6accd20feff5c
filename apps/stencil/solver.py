"""The iteration loop: halo exchange, update, residual, checkpoints, timing and the final check.

One iteration (``--halo overlap``)::

    start halo exchange of the exchanged field      (pack faces, start requests)
    update the inner box                            (cells that read no ghost), in slabs,
                                                    testing the requests between them (progress)
    finish the exchange                             (wait, unpack ghosts)
    update the boundary strips                      (the rest of the box)
    problem.after()                                 (star: in += 1)
    swap fields (heat)

``blocking`` and ``neighbor`` finish the exchange before one update of the
whole box. Every cell is computed by the same kernel expression in every mode
and on every decomposition, so the field is bit-for-bit the same; the residual
is a maximum (exact in any order), reduced with mpicomm's allreduce every
``check_every`` iterations, so the stopping iteration is the same too.
"""

from __future__ import annotations

import importlib.util
import math
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
from mpi4py import MPI

import kernels
import mpicomm
from mpicomm import cli

from . import fieldio
from .grid import Grid, shrink, slabs, strips
from .halo import HaloExchange
from .problem import Verdict, make

__all__ = ["Config", "Result", "solve", "memory_need", "stream_bandwidth", "resolve_kernel", "warm_up",
           "OVERLAP_PIECES"]

#: Slabs the interior is updated in under ``--halo overlap``, with an MPI progress test after each.
OVERLAP_PIECES = 4
#: Cells per side when none is given.
DEFAULT_SIZE = {2: 4096, 3: 256}


@dataclass
class Config:
    """Everything a run depends on (the command line, as data)."""

    problem: str = "heat"
    dims: int = 2
    size: int | None = None  #: cells per side; None: 4096 in 2-D, 256 in 3-D
    iters: int = 1000
    tol: float = 0.0
    check_every: int = 10
    kernel: str = "auto"
    halo: str = "overlap"
    radius: int = 2
    c: float | None = None
    dtype: str = "float64"
    rank_dims: list[int] | None = None
    checkpoint_every: int = 0
    checkpoint_dir: str = "checkpoints/stencil"
    keep: int = 2
    restart: bool = False
    plot: str | None = None
    stream: bool = True
    progress: bool = True


@dataclass
class Result:
    """What a run measured and found (the same on every rank)."""

    iterations: int
    start_iteration: int
    stopped: str
    residual: float | None
    seconds: float
    checkpoint_seconds: float
    points: int
    mlups: float
    gbs: float
    bytes_per_point: int
    flops_per_point: int
    stream_gbs: float | None
    bound_fraction: float | None
    compute_seconds: float | None
    efficiency: float | None
    verdict: Verdict
    digest: str
    rank_dims: list[int]
    kernel: str
    halo: str
    ranks: int
    block_min: list[int]
    block_max: list[int]
    refused: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["verdict"] = asdict(self.verdict)
        return out


def resolve_kernel(name: str) -> str:
    """``auto`` → ``compiled`` where numba is installed, else ``numpy``; other names as given."""
    if name == "auto":
        return "compiled" if kernels.available("compiled")[0] else "numpy"
    return name


def stream_bandwidth(k: Any, comm: MPI.Intracomm, elements: int = 1 << 23, repeat: int = 5) -> float:
    """STREAM triad bandwidth of all ranks together, in bytes/s, counting the write-allocate (32 B/element).

    Every round starts all ranks together and lasts until the slowest is done,
    so the rate is the aggregate the ranks really got at once (also when there
    are more ranks than cores); the best of *repeat* rounds.
    """
    xp = k.xp
    a = xp.zeros(elements)
    b = xp.arange(elements, dtype=np.float64)
    c = xp.ones(elements)
    k.triad(a, b, c, 3.0)  # first touch, compile
    k.sync()
    best = float("inf")
    for _ in range(repeat):
        comm.Barrier()
        t = time.perf_counter()
        k.triad(a, b, c, 3.0)
        k.sync()
        best = min(best, comm.allreduce(time.perf_counter() - t, op=MPI.MAX))
    return comm.Get_size() * 32.0 * elements / best


def warm_up(problem: Any, k: Any, grid: Grid, halo: HaloExchange, mode: str, f: dict, spare: dict | None, box,
            mcomm: Any) -> None:
    """Every kernel and call of the timed loop once, untimed, on copies of the fields (collective).

    The first call of a kernel compiles it (numba: about a second with an
    empty cache, then a load from it; CuPy: the CUDA module) and the first
    exchange and allreduce set up their buffers: one-time costs that would
    otherwise land in the first timed iteration (a first run measured 4.3 ms
    per iteration instead of 0.21 that way). So, in the loop's own *mode*: one
    halo exchange (pack and unpack), the update without and with the fused
    residual, ``problem.after``, and the residual's allreduce. The fields the
    run continues from are left as they were.
    """
    work = {n: a.copy() for n, a in f.items()}
    scratch = {n: a.copy() for n, a in spare.items()} if spare is not None else None
    ex = work[problem.exchanged]
    if mode == "overlap":
        halo.start(ex)
        halo.progress()
        halo.finish(ex)
    else:
        halo.exchange(ex)
    for residual in (False, True):
        problem.step(k, work, scratch, box, residual)
    problem.after(k, work, grid)
    k.sync()
    res = np.zeros(1)
    mcomm.Allreduce(res, np.zeros(1), op=MPI.MAX)
    del work, scratch


def _compute_only(problem: Any, k: Any, f: dict, spare: dict, boxes: list, iters: int, comm: MPI.Intracomm) -> float:
    """Seconds per iteration of the update alone (no exchange), slowest rank; leaves the fields as they were.

    *boxes* are the pieces the loop updates, in its order (the overlap mode's interior slabs and edge strips, else
    the whole block): NumPy's temporaries of a slab stay in cache where the whole block's do not, so timing the
    whole block against a loop of slabs would put the efficiency above 100 %."""
    if problem.swaps:
        scratch = {n: a.copy() for n, a in spare.items()}
        work = f
    else:
        work = {n: a.copy() for n, a in f.items()}
        scratch = None
    for box in boxes:  # compile / warm
        problem.step(k, work, scratch, box, False)
    k.sync()
    comm.Barrier()
    t = time.perf_counter()
    for _ in range(iters):
        for box in boxes:
            problem.step(k, work, scratch, box, False)
    k.sync()
    return comm.allreduce((time.perf_counter() - t) / iters, op=MPI.MAX)


class _Progress:
    """Rank 0's progress: a :class:`mpicomm.cli.Progress` line at every tenth of the iterations, and the last."""

    def __init__(self, total: int, start: int, show: bool):
        self.start, self.total = start, total
        self.line = cli.Progress(total - start, "stencil", show=show and total > start)
        self.next = 1

    def update(self, it: int, residual: float | None, final: bool) -> None:
        done = it - self.start
        if done * 10 < self.next * self.line.total and not final:
            return
        self.next = done * 10 // max(1, self.line.total) + 1
        parts = ([f"iteration {it}/{self.total}"] if self.start else []) + \
            ([f"residual {residual:.3e}"] if residual is not None else [])
        text = ", ".join(parts)
        self.line.step(text, steps=done - self.line.done)


def solve(comm: MPI.Intracomm, cfg: Config, say=None) -> Result:
    """Run the stencil described by *cfg* on *comm* (collective); :class:`Result` on every rank.

    Raises ``ValueError`` (bad settings; the same on every rank) or
    ``apps.checkpoint.CheckpointError`` (a checkpoint that cannot be used).
    """
    say = say or (lambda text: None)
    if cfg.iters < 0:
        raise ValueError(f"--iters {cfg.iters}: must be >= 0")
    if cfg.check_every < 1:
        raise ValueError(f"--check-every {cfg.check_every}: must be >= 1")
    if cfg.checkpoint_every < 0:
        raise ValueError(f"--checkpoint-every {cfg.checkpoint_every}: must be >= 0 (0: no checkpoints)")
    if cfg.tol < 0:
        raise ValueError(f"--tol {cfg.tol}: must be >= 0 (0: run all --iters)")
    if cfg.dims not in (2, 3):
        raise ValueError(f"--dims {cfg.dims}: must be 2 or 3")
    if cfg.size is None:
        cfg = replace(cfg, size=DEFAULT_SIZE[cfg.dims])
    if cfg.problem == "star" and cfg.tol:
        raise ValueError(f"--tol {cfg.tol:g} with --problem star: the star stencil has no residual to stop on "
                         f"(it accumulates); use --iters")
    if cfg.plot and importlib.util.find_spec("matplotlib") is None:
        raise ValueError(f"--plot {cfg.plot}: needs matplotlib (pip install -e '.[plot]')")
    name = resolve_kernel(cfg.kernel)
    if name not in kernels.PATHS:
        raise ValueError(f"--kernel {cfg.kernel!r}: expected auto or one of {', '.join(kernels.PATHS)}")
    ok, why = kernels.available(name)
    if not ok:
        raise ValueError(f"--kernel {name}: {why}")
    problem = make(cfg.problem, cfg.dims, cfg.size, cfg.radius, cfg.c)
    dtype = np.dtype(cfg.dtype)
    if dtype not in (np.dtype(np.float64), np.dtype(np.float32)):
        raise ValueError(f"--dtype {cfg.dtype}: expected float64 or float32")
    k = kernels.select(name)
    grid = Grid(comm, problem.layout, cfg.rank_dims)
    try:
        return _run(comm, cfg, problem, k, grid, dtype, say)
    finally:
        grid.free()


def memory_need(cfg: Config, size: int, rank_dims: list[int], itemsize: int) -> int:
    """About the bytes the busiest rank allocates for a grid of *size* cells per side over *rank_dims* ranks.

    The fields on the largest block with its ghost cells (heat: u and the
    spare; star: in and out), and the larger of their copies for the
    untimed warm-up and the float64/uint64 temporaries of the verification and
    the digest on the owned cells; the STREAM arrays (3 × 2²³ float64) unless
    ``--no-stream``; with ``--plot``, rank 0's gathered global field and picture.
    With ``--kernel cupy`` the fields live on the GPU: the host holds one
    field while it is made, and the owned cells' temporaries.
    """
    width = cfg.radius if cfg.problem == "star" else 1
    owned = local = 1
    for parts in rank_dims:
        block = -(-size // max(parts, 1))
        owned *= block
        local *= block + 2 * width
    temporaries = owned * (itemsize + 40)
    if cfg.kernel == "cupy":
        need = local * itemsize + temporaries
    else:
        need = 2 * local * itemsize + max(2 * local * itemsize, temporaries)
    if cfg.stream:
        need += 3 * 8 * (1 << 23)
    if cfg.plot:  # rank 0's
        need += 2 * size ** len(rank_dims) * itemsize + 16 * size * size
    return need


def _check_memory(comm, cfg: Config, grid: Grid, dtype, kernel: str) -> None:
    """Refuse, on every rank, a grid whose fields cannot fit the memory available (collective)."""
    from apps import memory

    smallest = max(max(grid.dims) * max(1, grid.width), 2 * cfg.radius + 1 if cfg.problem == "star" else 1)
    cfg = replace(cfg, kernel=kernel)
    memory.check(comm, lambda v: memory_need(cfg, v["--size"], list(grid.dims), dtype.itemsize),
                 [memory.Knob("--size", cfg.size, low=min(smallest, cfg.size))],
                 otherwise="spread the run over more nodes" + (" or use --dtype float32" if dtype.itemsize > 4 else ""))


def _run(comm, cfg: Config, problem, k, grid: Grid, dtype, say) -> Result:
    # Before anything is allocated, with the same verdict on every rank: the fields fit in memory,
    # and every rank can write the checkpoint directory.
    _check_memory(grid.cart, cfg, grid, dtype, k.name)
    if cfg.checkpoint_every:
        fieldio.prepare(grid.cart, cfg.checkpoint_dir, fresh=not cfg.restart)
    mcomm = mpicomm.Comm(grid.cart)
    p = grid.cart.Get_size()
    block_min = _blocks(grid, MPI.MIN)
    block_max = _blocks(grid, MPI.MAX)
    say(
        f"stencil: {problem.name} {cfg.dims}-D, {' x '.join([str(cfg.size)] * cfg.dims)} cells, {p} rank{'s' if p > 1 else ''} "
        f"as {' x '.join(map(str, grid.dims))} (blocks {' x '.join(f'{a}..{b}' if a != b else str(a) for a, b in zip(block_min, block_max))}), "
        f"halo {cfg.halo}, kernel {k.name}, {dtype.name}"
    )
    stream = None
    if cfg.stream:
        stream = stream_bandwidth(k, grid.cart)
        bpp = problem.bytes_per_point(dtype.itemsize)
        say(f"  STREAM triad (all ranks at once, write-allocate counted): {stream / 1e9:.2f} GB/s "
            f"-> bound {stream / bpp / 1e6:.0f} MLUP/s at {bpp} B/point")

    f = problem.initial(grid, k.xp, dtype)
    spare = {n: a.copy() for n, a in f.items()} if problem.swaps else None
    expect = {"problem": problem.name, "dims": cfg.dims, "size": cfg.size, "dtype": dtype.str,
              "radius": cfg.radius if problem.name == "star" else None, "c": getattr(problem, "c", None)}
    start, refused = 0, []
    residual, stopped = None, "--iters"
    if cfg.restart:
        body, refused = fieldio.load(grid, f, cfg.checkpoint_dir, expect)
        for reason in refused:
            say(f"  refused checkpoint: {reason}")
        if body is None:
            say(f"  no checkpoint in {cfg.checkpoint_dir}: starting from iteration 0")
        else:
            start = body["step"]
            if problem.swaps:
                for n in spare:
                    spare[n][...] = f[n]  # ghosts on the physical boundary: the same boundary values
            say(f"  restarted from {body['path']} (iteration {start})")
            if cfg.tol and body.get("residual") is not None and body["residual"] <= cfg.tol:
                residual, stopped = body["residual"], f"--tol {cfg.tol:g}, reached before that checkpoint"

    halo = HaloExchange(grid, k, dtype, cfg.halo)
    box = grid.update
    has = tuple((w if grid.has_neighbour(j, 0) else 0, w if grid.has_neighbour(j, 1) else 0)
                for j, w in ((j, grid.width) for j in range(grid.ndim)))
    inner = shrink(box, has)
    edges = strips(box, inner)
    pieces = slabs(inner, OVERLAP_PIECES)

    # Compile and set up everything the loop uses before the clock starts (timings exclude one-time costs).
    warm_up(problem, k, grid, halo, cfg.halo, f, spare, box, mcomm)
    # The update alone, before and after the loop (the faster counts): the parallel efficiency's numerator.
    updated = [*pieces, *edges] if cfg.halo == "overlap" else [box]  # what one iteration updates, in its pieces
    compute = _compute_only(problem, k, f, spare, updated, 5, grid.cart) if p > 1 else None

    progress = _Progress(cfg.iters, start, cfg.progress and grid.cart.Get_rank() == 0)
    res_buf, res_out = np.zeros(1), np.zeros(1)
    ckpt_seconds = 0.0
    it = start
    grid.cart.Barrier()
    t0 = time.perf_counter()
    while it < cfg.iters and stopped == "--iters":
        check = (it + 1) % cfg.check_every == 0 or it + 1 == cfg.iters
        ex = f[problem.exchanged]
        if cfg.halo == "overlap":
            halo.start(ex)
            r = None
            for piece in pieces:  # the interior in slabs, letting MPI progress the halos between them
                got = problem.step(k, f, spare, piece, check)
                r = got if r is None or (got is not None and got > r) else r
                halo.progress()
            halo.finish(ex)
            rs = [problem.step(k, f, spare, b, check) for b in edges]
        else:
            halo.exchange(ex)
            r = problem.step(k, f, spare, box, check)
            rs = []
        problem.after(k, f, grid)
        if problem.swaps:
            f, spare = spare, f
        it += 1
        if check and problem.swaps:
            res_buf[0] = np.max([x for x in [r, *rs] if x is not None] or [0.0])  # NaN propagates
            mcomm.Allreduce(res_buf, res_out, op=MPI.MAX)
            residual = float(res_out[0])
            if math.isnan(residual):
                stopped = "a NaN residual (the iteration diverged)"
            elif cfg.tol and residual <= cfg.tol:
                stopped = f"--tol {cfg.tol:g}"
        final = stopped != "--iters" or it == cfg.iters
        if cfg.checkpoint_every and (it % cfg.checkpoint_every == 0 or final):
            k.sync()
            tc = time.perf_counter()
            fieldio.save(grid, f, it, cfg.checkpoint_dir, cfg.keep, residual=residual, **expect)
            ckpt_seconds += time.perf_counter() - tc
        progress.update(it, residual, final)
        if stopped != "--iters":
            break
    k.sync()
    seconds = grid.cart.allreduce(time.perf_counter() - t0, op=MPI.MAX)
    if compute is not None and it > start:
        compute = min(compute, _compute_only(problem, k, f, spare, updated, 5, grid.cart))
    halo.free()

    done = it - start
    loop = max(seconds - ckpt_seconds, 1e-12)
    points = problem.points()
    mlups = points * done / loop / 1e6 if done else 0.0
    bpp = problem.bytes_per_point(dtype.itemsize)
    gbs = mlups * 1e6 * bpp / 1e9
    fraction = (mlups * 1e6 * bpp / stream) if stream and done else None
    efficiency = (compute * done / loop) if compute and done else None
    verdict = problem.verify(grid.cart, grid, f, it)
    digest = fieldio.digest(grid, f)
    if cfg.plot:
        fieldio.plot(grid, f[problem.fields[-1]], cfg.plot,
                     f"{problem.name} {cfg.dims}-D, {cfg.size} per side, iteration {it}")
    return Result(
        iterations=it, start_iteration=start, stopped=stopped, residual=residual, seconds=seconds,
        checkpoint_seconds=ckpt_seconds, points=points, mlups=mlups, gbs=gbs, bytes_per_point=bpp,
        flops_per_point=problem.flops_per_point(), stream_gbs=stream / 1e9 if stream else None,
        bound_fraction=fraction, compute_seconds=compute, efficiency=efficiency, verdict=verdict,
        digest=digest, rank_dims=list(grid.dims), kernel=k.name, halo=cfg.halo, ranks=p,
        block_min=block_min, block_max=block_max, refused=refused,
    )


def _blocks(grid: Grid, op: MPI.Op) -> list[int]:
    out = np.zeros(grid.ndim, np.int64)
    grid.cart.Allreduce(np.array(grid.size, np.int64), out, op=op)
    return [int(x) for x in out]
