"""``python -m mpicomm info|algorithms|verify|cleanup``: what this installation sees, its algorithms, checking one, tidying up.

``info``: the MPI library, its thread level, CUDA-awareness, GPUs and rank
layout; then, as a doctor (:mod:`mpicomm.doctor`), the optional packages
present and what each enables, the ``MPICOMM_*`` variables set, and stale
MPICH segments in /dev/shm. Run it once after installing or after pointing
mpi4py at a cluster's MPI, or under the launcher
(``mpiexec -n 4 python -m mpicomm info``) to see every rank's placement.

``algorithms``: every registered (collective, algorithm) with its
restrictions and α-β-γ cost, and the selection table's rules
(``--markdown`` for a table to paste into documents).

``algorithms --explain COLLECTIVE SIZE [--ranks N]``: why ``auto`` picks what
it picks for one call, without starting MPI: each algorithm, whether it may
run (and why not), the model's prediction, the measured time where a
rules file (``python -m mpicomm.tune --collectives``) has one, and the
choice with its source: the measured rules, the default rules (the table), or
an ``MPICOMM_<COLLECTIVE>_ALGORITHM`` setting. The model's prediction is shown
beside each algorithm; it informs, it does not choose.

``algorithms --schedule COLLECTIVE ALGORITHM -p P [--count N] [--counts a,b,...]
[--rank R] [--root R] [--nodes K] [--dtype T] [--plot FILE.png]``: what the
algorithm does on every rank (or rank R) of one call, without MPI - its
rounds of sends and receives, then copies and combines, counter waits and
nested calls (:func:`mpicomm.schedule.describe` of
:func:`mpicomm.plan.preview.schedules_for`) - and the pair check
(:func:`mpicomm.schedule.check_pairs`): every message must meet a receive of
the same size on its peer, in order; exit 1 where one does not. ``--plot``
draws a space-time diagram (:func:`draw_schedules`); ``--schedule-file FILE``
writes every rank's schedule as a schedule file (:mod:`mpicomm.schedule_file`),
which ``mpicomm.register_schedule_file`` registers as an algorithm.

``verify COLLECTIVE ALGORITHM -p 2..7 [--quick] [--timeout S]``: the algorithm
against the MPI library's own collective at each p (a range 2..7, a list
2,3,5 or one), in MPI jobs this command starts (:mod:`mpicomm.verify`): counts
0, 1, p−1, p+1 and 10⁵ (not with ``--quick``), int64 and float64 sums and a
non-commutative op, every root, in place, blocking, nonblocking and
persistent, and the pair check of its schedules. One line per p, a summary;
exit 1 on any failure.

``--module PKG.MOD[,PKG.MOD2]`` (algorithms, verify): import modules of user
algorithms first (``mpicomm.register_algorithm``) and pass them on to every
job started, through ``MPICOMM_ALGORITHM_MODULES`` (see
``docs/examples/torus_allreduce.py``).

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
totals in ``summary``; ``--schedule``: one row per rank printed (its lines and
its rounds as data), the call in ``call``, the pair check in ``pairs``;
``verify``: one row per p, the totals in ``summary``. ``--out FILE.md``
(``--schedule``, ``verify``): the lines printed as a Markdown report (an
existing file is kept unless ``--append`` or ``--force``).
"""

from __future__ import annotations

import argparse
import re
import socket
import sys
import textwrap
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from mpicomm import cli

#: The program name the usage, messages and JSON documents give.
PROG = "python -m mpicomm"


def info(json_path: str | None = None, argv: list[str] | None = None) -> int:
    """Print the installation's facts and every rank's placement (rank 0); *json_path*: also as JSON."""
    import mpi4py

    import mpicomm
    from mpicomm import config, device, doctor
    from mpicomm.engine import lane
    from mpicomm.launcher import from_environment
    from mpicomm.transport import buffers

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
        f"compiled lane  {'built, bound to the MPI library' if lane.available() else 'off: ' + lane.why_not}",
        f"launcher       {launch.launcher} (rank {launch.rank} of {launch.size} from the environment)",
        f"ranks          {comm.size} on {comm.nodes} node(s)",
        "",
        f"{'rank':>5} {'local':>7} {'node':>5}  {'host':<20} gpu",
    ]
    lines += [f"{r:>5} {lr:>3}/{ls:<3} {node:>5}  {host:<20} {dev}" for r, lr, ls, node, host, dev in rows]
    found, variables, stale = doctor.packages(), doctor.settings(), doctor.stale_segments()
    lines += ["", *doctor.report(found, variables, stale)]
    print("\n".join(lines))
    if json_path:
        installation = {
            "mpicomm": mpicomm.__version__, "mpi4py": mpi4py.__version__,
            "mpi_library": MPI.Get_library_version().splitlines()[0].strip(),
            "mpi_standard": ".".join(map(str, MPI.Get_version())), "thread_level": levels.get(MPI.Query_thread(), "?"),
            "cuda_aware": buffers.library_cuda_support(), "cuda_aware_forced": forced,
            "cupy": cupy.__version__ if cupy else None, "gpus_visible": device.visible_devices() if cupy else 0,
            "compiled_lane": lane.available(), "compiled_lane_off": lane.why_not or None,
            "launcher": launch.launcher, "ranks": comm.size, "nodes": comm.nodes,
            "optional": {package.name: version for package, version in found}, "settings": variables,
            "stale_segments": None if stale is None else {"count": len(stale), "bytes": sum(s.bytes for s in stale)},
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
                limits.append("node, then leaders (one node: the node level alone)")
            rows.append((collective, name, ", ".join(limits) or "-", algorithm.cost))
    return rows


def algorithm_markdown() -> str:
    """The Markdown table of every algorithm (``--markdown``; the documentation builds its table from the same rows)."""
    lines = ["| collective | algorithm | restrictions | cost |", "|---|---|---|---|"]
    lines += [f"| {c} | {n} | {r} | {cost} |" for c, n, r, cost in algorithm_rows()]
    return "\n".join(lines)


def algorithms(markdown: bool = False, json_path: str | None = None, argv: list[str] | None = None) -> int:
    """Print every registered algorithm with its restrictions and cost, and the selection table's rules."""
    from mpicomm import selection
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
        rules = selection.SELECTION.get(collective, [])
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
        default = {c: selection.SELECTION.get(c, []) for c in COLLECTIVES}
        cli.write_json(json_path, _command(argv), results, selection=default)
    return 0


def _explain_layout(host: str, ranks: int | None) -> tuple[int, int, int]:
    """(p, nodes, ppn) to explain: *ranks* on one node; else the layout of this host's newest measured rules; else
    2 on one node."""
    from mpicomm import rules

    if ranks is not None:
        return ranks, 1, ranks
    for layout in rules.saved_layouts(host):
        found = re.fullmatch(r"p(\d+)-(\d+)x(\d+)", layout)
        if found:
            p, nodes, ppn = map(int, found.groups())
            return p, nodes, ppn
    return 2, 1, 2


def _tune_advice(p: int, nodes: int) -> str:
    """What writes the measured rules of a layout of *p* ranks on *nodes* node(s): a command ``tune`` accepts."""
    from mpicomm.tune import MIN_RANKS, tune_command

    if p < MIN_RANKS:
        return (f"none can exist: python -m mpicomm.tune --collectives needs at least {MIN_RANKS} ranks (a collective "
                f"of one rank moves nothing); explain a layout of {MIN_RANKS} or more with --ranks N")
    where = "" if nodes == 1 else f" (on {nodes} nodes, the ranks spread as in this layout)"
    return f"write them with {tune_command(p, '--collectives')}{where}"


def explain(collective: str, size: int, ranks: int | None = None, json_path: str | None = None,
            argv: list[str] | None = None) -> int:
    """Print why ``auto`` picks its algorithm for *collective* at *size* bytes (see the module docstring): each
    algorithm allowed or why not, the model's prediction, the measured time where the measured rules have one,
    and the rule that chose."""
    from mpicomm import model, registry, rules, selection
    from mpicomm.bench.metrics import COLLECTIVES, layout, model_bytes
    from mpicomm.facts import Facts

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
        nbytes: int | None = None if spec.neighbors else model_bytes(spec.name, count, 8, p)  # (neighbours: no size)
        op = "sum" if spec.op else None
    else:
        count, nbytes = (max(1, size // 8), size) if collective != "barrier" else (0, None)
        op = "sum" if collective in ("reduce", "allreduce", "scan", "exscan", "reduce_scatter") else None
    lines = [f"{collective}, size {size} B (as python -m mpicomm.bench and mpicomm.tune --sizes count it; "
             f"selection size {nbytes if nbytes is not None else '-'} B, float64{' sum' if op else ''}), "
             f"p = {p} on {nodes} node(s), "
             f"up to {ppn} per node (layout {key}), host {host}"]
    path = rules.path_for(host, key)
    try:
        measured = rules.load_for(host, key, registry.algorithms)
    except (OSError, rules.RulesError) as exc:
        measured = None
        lines.append(f"measured rules: ignored: {exc}")
    else:
        lines.append(f"measured rules: {measured.path} (measured {measured.measured or '?'})" if measured is not None
                     else f"measured rules: none for this layout ({path}; {_tune_advice(p, nodes)})")
    lines.append(f"default rules: {selection.DEFAULT.path or 'built in'}")
    fitted = model.load(host, key, quiet=True)
    machine = fitted if fitted is not None else replace(model.NOMINAL, ppn=ppn, nodes=nodes, host=host)
    lines.append((f"model: fitted {model.path_for(host, key)}" if fitted is not None
                  else f"model: nominal (no fit saved for this layout: {model.path_for(host, key)})")
                 + "; it predicts, the rules choose")
    facts = Facts(p=p, bytes=nbytes, count=count, op=op, nodes=nodes, ppn=ppn, rules=measured, blocking=True)
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
            "layout": key, "host": host, "rules": measured.path if measured is not None else None,
            "default_rules": selection.DEFAULT.path or None,
            "model": model.path_for(host, key) if fitted is not None else "nominal"}
    try:
        table_pick, _, table_rule = selection.auto_rule(collective, replace(facts, rules=None))
        picked, _, rule = selection.auto_rule(collective, facts)
        chosen, source = selection.choose(collective, None, None, facts)
    except ValueError as exc:
        print("\n".join(lines + [f"no algorithm can run: {exc}"]))
        if json_path:
            cli.write_json(json_path, _command(argv), table, call=call, choice={"error": str(exc)})
        return 1
    lines += [f"{'*' if r[0] == chosen.name else ' '} {r[0]:<{widths[0]}}  {r[2]:>{widths[2]}}  "
              f"{r[3]:>{widths[3]}}  {r[1]}" for r in rows]
    lines.append("")
    lines.append(f"table: {table_pick.name} ({table_rule})")
    if source in ("rules", "table"):
        why = rule
    elif source == "environment":
        why = f"MPICOMM_{collective.upper()}_ALGORITHM is set; without it auto would pick {picked.name} ({rule})"
        rule = ""
    else:
        why, rule = source, ""
    lines.append(f"auto (*): {chosen.name} (from the {source}: {why})")
    print("\n".join(lines))
    if json_path:
        for row in table:
            row["chosen"] = row["algorithm"] == chosen.name
        cli.write_json(json_path, _command(argv), table, call=call,
                       choice={"algorithm": chosen.name, "source": source, "why": why, "rule": rule or None,
                               "table": table_pick.name})
    return 0


# ---------------------------------------------------------------- algorithms --schedule (mpicomm.plan.preview)


def _round_row(s: Any, index: int, r: Any) -> dict[str, Any]:
    """One round of a schedule as plain data (the ``--json`` document of ``--schedule``)."""

    def message(peer: int, v: Any) -> dict[str, Any]:
        return {"peer": peer, "buffer": repr(v).split("[")[0], "start": v.start, "stop": v.stop,
                "bytes": v.size * s.buffers[v.buf][1].itemsize}

    return {"round": index, "pre": [str(x) for x in r.pre], "recvs": [message(peer, v) for peer, v in r.recvs],
            "sends": [message(peer, v) for peer, v in r.sends], "waits": [str(x) for x in r.syncs],
            "nested": [str(x) for x in r.nested], "library": [str(x) for x in r.library],
            "ops": [str(x) for x in r.ops]}


def _pair_line(scheds: list[Any], problems: list[str]) -> list[str]:
    """The pair check's lines: every message meets its receive, or what does not."""
    from mpicomm.schedule import message_count

    messages = sum(message_count(s)[0] for s in scheds)
    unchecked = []
    if any(r.syncs for s in scheds for r in s.rounds):
        unchecked.append("counter waits in shared memory")
    if any(r.nested for s in scheds for r in s.rounds):
        unchecked.append("nested calls (checked as calls of their own)")
    if any(r.library for s in scheds for r in s.rounds):
        unchecked.append("the MPI library's own requests")
    if any(s.then is not None for s in scheds):
        unchecked.append("rounds built at run time")
    note = f"; not checked: {', '.join(unchecked)}" if unchecked else ""
    if not problems:
        return [f"pair check: ok - each of the {messages} message(s) meets a receive of the same size on its peer, "
                f"in order{note}" if messages else f"pair check: ok - no messages between ranks{note}"]
    return [f"pair check: FAILED - {len(problems)} problem(s){note}:"] + [f"  {problem}" for problem in problems]


def schedule(collective: str, algorithm: str, p: int, *, count: int = 8, counts: list[int] | None = None,
             rank: int | None = None, root: int = 0, nodes: int = 1, dtype: str = "float64",
             json_path: str | None = None, plot: str | None = None, out: str | None = None, append: bool = False,
             schedule_file: str | None = None, argv: list[str] | None = None) -> int:
    """Print every rank's schedule of *algorithm* (or rank *rank*'s) and the pair check; 1 when messages do
    not meet, 2 when the algorithm refuses the call (its schedule function raised ValueError) or its schedules
    cannot be written to *schedule_file* (:func:`mpicomm.schedule_file.to_json`)."""
    from mpicomm import schedule_file as files
    from mpicomm.catalogue import CATALOGUE
    from mpicomm.plan.preview import Layout, schedules_for
    from mpicomm.schedule import check_pairs, describe, message_count

    try:
        scheds = schedules_for(collective, algorithm, p, count, root=root, counts=counts, dtype=dtype,
                               layout=Layout.even(p, nodes))
    except ValueError as exc:
        print(f"{PROG} algorithms --schedule: {collective}/{algorithm} cannot describe this call: {exc}",
              file=sys.stderr)
        return 2
    text = None
    if schedule_file:
        try:
            text = files.to_json(scheds)
        except ValueError as exc:
            print(f"{PROG} algorithms --schedule-file: {exc}", file=sys.stderr)
            return 2
    problems = check_pairs(scheds)
    what = (f"counts {','.join(map(str, counts))}" if counts is not None else f"count {count}") + f" x {dtype}"
    head = (f"{collective} ({algorithm}): p = {p} on {nodes} node(s), {what}"
            + (f", root {root}" if CATALOGUE[collective].rooted else ""))
    lines = [head, ""]
    shown = scheds if rank is None else [scheds[rank]]
    for s in shown:
        lines += describe(s) + [""]
    lines += _pair_line(scheds, problems)
    print("\n".join(lines))
    if plot:
        draw_schedules(plot, scheds, head, problems)
    if json_path:
        rows = [{"rank": s.rank, "lines": describe(s), "messages": message_count(s)[0],
                 "rounds_communicating": message_count(s)[1], "scratch_bytes": s.scratch_bytes(), "gated": s.gated,
                 "built_at_run_time": s.then is not None,
                 "rounds": [_round_row(s, i, r) for i, r in enumerate(s.rounds)]} for s in shown]
        call = {"collective": collective, "algorithm": algorithm, "p": p, "count": count, "counts": counts,
                "root": root, "nodes": nodes, "dtype": dtype, "rank": rank}
        cli.write_json(json_path, _command(argv), rows, call=call,
                       pairs={"ok": not problems, "problems": problems,
                              "messages": sum(message_count(s)[0] for s in scheds)})
    if out:
        from mpicomm.verify import markdown_report

        markdown_report(out, append, f"schedule of {collective}/{algorithm}, p = {p}", _command(argv), lines,
                        plot)
    if schedule_file and text is not None:
        cli.write_out(schedule_file, text)
    return 1 if problems else 0


def _matched(scheds: list[Any]) -> tuple[list[tuple[int, int, int, int, int]], list[tuple[int, int, int, bool]]]:
    """Messages matched in order per pair of ranks, as MPI matches them: ``(sender, its round, receiver, its
    round, bytes)``; and the unmatched ones: ``(rank, round, peer, is a send)``."""
    sends: dict[tuple[int, int], list[tuple[int, int]]] = {}
    recvs: dict[tuple[int, int], list[int]] = {}
    for s in scheds:
        for k, r in enumerate(s.rounds):
            for peer, v in r.sends:
                sends.setdefault((s.rank, peer), []).append((k, v.size * s.buffers[v.buf][1].itemsize))
            for peer, _ in r.recvs:
                recvs.setdefault((peer, s.rank), []).append(k)
    matched, unmatched = [], []
    for (a, b) in sorted(set(sends) | set(recvs)):
        out, into = sends.get((a, b), []), recvs.get((a, b), [])
        for (ka, nbytes), kb in zip(out, into):
            matched.append((a, ka, b, kb, nbytes))
        unmatched += [(a, ka, b, True) for ka, _ in out[len(into):]]
        unmatched += [(b, kb, a, False) for kb in into[len(out):]]
    return matched, unmatched


def timeline(scheds: list[Any]) -> list[list[int]]:
    """The step at which each rank's rounds are drawn: one after the rank's previous round, and no earlier than
    the rounds that send what it receives (so every message goes forward in time, or straight down)."""
    matched, _ = _matched(scheds)
    waits: list[list[list[tuple[int, int]]]] = [[[] for _ in s.rounds] for s in scheds]
    for a, ka, b, kb, _ in matched:
        if 0 <= b < len(scheds):
            waits[b][kb].append((a, ka))
    t = [list(range(len(s.rounds))) for s in scheds]
    for _ in range(sum(len(s.rounds) for s in scheds) + 1):  # a fixed point (or as far as a broken schedule allows)
        changed = False
        for r, rounds in enumerate(waits):
            for k, deps in enumerate(rounds):
                want = max([t[r][k - 1] + 1 if k else 0] + [t[a][ka] for a, ka in deps if a < len(t)])
                if want != t[r][k]:
                    t[r][k], changed = want, True
        if not changed:
            break
    return t


_ARRIVE = 0.45  # where in its step a round's messages have arrived (they leave at its start)

#: Colours of the space-time diagram.
_COLOURS = {"message": "tab:blue", "copy": "0.6", "combine": "tab:orange", "local": "tab:purple",
            "wait": "tab:red", "nested": "lightsteelblue", "library": "khaki", "unmatched": "crimson"}


def draw_schedules(path: str, scheds: list[Any], title: str, problems: list[str] | None = None) -> None:
    """:func:`schedule_figure` written to *path* (PNG, SVG, PDF: by the extension), cropped to what it draws."""
    fig = schedule_figure(scheds, title, problems)
    fig.savefig(path, dpi=120, bbox_inches="tight")  # (tight: a label or the legend below is never cut off)
    cli.pyplot().close(fig)


def schedule_figure(scheds: list[Any], title: str, problems: list[str] | None = None) -> Any:
    """A space-time diagram of one call's schedules (a matplotlib figure).

    One lane per rank, steps along x (:func:`timeline`); a round is a black bar
    from posting its messages to their completion; an arrow per message from
    the start of the sender's round to the end of the receiver's, labelled
    with its size; after a round, a box for its local work (copies grey, combines orange, named local
    steps purple); a red diamond for a wait on shared-memory counters; a
    hatched box for a nested call (its collective and communicator size) or a
    request of the MPI library's own; red stubs for messages that do not meet.
    """
    from matplotlib.lines import Line2D
    from matplotlib.patches import FancyArrowPatch, Patch, Rectangle

    from mpicomm.schedule import Combine, Copy

    plt = cli.pyplot()
    p = len(scheds)
    t = timeline(scheds)
    steps = max((x + 1 for row in t for x in row), default=1)
    fig, ax = plt.subplots(figsize=(min(40.0, max(6.0, 1.2 * steps + 2.5)), max(2.6, 0.75 * p + 1.6)))
    for r in range(p):
        ax.axhline(r, color="0.85", lw=1, zorder=0)
    seen: set[str] = set()
    for s in scheds:
        r = s.rank
        for k, rd in enumerate(s.rounds):
            x = t[r][k]
            if rd.sends or rd.recvs:
                ax.plot([x, x + _ARRIVE], [r, r], "-", color="black", lw=2.2, solid_capstyle="butt", zorder=3)
            for when, ops in ((-0.45, rd.pre), (_ARRIVE + 0.05, rd.ops)):
                if not ops:
                    continue
                kinds = {"combine" if type(op) is Combine else "copy" if type(op) is Copy else "local" for op in ops}
                kind = next(k for k in ("combine", "local", "copy") if k in kinds)
                seen.add(kind)
                ax.add_patch(Rectangle((x + when, r - 0.14), 0.4, 0.28, facecolor=_COLOURS[kind],
                                       edgecolor="0.3", lw=0.5, zorder=2))
                if len(ops) > 1:
                    ax.text(x + when + 0.2, r, str(len(ops)), ha="center", va="center", fontsize=6, zorder=4)
            if rd.syncs:
                seen.add("wait")
                ax.plot([x], [r], "D", color=_COLOURS["wait"], ms=6, zorder=4)
                counters = sorted({sync.name or f"counter {sync.word}" for sync in rd.syncs})
                ax.text(x, r - 0.2, "wait " + ", ".join(counters), ha="center", va="bottom", fontsize=6,
                        color=_COLOURS["wait"])
            for call, items in (("nested", rd.nested), ("library", rd.library)):
                for item in items:
                    seen.add(call)
                    ax.add_patch(Rectangle((x - 0.1, r - 0.3), _ARRIVE + 0.2, 0.6, facecolor=_COLOURS[call],
                                           hatch="//", edgecolor="0.3", lw=0.6, zorder=2))
                    text = (f"{item.collective}\n{getattr(item.comm, 'size', '?')} ranks" if call == "nested"
                            else "library")
                    ax.text(x + _ARRIVE / 2, r, text, ha="center", va="center", fontsize=6, zorder=4)
    matched, unmatched = _matched(scheds)
    label = len(matched) <= 200
    for a, ka, b, kb, nbytes in matched:
        if not (0 <= b < p):
            continue
        seen.add("message")
        start, end = (t[a][ka], a), (t[b][kb] + _ARRIVE, b)
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=9, lw=0.8,
                                     color=_COLOURS["message"], zorder=3, shrinkA=1, shrinkB=1))
        if label:
            at = 0.3 if abs(b - a) == 1 else 0.3 / abs(b - a)  # near the sender, where arrows do not cross yet
            ax.text(start[0] + at * (end[0] - start[0]) + 0.03, a + at * (b - a), cli.format_size(nbytes),
                    fontsize=6, color=_COLOURS["message"], ha="left", va="center",
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.3, "alpha": 0.8}, zorder=4)
    for r, k, peer, is_send in unmatched:
        seen.add("unmatched")
        x = t[r][k]
        dy = 0.35 if peer > r else -0.35
        ax.annotate("", xy=(x + (0.35 if is_send else -0.35), r + dy), xytext=(x if is_send else x + _ARRIVE, r),
                    arrowprops={"arrowstyle": "-|>" if is_send else "<|-", "color": _COLOURS["unmatched"]})
        ax.text(x, r + dy, f"{'to' if is_send else 'from'} {peer}?", fontsize=6, color=_COLOURS["unmatched"])
    ax.set_yticks(range(p))
    ax.set_yticklabels([f"rank {r}" for r in range(p)])
    ax.set_ylim(p - 0.4, -0.6)
    ax.set_xlim(-0.6, steps + 0.1)
    # Wrapped to the figure's width (about 12 characters an inch at 10 points): a narrow figure (few steps) cut
    # the one-line label at both ends.
    ax.set_xlabel(textwrap.fill("step: a round posts its messages (black bar), they arrive by its end, then its local "
                                "work runs", max(30, int(fig.get_figwidth() * 12))))
    status = "" if problems is None else (" - pair check ok" if not problems else f" - {len(problems)} pair problem(s)")
    ax.set_title(title + status, fontsize=9, color="crimson" if problems else "black")
    names = {"message": "message (size)", "copy": "copy", "combine": "combine", "local": "local step",
             "wait": "counter wait", "nested": "nested call", "library": "library request",
             "unmatched": "unmatched message"}
    handles = [Line2D([], [], color=_COLOURS[k], lw=1.2, label=names[k]) if k in ("message", "unmatched")
               else Line2D([], [], marker="D", ls="", color=_COLOURS[k], label=names[k]) if k == "wait"
               else Patch(facecolor=_COLOURS[k], edgecolor="0.3", hatch="//" if k in ("nested", "library") else None,
                          label=names[k]) for k in names if k in seen]
    if handles:
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=min(4, len(handles)),
                  fontsize=7, frameon=False)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- verify (mpicomm.verify)


def verify(collective: str, algorithm: str, ps: list[int], *, quick: bool = False, modules: str | None = None,
           timeout: float | None = None, json_path: str | None = None, out: str | None = None,
           append: bool = False, argv: list[str] | None = None) -> int:
    """Check *algorithm* against the MPI library's collective at each p of *ps* (:func:`mpicomm.verify.verify`)."""
    from mpicomm import verify as checker

    return checker.verify(collective, algorithm, ps, quick=quick, modules=modules,
                          timeout=timeout or checker.DEFAULT_TIMEOUT, json_path=json_path, out=out, append=append,
                          command=_command(argv))


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


COMMANDS = {"info": info, "algorithms": algorithms, "cleanup": cleanup, "verify": verify}


#: Options of one mode only: (option, attribute, where it goes) - a usage error anywhere else.
_SCHEDULE_ONLY = (("--count", "count"), ("--counts", "counts"), ("--rank", "rank"), ("--root", "root"),
                  ("--nodes", "nodes"), ("--dtype", "dtype"), ("--plot", "plot"),
                  ("--schedule-file", "schedule_file"))
_VERIFY_ONLY = (("--quick", "quick"), ("--timeout", "timeout"))


def _given(args: argparse.Namespace, attribute: str) -> bool:
    value = getattr(args, attribute)
    return value not in (None, False)


def _use_modules(parser: argparse.ArgumentParser, text: str) -> str:
    """Import the user algorithm modules of ``--module`` and pass them on (``MPICOMM_ALGORITHM_MODULES``)."""
    import os

    from mpicomm import registry

    try:
        registry.import_modules(text, "--module")
    except (ImportError, ValueError, TypeError) as exc:
        parser.error(str(exc))
    names = registry.module_names(os.environ.get(registry.MODULES_VARIABLE, "")) + registry.module_names(text)
    value = ",".join(dict.fromkeys(names))
    os.environ[registry.MODULES_VARIABLE] = value  # every job these commands start imports them too
    return value


def _algorithm(parser: argparse.ArgumentParser, what: str, collective: str, algorithm: str) -> None:
    """A usage error naming the known collectives or algorithms, unless *collective*/*algorithm* is registered."""
    from mpicomm import registry

    try:
        registry.lookup(collective, algorithm)
    except (ValueError, ImportError) as exc:
        parser.error(f"{what} {collective} {algorithm}: {exc}")


def _schedule_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """The checked keyword arguments of :func:`schedule` (usage errors for anything out of range)."""
    import numpy as np

    from mpicomm.catalogue import CATALOGUE

    collective, algorithm = args.schedule
    _algorithm(parser, "--schedule", collective, algorithm)
    spec = CATALOGUE[collective]
    if args.p is None:
        parser.error(f"--schedule needs -p P, the number of ranks: {PROG} algorithms --schedule {collective} "
                     f"{algorithm} -p 4")
    try:
        p = int(args.p)
    except ValueError:
        parser.error(f"-p {args.p}: --schedule takes one number of ranks (e.g. -p 4)")
    if p < 1:
        parser.error(f"-p {p}: must be >= 1")
    try:
        count = cli.parse_size(args.count if args.count is not None else 8, "--count", minimum=0)
    except ValueError as exc:
        parser.error(str(exc))
    counts = None
    if args.counts is not None:
        if not spec.vector:
            vforms = ", ".join(c.name for c in CATALOGUE.values() if c.vector)
            parser.error(f"--counts gives per-rank counts, which only the v-forms take ({vforms}); {collective} "
                         f"takes --count N")
        try:
            counts = [int(c) for c in args.counts.split(",")]
        except ValueError:
            parser.error(f"--counts {args.counts}: not a list of element counts (write e.g. 3,0,5,1)")
        if any(c < 0 for c in counts):
            parser.error(f"--counts {args.counts}: counts must be >= 0")
        if len(counts) != p:
            parser.error(f"--counts {args.counts}: {len(counts)} count(s) for p = {p} ranks; give one per rank")
    for option, value in (("--rank", args.rank), ("--root", args.root)):
        if value is not None and not 0 <= value < p:
            parser.error(f"{option} {value}: must be a rank 0..{p - 1} of p = {p}")
    if args.root is not None and not spec.rooted:
        parser.error(f"--root: {collective} has no root")
    nodes = 1 if args.nodes is None else args.nodes
    if not 1 <= nodes <= p:
        parser.error(f"--nodes {nodes}: must be 1..p (= {p})")
    try:
        dtype = np.dtype(args.dtype or "float64")
    except TypeError:
        parser.error(f"--dtype {args.dtype}: not a NumPy element type (e.g. float64, float32, int64, complex128)")
    if args.plot:
        try:
            cli.pyplot()
        except ValueError as exc:
            parser.error(f"--plot: {exc}")
    return {"collective": collective, "algorithm": algorithm, "p": p, "count": count, "counts": counts,
            "rank": args.rank, "root": args.root or 0, "nodes": nodes, "dtype": str(dtype)}


def main(argv: list[str] | None = None) -> int:
    work = cli.parse_or_exit(_parse, argv)
    return int(work())


def _parse(argv: list[str] | None) -> Callable[[], int]:
    """The checked command line, as the work it asks for (usage errors exit with status 2 before any work)."""
    parser = cli.Parser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=sorted(COMMANDS),
                        help="info: the MPI library, GPUs and rank layout; algorithms: every algorithm and its cost "
                             "(--explain: why auto picks one; --schedule: what one does on every rank); verify: "
                             "one algorithm against the MPI library's own collective at several p; "
                             "cleanup: remove this user's MPICH shared-memory segments in /dev/shm (mpich_shm_*) "
                             "that no live process maps or holds open - what jobs ended by Ctrl-C, MPI_Abort, a "
                             "kill or a time limit leave behind (2-4 MiB each); segments of running jobs are kept")
    parser.add_argument("operands", nargs="*", metavar="COLLECTIVE ALGORITHM",
                        help="verify: the collective and the algorithm to check (verify allreduce ring -p 2..4)")
    parser.add_argument("--markdown", action="store_true", help="algorithms: print a Markdown table")
    parser.add_argument("--explain", nargs=2, metavar=("COLLECTIVE", "SIZE"),
                        help="algorithms: why auto picks its algorithm for COLLECTIVE at SIZE bytes (1M, 64K, 8; "
                             "the benchmark's Size): each algorithm allowed or why not, predicted and measured "
                             "times, the choice and its source (measured rules, default rules, environment); no mpiexec needed")
    parser.add_argument("--ranks", type=int, metavar="N",
                        help="with --explain: N ranks on one node (default: the layout of this host's newest "
                             "measured rules file, else 2)")
    parser.add_argument("--schedule", nargs=2, metavar=("COLLECTIVE", "ALGORITHM"),
                        help="algorithms: print ALGORITHM's schedule of COLLECTIVE on every rank (rounds of "
                             "sends and receives, then copies and combines), and check that every message meets "
                             "a receive of the same size (exit 1 if not); no mpiexec needed")
    parser.add_argument("-p", metavar="P",
                        help="--schedule: the number of ranks (4); verify: the numbers of ranks, one (4), a list "
                             "(2,3,5) or a range (2..7)")
    parser.add_argument("--count", metavar="N",
                        help="--schedule: elements of the vector, or of one rank's block for gather, scatter, "
                             "allgather, alltoall and reduce_scatter_block (default 8)")
    parser.add_argument("--counts", metavar="A,B,...",
                        help="--schedule of a v-form: one element count per rank (alltoallv: every rank sends "
                             "counts[s] to rank s)")
    parser.add_argument("--rank", type=int, metavar="R", help="--schedule: print rank R's schedule only")
    parser.add_argument("--root", type=int, metavar="R", help="--schedule: the root of a rooted collective (0)")
    parser.add_argument("--nodes", type=int, metavar="K",
                        help="--schedule: spread the ranks block-wise over K nodes (1)")
    parser.add_argument("--dtype", metavar="TYPE", help="--schedule: the element type (float64)")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="--schedule: also draw a space-time diagram (one lane per rank, an arrow per "
                             "message; needs matplotlib)")
    parser.add_argument("--schedule-file", metavar="FILE.json",
                        help="--schedule: also write every rank's schedule as a schedule file (the format "
                             "mpicomm.register_schedule_file registers as an algorithm; messages, copies and "
                             "combines only: shared-memory and hierarchical algorithms cannot be written)")
    parser.add_argument("--module", metavar="PKG.MOD[,PKG.MOD2]",
                        help="algorithms, verify: import these modules of user algorithms first, and give them "
                             "to every MPI job started (sets MPICOMM_ALGORITHM_MODULES)")
    parser.add_argument("--quick", action="store_true",
                        help="verify: skip the large count (100000 elements)")
    parser.add_argument("--timeout", type=float, metavar="S",
                        help="verify: seconds one MPI job may run (default 300)")
    parser.add_argument("--dry-run", action="store_true",
                        help="cleanup: list the stale segments with their sizes and ages, remove nothing")
    parser.add_argument("--dir", metavar="DIR", default=None,
                        help="cleanup: where the segments live (default: /dev/shm)")
    cli.add_json(parser, "the rows printed")
    cli.add_out(parser, "the lines printed (algorithms --schedule, verify)")
    args = parser.parse_intermixed_args(argv)
    schedule_mode = args.command == "algorithms" and bool(args.schedule)
    if args.operands and args.command != "verify":
        parser.error(f"unexpected argument(s) {' '.join(args.operands)}: only verify takes COLLECTIVE ALGORITHM "
                     f"({PROG} verify allreduce ring -p 2..4)")
    if args.schedule and args.command != "algorithms":
        parser.error(f"--schedule goes with the algorithms command: {PROG} algorithms --schedule allreduce ring -p 4")
    for option, attribute in _SCHEDULE_ONLY:
        if _given(args, attribute) and not schedule_mode:
            parser.error(f"{option} goes with algorithms --schedule: {PROG} algorithms --schedule allreduce ring "
                         f"-p 4 {option} ...")
    for option, attribute in _VERIFY_ONLY:
        if _given(args, attribute) and args.command != "verify":
            parser.error(f"{option} goes with the verify command: {PROG} verify allreduce ring -p 2..4 {option}")
    if args.p is not None and not (schedule_mode or args.command == "verify"):
        parser.error(f"-p goes with algorithms --schedule and verify: {PROG} verify allreduce ring -p 2..4")
    if args.module and args.command not in ("algorithms", "verify"):
        parser.error("--module goes with the algorithms and verify commands")
    if (args.out or args.append or args.force) and not (schedule_mode or args.command == "verify"):
        parser.error("--out, --append and --force go with algorithms --schedule and verify")
    cli.check_out(parser, args)
    if args.schedule and (args.explain or args.markdown or args.ranks is not None):
        parser.error("--schedule shows one algorithm's schedule; it does not go with --explain, --ranks or "
                     "--markdown")
    if args.command in ("algorithms", "verify"):
        from mpicomm import registry

        try:
            registry.table()  # mpicomm's own algorithms and MPICOMM_ALGORITHM_MODULES's: a bad name is a usage error
        except ImportError as exc:
            parser.error(str(exc))
    if args.module:
        _use_modules(parser, args.module)
    if args.command == "verify":
        if args.markdown or args.explain or args.ranks is not None or args.dry_run or args.dir:
            parser.error("verify takes COLLECTIVE ALGORITHM, -p, --quick, --timeout, --module, --json and --out")
        if len(args.operands) != 2:
            parser.error(f"verify takes COLLECTIVE ALGORITHM, got {' '.join(args.operands) or 'nothing'}: "
                         f"{PROG} verify allreduce ring -p 2..4")
        collective, algorithm = args.operands
        _algorithm(parser, "verify", collective, algorithm)
        from mpicomm.verify import parse_ranks, unchecked

        why = unchecked(collective)
        if why:
            parser.error(f"verify {collective} {algorithm}: {why}")
        if args.p is None:
            parser.error(f"verify needs -p, the numbers of ranks: {PROG} verify {collective} {algorithm} -p 2..4")
        try:
            ps = parse_ranks(args.p)
        except ValueError as exc:
            parser.error(str(exc))
        if args.timeout is not None and args.timeout <= 0:
            parser.error(f"--timeout {args.timeout:g}: must be > 0 seconds")
        return lambda: verify(collective, algorithm, ps, quick=args.quick, modules=args.module, timeout=args.timeout,
                      json_path=args.json, out=args.out, append=args.append, argv=argv)
    if schedule_mode:
        return lambda: schedule(**_schedule_args(parser, args), json_path=args.json, plot=args.plot, out=args.out,
                        append=args.append, schedule_file=args.schedule_file, argv=argv)
    if (args.dry_run or args.dir) and args.command != "cleanup":
        parser.error("--dry-run and --dir go with the cleanup command: python -m mpicomm cleanup --dry-run")
    if args.command == "cleanup":
        if args.markdown or args.explain or args.ranks is not None:
            parser.error("cleanup takes --dry-run, --dir and --json only")
        return lambda: cleanup(args.dry_run, args.dir, args.json, argv)
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
            parser.error(str(exc))
        return lambda: explain(collective, size, args.ranks, args.json, argv)
    if args.command == "algorithms":
        return lambda: algorithms(args.markdown, args.json, argv)
    return lambda: info(args.json, argv)


if __name__ == "__main__":
    sys.exit(main())
