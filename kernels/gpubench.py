"""Every GPU kernel against its bound, measured in the same run: ``python -m kernels.gpubench``.

    python -m kernels.gpubench                              # on a GPU: every kernel at its default size
    python -m kernels.gpubench --kernels matmul,spmv --out GPU-KERNELS.md --json gpu-kernels.json
    python -m kernels.gpubench --simulator --tiny           # numba's CUDA simulator on the CPU: checks the CLI

Each kernel runs next to the operation that bounds it, interleaved repeat by
repeat, on the same data:

============  ===============================  ========================================================
kernel        form                             bound
============  ===============================  ========================================================
heat          CUDA C (kernels/heat.py), 2-D    device-to-device copy of the bytes it moves (2 per cell)
              and 3-D
star          CUDA C (kernels/star.py), r = 2  copy (3 × itemsize per cell: read inp, read and write out)
halo          SIMT pack of a face normal to    copy of the face's bytes (read and write)
              axis 0 (contiguous rows) and to
              the last axis (short strided
              rows)
bias_gelu     SIMT, fused                      copy of x (2 × itemsize per element)
matmul        SIMT tiled, FP32, 16 × 16 tiles  cuBLAS (``cupy.matmul``, FP32 without TF32: CuPy's
                                               default), in TFLOP/s
spmv          SIMT scalar and warp forms       cuSPARSE (``cupyx.scipy.sparse.csr_matrix @ x``) and the
                                               copy of the bytes the product moves at least
============  ===============================  ========================================================

Bytes count what a kernel must move at least (a GPU does not write-allocate):
a copy's rate is (read + written) / time, so a kernel at 100 % of the copy
moves its bytes as fast as the copy moves its own. Rates are medians of
``--repeat`` repeats of ``--iters`` calls; every kernel and bound runs once
before the first timed repeat (numba compiles on the first launch, CuPy loads
its modules). Times come from the host clock around a stream synchronisation.

``--simulator`` runs the SIMT kernels in numba's CUDA simulator on NumPy arrays
(the CUDA C stencils are left out: they need a GPU), with NumPy operations as
the "bounds": the numbers only show that every step runs, never a GPU's speed.
``--tiny`` takes sizes of a few tiles.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from types import ModuleType
from typing import Any

import numpy as np

from mpicomm import cli

from . import simt

__all__ = ["KERNELS", "Case", "Row", "cases", "measure", "parser", "main"]

#: The kernels measured, in the table's order.
KERNELS = ("heat", "star", "halo", "bias_gelu", "matmul", "spmv")
_GPU_ONLY = ("heat", "star")


@dataclass
class Case:
    """One kernel form and its bound on prepared data: each call runs once; *work* is bytes or flops per call."""

    kernel: str
    form: str
    size: str
    unit: str  # "GB/s" or "TFLOP/s"
    work: float
    run: Callable[[], Any]
    bound: str
    bound_work: float
    bound_run: Callable[[], Any]


@dataclass
class Row:
    """One measured case: medians over the repeats."""

    kernel: str
    form: str
    size: str
    dtype: str
    unit: str
    ms: float
    rate: float
    bound: str
    bound_ms: float
    bound_rate: float
    fraction: float


def _copy(xp: ModuleType, nbytes: float, dtype: np.dtype) -> tuple[float, Callable[[], Any]]:
    """A device-to-device (simulator: host) copy moving about *nbytes* (half read, half written)."""
    n = max(1, int(nbytes // (2 * np.dtype(dtype).itemsize)))
    src, dst = xp.ones(n, dtype=dtype), xp.empty(n, dtype=dtype)
    return 2.0 * n * np.dtype(dtype).itemsize, lambda: xp.copyto(dst, src)


def _copy_case(kernel: str, form: str, size: str, xp: ModuleType, nbytes: float, run: Callable[[], Any],
               dtype: np.dtype) -> Case:
    work, copy = _copy(xp, nbytes, dtype)
    return Case(kernel, form, size, "GB/s", nbytes, run, "copy", work, copy)


def _stencils(xp: ModuleType, tiny: bool, dtype: np.dtype) -> list[Case]:
    from .paths import select

    k = select("cupy")
    item = np.dtype(dtype).itemsize
    out = []
    for dims, n in ((2, 16 if tiny else 8192), (3, 8 if tiny else 512)):
        u = xp.ones((n + 2,) * dims, dtype=dtype)
        v = xp.zeros_like(u)
        box = ((1, n + 1),) * dims
        out.append(_copy_case("heat", f"CUDA C {dims}-D", "x".join([str(n)] * dims), xp, 2.0 * item * n ** dims,
                              lambda u=u, v=v, box=box: k.heat(u, v, 0.125, box, residual=False), dtype))
    n, r = (16 if tiny else 8192), 2
    inp, res = xp.ones((n + 2 * r,) * 2, dtype=dtype), xp.zeros((n + 2 * r,) * 2, dtype=dtype)
    out.append(_copy_case("star", f"CUDA C r={r}", f"{n}x{n}", xp, 3.0 * item * n * n,
                          lambda: k.star(inp, res, r, ((r, n + r), (r, n + r))), dtype))
    return out


def _halo(xp: ModuleType, tiny: bool, dtype: np.dtype) -> list[Case]:
    from .halo import pack_simt

    n, g = (6 if tiny else 512), 2
    u = xp.ones((n + 2 * g,) * 3, dtype=dtype)
    owned = (g, n + g)
    out = []
    for axis in (0, 2):
        box = tuple((g, 2 * g) if a == axis else owned for a in range(3))
        cells = g * n * n
        buf = xp.empty(cells, dtype=dtype)
        threads = 4 if tiny else 128
        out.append(_copy_case("halo", f"SIMT pack, axis {axis} face", f"{n}^3 w={g}", xp,
                              2.0 * cells * np.dtype(dtype).itemsize,
                              lambda box=box, buf=buf, threads=threads: pack_simt(u, box, buf, threads=threads),
                              dtype))
    return out


def _gelu(xp: ModuleType, tiny: bool, dtype: np.dtype) -> list[Case]:
    from .gelu import bias_gelu

    m, n = (3, 40) if tiny else (8192, 4096)
    x = xp.ones((m, n), dtype=dtype)
    bias = xp.ones(n, dtype=dtype)
    out = xp.empty_like(x)
    threads = 32 if tiny else 128
    return [_copy_case("bias_gelu", "SIMT fused", f"{m}x{n}", xp, 2.0 * m * n * np.dtype(dtype).itemsize,
                       lambda: bias_gelu(x, bias, out, threads=threads), dtype)]


def _matmul(xp: ModuleType, tiny: bool, dtype: np.dtype) -> list[Case]:
    from .matmul import TILE, matmul

    n, tile = (8, 4) if tiny else (4096, TILE)
    a, b = xp.ones((n, n), dtype=dtype), xp.ones((n, n), dtype=dtype)
    c, c2 = xp.empty((n, n), dtype=dtype), xp.empty((n, n), dtype=dtype)
    flops = 2.0 * n ** 3
    bound = "cuBLAS" if xp is not np else "numpy.matmul"
    return [Case("matmul", f"SIMT tiled {tile}x{tile}", f"{n}^3", "TFLOP/s", flops,
                 lambda: matmul(a, b, c, tile=tile), bound, flops, lambda: xp.matmul(a, b, out=c2))]


def _csr(xp: ModuleType, m: int, per_row: int, dtype: np.dtype) -> tuple[Any, Any, Any]:
    """A CSR matrix of m × m with per_row entries per row at pseudo-random columns (sorted within a row)."""
    rows = np.arange(m, dtype=np.int64)[:, None]
    cols = (rows * 7919 + np.arange(per_row, dtype=np.int64)[None, :] * 104729) % m
    cols.sort(axis=1)
    indptr = xp.asarray(np.arange(0, m * per_row + 1, per_row, dtype=np.int32))
    indices = xp.asarray(cols.reshape(-1).astype(np.int32))
    data = xp.ones(m * per_row, dtype=dtype)
    return indptr, indices, data


def _spmv(xp: ModuleType, tiny: bool, dtype: np.dtype) -> list[Case]:
    from .spmv import nbytes, spmv, spmv_numpy

    m, per_row = (4, 40) if tiny else (1 << 20, 32)
    indptr, indices, data = _csr(xp, m, per_row, dtype)
    x, y, y2 = xp.ones(m, dtype=dtype), xp.empty(m, dtype=dtype), xp.empty(m, dtype=dtype)
    moved = float(nbytes(m, m * per_row, dtype, np.int32))
    if xp is np:
        bound, product = "numpy CSR", (lambda: spmv_numpy(indptr, indices, data, x, y2))
    else:
        sparse = importlib.import_module("cupyx.scipy.sparse")
        matrix = sparse.csr_matrix((data, indices, indptr), shape=(m, m))
        bound, product = "cuSPARSE", (lambda: matrix.dot(x))
    size = f"{m} rows x {per_row}"
    out = []
    for form in ("scalar", "warp"):
        def run(form: str = form) -> None:
            spmv(indptr, indices, data, x, y, form=form, validate=False)
        out.append(Case("spmv", f"SIMT {form}", size, "GB/s", moved, run, bound, moved, product))
        out.append(_copy_case("spmv", f"SIMT {form}", size, xp, moved, run, dtype))
    return out


_BUILDERS: dict[str, Callable[[ModuleType, bool, np.dtype], list[Case]]] = {
    "heat": _stencils, "halo": _halo, "bias_gelu": _gelu, "matmul": _matmul, "spmv": _spmv}


def cases(xp: ModuleType, kernels: list[str], tiny: bool, dtype: np.dtype) -> list[Case]:
    """The prepared cases of *kernels* (heat and star are built together) on arrays of *xp*."""
    out: list[Case] = []
    if "heat" in kernels or "star" in kernels:
        out += [c for c in _stencils(xp, tiny, dtype) if c.kernel in kernels]
    for name in kernels:
        if name not in _GPU_ONLY:
            out += _BUILDERS[name](xp, tiny, dtype)
    return out


def _timed(xp: ModuleType, fn: Callable[[], Any], iters: int) -> float:
    simt.sync(xp)
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    simt.sync(xp)
    return time.perf_counter() - start


def measure(xp: ModuleType, case: Case, iters: int, repeat: int, dtype: np.dtype) -> Row:
    """Warm both up, then *repeat* times: the kernel's *iters* calls, the bound's *iters* calls; medians."""
    case.run()
    case.bound_run()
    kernel, bound = [], []
    for _ in range(repeat):
        kernel.append(_timed(xp, case.run, iters) / iters)
        bound.append(_timed(xp, case.bound_run, iters) / iters)
    t, tb = statistics.median(kernel), statistics.median(bound)
    scale = 1e9 if case.unit == "GB/s" else 1e12
    rate, bound_rate = case.work / t / scale, case.bound_work / tb / scale
    return Row(case.kernel, case.form, case.size, np.dtype(dtype).name, case.unit, t * 1e3, rate, case.bound,
               tb * 1e3, bound_rate, rate / bound_rate)


HEADER = ["kernel", "form", "size", "dtype", "ms", "rate", "bound", "bound ms", "bound rate", "of bound"]


def table(rows: list[Row]) -> str:
    """The Markdown table of *rows*."""
    cells = [[r.kernel, r.form, r.size, r.dtype, f"{r.ms:.4g}", f"{r.rate:.4g} {r.unit}", r.bound,
              f"{r.bound_ms:.4g}", f"{r.bound_rate:.4g} {r.unit}", f"{100 * r.fraction:.0f} %"] for r in rows]
    return cli.markdown_table(HEADER, cells)


def _machine(xp: ModuleType) -> str:
    if xp is np:
        return "numba's CUDA simulator on the CPU (NumPy arrays): these times are Python threads', not a GPU's"
    props = xp.cuda.runtime.getDeviceProperties(xp.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    cc = xp.cuda.Device().compute_capability
    return (f"{name} (compute capability {cc[0]}.{cc[1:]}), CuPy {xp.__version__}, CUDA runtime "
            f"{xp.cuda.runtime.runtimeGetVersion()}")


def parser() -> argparse.ArgumentParser:
    """The command line's parser."""
    p = cli.Parser(
        prog="python -m kernels.gpubench",
        description="Every GPU kernel of kernels/ next to its bound, measured in the same run: the stencils, halo "
                    "pack and fused bias + GELU against a device-to-device copy of the same bytes, the tiled matmul "
                    "against cuBLAS, the CSR SpMV forms against cuSPARSE and the copy.",
        epilog="example: python -m kernels.gpubench --out GPU-KERNELS.md --json gpu-kernels.json; "
               "python -m kernels.gpubench --simulator --tiny (no GPU: numba's simulator, to check the steps)")
    p.add_argument("--kernels", default="all", metavar="all|NAME,...",
                   help=f"kernels to measure, comma-separated from {', '.join(KERNELS)} (default: all)")
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32", help="(default: float32)")
    p.add_argument("--iters", type=int, default=20, metavar="N", help="timed calls per case, in each repeat "
                                                                     "(default: 20)")
    cli.add_repeat(p, 3, "the timed calls of each case and its bound")
    p.add_argument("--tiny", action="store_true", help="sizes of a few tiles (for the simulator)")
    p.add_argument("--simulator", action="store_true",
                   help="run the SIMT kernels in numba's CUDA simulator on the CPU (implies leaving out the CUDA C "
                        "stencils heat and star)")
    cli.add_out(p, "the table")
    cli.add_json(p, "the rows and the machine")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return p


def _kernels(p: argparse.ArgumentParser, text: str, simulator: bool) -> list[str]:
    names = list(KERNELS) if text == "all" else [n.strip() for n in text.split(",") if n.strip()]
    for name in names:
        if name not in KERNELS:
            p.error(f"--kernels must be all or a comma-separated list of {', '.join(KERNELS)}; got {name!r}")
    if simulator:
        if text != "all" and any(n in _GPU_ONLY for n in names):
            p.error(f"--kernels: {', '.join(n for n in names if n in _GPU_ONLY)} are CUDA C kernels and need a GPU; "
                    f"leave them out with --simulator")
        names = [n for n in names if n not in _GPU_ONLY]
    return names


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, measure, print the table; write --out / --json."""
    argv = list(sys.argv[1:] if argv is None else argv)
    p = parser()
    args = p.parse_args(argv)
    names = _kernels(p, args.kernels, args.simulator)
    cli.at_least(p, args, 1, "--iters", "--repeat")
    cli.check_out(p, args)
    if args.simulator:
        try:
            simt.use_simulator()
        except RuntimeError as exc:
            p.error(f"--simulator: {exc}")
        xp: ModuleType = np
    else:
        from mpicomm.device import visible_devices

        if visible_devices() == 0:
            p.error("no GPU is visible (CuPy missing, no driver or no device); run on a GPU machine, or pass "
                    "--simulator --tiny to check the steps in numba's CUDA simulator")
        xp = importlib.import_module("cupy")
    why = simt.reason()
    if why is not None:
        p.error(why)
    dtype = np.dtype(args.dtype)
    prepared = cases(xp, names, args.tiny, dtype)
    progress = cli.Progress(len(prepared), "kernels.gpubench", show=not args.quiet)
    rows = []
    for case in prepared:
        rows.append(measure(xp, case, args.iters, args.repeat, dtype))
        progress.step(f"{case.kernel} {case.form} {case.size} against {case.bound}")
    command = cli.command_line("python -m kernels.gpubench", argv)
    machine = _machine(xp)
    text = table(rows)
    print(text)
    sys.stdout.flush()
    if args.out:
        lines = ["## GPU kernels against their bounds", "", f"Command: `{command}`", "", f"Machine: {machine}", "",
                 text, ""]
        cli.write_out(args.out, "\n".join(lines), args.append)
    if args.json:
        cli.write_json(args.json, command, {"machine": machine, "rows": [asdict(r) for r in rows]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
