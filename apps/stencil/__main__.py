"""Command line: ``mpiexec -n N python -m apps.stencil [options]`` (``--help`` lists them)."""

from __future__ import annotations

import argparse
import sys

from mpicomm import cli

PROG = "python -m apps.stencil"

EXAMPLE = """examples:
  mpiexec -n 4 python -m apps.stencil                              # heat 2-D 4096², 1000 iterations, verified
  mpiexec -n 3 python -m apps.stencil --dims 3 --size 256 --halo blocking
  mpiexec -n 2 python -m apps.stencil --problem star --radius 2 --size 8000 --iters 100
  mpiexec -n 2 python -m apps.stencil --size 8K --iters 200 --json run.json   # sizes as 8192, 8K or 1e4
  mpiexec -n 4 python -m apps.stencil --checkpoint-every 100 --checkpoint-dir ckpt   # then, after a crash:
  mpiexec -n 4 python -m apps.stencil --checkpoint-every 100 --checkpoint-dir ckpt --restart
"""


def _rank_dims(text: str) -> list[int]:
    try:
        dims = [int(x) for x in text.lower().split("x")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a rank grid like 2x2 or 4x1x1") from None
    if any(d < 0 for d in dims):
        raise argparse.ArgumentTypeError(f"{text!r}: rank counts must be >= 0 (0: let MPI choose)")
    return dims


def parser() -> argparse.ArgumentParser:
    """The command line's parser (no checks beyond argparse's: :func:`parse` makes them)."""
    from apps import options
    from kernels import PATHS

    from .halo import MODES
    from .problem import PROBLEMS

    parser = cli.Parser(
        prog=PROG,
        description="Structured-grid stencil solver over a Cartesian communicator: halo exchange overlapped with "
        "compute, a global residual with mpicomm's allreduce, atomic checkpoints, and a check against the closed-form "
        "answer at the end (exit status 1 if it fails). Every kernel is compiled and warmed up before the timed "
        "loop starts.",
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--problem", choices=PROBLEMS, default="heat",
                        help="heat: heat equation / Jacobi with an exactly known discrete solution (2-D 5-point, 3-D "
                             "7-point); star: the PRK star stencil of --radius r, checked by its L1 norm (default: heat)")
    parser.add_argument("--dims", type=int, choices=(2, 3), default=2, help="2 or 3 dimensions (default: 2)")
    parser.add_argument("--size", type=cli.size_arg, default=None, metavar="N",
                        help="cells per side, e.g. 4096, 4K or 1e4 (default: 4096 in 2-D, 256 in 3-D)")
    parser.add_argument("--iters", type=int, default=1000, metavar="N",
                        help="iterations of the solver (default: 1000)")
    parser.add_argument("--tol", type=float, default=0.0,
                        help="stop when the residual max|u_new - u| falls to this (default: 0, run all --iters)")
    parser.add_argument("--check-every", type=int, default=10, metavar="K",
                        help="compute the global residual every K iterations (default: 10)")
    parser.add_argument("--kernel", choices=("auto", *PATHS), default="auto",
                        help="compute path: numpy, compiled (numba), cupy (GPU); auto = compiled if numba is "
                             "installed, else numpy (default: auto)")
    parser.add_argument("--halo", choices=MODES, default="overlap",
                        help="blocking: exchange, then update; overlap: update the interior while halos are in flight; "
                             "neighbor: MPI neighbourhood collective (default: overlap)")
    parser.add_argument("--radius", type=int, default=2, help="star stencil radius (default: 2)")
    parser.add_argument("--c", type=float, default=None, help="heat: c = κ·dt/h², 0 < c <= 1/(2·dims) (default: 1/(2·dims), Jacobi)")
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64", help="(default: float64)")
    parser.add_argument("--rank-dims", type=_rank_dims, default=None, metavar="AxB[xC]",
                        help="rank grid, e.g. 4x1 (0 = let MPI choose; default: MPI_Dims_create)")
    options.add_checkpoint_options(parser, "stencil", "iterations")
    parser.add_argument("--plot", metavar="FILE.png", default=None, help="save a picture of the final field")
    cli.add_json(parser, "the settings and the results")
    parser.add_argument("--no-stream", dest="stream", action="store_false",
                        help="skip the STREAM triad measurement (no fraction of the memory bound)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return parser


def parse(argv: list[str] | None):
    """The parser and the checked options; usage errors exit with status 2 (argparse's) before the work starts."""
    from apps import options
    from kernels import available

    p = parser()
    args = p.parse_args(argv)
    if args.size is None:
        args.size = 4096 if args.dims == 2 else 256
    cli.at_least(p, args, 1, "--size", "--check-every")
    cli.at_least(p, args, 0, "--iters")
    options.check_checkpoint_options(p, args)
    cli.refuse_unless(p, args, args.problem == "star", "--problem star", "--radius")
    cli.refuse_unless(p, args, args.problem == "heat", "--problem heat", "--c")
    if args.tol < 0:
        p.error(f"--tol must be >= 0, got {args.tol:g}")
    if args.rank_dims is not None and len(args.rank_dims) != args.dims:
        p.error(f"--rank-dims {'x'.join(map(str, args.rank_dims))}: give {args.dims} numbers for --dims {args.dims}")
    if args.kernel != "auto":
        ok, why = available(args.kernel)
        if not ok:
            p.error(f"--kernel {args.kernel} cannot run here: {why}")
    return p, args


def report(res, say) -> None:
    """The summary rank 0 prints."""
    say(f"iterations      {res.iterations} (stopped by {res.stopped}"
        + (f", resumed at {res.start_iteration}" if res.start_iteration else "") + ")"
        + (f", residual {res.residual:.3e}" if res.residual is not None else ""))
    done = res.iterations - res.start_iteration
    per = (res.seconds - res.checkpoint_seconds) / done if done else 0.0
    say(f"time            {cli.format_time(res.seconds)} ({cli.format_time(per)} per iteration"
        + (f"; checkpoints {cli.format_time(res.checkpoint_seconds)}" if res.checkpoint_seconds else "") + ")")
    say(f"update rate     {res.mlups:.1f} MLUP/s ({res.mlups * res.flops_per_point:.0f} MFlop/s)")
    say(f"effective BW    {res.gbs:.2f} GB/s ({res.bytes_per_point} B/point)")
    if res.bound_fraction is not None:
        say(f"memory bound    {res.bound_fraction:.0%} of STREAM ({res.stream_gbs:.2f} GB/s triad → "
            f"{res.stream_gbs * 1e3 / res.bytes_per_point:.0f} MLUP/s)")
    faster = _faster_kernel(res.kernel)
    if faster:
        say(f"                {faster}")
    if res.efficiency is not None:
        say(f"parallel eff.   {res.efficiency:.0%} (the same blocks' update alone / the whole iteration, "
            f"{res.ranks} ranks)")
        if res.efficiency > 1:
            say("                above 100 %: the loop ran faster than the update alone, timed for 5 iterations "
                "before and after it (run-to-run noise, larger than the halo exchange's cost at this size)")
    v = res.verdict
    say(f"verification    {'PASS' if v.passed else 'FAIL'}: {v.what}; error {v.error:.3e} (tolerance {v.tolerance:.1e})")
    say(f"field digest    {res.digest}")


def _faster_kernel(kernel: str) -> str | None:
    """Where the NumPy kernel ran: the line that says which kernel is faster and how to get it (NumPy's update takes
    several passes over memory; the compiled one, one pass: the README's figure of the memory bound is its)."""
    if kernel != "numpy":
        return None
    from kernels import available

    ok, why = available("compiled")
    if ok:
        return "kernel numpy: --kernel compiled (numba, one pass over memory) runs nearer the bound"
    return f"kernel numpy (several passes over memory); the compiled kernel runs nearer the bound: {why}"


def run(argv: list[str] | None = None) -> int:
    from apps import options

    parser, args = options.parse_or_exit(parse, argv)
    from mpi4py import MPI

    from apps import report as json_report
    from apps.checkpoint import CheckpointError

    from .solver import Config, solve

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()

    def say(text: str) -> None:
        if rank == 0:
            print(text, flush=True)

    cfg = Config(
        problem=args.problem, dims=args.dims, size=args.size, iters=args.iters, tol=args.tol,
        check_every=args.check_every, kernel=args.kernel, halo=args.halo, radius=args.radius, c=args.c,
        dtype=args.dtype, rank_dims=args.rank_dims, checkpoint_every=args.checkpoint_every,
        checkpoint_dir=args.checkpoint_dir, keep=args.keep, restart=args.restart, plot=args.plot,
        stream=args.stream, progress=not args.quiet,
    )
    if cfg.kernel == "cupy":
        import mpicomm

        mpicomm.Comm().bind_device()
    try:
        res = solve(comm, cfg, say)
    except (ValueError, CheckpointError) as exc:
        # The same settings, hence the same error, on every rank: said once, every rank exits with status 2.
        options.exit_error(parser.prog, str(exc), rank, comm.Get_size())
    report(res, say)
    if args.plot:
        say(f"plot            {args.plot}")
    if args.json and rank == 0:
        results = {"config": vars(args) | {"rank_dims": res.rank_dims}, "result": res.as_dict()}
        json_report.write_json(args.json, PROG, argv, comm.Get_size(), results)
    return 0 if res.verdict.passed else 1


if __name__ == "__main__":
    from mpicomm.runtime import main

    sys.exit(main(run))
