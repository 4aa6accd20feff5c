"""``python -m mpicomm info|algorithms|cleanup``: what this installation sees, which algorithms it has, and tidying up.

``info``: the MPI library, CUDA-awareness, GPUs and rank layout. Run it once
after pointing mpi4py at a cluster's MPI, or under the launcher
(``mpiexec -n 4 python -m mpicomm info``) to see every rank's placement.

``algorithms``: every registered (collective, algorithm) with its
restrictions and α-β-γ cost, and the selection table's rules
(``--markdown`` for a table to paste into documents).

``algorithms --explain COLLECTIVE SIZE [--ranks N]``: why ``auto`` picks what
it picks for one call, without starting MPI: each algorithm, whether it may
run (and why not), the model's prediction, the measured time where a
decisions file (``python -m mpicomm.tune --collectives``) has one, and the
choice with its source (decisions, model or table).

``cleanup``: remove this user's MPICH shared-memory segments in /dev/shm
(``mpich_shm_*``, 2-4 MiB each) that no live process maps or holds open:
what jobs ended by Ctrl-C, ``MPI_Abort``, a killed rank or a time limit
leave behind (:mod:`mpicomm.cleanup`). Segments of running jobs are kept.
``--dry-run`` lists what it would remove, with sizes; no mpiexec needed.

``--json FILE`` (every command): the rows printed, as a JSON document
(:func:`mpicomm.cli.document`: ``schema`` ``mpicomm-results``,
``schema_version``, the command, machine, versions and date, then
``results``). ``info``: one row per rank, the installation's facts in
``installation``; ``algorithms``: one row per (collective, algorithm), the
selection table's rules in ``selection``; ``--explain``: one row per
algorithm, the call and the choice in ``call`` and ``choice``; ``cleanup``:
one row per stale segment (``path``, ``bytes``, ``age_s``, ``removed``), the
totals in ``summary``.
"""

from __future__ import annotations

import argparse
import re
import socket
import sys
from dataclasses import replace
from typing import Any

from mpicomm import cli

#: The program name the usage, messages and JSON documents give.
PROG = "python -m mpicomm"


def info(json_path: str | None = None, argv: list[str] | None = None) -> int:
    """Print the installation's facts and every rank's placement (rank 0); *json_path*: also as JSON."""
    import mpi4py

    import mpicomm
    from mpicomm import buffers, config, device
    from mpicomm.launcher import from_environment

    launch = from_environment()  # before MPI starts, as a program would
    from mpi4py import MPI

    comm = mpicomm.Comm()
    rows = comm.gather((comm.rank, comm.local_rank, comm.local_size, comm.node, comm.host, comm.device), root=0)
    if comm.rank != 0:
        return 0
    levels = {MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled",
              MPI.THREAD_SERIALIZED: "serialized", MPI.THREAD_MULTIPLE: "multiple"}
    cupy = device.cupy_module()
    forced = config.cuda_aware_setting()
    lines = [
        f"mpicomm        {mpicomm.__version__}",
        f"mpi4py         {mpi4py.__version__}",
        f"MPI library    {MPI.Get_library_version().splitlines()[0].strip()}",
        f"MPI standard   {'.'.join(map(str, MPI.Get_version()))}, thread level {levels.get(MPI.Query_thread(), '?')}",
        f"CUDA-aware     {buffers.library_cuda_support()} (library)"
        + ("" if forced is None else f", forced {forced} by MPICOMM_CUDA_AWARE"),
        f"CuPy           {cupy.__version__ + f', {device.visible_devices()} GPU(s) visible' if cupy else 'not installed'}",
        f"launcher       {launch.launcher} (rank {launch.rank} of {launch.size} from the environment)",
        f"ranks          {comm.size} on {comm.nodes} node(s)",
        "",
        f"{'rank':>5} {'local':>7} {'node':>5}  {'host':<20} gpu",
    ]
    lines += [f"{r:>5} {lr:>3}/{ls:<3} {node:>5}  {host:<20} {dev}" for r, lr, ls, node, host, dev in rows]
    print("\n".join(lines))
    if json_path:
        installation = {
            "mpicomm": mpicomm.__version__, "mpi4py": mpi4py.__version__,
            "mpi_library": MPI.Get_library_version().splitlines()[0].strip(),
            "mpi_standard": ".".join(map(str, MPI.Get_version())), "thread_level": levels.get(MPI.Query_thread(), "?"),
            "cuda_aware": buffers.library_cuda_support(), "cuda_aware_forced": forced,
            "cupy": cupy.__version__ if cupy else None, "gpus_visible": device.visible_devices() if cupy else 0,
            "launcher": launch.launcher, "ranks": comm.size, "nodes": comm.nodes,
        }
        ranks = [{"rank": r, "local_rank": lr, "local_size": ls, "node": node, "host": host, "gpu": dev}
                 for r, lr, ls, node, host, dev in rows]
        cli.write_json(json_path, _command(argv, comm.size), ranks, installation=installation)
    return 0


def _command(argv: list[str] | None, ranks: int = 1) -> str:
    """This command line for a JSON document (with ``mpiexec -n N`` when it ran on N > 1 ranks)."""
    return ("" if ranks == 1 else f"mpiexec -n {ranks} ") + cli.command_line(PROG, argv)


def algorithm_rows() -> list[tuple[str, str, str, str]]:
    """(collective, algorithm, restrictions, cost) for every registered algorithm, in the catalogue's order."""
    from mpicomm import registry
    from mpicomm.catalogue import COLLECTIVES

    table = registry.table()
    rows = []
    for collective in COLLECTIVES:
        for name, algorithm in sorted(table.get(collective, {}).items()):
            limits = []
            if algorithm.commutative_only:
                limits.append("commutative op")
            if algorithm.power_of_two:
                limits.append("p a power of two")
            if not algorithm.in_place:
                limits.append("copies input when in place")
            if getattr(algorithm, "single_node", False):
                limits.append("one node (shared memory)")
            if getattr(algorithm, "host_only", False):
                limits.append("host memory only")
            if getattr(algorithm, "blocking_only", False):
                limits.append("blocking calls only")
            if getattr(algorithm, "composite", False):
                limits.append("several nodes (node, then leaders)")
            rows.append((collective, name, ", ".join(limits) or "-", algorithm.cost))
    return rows


def algorithm_markdown() -> str:
    """The Markdown table of every algorithm (README.md's copy is this, between its algorithm-table markers)."""
    lines = ["| collective | algorithm | restrictions | cost |", "|---|---|---|---|"]
    lines += [f"| {c} | {n} | {r} | {cost} |" for c, n, r, cost in algorithm_rows()]
    return "\n".join(lines)


#: README.md's algorithm table lies between these lines (``algorithms --readme README.md`` rewrites it).
README_MARKERS = ("<!-- algorithm table: python -m mpicomm algorithms --readme README.md -->",
                  "<!-- end of algorithm table -->")


def update_readme(path: str) -> bool:
    """Rewrite the algorithm table in the Markdown file *path*; True when it changed."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    begin, end = README_MARKERS
    if begin not in text or end not in text:
        raise ValueError(f"{path}: no algorithm table markers ({begin!r} … {end!r}); add them where the table goes")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    new = f"{head}{begin}\n{algorithm_markdown()}\n{end}{tail}"
    if new != text:
        with open(path, "w", encoding="utf-8") as f:
            f.write(new)
    return new != text


def algorithms(markdown: bool = False, json_path: str | None = None, argv: list[str] | None = None) -> int:
    """Print every registered algorithm with its restrictions and cost, and the selection table's rules."""
    from mpicomm import registry
    from mpicomm.catalogue import COLLECTIVES

    rows = algorithm_rows()
    if markdown:
        lines = [algorithm_markdown()]
    else:
        widths = [max(len(str(row[i])) for row in rows) for i in range(3)]
        lines = [f"{c:<{widths[0]}}  {n:<{widths[1]}}  {r:<{widths[2]}}  {cost}" for c, n, r, cost in rows]
    lines.append("")
    lines.append("auto selection (first matching rule; sizes in bytes):")
    for collective in COLLECTIVES:
        rules = registry.SELECTION.get(collective, [])
        text = "; ".join(
            ", ".join(f"{k}={v}" for k, v in rule.items() if k != "algorithm") + f" → {rule['algorithm']}"
            if len(rule) > 1 else f"otherwise → {rule['algorithm']}"
            for rule in rules
        )
        lines.append(f"  {collective}: {text}")
    print("\n".join(lines))
    if json_path:
        results = [{"collective": c, "algorithm": n, "restrictions": [] if r == "-" else r.split(", "), "cost": cost}
                   for c, n, r, cost in rows]
        selection = {c: registry.SELECTION.get(c, []) for c in COLLECTIVES}
        cli.write_json(json_path, _command(argv), results, selection=selection)
    return 0


def _explain_layout(host: str, ranks: int | None) -> tuple[int, int, int]:
    """(p, nodes, ppn) to explain: *ranks* on one node; else the newest decisions file's layout; else 2 on one node."""
    from mpicomm import decisions

    if ranks is not None:
        return ranks, 1, ranks
    for layout in decisions.saved_layouts(host):
        found = re.fullmatch(r"p(\d+)-(\d+)x(\d+)", layout)
        if found:
            p, nodes, ppn = map(int, found.groups())
            return p, nodes, ppn
    return 2, 1, 2


def _tune_advice(p: int, nodes: int) -> str:
    """What writes the decisions of a layout of *p* ranks on *nodes* node(s): a command ``tune`` accepts."""
    from mpicomm.tune import MIN_RANKS, tune_command

    if p < MIN_RANKS:
        return (f"none can exist: python -m mpicomm.tune --collectives needs at least {MIN_RANKS} ranks (a collective "
                f"of one rank moves nothing); explain a layout of {MIN_RANKS} or more with --ranks N")
    where = "" if nodes == 1 else f" (on {nodes} nodes, the ranks spread as in this layout)"
    return f"write them with {tune_command(p, '--collectives')}{where}"


def explain(collective: str, size: int, ranks: int | None = None, json_path: str | None = None,
            argv: list[str] | None = None) -> int:
    """Print why ``auto`` picks its algorithm for *collective* at *size* bytes (see the module docstring)."""
    from mpicomm import decisions, model, registry
    from mpicomm.bench.metrics import COLLECTIVES, layout

    known = registry.table()
    if collective not in known and collective in COLLECTIVES:  # a benchmark name (reduce_scatter_block's)
        collective = COLLECTIVES[collective].registry
    if collective not in known:
        print(f"python -m mpicomm algorithms --explain: unknown collective {collective!r}; known: "
              f"{', '.join(sorted(known))}", file=sys.stderr)
        return 2
    host = socket.gethostname()
    p, nodes, ppn = _explain_layout(host, ranks)
    key = model.layout_key(p, nodes, ppn)
    spec = next((s for s in COLLECTIVES.values() if s.registry == collective), None)
    if spec is not None and spec.name != "barrier":
        count = layout(spec.name, size, p)[0]
        nbytes: int | None = count * 8 * (1 if spec.whole or spec.name in ("gather", "scatter") else p)
        op = "sum" if spec.op else None
    else:
        count, nbytes = (max(1, size // 8), size) if collective != "barrier" else (0, None)
        op = "sum" if collective in ("reduce", "allreduce", "scan", "exscan", "reduce_scatter") else None
    lines = [f"{collective}, size {size} B (as python -m mpicomm.bench and mpicomm.tune --sizes count it; "
             f"selection size {nbytes if nbytes is not None else '-'} B, float64{' sum' if op else ''}), "
             f"p = {p} on {nodes} node(s), "
             f"up to {ppn} per node (layout {key}), host {host}"]
    path = decisions.path_for(host, key)
    try:
        measured = decisions.load_for(host, key, registry.algorithms)
    except (OSError, decisions.DecisionsError) as exc:
        measured = None
        lines.append(f"decisions: ignored: {exc}")
    else:
        lines.append(f"decisions: {path} (measured {measured.measured or '?'})" if measured is not None
                     else f"decisions: none for this layout ({path}; {_tune_advice(p, nodes)})")
    fitted = model.load(host, key, quiet=True)
    machine = fitted if fitted is not None else replace(model.NOMINAL, ppn=ppn, nodes=nodes, host=host)
    lines.append(f"model: fitted {model.path_for(host, key)}" if fitted is not None
                 else f"model: nominal (no fit saved for this layout: {model.path_for(host, key)})")
    facts = {"p": p, "bytes": nbytes, "count": count, "commutative": True, "op": op, "nodes": nodes, "ppn": ppn,
             "device": False, "machine": fitted, "decisions": measured, "blocking": True}
    point = measured.measured_at(collective, nbytes) if measured is not None else None
    at = "" if point is None else f" at {point.get('bytes')} B" if point.get("bytes") != nbytes else ""
    rows = [("algorithm", "allowed", f"model ({cli.US})", f"measured ({cli.US}){at}")]
    table: list[dict[str, Any]] = []
    for name, algorithm in sorted(known[collective].items()):
        why = registry.allowed(algorithm, facts)
        try:
            model_us: float | None = registry.predict(collective, name, nbytes or 0, p, machine) * 1e6
        except (LookupError, ValueError):
            model_us = None
        seconds = (point or {}).get("us", {}).get(name)
        measured_us = float(seconds) if isinstance(seconds, (int, float)) else None
        rows.append((name, "yes" if why is None else f"no: {why}", "-" if model_us is None else f"{model_us:.1f}",
                     "-" if measured_us is None else f"{measured_us:.1f}"))
        table.append({"algorithm": name, "allowed": why is None, "why_not": why, "model_us": model_us,
                      "measured_us": measured_us})
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines.append("")
    call = {"collective": collective, "size": size, "selection_bytes": nbytes, "p": p, "nodes": nodes, "ppn": ppn,
            "layout": key, "host": host, "decisions": path if measured is not None else None,
            "model": model.path_for(host, key) if fitted is not None else "nominal"}
    try:
        table_pick = registry.auto(collective, facts).name
        chosen, source = registry.choose(collective, None, None, facts)
    except ValueError as exc:
        print("\n".join(lines + [f"no algorithm can run: {exc}"]))
        if json_path:
            cli.write_json(json_path, _command(argv), table, call=call, choice={"error": str(exc)})
        return 1
    lines += [f"{'*' if r[0] == chosen.name else ' '} {r[0]:<{widths[0]}}  {r[2]:>{widths[2]}}  "
              f"{r[3]:>{widths[3]}}  {r[1]}" for r in rows]
    lines.append("")
    lines.append(f"table: {table_pick}")
    why = {"decisions": f"measured fastest for this size ({path})", "model": "least predicted time",
           "table": "first matching rule of the static table (no decision covers this size, no fitted model)",
           "environment": f"MPICOMM_{collective.upper()}_ALGORITHM is set"}.get(source, source)
    lines.append(f"auto (*): {chosen.name} (from the {source}: {why})")
    print("\n".join(lines))
    if json_path:
        for row in table:
            row["chosen"] = row["algorithm"] == chosen.name
        cli.write_json(json_path, _command(argv), table, call=call,
                       choice={"algorithm": chosen.name, "source": source, "why": why, "table": table_pick})
    return 0


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def _age(seconds: float) -> str:
    """``42`` → ``"42 s"``, ``600`` → ``"10 min"``, ``20200`` → ``"5.6 h"``, ``200000`` → ``"2.3 d"``."""
    for limit, scale, unit, digits in ((120, 1, "s", 0), (7200, 60, "min", 0), (172800, 3600, "h", 1)):
        if seconds < limit:
            return f"{seconds / scale:.{digits}f} {unit}"
    return f"{seconds / 86400:.1f} d"


def cleanup(dry_run: bool = False, directory: str | None = None, json_path: str | None = None,
            argv: list[str] | None = None) -> int:
    """Remove (or with *dry_run* list) this user's stale MPICH segments; print one line each and a summary.

    Exit status 0 also when nothing was stale; 1 when a segment could not be
    told apart from a live one's (no /proc) or could not be removed.
    """
    from mpicomm import cleanup as shm_cleanup

    where = directory or shm_cleanup.SHM_DIR
    try:
        found = shm_cleanup.stale(where)
    except RuntimeError as exc:
        print(f"{PROG} cleanup: {exc}", file=sys.stderr)
        return 1
    kept = len(shm_cleanup.segments(where)) - len(found)
    try:
        removed = [] if dry_run else shm_cleanup.remove(found)
    except OSError as exc:
        print(f"{PROG} cleanup: cannot remove a segment: {exc}; check the permissions of {where}",
              file=sys.stderr)
        return 1
    done = {s.path for s in removed}
    for s in found:
        verb = "would remove" if dry_run else ("removed" if s.path in done else "gone meanwhile")
        print(f"{verb:<14} {s.path}  {_mib(s.bytes):>9}  {_age(s.age):>7} old")
    total = sum(s.bytes for s in (found if dry_run else removed))
    count = len(found) if dry_run else len(removed)
    print(f"{'would remove' if dry_run else 'removed'} {count} stale MPICH segment(s), {_mib(total)}, in {where}; "
          f"kept {kept} in use by live processes")
    if json_path:
        rows = [{"path": s.path, "bytes": s.bytes, "age_s": round(s.age, 3), "removed": s.path in done}
                for s in found]
        summary = {"directory": where, "dry_run": dry_run, "stale": len(found), "removed": len(removed),
                   "bytes": total, "kept_in_use": kept}
        cli.write_json(json_path, _command(argv), rows, summary=summary)
    return 0


COMMANDS = {"info": info, "algorithms": algorithms, "cleanup": cleanup}


def _version() -> str:
    import mpicomm

    return mpicomm.__version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"mpicomm {_version()}")
    parser.add_argument("command", choices=sorted(COMMANDS),
                        help="info: the MPI library, GPUs and rank layout; algorithms: every algorithm and its cost; "
                             "cleanup: remove this user's MPICH shared-memory segments in /dev/shm (mpich_shm_*) "
                             "that no live process maps or holds open - what jobs ended by Ctrl-C, MPI_Abort, a "
                             "kill or a time limit leave behind (2-4 MiB each); segments of running jobs are kept")
    parser.add_argument("--markdown", action="store_true", help="algorithms: print a Markdown table")
    parser.add_argument("--readme", metavar="FILE.md",
                        help="algorithms: rewrite the algorithm table between its markers in FILE.md (README.md)")
    parser.add_argument("--explain", nargs=2, metavar=("COLLECTIVE", "SIZE"),
                        help="algorithms: why auto picks its algorithm for COLLECTIVE at SIZE bytes (1M, 64K, 8; "
                             "the benchmark's Size): each algorithm allowed or why not, predicted and measured "
                             "times, the choice and its source (decisions, model, table); no mpiexec needed")
    parser.add_argument("--ranks", type=int, metavar="N",
                        help="with --explain: N ranks on one node (default: the layout of this host's newest "
                             "decisions file, else 2)")
    parser.add_argument("--dry-run", action="store_true",
                        help="cleanup: list the stale segments with their sizes and ages, remove nothing")
    parser.add_argument("--dir", metavar="DIR", default=None,
                        help="cleanup: where the segments live (default: /dev/shm)")
    cli.add_json(parser, "the rows printed")
    args = parser.parse_args(argv)
    if (args.dry_run or args.dir) and args.command != "cleanup":
        parser.error("--dry-run and --dir go with the cleanup command: python -m mpicomm cleanup --dry-run")
    if args.command == "cleanup":
        if args.markdown or args.readme or args.explain or args.ranks is not None:
            parser.error("cleanup takes --dry-run, --dir and --json only")
        return cleanup(args.dry_run, args.dir, args.json, argv)
    if args.ranks is not None and args.ranks < 1:
        parser.error(f"--ranks {args.ranks}: must be >= 1")
    if (args.explain or args.ranks is not None) and args.command != "algorithms":
        parser.error("--explain and --ranks go with the algorithms command: python -m mpicomm algorithms "
                     "--explain allreduce 1M")
    if args.ranks is not None and not args.explain:
        parser.error("--ranks needs --explain COLLECTIVE SIZE")
    if args.command == "algorithms" and args.explain:
        collective, text = args.explain
        if "," in text or ":" in text:
            parser.error(f"--explain takes one size, not {text!r} (e.g. 1M)")
        try:
            size = cli.parse_size(text, f"--explain {collective} SIZE")
        except ValueError as exc:
            reason = str(exc) if "not a size" not in str(exc) else (
                f"--explain {collective} {text}: {text!r} is not a size; write bytes as 4096, 64K, 64KiB, 1M, "
                f"1.5G or 1e6")
            parser.error(reason)
        return explain(collective, size, args.ranks, args.json, argv)
    if args.readme and args.command != "algorithms":
        parser.error("--readme goes with the algorithms command: python -m mpicomm algorithms --readme README.md")
    if args.command == "algorithms" and args.readme:
        try:
            changed = update_readme(args.readme)
        except (OSError, ValueError) as exc:
            parser.error(str(exc))
        print(f"{args.readme}: algorithm table {'rewritten' if changed else 'already current'}")
        return 0
    if args.command == "algorithms":
        return algorithms(args.markdown, args.json, argv)
    return info(args.json, argv)


if __name__ == "__main__":
    sys.exit(main())
