"""Scaling benchmark of the stencil: weak and strong scaling, each halo mode, side by side in one run.

    python -m apps.stencil.bench --ranks 1,2 --size 4096 --iters 300 --halo blocking,overlap --out BENCH.md

Runs ``mpiexec -n N python -m apps.stencil`` for every rank count and halo mode
(interleaved round by round, ``--repeat`` rounds, so slow drifts of a shared
machine hit every configuration alike; each configuration's run with the
median rate is reported) at two sizes:

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


def _mpiexec() -> str | None:
    import shutil

    here = os.path.dirname(sys.executable)
    return shutil.which("mpiexec", path=here + os.pathsep + os.environ.get("PATH", ""))


def _run(mpiexec: str, n: int, args: list[str], timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="stencil-bench-") as d:
        out = os.path.join(d, "r.json")
        cmd = [mpiexec, "-n", str(n), sys.executable, "-m", "apps.stencil", "--quiet", "--json", out, *args]
        env = dict(os.environ, MPIEXEC_TIMEOUT=str(int(timeout)))
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 30, env=env)
        if proc.returncode != 0:
            raise SystemExit(cli.error_line(PROG, f"a run failed with status {proc.returncode}: {' '.join(cmd)}\n"
                                                  f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}"))
        with open(out) as f:
            return json.load(f)["results"]["result"]


def _median(runs: list[dict]) -> dict:
    """The run with the median rate (the upper one of the middle two for an even count)."""
    return sorted(runs, key=lambda r: r["mlups"])[len(runs) // 2]


def _scalings(text: str) -> list[str]:
    """``--scaling``: weak, strong, both (= weak,strong) or a comma-separated list of weak and strong."""
    names = ["weak", "strong"] if text.strip() == "both" else [s.strip() for s in text.split(",") if s.strip()]
    if not names or any(s not in ("weak", "strong") for s in names):
        raise argparse.ArgumentTypeError(f"must be weak, strong or both; got {text!r}")
    return list(dict.fromkeys(names))


def _ranks(text: str) -> list[int]:
    try:
        ranks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        ranks = []
    if not ranks or min(ranks) < 1:
        raise argparse.ArgumentTypeError(f"must be rank counts >= 1, comma-separated, such as 1,2; got {text!r}")
    return ranks


def _modes(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    if not modes or any(m not in ("blocking", "overlap", "neighbor") for m in modes):
        raise argparse.ArgumentTypeError(f"must be blocking, overlap or neighbor, comma-separated; got {text!r}")
    return modes


def parser() -> argparse.ArgumentParser:
    """The command line's parser."""
    from kernels import PATHS

    parser = cli.Parser(prog=PROG, description=__doc__.split("\n\n")[0],
                        epilog="example: python -m apps.stencil.bench --ranks 1,2 --size 4K --iters 300 "
                               "--out STENCIL.md --json stencil.json")
    parser.add_argument("--ranks", type=_ranks, default=[1, 2], metavar="N[,N…]",
                        help="rank counts, comma-separated; the first is the baseline (default: 1,2)")
    parser.add_argument("--dims", type=int, choices=(2, 3), default=2, help="2 or 3 dimensions (default: 2)")
    parser.add_argument("--size", type=cli.size_arg, default=None, metavar="N",
                        help="cells per side at the baseline, e.g. 4096, 4K or 1e4 (default: 4096 in 2-D, 256 in 3-D)")
    parser.add_argument("--iters", type=int, default=300, metavar="N",
                        help="timed iterations of the solver per run (per configuration) (default: 300)")
    parser.add_argument("--halo", type=_modes, default=["blocking", "overlap", "neighbor"], metavar="MODE[,MODE…]",
                        help="halo modes: blocking, overlap, neighbor (default: all three)")
    parser.add_argument("--kernel", choices=("auto", *PATHS), default="auto",
                        help="compute path of every run (default: auto)")
    parser.add_argument("--scaling", type=_scalings, default=["weak", "strong"], metavar="weak|strong|both",
                        help="weak, strong or both (default: both)")
    cli.add_repeat(parser, 3, "every configuration (round by round, interleaved)")
    parser.add_argument("--timeout", type=float, default=600, metavar="S", help="seconds per run (default: 600)")
    cli.add_out(parser, "the table")
    cli.add_json(parser, "the table's rows and every configuration's median run")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return parser


def _parse(argv: list[str]) -> tuple[argparse.Namespace, str]:
    """The checked command line and the mpiexec that starts the runs."""
    from kernels import available

    p = parser()
    args = p.parse_args(argv)
    cli.check_out(p, args)
    cli.at_least(p, args, 1, "--repeat", "--iters")
    if not args.timeout > 0:
        p.error(f"--timeout must be > 0, got {args.timeout:g}")
    if args.kernel != "auto":
        ok, why = available(args.kernel)
        if not ok:
            p.error(f"--kernel {args.kernel} cannot run here: {why}")
    mpiexec = _mpiexec()
    if not mpiexec:
        p.error("no mpiexec next to this Python or on PATH (pip install -e '.[mpich]')")
    return args, mpiexec


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, mpiexec = cli.parse_or_exit(_parse, argv)
    ranks, modes, scalings = args.ranks, args.halo, args.scaling
    size = args.size or (4096 if args.dims == 2 else 256)

    def side(n: int, scaling: str) -> int:
        return size if scaling == "strong" else round(size * (n / ranks[0]) ** (1 / args.dims))

    configs = [(s, n, m) for s in scalings for n in ranks for m in modes if not (s == "weak" and n == ranks[0] and "strong" in scalings)]
    runs: dict[tuple, list[dict]] = {}
    progress = cli.Progress(len(configs) * args.repeat, "stencil.bench", show=not args.quiet)
    for _ in range(args.repeat):
        for scaling, n, mode in configs:
            res = _run(mpiexec, n, ["--dims", str(args.dims), "--size", str(side(n, scaling)), "--iters",
                                    str(args.iters), "--halo", mode, "--kernel", args.kernel], args.timeout)
            runs.setdefault((scaling, n, mode), []).append(res)
            progress.step(f"{scaling} n={n} {mode}: {res['mlups']:.0f} MLUP/s")
    chosen = {key: _median(found) for key, found in runs.items()}

    def get(scaling: str, n: int, mode: str) -> dict:
        if scaling == "weak" and n == ranks[0] and "strong" in scalings:
            scaling = "strong"  # the baseline is the same run
        return chosen[(scaling, n, mode)]

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
    kernel = next(iter(chosen.values()))["kernel"]
    head = (f"Stencil scaling: {args.dims}-D heat, kernel {kernel}, {args.iters} iterations, median of {args.repeat}, "
            f"{platform.node()} ({os.cpu_count()} cores)")
    table = "\n".join(lines)
    print(head)
    print(table)
    command = cli.command_line(PROG, argv)
    if args.out:
        cli.write_out(args.out, f"### {head}\n\n```\n{command}\n```\n\n{table}\n", args.append)
    if args.json:
        cli.write_json(args.json, command, {"kernel": kernel, "dims": args.dims, "iterations": args.iters,
                                            "repeat": args.repeat, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
