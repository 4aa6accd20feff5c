"""Who am I, before MPI starts: rank and node layout read from the launcher's environment.

Every launcher tells each process where it sits through environment variables.
Reading them needs no MPI, so a program can pick its GPU, its log file or its
seed before ``MPI_Init`` (CUDA-aware MPI libraries want the device chosen
first). This module never imports ``mpi4py.MPI``.

Launchers are tried in the order of :data:`LAUNCHERS` (a table of the variables
each one sets): the one that started
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
from typing import Mapping

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


#: What each launcher sets, in the order launchers are consulted: the one that started
#: this process directly must win. Per field, the variable names to try in turn
#: (None: the launcher does not say). Fields: rank, size, local_rank, local_size, node, nodes.
LAUNCHERS: dict[str, tuple[tuple[str, ...] | None, ...]] = {
    "openmpi": (("OMPI_COMM_WORLD_RANK",), ("OMPI_COMM_WORLD_SIZE",), ("OMPI_COMM_WORLD_LOCAL_RANK",),
                ("OMPI_COMM_WORLD_LOCAL_SIZE",), None, None),
    "mvapich": (("MV2_COMM_WORLD_RANK",), ("MV2_COMM_WORLD_SIZE",), ("MV2_COMM_WORLD_LOCAL_RANK",),
                ("MV2_COMM_WORLD_LOCAL_SIZE",), None, None),
    # MPICH's and Intel MPI's hydra. srun --mpi=pmi2 sets PMI_RANK/PMI_SIZE too, but no local
    # ranks: Slurm's entry, which agrees on the rank, fills them in.
    "hydra": (("PMI_RANK",), ("PMI_SIZE",), ("MPI_LOCALRANKID",), ("MPI_LOCALNRANKS",), None, None),
    # Slurm's local size comes from SLURM_(STEP_)TASKS_PER_NODE, read in _slurm_local_size.
    "slurm": (("SLURM_PROCID",), ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"), ("SLURM_LOCALID",),
              None, ("SLURM_NODEID",), ("SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES")),
    # A lone RANK is too common a name: torchrun counts only with LOCAL_RANK beside it.
    "torchrun": (("RANK",), ("WORLD_SIZE",), ("LOCAL_RANK",), ("LOCAL_WORLD_SIZE",), ("GROUP_RANK",),
                 ("GROUP_WORLD_SIZE",)),
}
_FIELDS = ("rank", "size", "local_rank", "local_size", "node", "nodes")


def _read(launcher: str, env: Env) -> dict | None:
    """The fields *launcher* sets in *env*, or None if it did not start this process."""
    names = LAUNCHERS[launcher]
    if _int(env, *names[0]) is None or (launcher == "torchrun" and "LOCAL_RANK" not in env):
        return None
    values = {field: (None if n is None else _int(env, *n)) for field, n in zip(_FIELDS, names)}
    if launcher == "slurm":
        values["local_size"] = _slurm_local_size(env, values["node"])
    return values


def _slurm_local_size(env: Env, node: int | None) -> int | None:
    spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if not spec or node is None:
        return None
    try:
        per_node = slurm_tasks_per_node(spec)
    except ValueError:
        raise ValueError(f"cannot parse SLURM_(STEP_)TASKS_PER_NODE={spec!r}; expected e.g. '2(x3),1'") from None
    return per_node[node] if node < len(per_node) else None


def from_environment(environ: Env | None = None) -> LaunchInfo:
    """Read this process's rank and node layout from the launcher's environment.

    Returns a singleton layout (rank 0 of 1, launcher ``"none"``) when no known
    launcher variables are set. Missing fields of the winning launcher are
    filled from later launchers that agree on the rank (``srun --mpi=pmi2``
    gives ``PMI_RANK`` and Slurm's local ids together).
    """
    env = os.environ if environ is None else environ
    found: list[tuple[str, dict]] = []
    for name in LAUNCHERS:
        values = _read(name, env)
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
