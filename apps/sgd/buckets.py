"""Gradient buckets: contiguous slices of the flat gradient buffer, in reverse layer order (pure, no MPI).

PyTorch DDP groups gradients into buckets in the reverse order of the parameters,
because backward produces them in that order: the last layer's gradients are final
first, so the bucket holding them can start its all-reduce while earlier layers are
still computing. The first bucket is capped at about 1 MiB (so communication starts
early; at the cap if that is smaller), the others at ``bucket_cap_mb`` (25 MiB by
default); a bucket is closed as
soon as it reaches its cap, so it may exceed it by up to one parameter.

The model keeps every gradient as a view into one flat buffer, laid out in forward
order, so a bucket - a run of consecutive parameters taken from the end - is one
contiguous slice ``grads[start:stop]``: reducing it copies nothing in or out.

A bucket is *ready* when the backward hook of the lowest layer owning one of its
parameters has fired (hooks fire for layers n−1 … 0). Buckets become ready in index
order, which is also the order every rank launches them in: launching out of order
on different ranks would pair different buckets in one collective.

ZeRO-2 keeps no full gradient buffer: bucket b's gradients live in one of a few
reused buffers, buffer ``b % S`` (:func:`in_flight` gives S, :func:`buffer_sizes`
their sizes). Backward writes into bucket b from the backward of its highest layer
(``written_from``) down to that of ``ready_after``; its collective then starts, and
the buffer is free again once that collective has completed. With one bucket per
layer and S = 2::

    backward of layer    3            2            1
    buffer 0             bucket 0  →  (reducing)   bucket 2 (once bucket 0 is done)
    buffer 1                          bucket 1  →  (reducing)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Bucket", "Parameter", "FIRST_CAP_BYTES", "DEFAULT_CAP_MB", "plan", "ready_at", "in_flight", "buffer_sizes"]

#: DDP's first bucket: small, so the first all-reduce starts as early as possible.
FIRST_CAP_BYTES = 1 << 20
#: DDP's ``bucket_cap_mb`` default.
DEFAULT_CAP_MB = 25.0


@dataclass(frozen=True)
class Parameter:
    """One parameter's place in the flat buffers: ``flat[start:stop]``, owned by layer ``layer``."""

    name: str
    start: int
    stop: int
    layer: int


@dataclass(frozen=True)
class Bucket:
    """Elements ``[start, stop)`` of the flat gradient buffer, written by the backward of layers
    ``written_from`` down to ``ready_after``; ready after layer ``ready_after``'s backward."""

    index: int
    start: int
    stop: int
    ready_after: int
    names: tuple[str, ...]
    written_from: int

    @property
    def size(self) -> int:
        return self.stop - self.start


def plan(parameters: Sequence[Parameter], itemsize: int, *, cap_mb: float = DEFAULT_CAP_MB,
         first_cap_bytes: int = FIRST_CAP_BYTES, per_parameter: bool = False) -> list[Bucket]:
    """The buckets of a model whose *parameters* are laid out in forward order, contiguously.

    ``per_parameter`` gives one bucket per parameter (what bucketing exists to avoid:
    one collective, with its latency, per tensor).
    """
    if cap_mb <= 0:
        raise ValueError(f"bucket cap {cap_mb} MB: must be > 0 (DDP's default is {DEFAULT_CAP_MB})")
    ordered = sorted(parameters, key=lambda p: p.start)
    for a, b in zip(ordered, ordered[1:]):
        if a.stop != b.start:
            raise ValueError(f"parameters {a.name} [{a.start}, {a.stop}) and {b.name} [{b.start}, {b.stop}) "
                             f"are not contiguous: buckets need one flat buffer")
    buckets: list[Bucket] = []
    members: list[Parameter] = []

    def close() -> None:
        if members:
            buckets.append(Bucket(len(buckets), members[-1].start, members[0].stop,
                                  min(p.layer for p in members), tuple(p.name for p in members),
                                  max(p.layer for p in members)))
            members.clear()

    for param in reversed(ordered):
        members.append(param)
        cap = min(first_cap_bytes, cap_mb * (1 << 20)) if not buckets else cap_mb * (1 << 20)
        if per_parameter or (members[0].stop - param.start) * itemsize >= cap:
            close()
    close()
    return buckets


def ready_at(buckets: Sequence[Bucket], layers: int) -> list[list[int]]:
    """``ready_at(...)[i]``: the buckets that become ready when layer i's backward hook fires."""
    table: list[list[int]] = [[] for _ in range(layers)]
    for b in buckets:
        table[b.ready_after].append(b.index)
    return table


def in_flight(buckets: Sequence[Bucket], *, overlap: bool = True) -> int:
    """S, the number of reused gradient buffers backward cycles through (ZeRO-2): bucket b uses buffer b % S.

    Bucket b takes over the buffer of bucket b − S, which is free once that
    bucket's collective has completed. That collective must at least have
    started when backward first writes into b - ``ready_after(b − S) >
    written_from(b)`` - or backward would wait for a collective that cannot
    start. The smallest such S is the number of buckets backward writes into at
    once (one, or two where a layer's parameters straddle two buckets); one
    buffer more lets a bucket's collective run while backward fills the next
    (double buffering, as DeepSpeed's ZeRO-2 does). Without *overlap* every
    collective starts after backward, so every bucket needs its own buffer.
    Never more than there are buckets.
    """
    n = len(buckets)
    if not overlap:
        return n
    s = 1
    while s < n and any(buckets[b - s].ready_after <= buckets[b].written_from for b in range(s, n)):
        s += 1
    return min(n, s + 1)


def buffer_sizes(buckets: Sequence[Bucket], slots: int) -> list[int]:
    """Elements of each of the *slots* reused buffers: buffer s holds buckets s, s + slots, …, sized for the largest."""
    return [max(b.size for b in buckets[s::slots]) for s in range(slots)]
