"""Scaling benchmark of the stencil: weak and strong scaling, each halo mode, side by side in one run.

    python -m apps.stencil.bench --ranks 1,2 --size 4096 --iters 300 --halo blocking,overlap --out BENCH.md

Runs ``mpiexec -n N python -m apps.stencil`` for every rank count and halo mode
(interleaved round by round, best of ``--repeat``, so slow drifts of a shared
machine hit every configuration alike) at two sizes:

* **strong** — the same grid (``--size`` per side) at every rank count:
  efficiency = rate(N) / (N · rate(1));
* **weak** — the same cells per rank: ``--size · √N`` per side in 2-D
  (``∛N`` in 3-D), relative to the first rank count, rounded: efficiency = rate(N) / (N · rate(1)) with the rate
  per cell of each run.

Each row also shows the STREAM-bound fraction the application measured in
that run, which separates "the halo exchange costs" from "two ranks share one
memory bus". The table goes to stdout and, with ``--out``, to a Markdown file
with the command that made it (an existing file is kept unless ``--append`` or
``--force``); ``--json`` writes the rows and every run's result. Each run
warms up (compiles) its kernels before its timed loop, so the numba cache's
state does not change the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile

from mpicomm import cli

__all__ = ["main"]

PROG = "python -m apps.stencil.bench"


def _mpiexec() -> str:
    import shutil

    here = os.path.dirname(sys.executable)
    found = shutil.which("mpiexec", path=here + os.pathsep + os.environ.get("PATH", ""))
    if not found:
        raise SystemExit("python -m apps.stencil.bench: no mpiexec next to this Python or on PATH "
                         "(pip install -e '.[mpich]')")
    return found


def _run(n: int, args: list[str], timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="stencil-bench-") as d:
        out = os.path.join(d, "r.json")
        cmd = [_mpiexec(), "-n", str(n), sys.executable, "-m", "apps.stencil", "--quiet", "--json", out, *args]
        env = dict(os.environ, MPIEXEC_TIMEOUT=str(int(timeout)))
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 30, env=env)
        if proc.returncode != 0:
            raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        with open(out) as f:
            return json.load(f)["results"]["result"]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                     epilog="example: python -m apps.stencil.bench --ranks 1,2 --size 4K --iters 300 "
                                            "--out STENCIL.md --json stencil.json")
    parser.add_argument("--ranks", default="1,2", help="rank counts, comma-separated; the first is the baseline (default: 1,2)")
    parser.add_argument("--dims", type=int, choices=(2, 3), default=2, help="2 or 3 dimensions (default: 2)")
    parser.add_argument("--size", type=cli.size_arg, default=None, metavar="N",
                        help="cells per side at the baseline, e.g. 4096, 4K or 1e4 (default: 4096 in 2-D, 256 in 3-D)")
    parser.add_argument("--iters", type=int, default=300, help="iterations per run (default: 300)")
    parser.add_argument("--halo", default="blocking,overlap,neighbor", help="halo modes (default: all three)")
    parser.add_argument("--kernel", default="auto", help="compute path of every run (default: auto)")
    parser.add_argument("--scaling", default="weak,strong", help="weak, strong or both (default: both)")
    parser.add_argument("--repeat", type=int, default=2, help="runs per configuration, best kept (default: 2)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per run (default: 600)")
    cli.add_out(parser, "the table")
    cli.add_json(parser, "the table's rows and every configuration's best run")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)
    cli.check_out(parser, args)
    try:
        ranks = [int(x) for x in args.ranks.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--ranks {args.ranks!r}: expected comma-separated integers such as 1,2")
    if not ranks or min(ranks) < 1:
        parser.error(f"--ranks {args.ranks!r}: rank counts must be >= 1")
    if args.repeat < 1 or args.iters < 1:
        parser.error(f"--repeat {args.repeat} --iters {args.iters}: both must be >= 1")
    modes = [m for m in args.halo.split(",") if m]
    bad = [m for m in modes if m not in ("blocking", "overlap", "neighbor")]
    if bad:
        parser.error(f"--halo {bad[0]!r}: expected blocking, overlap or neighbor")
    scalings = [s for s in args.scaling.split(",") if s]
    if any(s not in ("weak", "strong") for s in scalings):
        parser.error(f"--scaling {args.scaling!r}: expected weak, strong or weak,strong")
    size = args.size or (4096 if args.dims == 2 else 256)

    def side(n: int, scaling: str) -> int:
        return size if scaling == "strong" else round(size * (n / ranks[0]) ** (1 / args.dims))

    configs = [(s, n, m) for s in scalings for n in ranks for m in modes if not (s == "weak" and n == ranks[0] and "strong" in scalings)]
    best: dict[tuple, dict] = {}
    progress = cli.Progress(len(configs) * args.repeat, "stencil.bench", show=not args.quiet)
    for _ in range(args.repeat):
        for scaling, n, mode in configs:
            res = _run(n, ["--dims", str(args.dims), "--size", str(side(n, scaling)), "--iters", str(args.iters),
                           "--halo", mode, "--kernel", args.kernel], args.timeout)
            key = (scaling, n, mode)
            if key not in best or res["mlups"] > best[key]["mlups"]:
                best[key] = res
            progress.step(f"{scaling} n={n} {mode}: {res['mlups']:.0f} MLUP/s")

    def get(scaling: str, n: int, mode: str) -> dict:
        if scaling == "weak" and n == ranks[0] and "strong" in scalings:
            scaling = "strong"  # the baseline is the same run
        return best[(scaling, n, mode)]

    lines = ["| scaling | halo | ranks | grid | MLUP/s | per rank | efficiency | of STREAM bound | overlap gain |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|"]
    rows = []
    for scaling in scalings:
        for mode in modes:
            base = get(scaling, ranks[0], mode)
            for n in ranks:
                r = get(scaling, n, mode)
                base_rate = base["mlups"] / ranks[0]
                if scaling == "weak":
                    eff = (r["mlups"] / n) / base_rate
                else:
                    eff = r["mlups"] / (n * base_rate)
                gain = None
                if mode == "overlap" and "blocking" in modes:
                    gain = r["mlups"] / get(scaling, n, "blocking")["mlups"]
                bound = f"{r['bound_fraction']:.0%}" if r.get("bound_fraction") else "—"
                grid = " × ".join([str(side(n, scaling))] * args.dims)
                lines.append(f"| {scaling} | {mode} | {n} | {grid} | {r['mlups']:.0f} | {r['mlups'] / n:.0f} | "
                             f"{eff:.0%} | {bound} | {'' if gain is None else f'{gain:.2f}×'} |")
                rows.append({"scaling": scaling, "halo": mode, "ranks": n, "size": side(n, scaling),
                             "dims": args.dims, "mlups": r["mlups"], "mlups_per_rank": r["mlups"] / n,
                             "efficiency": eff, "bound_fraction": r.get("bound_fraction"), "overlap_gain": gain,
                             "run": r})
    kernel = next(iter(best.values()))["kernel"]
    head = (f"Stencil scaling: {args.dims}-D heat, kernel {kernel}, {args.iters} iterations, best of {args.repeat}, "
            f"{platform.node()} ({os.cpu_count()} cores)")
    table = "\n".join(lines)
    print(head)
    print(table)
    command = cli.command_line(PROG, argv)
    if args.out:
        with open(args.out, "a" if args.append else "w") as f:
            f.write(f"### {head}\n\n```\n{command}\n```\n\n{table}\n\n")
    if args.json:
        cli.write_json(args.json, command, {"kernel": kernel, "dims": args.dims, "iterations": args.iters,
                                            "repeat": args.repeat, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
