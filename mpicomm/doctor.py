"""What ``python -m mpicomm info`` checks beyond MPI: the optional packages and what each enables, the
``MPICOMM_*`` settings in force, and the shared memory killed jobs left behind.

The first place to look when something does not work ([Troubleshooting] in the documentation): a feature that
is missing because its package is, a variable set in a shell long ago, a ``/dev/shm`` filling up with MPICH's
segments. The optional packages are found without importing them (PyTorch alone takes seconds): their
presence from :mod:`importlib`, their versions from the installed distributions' metadata.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass

from . import cleanup

__all__ = ["Optional", "OPTIONAL", "packages", "settings", "stale_segments", "report"]


@dataclass(frozen=True)
class Optional:
    """An optional package: its import name, the distributions that provide it, its extra, what it enables."""

    module: str
    dists: tuple[str, ...]
    extra: str
    enables: str

    @property
    def name(self) -> str:
        """The name ``info`` prints: the distribution's (``scikit-learn``; ``cupy`` for any CuPy wheel)."""
        return self.dists[-1]


#: Every optional package mpicomm, its kernels and its applications use, in the order ``info`` prints them.
OPTIONAL = (
    Optional("torch", ("torch",), "torch", "the torch.distributed backend (import mpicomm.torch), apps.torchddp"),
    Optional("numba", ("numba",), "compiled", "the compiled CPU kernels: the stencil's fast path"),
    Optional("cupy", ("cupy-cuda12x", "cupy-cuda13x", "cupy"), "cuda12",
             "GPU buffers (CuPy arrays, CUDA tensors), --backend cupy"),
    Optional("matplotlib", ("matplotlib",), "plot", "the --plot pictures of benchmarks, schedules and applications"),
    Optional("sklearn", ("scikit-learn",), "digits", "apps.sgd's default data set (the digits)"),
)


def _version(package: Optional) -> str | None:
    """The installed version of *package*, ``"?"`` when it imports but no metadata says which; None if missing."""
    for dist in package.dists:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    try:
        found = importlib.util.find_spec(package.module) is not None
    except (ImportError, ValueError):  # a broken install, or a module set to None in sys.modules
        found = False
    return "?" if found else None


def packages() -> list[tuple[Optional, str | None]]:
    """Each optional package with its version (None: not installed)."""
    return [(package, _version(package)) for package in OPTIONAL]


def settings(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``MPICOMM_*`` variables set, by name."""
    environ = os.environ if environ is None else environ
    return {name: value for name, value in sorted(environ.items()) if name.startswith("MPICOMM_")}


def stale_segments(directory: str = cleanup.SHM_DIR) -> list[cleanup.Segment] | None:
    """This user's MPICH segments in *directory* no live process holds (:func:`mpicomm.cleanup.stale`); None
    where ``/proc`` cannot tell."""
    try:
        return cleanup.stale(directory)
    except RuntimeError:
        return None


def report(found: list[tuple[Optional, str | None]], variables: dict[str, str],
           stale: list[cleanup.Segment] | None, directory: str = cleanup.SHM_DIR) -> list[str]:
    """The lines ``info`` prints for these facts."""
    lines = ["optional packages (what each enables):"]
    for package, version in found:
        missing = f"missing: pip install -e '.[{package.extra}]'"
        lines.append(f"  {package.name:<13} {version or '-':<12} {package.enables}"
                     + ("" if version else f" - {missing}"))
    if variables:
        lines.append("settings       " + ", ".join(f"{name}={value}" for name, value in variables.items()))
    else:
        lines.append("settings       no MPICOMM_* variable set (the defaults)")
    if stale is None:
        lines.append(f"shared memory  cannot tell which segments in {directory} are stale (no /proc)")
    elif stale:
        size = sum(s.bytes for s in stale)
        lines.append(f"shared memory  {len(stale)} stale MPICH segment(s) in {directory}, {size / 2**20:.1f} MiB, "
                     f"left by jobs that did not end cleanly: python -m mpicomm cleanup")
    else:
        lines.append(f"shared memory  no stale MPICH segments in {directory}")
    return lines
