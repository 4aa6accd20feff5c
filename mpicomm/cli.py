"""Command-line conventions shared by every mpicomm and application command.

One size parser, one way to write times, one progress line, one ``--json``
document and one ``--out`` rule, so that ``python -m mpicomm.bench``,
``python -m mpicomm.tune``, ``python -m mpicomm info``, ``apps.demo``,
``apps.stencil``, ``apps.mapreduce``, ``apps.sgd`` and ``kernels.bench`` read
and write alike:

- sizes: :func:`parse_size` takes ``4096``, ``64K``, ``64KiB``, ``1M``,
  ``1.5G`` (K, M, G, T and KiB, MiB, GiB, TiB are powers of 1024) and
  ``1e6`` (exponent notation is decimal); :func:`parse_sizes` takes a list
  (``8,4K,64M``) or a range of powers of two (``8:1M``);
- times: :func:`format_time` writes ``12.3 µs``, ``4.10 ms``, ``2.00 s``; table
  headers that carry a unit write it as :data:`US` (``µs``);
- progress: :class:`Progress` writes ``[i/N] what  elapsed 0:12  ETA 0:30`` to
  stderr on one rank, flushed line by line (readable in a Slurm log);
- ``--json FILE``: :func:`write_json` wraps a command's results in a document
  carrying ``schema`` (:data:`SCHEMA`, ``mpicomm-results``), ``schema_version``
  (:data:`SCHEMA_VERSION`), the command line, the machine, the versions
  (Python, NumPy, mpi4py, the MPI library, mpicomm) and the UTC date;
- ``--out FILE.md``: Markdown reports only; :func:`add_out` adds ``--out``,
  ``--append`` and ``--force``, :func:`check_out` refuses to replace an
  existing report without ``--append`` or ``--force``, :func:`write_out`
  writes it and :func:`markdown_table` lays out its tables;
- ``--output FILE``: data files (:func:`add_output`), never replacing an
  existing file without ``--force`` either; pictures are ``--plot FILE.png``;
- options: ``--repeat N`` repeats the whole measurement and reports the median
  (:func:`add_repeat`), ``--iters N`` counts timed iterations per size and
  ``--warmup N`` untimed ones before them; an option that was renamed is a usage
  error naming the new one (:func:`renamed`), never a hidden alias;
- parsers: every command's parser is a :class:`Parser` (``--version``; a
  negative size such as ``-1M`` is a value its type refuses, not an unknown
  option; a type's rule reads ``--size must be >= 1, got 0``);
- errors: usage errors go through ``parser.error`` (``<prog>: error: <message>``,
  exit status 2) and state the rule and the value (:func:`at_least`:
  ``--repeat must be >= 1, got 0``); :func:`parse_or_exit` runs a command's
  parsing and checks so that, under ``mpiexec``, the lowest rank that found a
  usage error prints it and every rank exits with its status (the ranks agree
  first: a check of a file may fail on one rank only; where the MPI library is
  not wired to the launcher, every task a job of one, task 0 alone prints it,
  with :func:`unwired_hint`); errors found once the
  work has started read the same (:func:`error_line`), printed once per job
  where every rank finds them alike; an optional dependency missing for an
  option is a usage error naming the extra to install (:func:`require`).

Nothing here starts MPI: the MPI library's version is read only when a JSON
document is written, after the command has started MPI itself.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import re
import shlex
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

from .config import describe_cpu

__all__ = ["SCHEMA", "SCHEMA_VERSION", "US", "parse_size", "size_arg", "parse_sizes", "sizes_arg",
           "format_size", "format_time", "Progress", "add_json", "add_out", "add_output", "check_out", "write_out",
           "markdown_table", "add_repeat", "renamed", "at_least", "subparser", "error_line", "command_line", "versions",
           "document", "write_json", "pyplot", "run_main", "Parser", "parse_or_exit", "launched_ranks", "unwired_hint",
           "require", "EXTRAS", "refuse_unless", "did_you_mean"]

#: The ``schema`` field of every ``--json`` document, and its version (raised when a field changes meaning).
SCHEMA = "mpicomm-results"
SCHEMA_VERSION = 1

#: How microseconds are written in every table header and line.
US = "µs"

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*(-?)(\d+(?:\.\d*)?|\.\d+)(?:[eE]([+]?\d+))?\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)


_FORMS = ("a whole number with an optional unit K, M, G or T (powers of 1024; KiB, MiB... also "
          "accepted) or in exponent form, e.g. 4096, 64K, 64KiB, 1M, 1.5G, 1e6")


def _lead(what: str) -> str:
    return f"{what} " if what else ""


def parse_size(text: str | int, what: str = "size", minimum: int = 1) -> int:
    """Bytes (or elements) from ``4096``, ``64K``, ``64KiB``, ``64kb``, ``1M``, ``1.5G``, ``1e6``.

    K, M, G, T (with or without ``iB``/``B``) are powers of 1024; ``1e6`` is
    10⁶. The result must be a whole number ≥ *minimum*; anything else raises
    ValueError stating the rule, naming *what* and the value
    (``--size must be >= 1, got 0``; a negative size gets the same rule).
    """
    lead = _lead(what)
    if isinstance(text, bool) or not isinstance(text, (int, str)):
        raise ValueError(f"{lead}must be {_FORMS}, got {text!r}")
    if isinstance(text, int):
        value = text
    else:
        m = _SIZE.match(text)
        if not m or (m.group(3) and m.group(4)):
            raise ValueError(f"{lead}must be {_FORMS}, got {text!r}")
        try:
            sign = -1.0 if m.group(1) else 1.0
            exact = sign * float(m.group(2)) * 10.0 ** int(m.group(3) or 0) * _UNITS[m.group(4).upper()]
            if not math.isfinite(exact):
                raise OverflowError
            value = int(exact)
        except OverflowError:
            raise ValueError(f"{lead}must be a size below 2**1023 bytes, got {text!r}") from None
        if value != exact:
            raise ValueError(f"{lead}must be a whole number, got {text!r}, which is {exact:g}")
    if value < minimum:
        raise ValueError(f"{lead}must be >= {minimum}, got {str(text).strip()}")  # the rule's form: got 0, got -1M
    return value


def size_arg(text: str) -> int:
    """:func:`parse_size` as an argparse ``type=`` (its message becomes the usage error; a :class:`Parser` writes it
    ``--size must be >= 1, got 0``)."""
    try:
        return parse_size(text, what="")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_sizes(text: str, what: str = "sizes", minimum: int = 1) -> list[int]:
    """``"8:1M"`` → 8, 16, 32 … 1 MiB (doubling from the first size); ``"8,100,4K"`` → those sizes, in order."""
    if ":" in text:
        low, high = (parse_size(t, what, minimum) for t in text.split(":", 1))
        if low > high:
            raise ValueError(f"{_lead(what)}must go from the smaller size to the larger (LOW:HIGH), got {text!r}")
        out, size = [], low
        while size <= high:
            out.append(size)
            size = size * 2 if size else 1
        return out
    return [parse_size(t, what, minimum) for t in text.split(",")]


def sizes_arg(text: str) -> list[int]:
    """:func:`parse_sizes` as an argparse ``type=``."""
    try:
        return parse_sizes(text, what="")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def format_size(n: int) -> str:
    """``65536`` → ``"64 KiB"``, ``1000`` → ``"1000 B"`` (binary units only where they are exact)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def format_time(seconds: float) -> str:
    """``1.23e-5`` → ``"12.3 µs"``; ``0.0041`` → ``"4.10 ms"``; ``2`` → ``"2.00 s"`` (three significant digits)."""
    if not math.isfinite(seconds):
        return "-"
    rounded = float(f"{seconds:.3g}")  # round first, so 0.9996 ms is 1.00 ms, not 1000 µs
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, US), (1e-9, "ns")):
        if abs(rounded) >= scale or unit == "ns":
            value = rounded / scale
            break
    digits = 2 if abs(value) < 10 else 1 if abs(value) < 100 else 0
    return f"{value:.{digits}f} {unit}"


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


class Progress:
    """``label [i/N] text  elapsed m:ss  ETA m:ss`` lines on stderr, from one rank.

    ``Progress(total, "allreduce", show=rank == 0)``; call :meth:`step` after
    each unit of work (or :meth:`note` for a line without a step). The ETA
    extrapolates the mean time per step so far. Lines are flushed one by one,
    so a Slurm log shows them as they come; nothing is printed when *show* is
    false.
    """

    def __init__(self, total: int, label: str, show: bool = True, stream: TextIO | None = None):
        self.total, self.label, self.show = max(0, int(total)), label, show
        self.stream = stream
        self.done = 0
        self.start = time.perf_counter()

    def _write(self, line: str) -> None:
        if self.show:
            print(line, file=self.stream or sys.stderr, flush=True)

    def step(self, text: str = "", steps: int = 1) -> None:
        """Count *steps* units done and print the line for them."""
        self.done += steps
        elapsed = time.perf_counter() - self.start
        line = f"{self.label} [{self.done}/{self.total}]" + (f" {text}" if text else "") + f"  elapsed {_clock(elapsed)}"
        if 0 < self.done < self.total:
            line += f"  ETA {_clock(elapsed / self.done * (self.total - self.done))}"
        self._write(line)

    def note(self, text: str) -> None:
        """A line without a step (what is being done now)."""
        self._write(f"{self.label}: {text}")


def add_json(parser: argparse.ArgumentParser, what: str = "the results") -> None:
    """``--json FILE``: *what* as a JSON document (see :func:`document`)."""
    parser.add_argument("--json", metavar="FILE", default=None,
                        help=f"also write {what} as JSON, with the command, machine, versions, date and schema "
                             f"version (rank 0)")


def _add_force(parser: argparse.ArgumentParser, option: str) -> None:
    """One ``--force`` for ``--out`` and ``--output`` alike; its help names the ones the parser has."""
    action = parser._option_string_actions.get("--force")
    if action is None:
        parser.add_argument("--force", action="store_true", help=f"with {option}: replace the file if it exists")
    else:
        action.help = "with --out or --output: replace the file if it exists"


def add_out(parser: argparse.ArgumentParser, what: str = "the report") -> None:
    """``--out FILE.md``, ``--append``, ``--force``: *what* as Markdown; an existing file needs --append or --force."""
    parser.add_argument("--out", metavar="FILE.md", default=None,
                        help=f"also write {what}, the command and the machine to this Markdown file "
                             f"(an existing file is kept unless --append or --force)")
    parser.add_argument("--append", action="store_true", help="with --out: add to the end of the file")
    _add_force(parser, "--out")


def add_output(parser: argparse.ArgumentParser, what: str, metavar: str = "FILE", note: str = "") -> None:
    """``--output FILE`` (and ``--force``): *what*, a data file; an existing file is replaced only with --force."""
    parser.add_argument("--output", metavar=metavar, default=None,
                        help=f"write {what} to this file (an existing file is kept unless --force)"
                             + (f"; {note}" if note else ""))
    _add_force(parser, "--output")


def check_out(parser: argparse.ArgumentParser, args: argparse.Namespace, default: str | None = None) -> None:
    """The usage errors of ``--out``/``--append``/``--force`` (and ``--output`` where the parser has it).

    ``--append`` and ``--force`` together, either without a file to act on, an
    existing ``--out`` report without one of them, an existing ``--output``
    file without ``--force``. *default*: the report written when ``--out`` is
    not given (it follows the same rule).
    """
    out = getattr(args, "out", None) or default
    output = getattr(args, "output", None)
    append, force = getattr(args, "append", False), getattr(args, "force", False)
    if append and force:
        parser.error("--append and --force: choose one (add to the report, or replace it)")
    if append and not out:
        parser.error("--append needs --out FILE.md (the report to add to)")
    if force and not (out or output):
        files = [name for name, has in (("--out FILE.md", hasattr(args, "out") or default),
                                        ("--output FILE", hasattr(args, "output"))) if has]
        parser.error(f"--force needs {' or '.join(files)} (the file to replace)")
    if out and os.path.exists(out) and not (append or force):
        parser.error(f"--out {out} exists; add --append to add this report to it, or --force to replace it")
    if output and os.path.exists(output) and not force:
        parser.error(f"--output {output} exists; add --force to replace it, or choose another file")


def write_out(path: str, text: str, append: bool = False) -> None:
    """Write the report *text* to *path* (after :func:`check_out`): at the end of the file with *append*, after a
    blank line when the file is not empty; else as the whole file."""
    body = text if text.endswith("\n") else text + "\n"
    with open(path, "a" if append else "w") as f:
        if append and f.tell():
            f.write("\n")
        f.write(body)


def markdown_table(header: list[str], cells: list[list[str]]) -> str:
    """A Markdown table, columns padded to line up; the first column left-aligned, the rest right-aligned."""
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(header)]

    def line(values: list[str]) -> str:
        return "| " + " | ".join(v.ljust(w) if i == 0 else v.rjust(w)
                                 for i, (v, w) in enumerate(zip(values, widths))) + " |"

    rule = "|" + "|".join(":" + "-" * (w + 1) if i == 0 else "-" * (w + 1) + ":" for i, w in enumerate(widths)) + "|"
    return "\n".join([line(header), rule, *(line(row) for row in cells)])


def run_main(target: str, argv: Sequence[str]) -> tuple[int, str, str]:
    """Run a command in this process as ``python -m TARGET ARGV...`` (or ``python TARGET.py ARGV...``) runs it:
    ``(exit status, stdout, stderr)``. An uncaught exception is status 1 with its traceback on stderr. For
    tools that run many commands' ``--help`` without starting Python (and NumPy, mpi4py, PyTorch) for each."""
    import contextlib
    import io
    import runpy
    import traceback

    stdout, stderr, code = io.StringIO(), io.StringIO(), 0
    saved = sys.argv[:]
    sys.argv = [target, *argv]
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                if target.endswith(".py"):
                    runpy.run_path(target, run_name="__main__")
                else:
                    runpy.run_module(target, run_name="__main__", alter_sys=True)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except Exception:  # noqa: BLE001 - the command's failure, reported as its exit would be
                code = 1
                stderr.write(traceback.format_exc())
    finally:
        sys.argv = saved
    return code, stdout.getvalue(), stderr.getvalue()


def add_repeat(parser: argparse.ArgumentParser, default: int, what: str = "the whole measurement",
               when: str = "") -> None:
    """``--repeat N``: run *what* N times and report the median (one meaning in every command); *when* names the
    mode it applies to (``with --collectives``)."""
    parser.add_argument("--repeat", type=int, default=default, metavar="N",
                        help=(f"{when}: " if when else "") + f"run {what} N times and report the median "
                             f"(default: {default})")


class _Renamed(argparse.Action):
    """An option's earlier name: using it is a usage error that names the option to use instead."""

    def __init__(self, option_strings: Sequence[str], dest: str, new: str = "", why: str = "", **kwargs: Any):
        super().__init__(option_strings, dest=argparse.SUPPRESS, nargs="?", default=argparse.SUPPRESS,
                         help=argparse.SUPPRESS)
        self.new, self.why = new, why

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        parser.error(f"{option_string}: renamed {self.new}" + (f" ({self.why})" if self.why else ""))


def renamed(parser: Any, old: str, new: str, why: str = "") -> None:
    """``old`` becomes a usage error naming ``new`` (``--checkpoint: renamed --checkpoint-dir``), hidden from --help.

    For options whose old name a script may still pass: a clear error instead
    of a hidden alias (or of argparse taking ``--out`` as an abbreviation of
    ``--output``). *parser* may be an argument group.
    """
    parser.add_argument(old, action=_Renamed, new=new, why=why)


def at_least(parser: argparse.ArgumentParser, args: argparse.Namespace, minimum: float, *options: str) -> None:
    """The usage error ``--NAME must be >= minimum, got VALUE`` for the first of *options* below *minimum*.

    *options* are option strings (``"--iters"``); an option whose value is None
    (not given, no default) is not checked.
    """
    for option in options:
        value = getattr(args, option.lstrip("-").replace("-", "_"))
        if value is not None and value < minimum:
            parser.error(f"{option} must be >= {_number(minimum)}, got {_number(value)}")


def _number(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of sub-command *name* (its usage errors name it: ``python -m apps.sgd train: error: …``)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen: argparse.ArgumentParser = action.choices[name]
            return chosen
    raise KeyError(f"{parser.prog} has no sub-commands")


def error_line(prog: str, message: str, rank: int = 0, size: int = 1) -> str:
    """``<prog>: error: <message>`` - the usage error's prefix, for an error found once a command runs.

    With several ranks the line names this one (``<prog>: error: rank 1 of 4:
    …``), since every rank prints it; a command on one process (or without
    MPI) never says "rank 0 of 1".
    """
    return f"{prog}: error: " + (f"rank {rank} of {size}: " if size > 1 else "") + message


def command_line(prog: str, argv: Sequence[str] | None = None) -> str:
    """``prog`` and its arguments as one shell-quoted line (*argv* defaults to ``sys.argv[1:]``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    return " ".join([prog, *(shlex.quote(a) for a in args)])


def versions() -> dict[str, str]:
    """Python, NumPy, mpi4py, the MPI library (when MPI has started) and mpicomm."""
    import numpy

    from . import __version__

    out = {"python": platform.python_version(), "numpy": numpy.__version__, "mpicomm": __version__}
    try:
        import mpi4py

        out["mpi4py"] = mpi4py.__version__
    except ImportError:
        return out
    mpi = sys.modules.get("mpi4py.MPI")  # only when the command has imported it: importing it starts MPI
    if mpi is not None and mpi.Is_initialized():
        out["mpi_library"] = " ".join(mpi.Get_library_version().splitlines()[0].split())
    return out


_FIXED = ("schema", "schema_version", "command", "machine", "host", "versions", "date", "results")


def document(command: str, results: Any, /, **fields: Any) -> dict[str, Any]:
    """The ``--json`` document: schema, schema_version, command, machine, host, versions, date, *fields*, results.

    *fields* add command-specific keys (any name, ``path`` included); one
    that would replace a fixed key raises ValueError.
    """
    clash = sorted(set(fields) & set(_FIXED))
    if clash:
        raise ValueError(f"--json document: field(s) {clash} would replace the document's own; rename them")
    return {
        "schema": SCHEMA, "schema_version": SCHEMA_VERSION, "command": command,
        "machine": describe_cpu(), "host": platform.node(), "versions": versions(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **fields, "results": results,
    }


def write_json(path: str, command: str, results: Any, /, **fields: Any) -> None:
    """Write :func:`document` to *path* (replaced whole: written to a temporary file, then renamed)."""
    body = json.dumps(document(command, results, **fields), indent=1, default=_plain) + "\n"
    tmp = f"{path}.{os.getpid()}.partial"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(body)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _plain(value: Any) -> Any:
    """JSON for what ``json`` cannot write itself: NumPy scalars and arrays, tuples, sets, paths, dataclasses."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if hasattr(value, "__dataclass_fields__"):
        from dataclasses import asdict

        return asdict(value)
    return str(value)


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the file-only Agg backend (no display needed), or a ValueError saying how to install it.

    Every ``--plot`` of every command draws through this, so a missing matplotlib is
    reported the same way everywhere (as a usage error, before any MPI work is lost).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("plots need matplotlib: pip install -e '.[plot]'") from None
    return plt


# ---------------------------------------------------------------- one parser, one error path for every command

#: The extras of ``pip install -e '.[EXTRA]'`` that provide a module a command may need (the module's import name).
EXTRAS = {"matplotlib": "plot", "numba": "compiled", "torch": "torch", "sklearn": "digits", "cupy": "cuda12"}
#: The names users install them by, where the import name differs.
_PACKAGES = {"sklearn": "scikit-learn", "cupy": "CuPy"}

# A negative number argparse takes as a value, not an option: sizes too (-1M, -64KiB, -1e6), so that their type
# refuses them with its rule instead of argparse saying "expected one argument".
_NEGATIVE = re.compile(r"^-(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?([KMGTkmgt](i?[Bb])?|[Bb])?$")
# reST markup of a docstring reused as a description (``code``, :func:`name`): plain text in --help.
_REST = re.compile(r"``(.+?)``|:[a-z]+:`~?(.+?)`")
# argparse's "argument --size: must ..." (a type's refusal) in the rule's form "--size must ...".
_TYPE_RULE = re.compile(r"^argument (?:-[^\s/:]+/)*(-[^\s/:]+): (must|each) ")


class Parser(argparse.ArgumentParser):
    """The parser of every command: argparse's, in the dialect of this module.

    * ``--version`` on every command (``mpicomm <version>``);
    * a negative size (``--size -1M``) reaches its type, which states the rule;
    * a type's refusal reads like every other rule (``--size must be >= 1, got
      0``, not ``argument --size: must …``);
    * ``--help`` is plain text: the reST markup of a docstring used as the
      description is removed;
    * ``--plot FILE.png`` (any option whose metavar is ``FILE.png``) needs
      matplotlib: without it the command is refused before any work, naming the
      extra to install (:func:`require`);
    * the ``MPICOMM_*`` settings are checked with the options (what a ``Comm``
      would refuse later, with a traceback on every rank, is a usage error
      here: ``MPICOMM_ALLREDUCE_ALGORITHM='rign' is not an algorithm of
      allreduce (did you mean 'ring'?)``).

    Its sub-commands' parsers are Parsers too (without their own ``--version``).
    """

    def __init__(self, *args: Any, version: bool = True, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = _NEGATIVE
        self._top = version
        if version and self.add_help:
            from . import __version__

            self.add_argument("--version", action="version", version=f"mpicomm {__version__}",
                              help="print the version of mpicomm and exit")

    def format_help(self) -> str:
        return _REST.sub(lambda m: m.group(1) or m.group(2), super().format_help())

    def add_subparsers(self, **kwargs: Any) -> Any:
        kwargs.setdefault("parser_class", _SubParser)
        return super().add_subparsers(**kwargs)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        parsed, extras = super().parse_known_args(args, namespace)
        for action in self._actions:
            if action.metavar == "FILE.png" and getattr(parsed, action.dest, None):
                require(self, action.option_strings[-1], "matplotlib")
        if self._top and any(name.startswith("MPICOMM_") for name in os.environ):
            from . import config, registry
            from .catalogue import COLLECTIVES

            found = config.problems(COLLECTIVES, registry.algorithms, registry.import_modules, writes_trace=False)
            if found:
                self.error("; ".join(found))
        return parsed, extras

    def error(self, message: str) -> Any:
        super().error(_TYPE_RULE.sub(r"\1 \2 ", message))


class _SubParser(Parser):
    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, version=False, **kwargs)


def did_you_mean(value: str, choices: Sequence[str]) -> str:
    """`` (did you mean 'ring'?)`` for a misspelt *value* close to one of *choices*, else ``""``: every message
    that refuses a name (an algorithm, a collective) offers the same hint."""
    import difflib

    close = difflib.get_close_matches(value, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def require(parser: argparse.ArgumentParser, option: str, module: str, extra: str | None = None) -> None:
    """The usage error for *option* when *module* is not installed, naming the extra that provides it.

    ``--plot needs matplotlib, which is not installed: pip install -e '.[plot]'``.
    One rule for every optional dependency: checked while the command line is
    checked, before any work (or MPI) starts, exit status 2.
    """
    import importlib.util

    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        extra = extra or EXTRAS.get(module.split(".")[0], module)
        name = _PACKAGES.get(module, module)
        parser.error(f"{option} needs {name}, which is not installed: pip install -e '.[{extra}]'")


def refuse_unless(parser: argparse.ArgumentParser, args: argparse.Namespace, applies: bool, where: str,
                  *options: str) -> None:
    """Refuse each of *options* given where it does nothing (unless *applies*): an option the chosen mode ignores
    is a usage error, never silently ignored.

    *where* names the mode it belongs to, as the user writes it (``--mode
    ps-async``): ``--staleness 5 applies to --mode ps-async only; drop it or use
    --mode ps-async``. An option counts as given when its value differs from
    its default.
    """
    if applies:
        return
    for option in options:
        action = parser._option_string_actions[option]
        value = getattr(args, action.dest, None)
        if value != action.default:
            shown = option if action.nargs == 0 else f"{option} {_shown(value)}"
            parser.error(f"{shown} applies to {where} only; drop it or use {where}")


def _shown(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return _number(value) if isinstance(value, (int, float)) else str(value)


#: The (size, rank) variables a launcher sets for each process it starts, in the order they are believed: an MPI
#: launcher's before Slurm's (inside an allocation, hydra starts its proxies with srun, so SLURM_PROCID there is a
#: proxy's index, not a rank). Slurm's are srun's per-step ones: a batch script has SLURM_NTASKS (the allocation's)
#: and SLURM_PROCID=0 too, without being one of several tasks.
_LAUNCHED = (("PMI_SIZE", "PMI_RANK"), ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"),
             ("SLURM_STEP_NUM_TASKS", "SLURM_PROCID"))


def _launched(env: Any) -> tuple[int, int, str]:
    """(rank, size, the variable that gave the size) of this process as its launcher says; (0, 1, "") without one."""
    for size_var, rank_var in _LAUNCHED:
        try:
            size = int(env.get(size_var, ""))
        except ValueError:
            continue
        try:
            return int(env.get(rank_var, "0")), size, size_var
        except ValueError:
            return 0, size, size_var
    return 0, 1, ""


def launched_ranks(environ: Any = None) -> tuple[int, int]:
    """(rank, size) of this process as its launcher (``mpiexec``, ``srun``) says, before MPI starts.

    Only a launcher's own per-rank variables count: inside a Slurm job's batch
    script, ``SLURM_NTASKS`` describes the allocation, not this process; srun's
    tasks have ``SLURM_STEP_NUM_TASKS``. (A launcher's count is not MPI's: an
    MPI library that does not speak srun's PMI makes every task a job of one.)
    """
    rank, size, _ = _launched(os.environ if environ is None else environ)
    return rank, size


def unwired_hint(size: int, variable: str) -> str:
    """The line said once when MPI sees one process where the launcher started *size* (its *variable* says so)."""
    return (f"mpicomm: MPI sees 1 process but the launcher started {size} ({variable}={size}): the MPI library is not "
            f"wired to the launcher, so every task runs alone (task 0 alone said the above); launch with srun "
            f"--mpi=pmi2 (MPICH), srun --mpi=pmix (Open MPI) or the MPI's own mpiexec")


def _status(code: Any) -> int:
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def _release(out: str, err: str) -> None:
    """Print what was held back."""
    sys.stdout.write(out)
    sys.stderr.write(err)
    sys.stdout.flush()
    sys.stderr.flush()


def parse_or_exit(parse: Any, argv: Sequence[str] | None = None) -> Any:
    """``parse(argv)``, a command's whole parsing and checking; on a usage error (or ``--help``) every rank exits
    together with the same status, and the text is printed once per job.

    What *parse* prints is held back. Under a launcher with several ranks the
    ranks first agree (one ``allgather`` over ``COMM_WORLD``, which starts MPI):
    the lowest rank whose parsing ended prints what it printed, and every rank
    exits with that rank's status - also the ranks whose own checks passed, for
    a check of a file can fail on one rank only. A rank never waits for a rank
    that cannot answer: every rank reaches the agreement, whatever its parsing
    found (an exception other than a usage error is status 1, with its
    traceback). On one process the text is printed and the process exits.

    Where MPI sees one process but the launcher several (``srun --mpi=pmix``
    with an MPI that speaks only PMI-2: every task is a job of one) the tasks
    cannot agree; task 0 (the launcher's number) prints what it printed and
    :func:`unwired_hint`, the others nothing, and each exits with its own status.
    """
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    code: int | None = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            result = parse(argv)
        except SystemExit as exc:
            code = _status(exc.code)
        except Exception:  # noqa: BLE001 - a bug of the parsing: reported once, every rank exits 1, none waits
            import traceback

            code = 1
            err.write(traceback.format_exc())
    rank, size, variable = _launched(os.environ)
    codes = [code]
    alone = False  # MPI sees one process where the launcher started several
    if size > 1:
        from mpi4py import MPI

        alone = MPI.COMM_WORLD.Get_size() == 1
        if not alone:
            codes = MPI.COMM_WORLD.allgather(code)
            rank = MPI.COMM_WORLD.Get_rank()
    if alone:  # no agreement possible: task 0 speaks for the job, each task exits with its own status
        if code is None:
            return result
        if rank == 0:
            _release(out.getvalue(), err.getvalue() + unwired_hint(size, variable) + "\n")
        raise SystemExit(code)
    first = next((r for r, c in enumerate(codes) if c is not None), None)
    if first is None or first == rank:
        _release(out.getvalue(), err.getvalue())
    if first is None:
        return result
    status = int(codes[first] or 0)
    if size > 1:
        from .runtime import exit_agreed

        exit_agreed(status)
    raise SystemExit(status)
