"""Who am I, before MPI starts: rank and node layout read from the launcher's environment.

Every launcher tells each process where it sits through environment variables.
Reading them needs no MPI, so a program can pick its GPU, its log file or its
seed before ``MPI_Init`` (CUDA-aware MPI libraries want the device chosen
first). This module never imports ``mpi4py.MPI``.

Launchers are tried in the order of :data:`LAUNCHERS`: the one that started
*this* process directly wins. Inside a Slurm allocation, ``mpiexec`` (hydra)
starts its proxies with ``srun``, so ``SLURM_PROCID`` there is a proxy index,
not a rank; hydra's ``PMI_RANK`` is therefore consulted before Slurm's.

Once MPI is up, :class:`mpicomm.Comm` derives the same values from MPI itself
(``Split_type(COMM_TYPE_SHARED)``); the test suite checks the two agree.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Callable, Mapping

__all__ = ["LaunchInfo", "from_environment", "LAUNCHERS"]


@dataclass(frozen=True)
class LaunchInfo:
    """Position of this process as the launcher described it.

    Fields the launcher does not provide are ``None`` (hydra, for instance,
    does not number nodes).
    """

    launcher: str
    rank: int
    size: int
    local_rank: int | None
    local_size: int | None
    node: int | None
    nodes: int | None
    host: str


Env = Mapping[str, str]


def _int(env: Env, *names: str) -> int | None:
    for name in names:
        value = env.get(name)
        if value is None or value == "":
            continue
        try:
            return int(value)
        except ValueError:
            raise ValueError(
                f"environment variable {name}={value!r} is not an integer; "
                f"unset it or fix the launcher configuration"
            ) from None
    return None


def slurm_tasks_per_node(spec: str) -> list[int]:
    """Expand Slurm's compressed task list: ``"2(x3),1"`` → ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        if "(x" in part:
            value, repeat = part.rstrip(")").split("(x")
            counts.extend([int(value)] * int(repeat))
        else:
            counts.append(int(part))
    return counts


def _slurm(env: Env) -> dict | None:
    rank = _int(env, "SLURM_PROCID")
    if rank is None:
        return None
    node = _int(env, "SLURM_NODEID")
    local_size = None
    spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if spec and node is not None:
        try:
            per_node = slurm_tasks_per_node(spec)
        except ValueError:
            raise ValueError(
                f"cannot parse SLURM_(STEP_)TASKS_PER_NODE={spec!r}; expected e.g. '2(x3),1'"
            ) from None
        if node < len(per_node):
            local_size = per_node[node]
    return dict(
        rank=rank,
        size=_int(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"),
        local_rank=_int(env, "SLURM_LOCALID"),
        local_size=local_size,
        node=node,
        nodes=_int(env, "SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES"),
    )


def _openmpi(env: Env) -> dict | None:
    rank = _int(env, "OMPI_COMM_WORLD_RANK")
    if rank is None:
        return None
    return dict(
        rank=rank,
        size=_int(env, "OMPI_COMM_WORLD_SIZE"),
        local_rank=_int(env, "OMPI_COMM_WORLD_LOCAL_RANK"),
        local_size=_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE"),
        node=None,
        nodes=None,
    )


def _mvapich(env: Env) -> dict | None:
    rank = _int(env, "MV2_COMM_WORLD_RANK")
    if rank is None:
        return None
    return dict(
        rank=rank,
        size=_int(env, "MV2_COMM_WORLD_SIZE"),
        local_rank=_int(env, "MV2_COMM_WORLD_LOCAL_RANK"),
        local_size=_int(env, "MV2_COMM_WORLD_LOCAL_SIZE"),
        node=None,
        nodes=None,
    )


def _hydra(env: Env) -> dict | None:
    # MPICH's and Intel MPI's hydra; srun --mpi=pmi2 sets PMI_RANK/PMI_SIZE too,
    # but not MPI_LOCALRANKID, so Slurm's entry fills the gaps below.
    rank = _int(env, "PMI_RANK")
    if rank is None:
        return None
    return dict(
        rank=rank,
        size=_int(env, "PMI_SIZE"),
        local_rank=_int(env, "MPI_LOCALRANKID"),
        local_size=_int(env, "MPI_LOCALNRANKS"),
        node=None,
        nodes=None,
    )


def _torchrun(env: Env) -> dict | None:
    rank = _int(env, "RANK")
    if rank is None or "LOCAL_RANK" not in env:
        return None
    return dict(
        rank=rank,
        size=_int(env, "WORLD_SIZE"),
        local_rank=_int(env, "LOCAL_RANK"),
        local_size=_int(env, "LOCAL_WORLD_SIZE"),
        node=_int(env, "GROUP_RANK"),
        nodes=_int(env, "GROUP_WORLD_SIZE"),
    )


#: Launchers in the order they are consulted: (name, reader).
LAUNCHERS: list[tuple[str, Callable[[Env], dict | None]]] = [
    ("openmpi", _openmpi),
    ("mvapich", _mvapich),
    ("hydra", _hydra),
    ("slurm", _slurm),
    ("torchrun", _torchrun),
]


def from_environment(environ: Env | None = None) -> LaunchInfo:
    """Read this process's rank and node layout from the launcher's environment.

    Returns a singleton layout (rank 0 of 1, launcher ``"none"``) when no known
    launcher variables are set. Missing fields of the winning launcher are
    filled from later launchers that agree on the rank (``srun --mpi=pmi2``
    gives ``PMI_RANK`` and Slurm's local ids together).
    """
    env = os.environ if environ is None else environ
    found: list[tuple[str, dict]] = []
    for name, reader in LAUNCHERS:
        values = reader(env)
        if values is not None:
            found.append((name, values))
    host = env.get("SLURMD_NODENAME") or socket.gethostname()
    if not found:
        return LaunchInfo("none", 0, 1, 0, 1, 0, 1, host)
    launcher, merged = found[0]
    merged = dict(merged)
    for _, other in found[1:]:
        if other["rank"] != merged["rank"]:
            continue
        for key, value in other.items():
            if merged.get(key) is None and value is not None:
                merged[key] = value
    if merged.get("size") is None:
        raise ValueError(
            f"launcher {launcher!r} gave rank {merged['rank']} but no world size; "
            f"check the launcher's environment (e.g. PMI_SIZE, SLURM_NTASKS, WORLD_SIZE)"
        )
    return LaunchInfo(launcher=launcher, host=host, **merged)
