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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Bucket", "Parameter", "FIRST_CAP_BYTES", "DEFAULT_CAP_MB", "plan", "ready_at"]

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
    """Elements ``[start, stop)`` of the flat gradient buffer; ready after layer ``ready_after``'s backward."""

    index: int
    start: int
    stop: int
    ready_after: int
    names: tuple[str, ...]

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
                                  min(p.layer for p in members), tuple(p.name for p in members)))
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
