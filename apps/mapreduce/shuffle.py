"""The shuffle: pairs packed into contiguous columns, sent to their owner ranks with all-to-all-v in rounds.

Why columns: one pickled message per pair costs microseconds each and a Python
object per byte sent; here a batch of pairs is a few NumPy arrays (a ``hash``
column, the keys, the values), built with C-level joins and ``np.fromiter``, and a
round is one ``Alltoall`` of byte counts followed by one ``Alltoallv`` of bytes
through mpicomm's collectives.

Layout. A *batch* is a dict of named columns: ``hash`` (uint32, the key's stable
hash), then the key columns, then the value columns, by kind:

    ======  ===============================================================
    kind    columns
    ======  ===============================================================
    str     ``<p>blob`` uint8: each item's UTF-8 bytes followed by a NUL
    int     ``<p>int`` int64
    float   ``<p>flt`` float64
    ints    ``<p>len`` uint32 (items per value), ``<p>data`` int64
    ======  ===============================================================

(``<p>`` is ``k`` for keys, ``v`` for values.) A *segment* is an item range of a
batch on the wire: an int64 header (item count, then each column's byte length)
and the columns' bytes, each padded to 8 bytes.

Ownership: key → ``hash`` (CRC-32 of the UTF-8 bytes, or a 64-bit mix of an int,
then MurmurHash3's 32-bit finalizer) → owner ``hash·p >> 32``. The hash is the
same in every process and every run (unlike Python's ``hash``), so a key lands
on the same rank whatever produced it.

Rounds bound memory: a rank sends at most ``round_bytes / p`` bytes to each peer
per round (so it also receives at most about ``round_bytes``), moving through its
runs one at a time; the ranks agree after each round whether anyone has more.
"""

from __future__ import annotations

import operator
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np
from mpi4py import MPI

__all__ = [
    "KINDS",
    "KEY_KINDS",
    "Spec",
    "fmix32",
    "owners",
    "buckets",
    "take",
    "pack",
    "pack_partitioned",
    "unpack",
    "item_bytes",
    "bounds",
    "slice_batch",
    "concat_batches",
    "segment_nbytes",
    "write_segment",
    "read_segment",
    "iter_segments",
    "ShuffleStats",
    "exchange",
]

KINDS = ("str", "int", "float", "ints")
KEY_KINDS = ("str", "int")
_HEADER = np.dtype(np.int64)
_NUL = b"\0"


def _columns(kind: str, prefix: str) -> list[tuple[str, np.dtype]]:
    if kind == "str":
        return [(prefix + "blob", np.dtype(np.uint8))]
    if kind == "int":
        return [(prefix + "int", np.dtype(np.int64))]
    if kind == "float":
        return [(prefix + "flt", np.dtype(np.float64))]
    if kind == "ints":
        return [(prefix + "len", np.dtype(np.uint32)), (prefix + "data", np.dtype(np.int64))]
    raise ValueError(f"kind {kind!r}: unknown; use one of {', '.join(KINDS)}")


@dataclass(frozen=True)
class Spec:
    """Key and value kinds of a job's pairs, and the batch columns they make."""

    key: str = "str"
    value: str = "int"

    def __post_init__(self) -> None:
        if self.key not in KEY_KINDS:
            raise ValueError(f"key kind {self.key!r}: keys are one of {', '.join(KEY_KINDS)}")
        if self.value not in KINDS:
            raise ValueError(f"value kind {self.value!r}: values are one of {', '.join(KINDS)}")

    @property
    def columns(self) -> list[tuple[str, np.dtype]]:
        """(name, dtype) of every column of a batch, in wire order."""
        return [("hash", np.dtype(np.uint32))] + _columns(self.key, "k") + _columns(self.value, "v")


# ---------------------------------------------------------------------------------------------- hashing

def fmix32(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finalizer (every input bit reaches every output bit)."""
    h = np.asarray(h, dtype=np.uint32).copy()
    h ^= h >> np.uint32(16)
    h *= np.uint32(0x85EBCA6B)
    h ^= h >> np.uint32(13)
    h *= np.uint32(0xC2B2AE35)
    h ^= h >> np.uint32(16)
    return h


def _hash_ints(keys: np.ndarray) -> np.ndarray:
    x = keys.astype(np.int64).view(np.uint64).copy()
    x ^= x >> np.uint64(33)
    x *= np.uint64(0xFF51AFD7ED558CCD)
    x ^= x >> np.uint64(33)
    x *= np.uint64(0xC4CEB9FE1A85EC53)
    x ^= x >> np.uint64(33)
    return (x >> np.uint64(32)).astype(np.uint32)


def owners(hashes: np.ndarray, p: int) -> np.ndarray:
    """Owner rank of each hash: ``hash·p >> 32`` (int64, in [0, p))."""
    return ((np.asarray(hashes, dtype=np.uint64) * np.uint64(p)) >> np.uint64(32)).astype(np.int64)


def buckets(hashes: np.ndarray, count: int) -> np.ndarray:
    """Spill bucket of each hash on its owner, independent of the owner choice (int64, in [0, count))."""
    return owners(fmix32(np.asarray(hashes, dtype=np.uint32) ^ np.uint32(0x9E3779B9)), count)


# ---------------------------------------------------------------------------------------------- packing

def take(seq: Sequence, order: np.ndarray) -> list:
    """``[seq[i] for i in order]`` at C speed."""
    if len(order) == 0:
        return []
    if len(order) == 1:
        return [seq[int(order[0])]]
    return list(operator.itemgetter(*order.tolist())(seq))


def _encode_str(items: Sequence[str | bytes], what: str) -> list[bytes]:
    """UTF-8 bytes of each item (``bytes`` items are taken as UTF-8 already)."""
    if items and isinstance(items[0], bytes):
        try:
            b"".join(items)  # all bytes? (C speed)
            return list(items)
        except TypeError:
            pass
    try:
        return list(map(str.encode, items))
    except TypeError:
        pass
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} {exc.object!r} cannot be encoded as UTF-8 ({exc.reason})") from None
    out = []
    for x in items:
        if isinstance(x, bytes):
            out.append(x)
        elif isinstance(x, str):
            try:
                out.append(x.encode())
            except UnicodeEncodeError as exc:
                raise ValueError(f"{what} {x!r} cannot be encoded as UTF-8 ({exc.reason})") from None
        else:
            raise TypeError(f"{what} {x!r} is a {type(x).__name__}; this job's {what}s are str")
    return out


def _join(encoded: list[bytes], what: str) -> np.ndarray:
    blob = _NUL.join(encoded) + _NUL if encoded else b""
    if blob.count(_NUL) != len(encoded):
        bad = next(x for x in encoded if _NUL in x)
        raise ValueError(f"{what} {bad.decode(errors='replace')!r} contains U+0000; str {what}s must not")
    return np.frombuffer(blob, np.uint8)


def _ints(items: Iterable, n: int, what: str) -> np.ndarray:
    try:
        return np.fromiter(items, np.int64, n)
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(f"{what}s must be integers in the int64 range ({exc})") from None


def _pack_values(values: Sequence, kind: str) -> dict[str, np.ndarray]:
    n = len(values)
    if kind == "int":
        return {"vint": _ints(values, n, "value")}
    if kind == "float":
        try:
            return {"vflt": np.fromiter(values, np.float64, n)}
        except (TypeError, ValueError) as exc:
            raise TypeError(f"values must be numbers for kind 'float' ({exc})") from None
    if kind == "str":
        return {"vblob": _join(_encode_str(values, "value"), "value")}
    lens = np.fromiter(map(len, values), np.uint32, n)
    return {"vlen": lens, "vdata": _ints(chain.from_iterable(values), int(lens.sum()), "value")}


def pack(keys: Sequence, values: Sequence, spec: Spec) -> dict[str, np.ndarray]:
    """A batch from parallel lists of keys and values (values already in packed form: ints as lists).

    ``str`` keys and values may also be given as ``bytes`` holding UTF-8; they unpack as ``str``.
    """
    if len(keys) != len(values):
        raise ValueError(f"{len(keys)} keys but {len(values)} values: give one value per key")
    batch, _ = _pack(keys, values, spec, None)
    return batch


def pack_partitioned(keys: Sequence, values: Sequence, spec: Spec, p: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """A batch whose items are grouped by owner rank; returns it and ``dest`` (p + 1 item offsets)."""
    batch, dest = _pack(keys, values, spec, p)
    return batch, dest


def _pack(keys: Sequence, values: Sequence, spec: Spec, p: int | None) -> tuple[dict[str, np.ndarray], np.ndarray]:
    n = len(keys)
    if spec.key == "str":
        encoded = _encode_str(keys, "key")
        hashes = fmix32(np.fromiter(map(zlib.crc32, encoded), np.uint32, n))
    else:
        ints = _ints(keys, n, "key")
        hashes = _hash_ints(ints)
    order = None
    if p is not None and p > 1:
        own = owners(hashes, p)
        order = np.argsort(own, kind="stable")
        dest = np.searchsorted(own[order], np.arange(p + 1)).astype(np.int64)
        hashes = hashes[order]
        values = take(values, order)
        if spec.key == "str":
            encoded = take(encoded, order)
        else:
            ints = ints[order]
    else:
        dest = np.array([0, n], np.int64)
    batch = {"hash": hashes.astype(np.uint32)}
    batch.update({"kblob": _join(encoded, "key")} if spec.key == "str" else {"kint": ints})
    batch.update(_pack_values(values, spec.value))
    return batch, dest


def _split_blob(blob: np.ndarray) -> list[str]:
    if blob.size == 0:
        return []
    return blob.tobytes()[:-1].decode("utf-8").split("\0")


def unpack(batch: dict[str, np.ndarray], spec: Spec) -> tuple[list, list]:
    """The keys and values of a batch as Python lists (ints values as lists of int)."""
    keys = _split_blob(batch["kblob"]) if spec.key == "str" else batch["kint"].tolist()
    if spec.value == "int":
        values = batch["vint"].tolist()
    elif spec.value == "float":
        values = batch["vflt"].tolist()
    elif spec.value == "str":
        values = _split_blob(batch["vblob"])
    else:
        flat = batch["vdata"].tolist()
        ends = np.cumsum(batch["vlen"], dtype=np.int64).tolist()
        values = [flat[a:b] for a, b in zip([0] + ends[:-1], ends)]
    return keys, values


def bounds(batch: dict[str, np.ndarray], spec: Spec) -> dict[str, np.ndarray]:
    """For each column, the n + 1 element offsets where each item's part begins (the last is the end)."""
    n = len(batch["hash"])
    out = {}
    for name, _ in spec.columns:
        col = batch[name]
        if name.endswith("blob"):
            out[name] = np.concatenate([[0], np.flatnonzero(col == 0) + 1]).astype(np.int64)
        elif name.endswith("data"):
            out[name] = np.concatenate([[0], np.cumsum(batch[name[0] + "len"], dtype=np.int64)])
        else:
            out[name] = np.arange(n + 1, dtype=np.int64)
    return out


def item_bytes(batch: dict[str, np.ndarray], spec: Spec, bnd: dict[str, np.ndarray] | None = None) -> np.ndarray:
    """Wire bytes of each item (int64), summed over its columns."""
    bnd = bounds(batch, spec) if bnd is None else bnd
    total = np.zeros(len(batch["hash"]), np.int64)
    for name, dtype in spec.columns:
        total += np.diff(bnd[name]) * dtype.itemsize
    return total


def slice_batch(batch: dict[str, np.ndarray], spec: Spec, bnd: dict[str, np.ndarray], a: int, b: int) -> dict[str, np.ndarray]:
    """Items [a, b) of a batch (views)."""
    return {name: batch[name][bnd[name][a]:bnd[name][b]] for name, _ in spec.columns}


def concat_batches(parts: list[dict[str, np.ndarray]], spec: Spec) -> dict[str, np.ndarray]:
    """One batch holding the items of *parts* in order."""
    return {name: np.concatenate([part[name] for part in parts]) if parts else np.empty(0, dtype)
            for name, dtype in spec.columns}


# ---------------------------------------------------------------------------------------------- segments

def _pad(n: int) -> int:
    return (n + 7) & ~7


def segment_nbytes(part: dict[str, np.ndarray], spec: Spec) -> int:
    """Bytes a segment of these columns takes on the wire (header included)."""
    return 8 * (1 + len(spec.columns)) + sum(_pad(part[name].nbytes) for name, _ in spec.columns)


def write_segment(out: np.ndarray, part: dict[str, np.ndarray], spec: Spec) -> int:
    """Write one segment into the uint8 array *out* (at its start); return the bytes written."""
    cols = [np.ascontiguousarray(part[name]) for name, _ in spec.columns]
    header = np.array([len(part["hash"])] + [c.nbytes for c in cols], _HEADER)
    pos = header.nbytes
    out[:pos] = header.view(np.uint8)
    for c in cols:
        out[pos:pos + c.nbytes] = c.view(np.uint8).reshape(-1)
        pos += _pad(c.nbytes)
    return pos


def read_segment(buf: np.ndarray, spec: Spec) -> tuple[dict[str, np.ndarray], int]:
    """The columns of the segment at the start of the uint8 array *buf* (copies), and its length in bytes."""
    ncols = len(spec.columns)
    hsize = 8 * (1 + ncols)
    if buf.nbytes < hsize:
        raise ValueError(f"segment cut short: {buf.nbytes} bytes, its header alone takes {hsize}")
    header = np.frombuffer(buf[:hsize].tobytes(), _HEADER)
    pos, part = hsize, {}
    for (name, dtype), nbytes in zip(spec.columns, header[1:].tolist()):
        if nbytes % dtype.itemsize or pos + nbytes > buf.nbytes:
            raise ValueError(f"segment damaged: column {name} claims {nbytes} bytes at {pos} of {buf.nbytes}")
        part[name] = np.frombuffer(buf[pos:pos + nbytes].tobytes(), dtype)
        pos += _pad(nbytes)
    if len(part["hash"]) != int(header[0]):
        raise ValueError(f"segment damaged: {len(part['hash'])} hashes for {int(header[0])} items")
    return part, pos


def iter_segments(buf: np.ndarray, spec: Spec) -> Iterable[dict[str, np.ndarray]]:
    """Every segment written back to back into *buf*."""
    pos = 0
    while pos < buf.nbytes:
        part, used = read_segment(buf[pos:], spec)
        pos += used
        yield part


# ---------------------------------------------------------------------------------------------- exchange

@dataclass
class ShuffleStats:
    """What one rank's shuffle did: rounds, items and bytes sent and received, seconds in MPI."""

    rounds: int = 0
    items_sent: int = 0
    items_received: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    seconds_mpi: float = 0.0


class _Cursor:
    """Walks one partitioned batch, handing out per-destination chunks of at most *cap* bytes."""

    def __init__(self, batch: dict[str, np.ndarray], dest: np.ndarray, spec: Spec, cap: int):
        self.batch, self.spec, self.cap = batch, spec, cap
        self.bnd = bounds(batch, spec)
        self.cum = np.concatenate([[0], np.cumsum(item_bytes(batch, spec, self.bnd))])
        self.next = dest[:-1].astype(np.int64).copy()
        self.stop = dest[1:].astype(np.int64)

    def done(self) -> bool:
        return bool((self.next >= self.stop).all())

    def chunk(self, d: int) -> tuple[int, int]:
        a, stop = int(self.next[d]), int(self.stop[d])
        if a >= stop:
            return a, a
        b = int(np.searchsorted(self.cum, self.cum[a] + self.cap, side="right")) - 1
        b = min(max(b, a + 1), stop)
        self.next[d] = b
        return a, b


def exchange(
    comm: Any,
    runs: Iterable[tuple[dict[str, np.ndarray], np.ndarray]],
    spec: Spec,
    round_bytes: int,
    deliver: Callable[[dict[str, np.ndarray], int], None],
    on_round: Callable[[ShuffleStats], None] | None = None,
) -> ShuffleStats:
    """Send every item of every run to its owner; call ``deliver(part, source)`` for each segment received.

    *runs* yields ``(batch, dest)`` pairs (``dest``: p + 1 item offsets per
    destination) and is consumed lazily, one run at a time. Collective: every
    rank calls it, with or without runs; it returns when no rank has data left.
    """
    p = comm.Get_size()
    cap = max(int(round_bytes) // p, 1)
    stats = ShuffleStats()
    runs = iter(runs)
    sendcounts, recvcounts = np.zeros(p, np.int64), np.zeros(p, np.int64)

    def advance() -> _Cursor | None:
        for batch, dest in runs:
            if len(dest) != p + 1:
                raise ValueError(f"run partitioned for {len(dest) - 1} ranks, the communicator has {p}")
            cursor = _Cursor(batch, dest, spec, cap)
            if not cursor.done():
                return cursor
        return None

    cursor = advance()
    while True:
        parts = []
        for d in range(p):
            if cursor is None:
                parts.append(None)
                continue
            a, b = cursor.chunk(d)
            parts.append(slice_batch(cursor.batch, spec, cursor.bnd, a, b) if b > a else None)
        sendcounts[:] = [segment_nbytes(part, spec) if part is not None else 0 for part in parts]
        sendbuf = np.empty(int(sendcounts.sum()), np.uint8)
        pos = 0
        for part in parts:
            if part is not None:
                pos += write_segment(sendbuf[pos:], part, spec)
                stats.items_sent += len(part["hash"])
        del parts
        if cursor is not None and cursor.done():
            cursor = None
            cursor = advance()  # the next run is loaded only now that this one is packed
        start = time.perf_counter()
        comm.Alltoall(sendcounts, recvcounts)
        recvbuf = np.empty(int(recvcounts.sum()), np.uint8)
        sdispl = np.concatenate([[0], np.cumsum(sendcounts)[:-1]])
        rdispl = np.concatenate([[0], np.cumsum(recvcounts)[:-1]])
        comm.Alltoallv([sendbuf, (sendcounts.tolist(), sdispl.tolist()), MPI.BYTE],
                       [recvbuf, (recvcounts.tolist(), rdispl.tolist()), MPI.BYTE])
        more = bool(comm.allreduce(int(cursor is not None), op=MPI.MAX))
        stats.seconds_mpi += time.perf_counter() - start
        stats.rounds += 1
        stats.bytes_sent += int(sendcounts.sum())
        stats.bytes_received += int(recvcounts.sum())
        del sendbuf
        for source in range(p):
            if recvcounts[source]:
                part, _ = read_segment(recvbuf[rdispl[source]:rdispl[source] + recvcounts[source]], spec)
                stats.items_received += len(part["hash"])
                deliver(part, source)
        del recvbuf
        if on_round is not None:
            on_round(stats)
        if not more:
            return stats
