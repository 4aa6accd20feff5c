"""The command-line options the applications share, written once so that they read alike everywhere.

* Checkpoints (:func:`add_checkpoint_options`): ``--checkpoint-every K``
  (0: never), ``--checkpoint-dir DIR`` (default ``checkpoints/<app>``, so two
  applications never share a directory), ``--keep N`` (default 2) and
  ``--restart`` (resume from the newest valid checkpoint in the directory).
  The checkpoint format itself is :mod:`apps.checkpoint`'s.
* ``--hidden W[,W…]`` (:func:`hidden_widths`): the width of each hidden layer
  (:func:`hidden_width` where they are all alike, as in the pipeline's blocks).
* ``--backend numpy|cupy``: the array module (:data:`BACKENDS`).
* Errors (:func:`parse_or_exit`, :func:`exit_error`): usage errors are
  argparse's (``<prog>: error: …``, status 2), printed once per job by the
  lowest rank that found one, before the work starts; an error found once the
  run has started reads the same (:func:`mpicomm.cli.error_line`), printed once,
  and every rank exits with status 2 together.

The rest of the conventions (sizes, ``--json``, ``--out``, ``--repeat``) are
:mod:`mpicomm.cli`'s, shared with the library's own commands.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from mpicomm import cli

__all__ = ["BACKENDS", "bind_device", "DEFAULT_KEEP", "checkpoint_dir", "add_checkpoint_options", "check_checkpoint_options",
           "hidden_widths", "hidden_width", "parse_or_exit", "exit_error"]

#: ``--backend``: the array module, in every command that has one.
BACKENDS = ("numpy", "cupy")


def bind_device(comm: Any) -> int | None:
    """Bind this rank's GPU for ``--backend cupy`` (before anything is allocated): through the mpicomm
    communicator (``comm.bind_device()``: node-local rank modulo the visible GPUs, ``MPICOMM_DEVICE``
    overrides), or from the launcher's environment for a plain mpi4py one. The ordinal, or None without a GPU;
    ValueError naming ``MPICOMM_DEVICE`` when it names no visible GPU."""
    binder = getattr(comm, "bind_device", None)
    if binder is not None:
        return binder()
    from mpicomm.device import bind

    return bind()
#: ``--keep``'s default: the newest checkpoint and the one before it (if the newest is damaged, the run resumes
#: from the other).
DEFAULT_KEEP = 2

T = TypeVar("T")


def checkpoint_dir(app: str) -> str:
    """``checkpoints/<app>``: the default ``--checkpoint-dir`` of application *app* (relative to the working
    directory)."""
    return f"checkpoints/{app}"


def add_checkpoint_options(p: Any, app: str, unit: str = "steps", every: str | None = None,
                           restart: str | None = None, keep: bool = True) -> None:
    """``--checkpoint-every``, ``--checkpoint-dir``, ``--keep``, ``--restart`` on *p* (a parser or a group).

    *unit* names what ``--checkpoint-every`` counts; *every* and *restart*
    replace their help (an application with another rhythm, or more to say
    about resuming, says it); ``keep=False`` leaves ``--keep`` out (an
    application that writes one checkpoint per run).
    """
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="K",
                   help=every or f"write a checkpoint every K {unit} and at the end (default: 0, never)")
    p.add_argument("--checkpoint-dir", default=checkpoint_dir(app), metavar="DIR",
                   help=f"where checkpoints go (default: {checkpoint_dir(app)})")
    if keep:
        p.add_argument("--keep", type=int, default=DEFAULT_KEEP, metavar="N",
                       help=f"checkpoints kept in --checkpoint-dir, the newest (default: {DEFAULT_KEEP})")
    p.add_argument("--restart", action="store_true",
                   help=restart or "resume from the newest valid checkpoint in --checkpoint-dir")


def check_checkpoint_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The usage errors of the checkpoint options: ``--checkpoint-every`` >= 0, ``--keep`` >= 1, and
    ``--checkpoint-dir`` or ``--keep`` set for a run that neither checkpoints nor restarts (they would be
    ignored)."""
    cli.at_least(parser, args, 0, "--checkpoint-every")
    if hasattr(args, "keep"):
        cli.at_least(parser, args, 1, "--keep")
    if not args.checkpoint_dir:
        parser.error("--checkpoint-dir must name a directory, got ''")
    if not (args.checkpoint_every or args.restart):
        for option in ("--checkpoint-dir", "--keep"):
            dest = option[2:].replace("-", "_")
            if hasattr(args, dest) and getattr(args, dest) != parser.get_default(dest):
                parser.error(f"{option} applies to a run that checkpoints (--checkpoint-every K) or restarts "
                             f"(--restart); add one, or drop {option}")


def hidden_widths(text: str) -> tuple[int, ...]:
    """``--hidden``'s argparse type: ``"256,256"`` -> (256, 256), the width of each hidden layer."""
    try:
        widths = tuple(int(w) for w in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be the width of each hidden layer, comma-separated, such as 128,128; "
                                         f"got {text!r}") from None
    if min(widths) < 1:
        raise argparse.ArgumentTypeError(f"each width must be >= 1, got {text!r}")
    return widths


def hidden_width(text: str) -> int:
    """``--hidden``'s argparse type where every hidden layer has the same width (the pipeline's blocks): one width."""
    widths = hidden_widths(text)
    if len(set(widths)) != 1:
        raise argparse.ArgumentTypeError(f"must be one width (every block's hidden layers are alike), got {text!r}")
    return widths[0]


def parse_or_exit(parse: Callable[[list[str] | None], T], argv: list[str] | None) -> T:
    """``parse(argv)``; a usage error is printed once per job and every rank exits with its status
    (:func:`mpicomm.cli.parse_or_exit`)."""
    result: T = cli.parse_or_exit(parse, argv)
    return result


def exit_error(prog: str, message: str, rank: int = 0, size: int = 1) -> NoReturn:
    """Print ``<prog>: error: …`` once per job and exit with status 2, every rank together: for the errors every
    rank finds alike (see :mod:`apps.agree`). A rank whose peers never arrive names itself in the line."""
    from mpicomm.runtime import exit_together

    exit_together(2, cli.error_line(prog, message), alone=cli.error_line(prog, message, rank, size))
    raise AssertionError("exit_together returned")  # pragma: no cover - it exits
