"""Argument checks at the public boundary: peers and tags; and what validation checks, on and off.

Each raises ``TypeError``/``ValueError`` naming the argument, the bad value and
the fix, and runs before anything is sent, so no peer is left waiting.
(Array checks live with the buffers: :func:`mpicomm.transport.buffers.check_array`.)

What a collective checks
------------------------

Every rank first reads its own arguments (``mpicomm.coll.arguments``,
``mpicomm.collectives``). These **local checks** run whatever
``MPICOMM_VALIDATE`` says:

* each buffer: an array or buffer object, C-contiguous, a receive buffer
  writable, an element type mpicomm moves (or, for a spec the MPI library
  runs, one mpi4py can map - not object arrays or bare structured dtypes),
  native byte order, the spec's shape (``[buf, count, datatype]``...),
  counts ≥ 0 and within the buffer, displacements within the buffer;
* on this rank: send and receive element types equal, send and receive
  counts consistent (allreduce, gather on the root, alltoall blocks,
  reduce_scatter sums...), per-rank counts and displacements one per rank;
* send and receive buffers that *partly* overlap (the same bytes stay
  allowed, as in place), and receive blocks of a v-spec that overlap;
* the root: an integer, a rank of the communicator (not ``PROC_NULL``);
  in place only where the collective allows it, and only on the root for
  rooted collectives;
* the op: known (name, ``MPI.Op``, ufunc, callable), defined on the element
  type, not one-sided-only; the algorithm: registered, allowed for this
  call (a commutative-only algorithm refuses a non-commutative op);
* two threads inside calls on one communicator at once (refused; the
  communicator then refuses every further call).

Creating a ``Comm`` also compares the settings that change the protocol
(``MPICOMM_VALIDATE``, ``MPICOMM_<COLLECTIVE>_ALGORITHM``) across its ranks,
whatever they say (:func:`mpicomm.config.protocol_mismatch`).

**Validation on** (``MPICOMM_VALIDATE=1``, the default): before any data
moves, the ranks agree (``mpicomm.coll.agreement``; one 32-byte allreduce,
a second exchange only when something differs). A local problem on any rank,
or any difference between ranks in the collective, its count, element type,
root, op (name, commutativity, and a user function's code), algorithm, the
cross-rank counts of the v-forms (gatherv/scatterv against the root's counts,
allgatherv and reduce_scatter counts alike everywhere, the alltoallv count
matrix), or whether a spec goes to the MPI library, raises the same
:class:`~mpicomm.ArgumentError` on every rank. The agreement cannot see: a
rank that never calls the collective at all (it waits: set
``MPICOMM_TIMEOUT``), values (NaNs...), a user op's behaviour beyond its
code and plain closed-over values, and displacements that differ between
ranks where MPI allows it.

**Validation off** (``MPICOMM_VALIDATE=0``): only the local checks above run,
and a local problem raises on *that rank only*, before it sends anything -
the other ranks enter the collective and wait for it. Nothing is compared
across ranks: a different collective, count, element type, root, op or
algorithm on one rank, mismatched v-form counts, or a spec only some ranks
hand to the MPI library are not detected, and the call then **hangs or
returns wrong data on some ranks** (MPI's own behaviour for erroneous
programs). The hang watchdog (``MPICOMM_TIMEOUT=seconds``) turns a hang
into a report - the stuck call (collective, sequence number, algorithm,
count, element type, op, root), which peers never sent or took a message,
which ranks never arrived, and every rank's last calls (the flight recorder)
- and aborts the job. Turn validation off only for programs already run
with it on.
"""

from __future__ import annotations

import numbers

from mpi4py import MPI

__all__ = ["check_peer", "check_tag", "check_int", "check_span"]


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
