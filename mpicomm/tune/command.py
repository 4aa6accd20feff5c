"""``mpiexec -n N python -m mpicomm.tune``: the command line of fitting the model and measuring collectives.

    mpiexec -n 2 python -m mpicomm.tune                  # fit, print the fit, save it
    mpiexec -n 2 python -m mpicomm.tune --show           # print the saved fit for this layout
    mpiexec -n 2 python -m mpicomm.tune --collectives    # time every algorithm, save the measured rules
    mpiexec -n 2 python -m mpicomm.tune --json fit.json  # also the fit (and its samples) as a JSON document

Without ``--collectives``: :func:`mpicomm.tune.fit.measure` over ``--sizes``
(default 8 B to 64 MiB, past the cache), the fit printed
(:func:`mpicomm.tune.reports.report`) and saved as JSON in the cache directory
(``MPICOMM_CACHE_DIR``, else ``$XDG_CACHE_HOME/mpicomm``, else
``~/.cache/mpicomm``), named by rank 0's host and the layout (ranks, nodes,
most ranks per node); every ``mpicomm.Comm`` with that layout on that host
then loads it for :func:`mpicomm.predict` and ``--explain``.

With ``--collectives``, nothing is fitted:
:func:`mpicomm.tune.collectives.measure_collectives` times every algorithm of
each collective (``--collective``, default all of ``python -m mpicomm.bench``'s)
over ``--sizes`` (default 8 B to 16 MiB), ``--repeat`` times interleaved (the
median counts), and saves the fastest per size as a rules file
(:mod:`mpicomm.rules`) next to the fit, which
``auto`` follows before the default rules; when a fit is saved for the layout,
the measurements also correct it.

Command-line conventions are :mod:`mpicomm.cli`'s: sizes as ``4096``, ``64K``,
``64KiB``, ``1M`` or ``1e6``; ``--output FILE`` writes the fit (or the rules)
there instead of the cache directory, never replacing a file without
``--force``; an option the chosen mode does not use is a usage error; usage
and rank-count errors read ``python -m mpicomm.tune: error: …`` and exit with
status 2; progress lines ``[i/N] ... elapsed ... ETA ...``
on stderr (``--quiet``: none); ``--json FILE`` writes an ``mpicomm-results``
document whose ``results`` are the fit (:func:`mpicomm.tune.reports.fit_json`:
the machine, what was not measured, the fitted lines and every sample), the
rules with ``--collectives``, or the saved fit or rules with ``--show``. Every
command tune advises (:func:`tune_command`) runs on at least
:data:`MIN_RANKS` ranks.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from .. import cli, config, model, rules
from .collectives import measure_collectives, model_corrections
from .fit import measure
from .reports import describe, fit_json, machine_json, report

__all__ = ["main", "parser", "MIN_RANKS", "PROG", "tune_command"]


#: The fewest ranks tune measures with: a message needs a sender and a receiver.
MIN_RANKS = 2

#: The program name in usage lines, advice and JSON documents.
PROG = "python -m mpicomm.tune"


def tune_command(p: int, *options: str) -> str:
    """The command line that runs tune on *p* ranks (at least :data:`MIN_RANKS`) with *options*, shell-quoted.

    Every command tune advises is built here, so none asks for fewer ranks than
    tune accepts; the tests parse each one with tune's own parser.
    """
    return " ".join(["mpiexec", "-n", str(max(MIN_RANKS, p)), PROG, *(shlex.quote(o) for o in options)])


def _user_options(argv: Sequence[str] | None) -> list[str]:
    return list(sys.argv[1:] if argv is None else argv)


def _no_saved(what: str, host: str, layout: str, path: str, p: int, nodes: int, *options: str) -> str:
    """The message for ``--show`` without a saved file: why, and a command that writes one (never on 1 rank)."""
    head = f"no {what} saved for host {host} and layout {layout} ({path})"
    if p < MIN_RANKS:
        return (f"{head}; tune needs at least {MIN_RANKS} ranks, so a layout of one rank never has one (one rank "
                f"sends no messages). Tune with the ranks your programs use, e.g. {MIN_RANKS}: "
                f"{tune_command(MIN_RANKS, *options)}; then see it with {tune_command(MIN_RANKS, *options, '--show')}")
    where = "" if nodes == 1 else f" (with the same {nodes} nodes and ranks per node)"
    return f"{head}; run: {tune_command(p, *options)}{where}"


def _collectives_main(args: argparse.Namespace, comm: Any, argv: Sequence[str] | None = None) -> int:
    """``--collectives``: measure, print, save the rules (or, with ``--show``, print the saved ones)."""
    from mpi4py import MPI

    plain = MPI.Intracomm(comm)
    rank, p = plain.Get_rank(), plain.Get_size()
    layout = model.layout_key(p, comm.nodes, comm.ppn)
    if args.show:
        if rank != 0:
            return plain.bcast(None, root=0)
        path = rules.path_for(comm.host, layout)
        try:
            saved = rules.load_for(comm.host, layout)
        except (OSError, rules.RulesError) as exc:
            print(cli.error_line(PROG, str(exc)), file=sys.stderr)
            status = 1
        else:
            if saved is None:
                print(cli.error_line(PROG, _no_saved("rules", comm.host, layout, path, p, comm.nodes, "--collectives")),
                      file=sys.stderr)
                status = 1
            else:
                status = 0
                text = saved.to_json()
                print(f"{saved.path}:\n{text}", end="")
                if args.json:
                    cli.write_json(args.json, _command(argv, p), {"rules": json.loads(text)}, saved=saved.path,
                                   layout=layout)
        return plain.bcast(status, root=0)
    if p < MIN_RANKS:
        _too_few_ranks(argv)
        return 2
    result, lines = measure_collectives(comm, args.collective, args.sizes, args.iters, args.repeat,
                                        show=not args.quiet)
    status = 0
    if rank == 0:
        print(f"mpicomm.tune --collectives: {p} ranks on {comm.nodes} node(s), up to {comm.ppn} per node "
              f"(layout {layout}), host {result.host}")
        print("\n".join(lines))
        saved_to: str | None = None
        try:
            saved_to = rules.save(result, args.output)
        except OSError as exc:
            print(cli.error_line(PROG, f"could not save the rules: {exc}; set MPICOMM_CACHE_DIR to a writable "
                                       f"directory or use --output"), file=sys.stderr)
            status = 1
        else:
            print(f"\nsaved: {saved_to}")
            if args.output and os.path.abspath(args.output) != rules.path_for(result.host, layout):
                print(f"(communicators load {rules.path_for(result.host, layout)}; copy it there to use it)")
        status = max(status, _save_corrections(comm, result, layout, args.output))
        if args.json:
            cli.write_json(args.json, _command(argv, p), {"rules": json.loads(result.to_json())}, saved=saved_to,
                           layout=layout)
    return plain.bcast(status, root=0)


def _save_corrections(comm: Any, result: rules.Rules, layout: str, out: str | None) -> int:
    """On rank 0: correct the fitted model from the measurements and save it (not with ``--output``); exit status."""
    machine = comm.machine
    if out is not None:
        return 0
    if machine is None:
        print(f"model: no fit saved for this layout, so none corrected; fit it first: {tune_command(comm.Get_size())}; "
              f"then run {tune_command(comm.Get_size(), '--collectives')} again")
        return 0
    factors = model_corrections(result.measurements, machine, comm.Get_size(), config.validate())
    if not factors:
        print("model: no size of 64 KiB or more was measured, so it is not corrected")
        return 0
    try:
        path = model.save(dataclasses.replace(machine, corrections=factors),
                          model.path_for(machine.host, layout))
    except OSError as exc:
        print(cli.error_line(PROG, f"could not save the corrected model: {exc}"), file=sys.stderr)
        return 1
    values = [f for _, _, f in factors]
    print(f"model: corrected {len(factors)} (collective, algorithm) formulas from these measurements (measured / "
          f"predicted {min(values):.2f}-{max(values):.2f}, median of the sizes >= 64 KiB): {path}")
    return 0


def _collective_names(text: str) -> list[str]:
    """``--collective allreduce,bcast`` → those names (``python -m mpicomm.bench`` names or registry names)."""
    from ..bench.metrics import COLLECTIVES, WORLD

    aliases = {spec.registry: name for name, spec in COLLECTIVES.items() if name in WORLD}
    if text.strip() == "all":
        return list(WORLD)
    names = [aliases.get(n.strip(), n.strip()) for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in WORLD]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown collective(s) {', '.join(map(repr, bad)) or '(none)'}; "
                                         f"valid: all, {', '.join(WORLD)} (comma-separated; the neighbourhood "
                                         f"collectives need a topology and keep their default rules)")
    return list(dict.fromkeys(names))


def parser() -> argparse.ArgumentParser:
    """The command line's parser (:func:`main` checks which options go together)."""
    parser = cli.Parser(
        prog=PROG,
        description="Fit the alpha-beta-gamma cost model on this machine and rank layout and save it, or (with "
                    "--collectives) measure every algorithm and save the fastest per size as selection rules "
                    f"(run under mpiexec with at least {MIN_RANKS} ranks; the layout is part of the file's name, so "
                    "tune with the ranks and nodes your programs use).",
        epilog=f"Example: {tune_command(2)}. Saved in $MPICOMM_CACHE_DIR, else "
               "$XDG_CACHE_HOME/mpicomm, else ~/.cache/mpicomm; every mpicomm.Comm with the same host and layout "
               "loads it: the fit for mpicomm.predict and --explain, the rules for algorithm='auto'.",
    )
    parser.add_argument("--sizes", type=cli.sizes_arg, default=None,
                        help="message sizes in bytes: LOW:HIGH (powers of two) or a list, each as 4096, 64K, "
                             "64KiB, 1M or 1e6 (default 8:64M, past the cache, so both regimes are fitted; with "
                             "--collectives 8:16M, in the benchmark's Size: the vector, or one rank's block for "
                             "allgather, alltoall, gather, scatter)")
    parser.add_argument("--iters", type=int, default=None, metavar="N",
                        help="timed iterations per size and per measurement (default: 1000 round trips up to 8 KiB, "
                             "fewer above)")
    cli.add_output(parser, "the fit (with --collectives: the rules)", metavar="PATH",
                   note="default: the cache directory, the only place communicators load it from")
    cli.renamed(parser, "--out", "--output", "the rules file; --out is for Markdown reports")
    parser.add_argument("--show", action="store_true",
                        help="print the fit (with --collectives: the rules) saved for this host and layout, "
                             "measure nothing; values that were not measured are marked [not measured: ...]")
    parser.add_argument("--collectives", action="store_true",
                        help="instead of fitting the model, time every registered algorithm of each collective "
                             "and save the fastest per size range as selection rules, which auto follows "
                             "before the default rules (rules-<host>-<layout>.json next to the fit)")
    parser.add_argument("--collective", type=_collective_names, default=None, metavar="all|NAME,...",
                        help="with --collectives: the collectives to decide (default all: allreduce, bcast, "
                             "reduce, allgather, alltoall, reduce_scatter, gather, scatter, scan, barrier)")
    cli.add_repeat(parser, 3, "each size's measurement (every algorithm, interleaved)", when="with --collectives")
    cli.renamed(parser, "--rounds", "--repeat")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    cli.add_json(parser, "the fit (with --collectives: the rules; with --show: what is saved)")
    return parser


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = parser()
    given = _user_options(argv)
    args = p.parse_args(given)
    cli.at_least(p, args, 1, "--iters", "--repeat")
    repeat_given = any(a == "--repeat" or a.startswith("--repeat=") for a in given)
    if args.show:
        for option, value in (("--sizes", args.sizes), ("--iters", args.iters), ("--output", args.output),
                              ("--force", args.force), ("--repeat", repeat_given), ("--collective", args.collective)):
            if value:
                p.error(f"{option} does not apply to --show, which measures nothing; drop it")
    if not args.collectives:
        for option, value in (("--collective", args.collective), ("--repeat", repeat_given)):
            if value:
                p.error(f"{option} needs --collectives (the fit does not use it); "
                        f"e.g. {tune_command(2, '--collectives', *given)}")
    if not args.show:
        cli.check_out(p, args)
    if args.collectives:
        args.sizes = args.sizes or cli.parse_sizes("8:16M")
        args.collective = args.collective or _collective_names("all")
        return args
    args.sizes = args.sizes or cli.parse_sizes("8:64M")
    if len(set(args.sizes)) < 2:
        p.error(f"--sizes must hold at least two sizes (a line needs two points, e.g. 8:64K); got {args.sizes}")
    return args


def _too_few_ranks(argv: Sequence[str] | None) -> None:
    print(cli.error_line(PROG, f"needs at least {MIN_RANKS} ranks to measure messages: "
                               f"{tune_command(MIN_RANKS, *_user_options(argv))}"), file=sys.stderr)


def _command(argv: Sequence[str] | None, p: int) -> str:
    """This run's command line, for a JSON document."""
    return f"mpiexec -n {p} " + cli.command_line(PROG, _user_options(argv))


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring); returns the exit status."""
    args = cli.parse_or_exit(_parse, argv)
    from mpi4py import MPI

    import mpicomm

    comm = mpicomm.Comm()
    plain = MPI.Intracomm(comm)
    rank, p = plain.Get_rank(), plain.Get_size()
    if args.collectives:
        return _collectives_main(args, comm, argv)
    if args.show:
        ppn = getattr(comm, "ppn", None) or plain.allreduce(comm.local_size, op=MPI.MAX)
        if rank != 0:
            return 0
        layout = model.layout_key(p, comm.nodes, ppn)
        path = model.path_for(comm.host, layout)
        machine = model.load(comm.host, layout)
        if machine is None:
            print(cli.error_line(PROG, _no_saved("fit", comm.host, layout, path, p, comm.nodes)), file=sys.stderr)
            return 1
        print("\n".join([f"{path}:"] + describe(machine)))
        if args.json:
            cli.write_json(args.json, _command(argv, p), {"layout": layout, **machine_json(machine)}, saved=path)
        return 0
    if p < MIN_RANKS:
        _too_few_ranks(argv)
        return 2
    fit = measure(comm, args.sizes, args.iters, show=not args.quiet)
    status = 0
    if rank == 0 and fit.machine is not None:
        print(report(fit))
        saved_to: str | None = None
        try:
            saved_to = model.save(fit.machine, args.output or model.path_for(fit.machine.host, fit.layout))
        except OSError as exc:
            print(cli.error_line(PROG, f"could not save the fit: {exc}; set MPICOMM_CACHE_DIR to a writable directory "
                                       f"or use --output"), file=sys.stderr)
            status = 1
        else:
            print(f"\nsaved: {saved_to}")
            if args.output:
                print(f"(communicators load {model.path_for(fit.machine.host, fit.layout)}; copy it there to use it)")
        if args.json:
            cli.write_json(args.json, _command(argv, p), fit_json(fit), saved=saved_to)
    return plain.bcast(status, root=0)
