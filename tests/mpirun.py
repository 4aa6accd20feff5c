"""Start MPI jobs from tests and from the suite's runner: one place for the launcher command line.

Every job gets a wall-clock limit twice over: hydra's ``MPIEXEC_TIMEOUT``
(which kills all ranks and reports it) and a hard kill of the launcher's whole
process group a few seconds later, should the launcher itself hang.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass

__all__ = ["mpiexec_path", "flavor", "command", "run", "clean_env", "job_env", "Result", "NETWORK"]

#: Environment that keeps the PyPI MPICH's traffic between simulated hosts (network namespaces on one
#: kernel) on TCP: the OFI netmod's tcp provider. The default UCX netmod would find shared memory across
#: the namespaces; restricted with UCX_TLS=tcp,self it lost wildcard (ANY_SOURCE) receives in about one
#: run in three here, which hung the rendezvous (a plain mpi4py program of 4 ranks, each serving one
#: wildcard request and answering it, hangs the same way with MPICH 5.0.2 from PyPI, and never on shared
#: memory, OFI/TCP or UCX's default transports). Hosts keep MPICH's own shared memory inside each host.
NETWORK = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"}

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Variables a launcher sets for its ranks; a job started from inside a rank must not inherit them.
_LAUNCHER_VARS = ("PMI_", "PMIX_", "HYDI_", "HYDRA_", "MPI_LOCAL", "OMPI_COMM_WORLD", "OMPI_MCA_", "PRTE_", "MPIEXEC_")


def mpiexec_path() -> str:
    """The ``mpiexec`` of this Python's environment (the PyPI MPICH/Open MPI), else the one on PATH."""
    here = os.path.dirname(sys.executable)
    found = shutil.which("mpiexec", path=here + os.pathsep + os.environ.get("PATH", ""))
    if not found:
        raise FileNotFoundError(
            "no mpiexec found next to this Python or on PATH; install an MPI runtime: pip install -e '.[mpich]'"
        )
    return found


@functools.cache
def flavor() -> str:
    """``"hydra"`` (MPICH, Intel MPI) or ``"openmpi"``."""
    try:
        out = subprocess.run([mpiexec_path(), "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "hydra"
    return "openmpi" if ("Open MPI" in out or "OpenRTE" in out or "PRRTE" in out or "prterun" in out) else "hydra"


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment without the enclosing launcher's per-rank variables, plus *extra*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_VARS)}
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra or {})
    return env


#: A ``sitecustomize`` that makes ``import torch`` fail as where torch is not installed, in every process that
#: imports it (the commands a test starts, and theirs): see :func:`without_torch`.
BLOCK_TORCH = '''import importlib.abc
import importlib.machinery
import sys


class _NoTorch(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        return importlib.machinery.ModuleSpec(name, self) if name.split(".")[0] == "torch" else None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        raise ModuleNotFoundError(f"No module named {module.__name__!r}", name=module.__name__)


sys.meta_path.insert(0, _NoTorch())
'''


def without_torch(directory: os.PathLike[str] | str) -> dict[str, str]:
    """The environment entries (``PYTHONPATH``) under which PyTorch cannot be imported, as where the torch extra is
    not installed; the hook goes to *directory*, made if absent."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "sitecustomize.py"), "w", encoding="utf-8") as f:
        f.write(BLOCK_TORCH)
    rest = clean_env().get("PYTHONPATH", REPO)
    return {"PYTHONPATH": os.pathsep.join([str(directory), rest])}


def job_env(extra: dict[str, str] | None = None, timeout: float | None = None) -> dict[str, str]:
    """The environment for a launcher started by a test: :func:`clean_env`, limits, Open MPI as root."""
    env = clean_env(extra)
    if timeout:
        env["MPIEXEC_TIMEOUT"] = str(int(timeout))  # hydra's limit (Open MPI gets --timeout)
    if flavor() == "openmpi" and hasattr(os, "geteuid") and os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")  # CI containers run as root
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env


def command(
    n: int, argv: list[str], hosts: str | None = None, launcher: str | None = None, timeout: float | None = None
) -> list[str]:
    """The launcher command line for *n* ranks running *argv* (``hosts``: hydra ``-hosts`` list)."""
    cmd = [mpiexec_path()]
    if flavor() == "openmpi":
        cmd += ["--oversubscribe"]  # more ranks than cores is fine for tests
        if timeout:
            cmd += ["--timeout", str(int(timeout))]
    if launcher:
        cmd += ["-launcher", launcher]
    if hosts:
        cmd += ["-hosts", hosts]
    return cmd + ["-n", str(n)] + argv


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool


def run(
    n: int,
    argv: list[str],
    *,
    timeout: float = 120,
    hosts: str | None = None,
    launcher: str | None = None,
    env: dict[str, str] | None = None,
    capture: bool = True,
    launcher_args: list[str] | None = None,
    prefix: list[str] | None = None,
) -> Result:
    """Run an MPI job of *n* ranks; never longer than *timeout* seconds (plus a few to clean up).

    *launcher_args* go right after ``mpiexec`` (e.g. ``-launcher-exec WRAPPER``); *prefix* runs the
    launcher through another command (e.g. ``nsenter --net=…``).
    """
    import time

    full_env = job_env(env, timeout)
    cmd = command(n, argv, hosts, launcher, timeout)
    cmd[1:1] = launcher_args or []
    cmd[:0] = prefix or []
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=full_env,
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.PIPE if capture else None,
        text=True,
        start_new_session=True,
    )
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout + 15)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    return Result(proc.returncode, out or "", err or "", time.monotonic() - start, timed_out)
