"""How close each kernel path comes to the memory bound: ``python -m kernels.bench``.

    python -m kernels.bench                              # every available path, 2-D 4096² and 3-D 256³
    python -m kernels.bench --size 2048 --iters 20       # 2-D 2048², 3-D 161³ (the same number of points)
    python -m kernels.bench --paths compiled --dims 2 --out KERNELS.md

A heat / Jacobi sweep (kernels/heat.py) does a handful of flops per cell and
streams two arrays, so memory bandwidth bounds it. This benchmark measures,
for each path and dimension, the sweep's update rate next to the STREAM triad's
bandwidth **in the same process, interleaved** (each repeat runs the triad and
then the sweep, so both see the same machine state), and reports the fraction
of the bound it reaches. Each rate is the median of ``--repeat`` repeats.

Memory-traffic accounting (float64; scale by itemsize/8 for float32):

* heat sweep with ordinary stores: 24 bytes per cell — read u, write-allocate
  v (the cache fetches the line before it is written), write v. Neighbours
  come from cache: each value of u is read from memory once per sweep.
* triad ``a = b + s*c``: 32 bytes per element — read b, read c, write-allocate
  a, write a.

Both count the write-allocate, so both are real traffic on a machine that does
one, and the bound is ``MLUP/s = triad bytes per second / 24``. The bound's
triad is one pass: the compiled path's loop on the CPU (when numba is
installed; otherwise NumPy's two-pass form, which underestimates the
bandwidth and is marked so), the CuPy kernel on the GPU. The sweeps run without
the fused residual unless ``--residual`` is given; u and v swap every iteration.

On the GPU (``--paths cupy``) the last column compares the sweep with a
device-to-device copy of the same run: both move 2 x itemsize bytes per cell
(read, write; a GPU does not write-allocate), the target being 80 %.

Every kernel a timed loop calls runs once before the first timed repeat (the
sweep with the same residual flag, the triad, the copy): numba compiles on the
first call and CuPy loads its modules, and neither belongs in a rate. The
command-line conventions are :mod:`mpicomm.cli`'s: ``--out`` a Markdown report
(an existing file is kept unless ``--append`` or ``--force``), ``--json`` one
document with the command, machine, versions and date, ``[i/N]`` progress lines.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from mpicomm import cli

from .paths import PATHS, Kernels, available, select
from .stream import BYTES_PER_ELEMENT

__all__ = ["DEFAULT_SIZES", "HEAT_BYTES_PER_CELL", "Row", "measure", "warm_up", "parser", "main"]

#: Points per side when --size is not given.
DEFAULT_SIZES = {2: 4096, 3: 256}
#: Memory traffic of one heat update in units of the itemsize: read u, write-allocate v, write v.
HEAT_BYTES_PER_CELL = 3


@dataclass
class Row:
    """One (path, dims) measurement; rates are the medians of the repeats."""

    path: str
    dims: int
    size: int
    dtype: str
    mlups: float
    gbs: float
    triad_path: str
    triad_gbs: float
    bound_mlups: float
    fraction: float
    seconds: float
    copy_gbs: float | None = None  #: device-to-device copy, read + write (GPU paths only)
    copy_fraction: float | None = None  #: the sweep's read u + write v against that copy (GPU paths only)


def _timed(k: Kernels, fn: Callable[[], Any], iters: int) -> float:
    k.sync()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    k.sync()
    return time.perf_counter() - start


def warm_up(k: Kernels, tk: Kernels, sweep: Callable[[], None], triad: Callable[[], None],
            copy: Callable[[], None] | None = None) -> None:
    """One untimed call of each timed kernel: numba compiles (or loads its cache), CuPy loads its modules, the
    arrays are touched and the caches warm."""
    sweep()
    triad()
    if copy is not None:
        copy()
    k.sync()
    tk.sync()


def _triad_path(path: str) -> str:
    """The path whose triad measures the bound for *path*: the same device, one pass where possible."""
    if path == "cupy":
        return "cupy"
    return "compiled" if available("compiled")[0] else "numpy"


_FLOAT64 = np.dtype(np.float64)


def measure(path: str, dims: int, size: int, iters: int, repeat: int, dtype: np.dtype = _FLOAT64,
            residual: bool = False, quiet: bool = True, progress: cli.Progress | None = None) -> Row:
    """Heat sweeps of a ``size**dims`` interior on *path*, interleaved with STREAM triads; the median of *repeat*.

    Each kernel runs once, untimed, before the first repeat. *progress* gets
    one step per repeat (default: a progress of its own, silent when *quiet*).
    """
    progress = progress or cli.Progress(repeat, "kernels.bench", show=not quiet)
    k = select(path)
    tk = k if _triad_path(path) == path else select(_triad_path(path))
    xp = k.xp
    shape = (size + 2,) * dims
    rng = np.random.default_rng(dims)
    u = xp.asarray(rng.random(shape).astype(dtype))
    v = u.copy()
    box = ((1, size + 1),) * dims
    elements = int(np.prod(shape))
    a = tk.xp.zeros(elements, dtype=dtype)
    b = tk.xp.asarray(rng.random(elements).astype(dtype))
    c = tk.xp.asarray(rng.random(elements).astype(dtype))
    fields = [u, v]

    def sweep() -> None:
        k.heat(fields[0], fields[1], 0.5 / dims, box, residual=residual)
        fields.reverse()

    dst = xp.empty_like(b) if path == "cupy" else None
    warm_up(k, tk, sweep, lambda: tk.triad(a, b, c, 3.0), (lambda: xp.copyto(dst, b)) if dst is not None else None)
    heats, triads = [], []
    for rep in range(repeat):
        triads.append(_timed(tk, lambda: tk.triad(a, b, c, 3.0), iters))
        seconds = _timed(k, sweep, iters)
        heats.append(seconds)
        progress.step(f"{path} {dims}-D {size}^{dims}: repeat {rep + 1}/{repeat}: "
                      f"{cli.format_time(seconds / iters)} per sweep")
    itemsize = np.dtype(dtype).itemsize
    heat_s, triad_s = statistics.median(heats), statistics.median(triads)
    mlups = size ** dims * iters / heat_s / 1e6
    copy_gbs = copy_fraction = None
    if dst is not None:
        # The GPU reference: a device-to-device copy moves 2 x itemsize per element (read, write; no
        # write-allocate on a GPU), as does a sweep per cell (read u, write v; neighbours from cache).
        copy_s = statistics.median(_timed(k, lambda: xp.copyto(dst, b), iters) for _ in range(repeat))
        copy_gbs = elements * 2 * itemsize * iters / copy_s / 1e9
        copy_fraction = mlups * 2 * itemsize / 1e3 / copy_gbs
    triad_gbs = elements * BYTES_PER_ELEMENT * itemsize * iters / triad_s / 1e9
    bound = triad_gbs * 1e3 / (HEAT_BYTES_PER_CELL * itemsize)
    return Row(path, dims, size, np.dtype(dtype).name, mlups, mlups * HEAT_BYTES_PER_CELL * itemsize / 1e3,
               _triad_path(path), triad_gbs, bound, mlups / bound, heat_s / iters, copy_gbs, copy_fraction)


HEADER = ["path", "dims", "grid", "MLUP/s", "GB/s (24 B/pt)", "triad GB/s", "bound MLUP/s", "of bound", "of D2D copy"]


def table(rows: list[Row]) -> str:
    """The result table (bytes per cell in the header follow the dtype)."""
    header = list(HEADER)
    if rows and rows[0].dtype != "float64":
        header[4] = f"GB/s ({HEAT_BYTES_PER_CELL * np.dtype(rows[0].dtype).itemsize} B/pt)"
    cells = [[r.path, f"{r.dims}-D", "x".join([str(r.size)] * r.dims), f"{r.mlups:.0f}", f"{r.gbs:.1f}",
              f"{r.triad_gbs:.1f}" + ("*" if r.triad_path == "numpy" else ""),
              f"{r.bound_mlups:.0f}", f"{r.fraction * 100:.0f} %",
              "—" if r.copy_fraction is None else f"{r.copy_fraction * 100:.0f} % of {r.copy_gbs:.0f} GB/s"]
             for r in rows]
    return cli.markdown_table(header, cells)


def _method(rows: list[Row], residual: bool) -> str:
    triads = sorted({r.triad_path for r in rows})
    text = ("Heat/Jacobi sweeps " + ("with" if residual else "without") + " the fused residual; "
            f"{HEAT_BYTES_PER_CELL} x itemsize bytes per cell (read u, write-allocate v, write v), STREAM triad "
            f"{BYTES_PER_ELEMENT} x itemsize bytes per element (read b, read c, write-allocate a, write a), measured "
            f"in the same run, interleaved; bound = triad bytes/s / bytes per cell. Triad measured by: "
            f"{', '.join(triads)}.")
    if "numpy" in triads:
        text += " * NumPy's triad takes two passes: a lower estimate of the bandwidth (install numba for one pass)."
    return text


def _machine(paths: list[str]) -> str:
    from mpicomm.config import describe_cpu

    text = f"{describe_cpu()}, NumPy {np.__version__}"
    if "compiled" in paths or _triad_path("numpy") == "compiled":
        import numba

        text += f", numba {numba.__version__}"
    if "cupy" in paths:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        text += f", CuPy {cupy.__version__} on {name}"
    return text


def parser() -> argparse.ArgumentParser:
    """The command line's parser."""
    parser = cli.Parser(
        prog="python -m kernels.bench",
        description="Heat/Jacobi sweep rate of each kernel path next to a STREAM triad measured in the same run, "
                    "and the fraction of the memory bound it reaches (24 bytes per cell and 32 per triad element "
                    "for float64, write-allocate counted in both).",
        epilog="example: python -m kernels.bench --paths compiled --dims 2 --size 2048 --iters 20 --out KERNELS.md",
    )
    parser.add_argument("--paths", default="all", metavar="all|PATH,...",
                        help=f"paths to measure, comma-separated from {', '.join(PATHS)} (default: all available)")
    parser.add_argument("--dims", default="2,3", metavar="2,3", help="dimensions to measure (default: 2,3)")
    parser.add_argument("--size", type=_sizes, default=None, metavar="N[,M]",
                        help="interior points per side: N in 2-D, M in 3-D, each as 4096, 4K or 1e3; without M, 3-D "
                             "takes the side with as many points as N² (N^(2/3): 4096 -> 256, 2048 -> 161). Default: "
                             "4096 (2-D) and 256 (3-D). Arrays add 2 ghost layers")
    parser.add_argument("--iters", type=int, default=10, metavar="N",
                        help="timed sweeps (and triads) per size, in each repeat (default: 10)")
    cli.add_repeat(parser, 3, "the timed sweeps and triads of each path and size")
    parser.add_argument("--dtype", choices=["float64", "float32"], default="float64", help="(default: float64)")
    parser.add_argument("--residual", action="store_true", help="sweep with the fused residual (max |v - u|)")
    cli.add_out(parser, "the table")
    cli.add_json(parser, "the rows and the method")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return parser


def _sizes(text: str) -> dict[int, int]:
    """``"2048"`` → {2: 2048, 3: 161} (3-D with as many points as 2-D); ``"2048,128"`` → {2: 2048, 3: 128}.

    Each side is read by :func:`mpicomm.cli.parse_size`: ``2K`` and ``2e3`` are sides too.
    """
    try:
        values = [cli.parse_size(v, "--size") for v in text.split(",")]
    except ValueError:
        values = []
    if len(values) not in (1, 2):
        raise argparse.ArgumentTypeError(f"must be N or N,M, sides >= 1 such as 2048, 2K or 1e3 (e.g. 2048 or "
                                         f"2048,128); got {text!r}")
    n = values[0]
    return {2: n, 3: values[1] if len(values) == 2 else max(1, round(n ** (2 / 3)))}


def _requested_paths(parser: argparse.ArgumentParser, text: str) -> list[str]:
    if text == "all":
        return [p for p in PATHS if available(p)[0]]
    names = [p.strip() for p in text.split(",") if p.strip()]
    for name in names:
        if name not in PATHS:
            parser.error(f"--paths must be all or a comma-separated list of {', '.join(PATHS)}; got {name!r}")
        ok, reason = available(name)
        if not ok:
            parser.error(f"--paths: {name} cannot run here: {reason}")
    return names


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str], list[int]]:
    """The checked command line: the options, the paths and the dimensions to measure."""
    p = parser()
    args = p.parse_args(argv)
    paths = _requested_paths(p, args.paths)
    try:
        dims = [int(d) for d in args.dims.split(",") if d.strip()]
    except ValueError:
        dims = []
    if not dims or any(d not in (2, 3) for d in dims):
        p.error(f"--dims must be 2, 3 or 2,3; got {args.dims!r}")
    cli.at_least(p, args, 1, "--iters", "--repeat")
    cli.check_out(p, args)
    return args, paths, dims


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, measure, print the table; write --out / --json."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args, paths, dims = cli.parse_or_exit(_parse, argv)

    rows = []
    progress = cli.Progress(len(paths) * len(dims) * args.repeat, "kernels.bench", show=not args.quiet)
    for path in paths:
        for d in dims:
            size = (args.size or DEFAULT_SIZES)[d]
            progress.note(f"{path} {d}-D {size}^{d} ({(size + 2) ** d * np.dtype(args.dtype).itemsize / 1e6:.0f} MB "
                          f"per array): {args.repeat} x {args.iters} sweeps")
            rows.append(measure(path, d, size, args.iters, args.repeat, np.dtype(args.dtype), args.residual,
                                progress=progress))
    command = cli.command_line("python -m kernels.bench", argv)
    machine = _machine(paths)
    method = _method(rows, args.residual)
    text = table(rows)
    print(text)
    print(method)
    sys.stdout.flush()
    if args.out:
        lines = ["## Kernel sweeps against the STREAM bound", "", f"Command: `{command}`", "", f"Machine: {machine}", "",
                 method, "", text, ""]
        cli.write_out(args.out, "\n".join(lines), args.append)
    if args.json:
        results = {"machine": machine, "method": method, "residual": args.residual, "rows": [asdict(r) for r in rows]}
        cli.write_json(args.json, command, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
