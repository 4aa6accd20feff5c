"""Argument checks at the public boundary: peers and tags.

Each raises ``TypeError``/``ValueError`` naming the argument, the bad value and
the fix, and runs before anything is sent, so no peer is left waiting.
(Array checks live with the buffers: :func:`mpicomm.buffers.check_array`.)
"""

from __future__ import annotations

import numbers

from mpi4py import MPI

from .requests import barrier

__all__ = ["check_peer", "check_tag", "check_int", "check_span", "agree"]


def check_int(value: object, name: str) -> int:
    """*value* as an int; TypeError for bools, floats and non-numbers."""
    if type(value) is int:  # the common case, cheaply
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__qualname__})")
    return int(value)


def check_peer(value: object, name: str, size: int, *, any_source: bool = False) -> int:
    """A peer rank: 0..size-1 or ``MPI.PROC_NULL`` (and ``MPI.ANY_SOURCE`` for receives)."""
    rank = check_int(value, name)
    if 0 <= rank < size or rank == MPI.PROC_NULL or (any_source and rank == MPI.ANY_SOURCE):
        return rank
    also = ", MPI.ANY_SOURCE" if any_source else ""
    raise ValueError(
        f"{name}={rank} is not a rank of this communicator of size {size}; "
        f"use 0..{size - 1}, MPI.PROC_NULL{also}"
    )


def check_tag(value: object, name: str, tag_ub: int, *, any_tag: bool = False) -> int:
    """A message tag: 0..tag_ub (and ``MPI.ANY_TAG`` for receives)."""
    tag = check_int(value, name)
    if 0 <= tag <= tag_ub or (any_tag and tag == MPI.ANY_TAG):
        return tag
    also = " or MPI.ANY_TAG" if any_tag else ""
    raise ValueError(f"{name}={tag} is not a valid tag; use 0..{tag_ub} (this MPI's TAG_UB){also}")


def check_span(offset: int, count: int, size: int, where: str) -> None:
    """Elements [offset, offset+count) must lie inside *where*, which has *size* elements."""
    if offset < 0 or count < 0 or offset + count > size:
        raise ValueError(
            f"elements [{offset}, {offset + count}) are outside {where}, which has {size} elements; "
            f"use 0 <= offset and offset + count <= {size}"
        )


def agree(comm: MPI.Intracomm, problem: str | None, what: str, payload: object = None) -> list:
    """Collective: share each rank's local problem (None when fine) and *payload*.

    If any rank has a problem, raise the same ValueError, naming every bad
    rank, on every rank; else return every rank's payload. Used before a
    collective operation that a local error would otherwise leave half-entered.
    """
    barrier(comm)  # everyone has arrived, this rank's pending requests served meanwhile
    shared = comm.allgather((problem, payload))
    bad = [(r, p) for r, (p, _) in enumerate(shared) if p is not None]
    if bad:
        raise ValueError(f"{what}: " + "; ".join(f"rank {r}: {p}" for r, p in bad))
    return [payload for _, payload in shared]
