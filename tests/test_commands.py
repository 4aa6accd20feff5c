"""One command-line dialect: every command's ``--help``, read the way a user reads it, and its usage errors.

Every command of the project (the library's tools, the benchmarks, the
applications, kernels.bench, jobs/collect.py) runs here with ``--help``, and
the options they share must mean the same everywhere:

* ``--out FILE.md`` comes with ``--append`` and ``--force`` (a report never
  replaces a file silently); ``--output FILE`` (a data file) with ``--force``;
* ``--backend`` is the array module: exactly ``{numpy,cupy}``;
* an application that checkpoints takes ``--checkpoint-dir`` (default
  ``checkpoints/<app>``, never shared), ``--restart``, ``--checkpoint-every``
  (default 0, never) and ``--keep`` (default 2);
* ``--repeat N`` says the median is reported, and no ``--rounds`` means
  something else; ``--iters`` counts per size (or per run), ``--warmup`` untimed
  iterations; ``--plot FILE.png``, ``--json FILE``;
* a usage error exits with status 2 and the line ``<prog>: error: …``, states
  the rule and the value (``--repeat must be >= 1, got 0``), and never says
  "rank 0 of 1"; an option's earlier name is an error naming the new one.

The commands run in two child processes (``runpy``, each command with its own
``sys.argv`` and captured output: one child for the commands that import
PyTorch, one for the rest, side by side), so the whole file costs two Python
start-ups, not one per command; they start no MPI job (nothing parses far
enough to, and no launcher's environment reaches them). Where a command owned by another part of the project is
still outside the dialect, the case is an ``xfail(strict=True)`` naming the
gap, so the suite says so and turns red once it is fixed without the mark
being removed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass

import pytest

from tests import mpirun

pytestmark = pytest.mark.serial


@dataclass(frozen=True)
class Command:
    """A command as users type it: how to run it (a module or a script) and its argv before any option."""

    prog: str  #: the program name its usage errors start with
    target: str  #: a module (``-m``) or a script path relative to the repository
    argv: tuple[str, ...] = ()  #: the sub-command
    positional: tuple[str, ...] = ()  #: required positional arguments, for the error probes
    needs: str = ""  #: a module without which the command cannot even print its help
    renamed: tuple[tuple[str, str], ...] = ()  #: (earlier name, name now) of options a user's script may still pass
    default_out: bool = False  #: writes a report even without --out (so --force alone is meaningful)
    out_probes: bool = True  #: False where --out belongs to some modes only (the mode's own error comes first)

    @property
    def name(self) -> str:
        return " ".join([self.prog, *self.argv])


_BENCHMARKS = ("pingpong", "allreduce", "bcast", "reduce", "allgather", "alltoall", "reduce_scatter", "gather",
               "scatter", "scan", "barrier")

COMMANDS = [
    Command("python -m mpicomm", "mpicomm", positional=("info",), out_probes=False),  # info|algorithms|verify|cleanup
    Command("python -m mpicomm.tune", "mpicomm.tune", renamed=(("--rounds", "--repeat"), ("--out", "--output"))),
    Command("python -m mpicomm.bench", "mpicomm.bench", positional=("allreduce",)),  # the list of benchmarks
    *(Command("python -m mpicomm.bench", "mpicomm.bench", (b,)) for b in _BENCHMARKS),
    Command("python -m mpicomm.bench.summary", "mpicomm.bench.summary", positional=("results.json",)),
    Command("python -m mpicomm.bench.lane", "mpicomm.bench.lane"),
    Command("python -m mpicomm.torch.bench", "mpicomm.torch.bench", needs="torch"),
    Command("python -m apps.demo", "apps.demo"),
    Command("python -m apps.stencil", "apps.stencil"),
    Command("python -m apps.stencil.bench", "apps.stencil.bench"),
    Command("python -m apps.mapreduce", "apps.mapreduce", ("wordcount",), ("in.txt",), renamed=(("--out", "--output"),)),
    Command("python -m apps.mapreduce", "apps.mapreduce", ("invindex",), ("in.txt",), renamed=(("--out", "--output"),)),
    Command("python -m apps.mapreduce", "apps.mapreduce", ("corpus",), ("corpus-dir",)),
    Command("python -m apps.mapreduce", "apps.mapreduce", ("bench",)),
    Command("python -m apps.sgd", "apps.sgd", ("train",)),
    Command("python -m apps.sgd", "apps.sgd", ("bench",)),
    Command("python -m apps.sgd", "apps.sgd", ("plot",), ("m.csv", "--plot", "m.png"), renamed=(("--out", "--plot"),)),
    Command("python -m apps.torchddp", "apps.torchddp", ("train",), needs="torch",
            renamed=(("--checkpoint", "--checkpoint-dir"), ("--resume", "--restart"), ("--backend", "--dist-backend"),
                     ("--log-every", "--progress-every"), ("--eval", "--eval-samples"))),
    Command("python -m apps.torchddp", "apps.torchddp", ("bench",), needs="torch", renamed=(("--rounds", "--repeat"),)),
    Command("python -m apps.pipeline", "apps.pipeline", ("schedule",)),
    Command("python -m apps.pipeline", "apps.pipeline", ("train",)),
    Command("python -m apps.pipeline", "apps.pipeline", ("bench",)),
    Command("python -m kernels.bench", "kernels.bench"),
    Command("python -m kernels.gpubench", "kernels.gpubench"),
    Command("python jobs/collect.py", "jobs/collect.py", positional=("runs/scaling-1",), default_out=True),
]
BY_NAME = {c.name: c for c in COMMANDS}

#: Applications that checkpoint: their --checkpoint-dir default is checkpoints/<app>.
CHECKPOINTING = {"python -m apps.stencil": "stencil", "python -m apps.sgd train": "sgd",
                 "python -m apps.torchddp train": "torchddp", "python -m apps.pipeline train": "pipeline",
                 "python -m apps.mapreduce wordcount": "mapreduce", "python -m apps.mapreduce invindex": "mapreduce"}
#: A map-reduce job has one point to resume from, after the map phase: one checkpoint per job, so nothing to keep.
ONE_CHECKPOINT = {"python -m apps.mapreduce wordcount", "python -m apps.mapreduce invindex"}

#: (command, check) pairs of commands still outside the dialect, each with the reason (none today).
KNOWN_GAPS: dict[tuple[str, str], str] = {}


# ---------------------------------------------------------------- running every command in one child

_CHILD = textwrap.dedent('''
    import json, sys, warnings
    from mpicomm.cli import run_main
    warnings.simplefilter("ignore")
    for line in sys.stdin:
        out = [dict(zip(("code", "stdout", "stderr"), run_main(target, argv))) for target, argv in json.loads(line)]
        sys.__stdout__.write("@@RESULTS " + json.dumps(out) + "\\n")
        sys.__stdout__.flush()
''')


@dataclass(frozen=True)
class Outcome:
    code: int
    stdout: str
    stderr: str


class Child:
    """A Python that runs commands in-process (``runpy``) on request: one start-up (and one import of PyTorch) for
    every command it runs; no launcher's environment, so nothing becomes an MPI job."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, cwd=mpirun.REPO,
                                     env=mpirun.clean_env({"OMP_NUM_THREADS": "1"}))

    def send(self, runs: list[tuple[str, list[str]]]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(runs) + "\n")
        self.proc.stdin.flush()

    def receive(self) -> list[Outcome]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("@@RESULTS "):
                return [Outcome(**r) for r in json.loads(line[len("@@RESULTS "):])]
        raise AssertionError(f"the child ended: {self.proc.stderr.read()[-4000:] if self.proc.stderr else ''}")

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def children():
    """Two children working side by side: the commands that import PyTorch (seconds to import) and the rest."""
    pair = {"torch": Child(), "rest": Child()}
    yield pair
    for child in pair.values():
        child.close()


def run_all(children: dict[str, Child], runs: list[tuple[Command, list[str]]]) -> list[Outcome]:
    """Each (command, argv) run by the child for its kind, both children at once; outcomes in the order given."""
    kinds = {kind: [i for i, (c, _) in enumerate(runs) if (c.needs == "torch") == (kind == "torch")]
             for kind in children}
    for kind, indices in kinds.items():
        children[kind].send([(runs[i][0].target, runs[i][1]) for i in indices])
    outcomes: list[Outcome | None] = [None] * len(runs)
    for kind, indices in kinds.items():
        for i, outcome in zip(indices, children[kind].receive()):
            outcomes[i] = outcome
    return [o for o in outcomes if o is not None]


def _available(command: Command) -> bool:
    import importlib.util

    return not command.needs or importlib.util.find_spec(command.needs) is not None


@dataclass(frozen=True)
class Option:
    """One option as ``--help`` shows it."""

    names: tuple[str, ...]
    metavar: str
    help: str

    def default(self) -> str | None:
        m = re.search(r"\(default:? ([^)]*)\)", self.help)
        return m.group(1).strip() if m else None

    def choices(self) -> set[str] | None:
        return set(self.metavar[1:-1].split(",")) if self.metavar.startswith("{") else None


_OPTION = re.compile(r"^  (-[^ ].*?)(?:  +(\S.*))?$")


def options_of(help_text: str) -> dict[str, Option]:
    """The options of a ``--help`` text, by each of their names."""
    found: dict[str, Option] = {}
    current: list = []

    def close() -> None:
        if current:
            invocation, text = current
            names, metavar = [], ""
            for part in invocation.split(", "):
                name, _, meta = part.partition(" ")
                names.append(name)
                metavar = metavar or meta
            option = Option(tuple(names), metavar, " ".join(text.split()))
            for name in names:
                found[name] = option

    for line in help_text.splitlines():
        m = _OPTION.match(line)
        if m:
            close()
            current = [m.group(1), m.group(2) or ""]
        elif current and line.startswith("   ") and line.strip():
            current[1] += " " + line.strip()
        else:
            close()
            current = []
    close()
    return found


@pytest.fixture(scope="module")
def helps(children) -> dict[str, Outcome]:
    """Every available command's ``--help``."""
    chosen = [c for c in COMMANDS if _available(c)]
    results = run_all(children, [(c, [*c.argv, "--help"]) for c in chosen])
    return {c.name: r for c, r in zip(chosen, results)}


def _probes(command: Command, options: dict[str, Option]) -> list[tuple[str, list[str], str]]:
    """(what, argv, the error line's message or a pattern of it) for the options the command has."""
    base = [*command.argv, *command.positional]
    probes = [("unknown option", [*base, "--no-such-option"], r"unrecognized arguments: --no-such-option")]
    if "--repeat" in options:
        probes.append(("--repeat 0", [*base, "--repeat", "0"], re.escape("--repeat must be >= 1, got 0")))
    if "--keep" in options:
        probes.append(("--keep 0", [*base, "--keep", "0"], re.escape("--keep must be >= 1, got 0")))
    if "--checkpoint-every" in options:
        rule = "0 or 1 (a job checkpoints once, after the map phase)" if command.name in ONE_CHECKPOINT else ">= 0"
        probes.append(("--checkpoint-every -1", [*base, "--checkpoint-every", "-1"],
                       re.escape(f"--checkpoint-every must be {rule}, got -1")))
    if "--backend" in options:
        probes.append(("--backend fortran", [*base, "--backend", "fortran"],
                       re.escape("argument --backend: invalid choice: 'fortran'")))
    if "--out" in options and command.out_probes and not command.default_out:
        probes.append(("--force alone", [*base, "--force"], r"--force needs --out FILE\.md"))
        probes.append(("--append alone", [*base, "--append"], r"--append needs --out FILE\.md"))
    for old, new in command.renamed:
        value = [] if old == "--resume" else ["2"]
        probes.append((f"{old} renamed", [*base, old, *value], re.escape(f"{old}: renamed {new}")))
    return probes


@pytest.fixture(scope="module")
def errors(children, helps) -> dict[str, list[tuple[str, Outcome, str]]]:
    """Every command's usage-error probes and what each printed."""
    plan = []
    for name, outcome in helps.items():
        command = BY_NAME[name]
        for what, argv, expect in _probes(command, options_of(outcome.stdout)):
            plan.append((name, what, command, argv, expect))
    results = run_all(children, [(command, argv) for _, _, command, argv, _ in plan])
    found: dict[str, list[tuple[str, Outcome, str]]] = {}
    for (name, what, _, _, expect), outcome in zip(plan, results):
        found.setdefault(name, []).append((what, outcome, expect))
    return found


# ---------------------------------------------------------------- the checks


def _case(name: str, check: str):
    reason = KNOWN_GAPS.get((name, check))
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(name, id=name.replace("python -m ", "").replace("python ", ""), marks=marks)


def _cases(check: str) -> list:
    return [_case(c.name, check) for c in COMMANDS]


def _help(helps, name: str) -> dict[str, Option]:
    if name not in helps:
        pytest.skip(f"{name} needs {BY_NAME[name].needs}, which is not installed")
    outcome = helps[name]
    assert outcome.code == 0, f"{name} --help exited {outcome.code}: {outcome.stderr[-2000:]}"
    assert outcome.stdout.startswith(f"usage: {BY_NAME[name].name}"), outcome.stdout[:200]
    return options_of(outcome.stdout)


def test_every_command_is_listed_once_and_each_help_parses(helps):
    assert len(BY_NAME) == len(COMMANDS)
    for name in helps:
        assert "-h" in _help(helps, name) and "--help" in _help(helps, name)["-h"].names


@pytest.mark.parametrize("name", _cases("out"))
def test_out_is_a_markdown_report_with_append_and_force(helps, name):
    options = _help(helps, name)
    if "--out" not in options:
        return
    assert options["--out"].metavar == "FILE.md", options["--out"]
    assert "--append" in options and "--force" in options, f"{name}: --out without --append/--force"
    assert "Markdown" in options["--out"].help and "kept unless --append or --force" in options["--out"].help


@pytest.mark.parametrize("name", _cases("output"))
def test_output_is_a_data_file_replaced_only_with_force(helps, name):
    options = _help(helps, name)
    if "--output" in options:
        assert "--force" in options and "kept unless --force" in options["--output"].help, options["--output"]


@pytest.mark.parametrize("name", _cases("backend"))
def test_backend_is_the_array_module(helps, name):
    options = _help(helps, name)
    if "--backend" in options:
        assert options["--backend"].choices() == {"numpy", "cupy"}, options["--backend"]


@pytest.mark.parametrize("name", _cases("checkpoint"))
def test_checkpoint_options_are_one_set_with_one_default_shape(helps, name):
    options = _help(helps, name)
    shared = {"--checkpoint-dir", "--restart", "--checkpoint-every", "--keep"}
    present = shared & options.keys()
    if name not in CHECKPOINTING:
        assert not present, f"{name} has {sorted(present)} but is not known to checkpoint: add it to CHECKPOINTING"
        return
    expected = shared - ({"--keep"} if name in ONE_CHECKPOINT else set())
    assert present == expected, f"{name}: {sorted(present)}"
    assert options["--checkpoint-dir"].default() == f"checkpoints/{CHECKPOINTING[name]}"
    assert options["--checkpoint-every"].metavar == "K" and options["--checkpoint-every"].default().startswith("0")
    if "--keep" in options:
        assert options["--keep"].default() == "2" and options["--keep"].metavar == "N"
    for old in ("--checkpoint", "--resume"):
        assert old not in options


def test_no_two_applications_share_a_checkpoint_directory(helps):
    defaults = {}
    for name, app in CHECKPOINTING.items():
        if name in helps:
            defaults.setdefault(_help(helps, name)["--checkpoint-dir"].default(), set()).add(app)
    assert all(len(apps) == 1 for apps in defaults.values()), defaults


@pytest.mark.parametrize("name", _cases("repeat"))
def test_repeat_reports_the_median_and_rounds_is_gone(helps, name):
    options = _help(helps, name)
    assert "--rounds" not in options, f"{name}: --rounds ({options.get('--rounds')})"
    if "--repeat" in options:
        assert options["--repeat"].metavar == "N" and "median" in options["--repeat"].help, options["--repeat"]
        assert "best" not in options["--repeat"].help


@pytest.mark.parametrize("name", _cases("iters"))
def test_iters_counts_per_size_and_warmup_untimed(helps, name):
    """In a benchmark (a command with --repeat, --sizes or --warmup) --iters is a count per size or configuration,
    never a total spread over the repeats."""
    options = _help(helps, name)
    benchmark = {"--repeat", "--sizes", "--warmup"} & options.keys()
    if "--iters" in options and benchmark:
        text = options["--iters"].help
        assert re.search(r"\b(per|each|every)\b", text) and not re.search(r"\b(over all|in all|total)\b", text), \
            options["--iters"]
    if "--warmup" in options:
        assert "untimed" in options["--warmup"].help, options["--warmup"]


@pytest.mark.parametrize("name", _cases("plot"))
def test_plot_json_and_hidden_read_alike(helps, name):
    options = _help(helps, name)
    if "--plot" in options:
        assert options["--plot"].metavar == "FILE.png", options["--plot"]
    if "--json" in options:
        assert options["--json"].metavar == "FILE", options["--json"]
    if "--hidden" in options:
        assert options["--hidden"].metavar in ("W[,W…]", "W") and "width of each" in options["--hidden"].help, \
            options["--hidden"]


@pytest.mark.parametrize("name", _cases("errors"))
def test_usage_errors_exit_2_with_prog_error_and_the_rule(errors, helps, name):
    _help(helps, name)
    prog = BY_NAME[name].prog
    for what, outcome, expect in errors[name]:
        assert outcome.code == 2, f"{name} {what}: exit {outcome.code}\n{outcome.stderr[-1500:]}"
        lines = [line for line in outcome.stderr.splitlines() if ": error: " in line]
        assert lines, f"{name} {what}: no error line\n{outcome.stderr[-1500:]}"
        assert all(line.startswith(f"{prog}") and re.match(rf"^{re.escape(prog)}( \w+)?: error: ", line)
                   for line in lines), f"{name} {what}: {lines}"
        assert re.search(expect, lines[-1]), f"{name} {what}: {lines[-1]!r} does not say {expect!r}"
        assert "rank 0 of 1" not in outcome.stderr and "Traceback" not in outcome.stderr, outcome.stderr


def test_the_help_examples_name_files_that_exist_or_are_forced(helps):
    """Every ``--out jobs/results/X`` in a help text names a committed result and passes --force with it (a
    report is never replaced silently, so an example that regenerates one says so)."""
    for name, outcome in helps.items():
        for line in outcome.stdout.splitlines():
            m = re.search(r"--out (jobs/results/\S+)", line)
            if m:
                assert os.path.exists(os.path.join(mpirun.REPO, m.group(1))), f"{name}: {line.strip()}"
                assert "--force" in line or "--append" in line, f"{name}: {line.strip()}"
