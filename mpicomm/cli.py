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
- ``--out FILE``: reports only; :func:`add_out` adds ``--out``, ``--append``
  and ``--force`` and :func:`check_out` refuses to replace an existing report
  without ``--force``.

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
           "format_size", "format_time", "Progress", "add_json", "add_out", "check_out", "command_line",
           "versions", "document", "write_json", "pyplot"]

#: The ``schema`` field of every ``--json`` document, and its version (raised when a field changes meaning).
SCHEMA = "mpicomm-results"
SCHEMA_VERSION = 1

#: How microseconds are written in every table header and line.
US = "µs"

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)(?:[eE]([+]?\d+))?\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)


def parse_size(text: str | int, what: str = "size", minimum: int = 1) -> int:
    """Bytes (or elements) from ``4096``, ``64K``, ``64KiB``, ``64kb``, ``1M``, ``1.5G``, ``1e6``.

    K, M, G, T (with or without ``iB``/``B``) are powers of 1024; ``1e6`` is
    10⁶. The result must be a whole number ≥ *minimum*; anything else raises
    ValueError naming *what*, the value and the accepted forms.
    """
    if isinstance(text, bool) or not isinstance(text, (int, str)):
        raise ValueError(f"{what} {text!r}: expected a size such as 4096, 64K, 64KiB, 1M or 1e6")
    if isinstance(text, int):
        value = text
    else:
        m = _SIZE.match(text)
        if not m or (m.group(2) and m.group(3)):
            raise ValueError(f"{what} {text!r}: not a size; write a number with an optional unit K, M, G or T "
                             f"(powers of 1024, KiB etc. also accepted) or in exponent form, e.g. 4096, 64K, "
                             f"64KiB, 1M, 1.5G, 1e6")
        try:
            exact = float(m.group(1)) * 10.0 ** int(m.group(2) or 0) * _UNITS[m.group(3).upper()]
            if not math.isfinite(exact):
                raise OverflowError
            value = int(exact)
        except OverflowError:
            raise ValueError(f"{what} {text!r}: too large to be a size") from None
        if value != exact:
            raise ValueError(f"{what} {text!r} is {exact:g}, not a whole number")
    if value < minimum:
        raise ValueError(f"{what} {text!r}: must be >= {minimum}")
    return value


def size_arg(text: str) -> int:
    """:func:`parse_size` as an argparse ``type=`` (its message becomes the usage error)."""
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_sizes(text: str, what: str = "sizes", minimum: int = 1) -> list[int]:
    """``"8:1M"`` → 8, 16, 32 … 1 MiB (doubling from the first size); ``"8,100,4K"`` → those sizes, in order."""
    if ":" in text:
        low, high = (parse_size(t, what, minimum) for t in text.split(":", 1))
        if low > high:
            raise ValueError(f"{what} {text!r}: the first size is larger than the last")
        out, size = [], low
        while size <= high:
            out.append(size)
            size = size * 2 if size else 1
        return out
    return [parse_size(t, what, minimum) for t in text.split(",")]


def sizes_arg(text: str) -> list[int]:
    """:func:`parse_sizes` as an argparse ``type=``."""
    try:
        return parse_sizes(text)
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


def add_out(parser: argparse.ArgumentParser, what: str = "the report") -> None:
    """``--out FILE``, ``--append``, ``--force``: *what* as Markdown; an existing file needs --append or --force."""
    parser.add_argument("--out", metavar="FILE.md", default=None,
                        help=f"also write {what}, the command and the machine to this Markdown file "
                             f"(an existing file is kept unless --append or --force)")
    parser.add_argument("--append", action="store_true", help="with --out: add to the end of the file")
    parser.add_argument("--force", action="store_true", help="with --out: replace the file if it exists")


def check_out(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The usage error for ``--append``/``--force`` without ``--out``, or an ``--out`` that would be replaced."""
    out = getattr(args, "out", None)
    if getattr(args, "append", False) and getattr(args, "force", False):
        parser.error("--append and --force: choose one (add to the report, or replace it)")
    if (getattr(args, "append", False) or getattr(args, "force", False)) and not out:
        parser.error("--append and --force need --out FILE.md")
    if out and os.path.exists(out) and not (args.append or args.force):
        parser.error(f"--out {out} exists; add --append to add this report to it, or --force to replace it")


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
