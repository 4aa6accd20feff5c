"""Removing the shared-memory segments MPICH leaves in ``/dev/shm`` when a job ends abnormally.

MPICH (ch4) puts each node's intra-node queues in a file in ``/dev/shm``
named ``mpich_shm_<hash>_<n>`` (``<hash>``: the FNV-1a hash of the PMI job
name; ``mpich_vci_<hash>_<n>`` for extra virtual communication interfaces),
2 to 4 MiB each, and unlinks it in ``MPI_Finalize``. A job that ends any other
way - ``MPI_Abort``, a killed rank, a time limit - leaves the file behind, and
``/dev/shm`` is memory: the files add up until jobs fail to start.

A segment is *stale* when no live process uses it: none maps it (its
``/proc/PID/maps``) and none holds it open (its ``/proc/PID/fd``). Every rank
of a running job keeps its segment mapped from ``MPI_Init`` to
``MPI_Finalize``, and the rank that creates it holds it open from the moment
the file exists, so a segment a live process uses is never stale. Only files
this user owns are considered; processes this user may not inspect cannot use
them either (MPICH creates them readable by their owner only). Processes in
another PID namespace (a container sharing this ``/dev/shm``) are invisible
here: run the cleanup where the jobs run.

:func:`remove_own_segments` is for a process that is about to abort its job:
it unlinks the segments it maps itself (the memory stays until every rank
has unmapped it), so an aborted job leaves nothing behind.

This module uses the standard library only and never starts MPI.
"""

from __future__ import annotations

import fnmatch
import os
import time
from dataclasses import dataclass

__all__ = ["Segment", "SHM_DIR", "PATTERNS", "segments", "in_use", "stale", "remove", "remove_own_segments"]

#: Where POSIX shared memory lives on Linux.
SHM_DIR = "/dev/shm"
#: The names MPICH gives its shared-memory segments.
PATTERNS = ("mpich_shm_*", "mpich_vci_*")


@dataclass(frozen=True)
class Segment:
    """One MPICH segment file: where it is, its size in bytes and its age in seconds (since last modified)."""

    path: str
    bytes: int
    age: float
    inode: tuple[int, int]  #: (device, inode): what ``/proc`` names when a process maps or opens it


def segments(directory: str = SHM_DIR, uid: int | None = None) -> list[Segment]:
    """The MPICH segments in *directory* owned by *uid* (default: this user), sorted by path."""
    uid = os.getuid() if uid is None else uid
    now = time.time()
    found = []
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return []
    for entry in entries:
        if not any(fnmatch.fnmatchcase(entry.name, p) for p in PATTERNS):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue  # its job finished meanwhile
        if not entry.is_file(follow_symlinks=False) or st.st_uid != uid:
            continue
        found.append(Segment(entry.path, st.st_size, max(0.0, now - st.st_mtime), (st.st_dev, st.st_ino)))
    return sorted(found, key=lambda s: s.path)


def _pids() -> list[str]:
    try:
        return [name for name in os.listdir("/proc") if name.isdigit()]
    except FileNotFoundError:  # no procfs: nothing can be told apart, so in_use() reports None
        return []


def in_use(directory: str = SHM_DIR) -> set[tuple[int, int]] | None:
    """(device, inode) of every file under *directory* some live process maps or holds open.

    None when ``/proc`` cannot be read at all (then nothing may be called stale).
    """
    if not os.path.isdir("/proc/self/fd"):
        return None
    try:
        device = os.stat(directory).st_dev
    except FileNotFoundError:
        return set()
    prefix = os.path.realpath(directory).rstrip("/") + "/"
    used: set[tuple[int, int]] = set()
    for pid in _pids():
        base = f"/proc/{pid}"
        try:
            with open(f"{base}/maps", encoding="utf-8", errors="replace") as maps:
                for line in maps:
                    # address perms offset dev inode path: the inode names the file even once renamed or deleted
                    fields = line.split(None, 5)
                    if len(fields) == 6 and fields[5].startswith(prefix) and fields[4] != "0":
                        used.add((device, int(fields[4])))
        except (OSError, ValueError):
            pass  # gone meanwhile, or not ours to read (then it cannot open this user's 0600 files either)
        try:
            fds = os.listdir(f"{base}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if not os.readlink(f"{base}/fd/{fd}").startswith(prefix):
                    continue
                st = os.stat(f"{base}/fd/{fd}")  # follows the magic link: the open file itself
            except OSError:
                continue
            used.add((st.st_dev, st.st_ino))
    return used


def stale(directory: str = SHM_DIR) -> list[Segment]:
    """This user's MPICH segments in *directory* that no live process maps or holds open."""
    candidates = segments(directory)
    if not candidates:
        return []
    used = in_use(directory)
    if used is None:
        raise RuntimeError(
            f"cannot read /proc, so cannot tell which segments in {directory} live processes use; nothing removed "
            f"(run this on Linux with procfs mounted)"
        )
    return [s for s in candidates if s.inode not in used]


def remove(found: list[Segment]) -> list[Segment]:
    """Unlink *found*; return those removed here (one that vanished meanwhile is not counted)."""
    removed = []
    for segment in found:
        try:
            st = os.stat(segment.path, follow_symlinks=False)
            if (st.st_dev, st.st_ino) != segment.inode:
                continue  # replaced by a new file of the same name since it was found: not the stale one
            os.unlink(segment.path)
        except FileNotFoundError:
            continue
        removed.append(segment)
    return removed


def remove_own_segments(directory: str = SHM_DIR) -> int:
    """Unlink the MPICH segments this process maps; return how many (for a process about to abort its job).

    The other ranks keep their mappings (the memory is freed when the last one
    unmaps), so this is safe at any point of an abort; a file that is already
    gone is skipped. Never raises.
    """
    try:
        prefix = os.path.realpath(directory).rstrip("/") + "/"
        names = set()
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                fields = line.split(None, 5)
                if len(fields) == 6 and fields[5].startswith(prefix):
                    path = fields[5].rstrip("\n")
                    if any(fnmatch.fnmatchcase(os.path.basename(path), p) for p in PATTERNS):
                        names.add(path)
        count = 0
        for path in names:
            try:
                os.unlink(path)
                count += 1
            except OSError:
                pass
        return count
    except Exception:  # noqa: BLE001 - best effort on the way to MPI_Abort
        return 0
