"""The JSON report every application writes with ``--json FILE``: one :func:`mpicomm.cli.document`.

The document's ``command`` is how to repeat the run - the settings from the
environment that change what it measures, the launcher with the rank count
and the command line (``MPICOMM_TIMEOUT=60 mpiexec -n 4 python -m apps.stencil
--size 8K``) - and ``ranks`` is a field of its own; the rest is the
application's ``results`` and fields.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from typing import Any

from mpicomm import cli

__all__ = ["SETTINGS", "environment", "command", "write_json"]

#: Environment variables that change what a run does or measures: mpicomm's own (algorithms, the torch
#: backend's progress mode...), MPICH's tuning and the thread count. Reports show the ones set.
SETTINGS = ("MPICOMM_", "MPIR_CVAR_", "OMP_NUM_THREADS")


def environment() -> dict[str, str]:
    """The settings of :data:`SETTINGS` present in this process's environment (the test harness's excepted)."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(SETTINGS) and not k.startswith("MPICOMM_TEST_")}


def command(prog: str, argv: Sequence[str] | None, ranks: int, settings: dict[str, str] | None = None) -> str:
    """``[VAR=value …] mpiexec -n RANKS PROG ARGS``: how to repeat this run (*argv* None: this process's)."""
    prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in (settings or {}).items())
    return f"{prefix}mpiexec -n {ranks} {cli.command_line(prog, argv)}"


def write_json(path: str, prog: str, argv: Sequence[str] | None, ranks: int, results: Any, /,
               settings: dict[str, str] | None = None, **fields: Any) -> None:
    """Write the run's ``--json`` document (rank 0 calls it): :func:`command` as its command, ``ranks`` and
    *fields* beside *results*."""
    cli.write_json(path, command(prog, argv, ranks, settings), results, ranks=ranks, **fields)
