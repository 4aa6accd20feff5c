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
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

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


#: The largest value a rank, size or count may take: MPI counts ranks in a C ``int``.
MAX_INT = 2**31 - 1
#: The most nodes a Slurm task list may describe when no node count bounds it (larger than any machine).
MAX_NODES = 1 << 20
_DIGITS = re.compile(r"[0-9]+")


def _int(env: Env, *names: str, minimum: int = 0) -> int | None:
    """The first of *names* set in *env*, as an int from *minimum* to :data:`MAX_INT`; None if none is set.

    Only plain decimal digits count: ``int()`` alone would also take ``"-1"``
    (a rank that indexes from the end), ``"+3"`` or ``"1_0"``.
    """
    for name in names:
        value = env.get(name)
        if value is None or value == "":
            continue
        text = value.strip()
        if not _DIGITS.fullmatch(text):
            raise ValueError(
                f"environment variable {name}={value!r} is not a non-negative integer; expected a whole number "
                f"from {minimum} to {MAX_INT}: unset it or fix the launcher configuration"
            )
        number = int(text)
        if not minimum <= number <= MAX_INT:
            raise ValueError(
                f"environment variable {name}={value!r} is out of range; expected a whole number from {minimum} "
                f"to {MAX_INT}: unset it or fix the launcher configuration"
            )
        return number
    return None


def _slurm_runs(spec: str, name: str = "SLURM_TASKS_PER_NODE", limit: int = MAX_NODES) -> list[tuple[int, int]]:
    """Slurm's compressed task list as ``(tasks, nodes)`` runs, unexpanded: ``"2(x3),1"`` → ``[(2, 3), (1, 1)]``.

    *limit* bounds the nodes the list may describe in all (the job's node
    count, else :data:`MAX_NODES`), so a corrupt ``1(x2000000000)`` is an error
    naming *name*, not a list of two billion entries.
    """
    expected = f"expected tasks per node as Slurm writes them, such as '2(x3),1', for at most {limit} node(s)"
    runs: list[tuple[int, int]] = []
    total = 0
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        found = re.fullmatch(r"([0-9]+)(?:\(x([0-9]+)\))?", part)
        if not found:
            raise ValueError(f"environment variable {name}={spec!r}: cannot parse {part!r}; {expected}")
        tasks, repeat = int(found.group(1)), int(found.group(2) or 1)
        if tasks > MAX_INT or repeat < 1:
            raise ValueError(f"environment variable {name}={spec!r}: {part!r} is out of range; {expected}")
        total += repeat
        if total > limit:
            raise ValueError(f"environment variable {name}={spec!r} describes {total} or more nodes; {expected}")
        runs.append((tasks, repeat))
    return runs


def slurm_tasks_per_node(spec: str, limit: int = MAX_NODES) -> list[int]:
    """Expand Slurm's compressed task list: ``"2(x3),1"`` → ``[2, 2, 2, 1]`` (at most *limit* entries).

    A list longer than *limit* nodes raises ``ValueError`` before anything is expanded.
    """
    return [tasks for tasks, repeat in _slurm_runs(spec, limit=limit) for _ in range(repeat)]


#: What each launcher sets, in the order launchers are consulted: the one that started
#: this process directly must win. Per field, the variable names to try in turn
#: (None: the launcher does not say). Fields: rank, size, local_rank, local_size, node, nodes.
LAUNCHERS: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...] | None,
                           tuple[str, ...] | None, tuple[str, ...] | None]] = {
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


#: The smallest value each field may take (sizes and counts are at least 1).
_MINIMUM = {"rank": 0, "size": 1, "local_rank": 0, "local_size": 1, "node": 0, "nodes": 1}


def _read(launcher: str, env: Env) -> dict | None:
    """The fields *launcher* sets in *env*, or None if it did not start this process."""
    names = LAUNCHERS[launcher]
    if (launcher == "torchrun" and "LOCAL_RANK" not in env) or _int(env, *names[0]) is None:
        return None
    values = {field: (None if n is None else _int(env, *n, minimum=_MINIMUM[field]))
              for field, n in zip(_FIELDS, names)}
    if launcher == "slurm":
        values["local_size"] = _slurm_local_size(env, values["node"])
    for index, total in (("rank", "size"), ("local_rank", "local_size")):
        below, bound = values[index], values[total]
        if below is not None and bound is not None and below >= bound:
            raise ValueError(
                f"launcher {launcher!r}: {index} {values[index]} ({_named(env, names, index)}) is not below "
                f"{total} {values[total]} ({_named(env, names, total)}); expected 0 <= {index} < {total}: fix "
                f"the launcher configuration or unset the stale variables"
            )
    return values


def _named(env: Env, names: tuple[tuple[str, ...] | None, ...], field: str) -> str:
    """Which variable gave *field* (``NAME='value'``), for error messages."""
    candidates = names[_FIELDS.index(field)] or ()
    if field == "local_size" and not candidates:
        candidates = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    for name in candidates:
        if env.get(name):
            return f"{name}={env[name]!r}"
    return "unset"


def _slurm_local_size(env: Env, node: int | None) -> int | None:
    """Tasks on node *node* from ``SLURM_(STEP_)TASKS_PER_NODE``, found without expanding the list."""
    name = "SLURM_STEP_TASKS_PER_NODE" if env.get("SLURM_STEP_TASKS_PER_NODE") else "SLURM_TASKS_PER_NODE"
    spec = env.get(name)
    if not spec or node is None:
        return None
    # No task list covers more nodes than the job has (the step's list fewer): the largest count bounds it.
    counts = [_int(env, n, minimum=1) for n in ("SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES")]
    limit = max([c for c in counts if c is not None], default=MAX_NODES)
    for tasks, repeat in _slurm_runs(spec, name, limit):
        if node < repeat:
            return tasks
        node -= repeat
    return None


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
