"""Spilling to local disk: runs of packed pairs and files of segments, in a private temporary directory.

Why: the memory limit is per rank and must hold whatever the input. When the
map-side store fills its share, it is packed (:mod:`.shuffle` columns, about a
sixth of its size in Python objects) and written out as a *run*; the shuffle
reads runs back one at a time. On the receiving side, when the bytes announced
for a rank would not fit, received pairs go to *bucket* files by hash and are
grouped one bucket at a time. Results too big to keep are written the same way.

Files are scratch: written without fsync (a crash loses the job anyway; durable
state is the checkpoint's business) in a directory made with ``mkdtemp`` under
``--spill-dir`` (default: the system's temporary directory), removed when the
job ends, also on errors and at interpreter exit.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from apps.checkpoint import read_arrays

from .shuffle import Spec, segment_nbytes, write_segment

__all__ = ["SpillDir", "write_run", "Run", "SegmentFile", "read_segments"]


def _remove(path: str | None) -> None:
    if path:
        shutil.rmtree(path, ignore_errors=True)


class SpillDir:
    """A private temporary directory, made on first use under *parent*; ``close()`` removes it."""

    def __init__(self, parent: str | None = None, prefix: str = "mapreduce-"):
        if parent is not None:
            if not isinstance(parent, str):
                raise TypeError(f"spill_dir {parent!r}: expected a directory name (str) or None")
            if not os.path.isdir(parent):
                raise ValueError(f"spill_dir {parent!r}: not an existing directory; create it or pick another")
        self.parent, self.prefix = parent, prefix
        self._path: str | None = None
        self._serial = 0
        self.files = 0
        self.bytes_written = 0
        self._finalizer: Any = None

    @property
    def path(self) -> str:
        """The directory (created now if it does not exist yet)."""
        if self._path is None:
            self._path = tempfile.mkdtemp(prefix=self.prefix, dir=self.parent)
            self._finalizer = weakref.finalize(self, _remove, self._path)
        return self._path

    def new_file(self, stem: str) -> str:
        """A fresh file name inside the directory."""
        self._serial += 1
        self.files += 1
        return os.path.join(self.path, f"{stem}-{self._serial:06d}.bin")

    def close(self) -> None:
        """Remove the directory and everything in it."""
        if self._finalizer is not None:
            self._finalizer()
        self._path = None

    def __enter__(self) -> SpillDir:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def write_run(path: str, arrays: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    """Write named arrays back to back (no fsync: scratch); return the entries :func:`read_arrays` takes."""
    entries, offset = [], 0
    with open(path, "wb") as f:
        for name, a in arrays.items():
            a = np.ascontiguousarray(a)
            f.write(a.reshape(-1).view(np.uint8).data)
            entries.append({"name": name, "dtype": a.dtype.str, "shape": list(a.shape), "offset": offset, "bytes": a.nbytes})
            offset += a.nbytes
    return entries


@dataclass
class Run:
    """Packed pairs grouped by owner rank: in memory (*batch*) or in a file (*path*, *entries*)."""

    count: int
    nbytes: int
    batch: dict[str, np.ndarray] | None = None
    dest: np.ndarray | None = None
    path: str | None = None
    entries: list[dict[str, Any]] = field(default_factory=list)
    owned: bool = True  # the file is ours to delete (not a checkpoint's)
    dest_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # wire bytes per destination

    def load(self) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """(batch, dest), read from disk if spilled."""
        if self.batch is not None:
            return self.batch, self.dest
        arrays = read_arrays(self.path, self.entries)
        dest = arrays.pop("dest")
        return arrays, dest

    def spill(self, spill: SpillDir) -> None:
        """Move the batch to a file of *spill* and drop it from memory."""
        if self.batch is None:
            return
        self.path = spill.new_file("run")
        self.entries = write_run(self.path, {**self.batch, "dest": self.dest})
        spill.bytes_written += self.nbytes
        self.batch, self.dest, self.owned = None, None, True

    def drop(self) -> None:
        """Forget the data (and delete the file if it is scratch)."""
        self.batch = self.dest = None
        if self.path and self.owned:
            try:
                os.remove(self.path)
            except FileNotFoundError:
                pass


class SegmentFile:
    """A file of segments (the shuffle's wire format) written one after another."""

    def __init__(self, path: str, spec: Spec):
        self.path, self.spec = path, spec
        self.count = 0
        self.nbytes = 0
        self._f = open(path, "ab")

    def append(self, part: dict[str, np.ndarray]) -> None:
        """Add one segment."""
        buf = np.empty(segment_nbytes(part, self.spec), np.uint8)
        used = write_segment(buf, part, self.spec)
        self._f.write(buf[:used].data)
        self.count += len(part["hash"])
        self.nbytes += used

    def close(self) -> None:
        """Finish writing (the file stays)."""
        if not self._f.closed:
            self._f.close()


def read_segments(path: str, spec: Spec) -> Iterator[dict[str, np.ndarray]]:
    """The segments of a file written by :class:`SegmentFile`, one at a time (never the whole file)."""
    ncols = len(spec.columns)
    with open(path, "rb") as f:
        while True:
            head = f.read(8 * (1 + ncols))
            if not head:
                return
            if len(head) != 8 * (1 + ncols):
                raise ValueError(f"{path}: a segment header is cut short ({len(head)} bytes)")
            sizes = np.frombuffer(head, np.int64)[1:].tolist()
            part = {}
            for (name, dtype), nbytes in zip(spec.columns, sizes):
                raw = f.read((nbytes + 7) & ~7)
                if len(raw) < nbytes:
                    raise ValueError(f"{path}: column {name} cut short ({len(raw)} of {nbytes} bytes)")
                part[name] = np.frombuffer(raw[:nbytes], dtype)
            yield part
