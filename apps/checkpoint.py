"""Checkpoints that are never half-written and never silently wrong: one format for every application.

A checkpoint is a set of data files plus a JSON *manifest* that names them with
their size and SHA-256. Files are written under a temporary name, flushed to
disk (``fsync``) and renamed into place; the manifest is written the same way
**last**, so it is the commit point: a run killed at any moment leaves either a
complete checkpoint or one without a manifest, which is never loaded. Reading
verifies sizes and checksums before any byte is used, and a damaged or partial
checkpoint is refused with a message naming the file and what is wrong.

No pickle: data files hold raw array bytes; dtypes and shapes live in the
manifest as text (``numpy.dtype.str`` and lists), so loading a checkpoint
cannot run code.

Layout of a checkpoint directory (``prefix`` names the application's series)::

    D/stencil-00000100.json    manifest: step, files (name, bytes, sha256), arrays, meta
    D/stencil-00000100.bin     data (written by one rank, or collectively with MPI-IO)

Who writes what is the application's choice: the stencil writes one global
field collectively with MPI-IO and rank 0 hashes and commits it; map-reduce
writes one file per rank and rank 0 gathers their checksums into the manifest.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable
from typing import Any, BinaryIO

import numpy as np

__all__ = [
    "CheckpointError",
    "FORMAT",
    "data_path",
    "manifest_path",
    "write_atomic",
    "commit",
    "sha256_file",
    "file_record",
    "write_arrays",
    "read_arrays",
    "save_manifest",
    "load_manifest",
    "verify",
    "steps",
    "newest_valid",
    "prune",
    "remove",
    "sweep",
]

#: The manifest's format tag; a manifest with another tag is refused.
FORMAT = "mpicomm-checkpoint/1"
_CHUNK = 1 << 22


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, partial or damaged (the message says which file and why)."""


def manifest_path(directory: str, prefix: str, step: int) -> str:
    """``D/<prefix>-<step:08d>.json``."""
    return os.path.join(directory, f"{prefix}-{step:08d}.json")


def data_path(directory: str, prefix: str, step: int, part: str = "") -> str:
    """``D/<prefix>-<step:08d>[.<part>].bin``: a data file of that checkpoint."""
    return os.path.join(directory, f"{prefix}-{step:08d}{'.' + part if part else ''}.bin")


def fsync_dir(directory: str) -> None:
    """Make a rename in *directory* durable (``fsync`` of the directory; nothing where that cannot be done)."""
    try:
        fd = os.open(directory or ".", os.O_RDONLY)
    except OSError:
        return  # a platform without directory fds: the rename is still atomic
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def commit(tmp: str, final: str) -> None:
    """Make *tmp* durable and atomically rename it to *final* (then make the rename durable)."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, final)
    fsync_dir(os.path.dirname(final))


class _Hashing:
    """A write-only file that hashes what passes through it."""

    def __init__(self, f: BinaryIO):
        self.f, self.sha, self.bytes = f, hashlib.sha256(), 0

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        self.sha.update(view)
        self.bytes += view.nbytes
        return self.f.write(view)


def write_atomic(path: str, write: Callable[[Any], None]) -> dict[str, Any]:
    """Write *path* through ``write(f)`` atomically; return its record ``{file, bytes, sha256}``.

    ``f`` has a ``write(bytes-like)`` method. A crash leaves at most a
    ``*.tmp`` file beside *path*, never a partial *path*.
    """
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as raw:
            f = _Hashing(raw)
            write(f)
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, path)
        fsync_dir(os.path.dirname(path))
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return {"file": os.path.basename(path), "bytes": f.bytes, "sha256": f.sha.hexdigest()}


def sha256_file(path: str) -> str:
    """The SHA-256 of a file, read in 4 MiB chunks."""
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            sha.update(chunk)
    return sha.hexdigest()


def file_record(path: str) -> dict[str, Any]:
    """``{file, bytes, sha256}`` of a file already written (e.g. collectively, with MPI-IO)."""
    return {"file": os.path.basename(path), "bytes": os.path.getsize(path), "sha256": sha256_file(path)}


def write_arrays(path: str, arrays: dict[str, np.ndarray]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Write named host arrays back to back into one data file, atomically.

    Returns the file's record and one entry per array (name, dtype, shape,
    offset, bytes) for the manifest; :func:`read_arrays` takes both back.
    """
    entries, offset = [], 0
    for name, a in arrays.items():
        a = np.ascontiguousarray(a)
        if a.dtype.hasobject:
            raise TypeError(f"checkpoint array {name!r} has dtype {a.dtype}: only plain numeric/bytes dtypes are stored")
        entries.append({"name": name, "dtype": a.dtype.str, "shape": list(a.shape), "offset": offset, "bytes": a.nbytes})
        offset += a.nbytes

    def write(f) -> None:
        for a in arrays.values():
            f.write(np.ascontiguousarray(a).reshape(-1).view(np.uint8))

    return write_atomic(path, write), entries


def read_arrays(path: str, entries: Iterable[dict[str, Any]]) -> dict[str, np.ndarray]:
    """The arrays :func:`write_arrays` stored (call :func:`verify` on the file first)."""
    out = {}
    with open(path, "rb") as f:
        for e in entries:
            f.seek(int(e["offset"]))
            raw = f.read(int(e["bytes"]))
            if len(raw) != int(e["bytes"]):
                raise CheckpointError(f"{path}: array {e['name']!r} is cut short ({len(raw)} of {e['bytes']} bytes)")
            out[e["name"]] = np.frombuffer(raw, dtype=np.dtype(e["dtype"])).reshape(e["shape"]).copy()
    return out


def save_manifest(path: str, step: int, files: list[dict[str, Any]], **meta: Any) -> None:
    """Write the manifest (the commit point of a checkpoint) atomically."""
    body = {"format": FORMAT, "step": int(step), "files": files, **meta}
    text = json.dumps(body, indent=1, sort_keys=True).encode()
    write_atomic(path, lambda f: f.write(text))


def load_manifest(path: str) -> dict[str, Any]:
    """Read and check a manifest; :class:`CheckpointError` if it is unreadable or not ours."""
    try:
        with open(path, "rb") as f:
            body = json.loads(f.read().decode())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: manifest unreadable ({exc})") from None
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not an mpicomm checkpoint manifest (format {body.get('format') if isinstance(body, dict) else None!r}, expected {FORMAT!r})")
    if not isinstance(body.get("files"), list) or not isinstance(body.get("step"), int):
        raise CheckpointError(f"{path}: manifest lacks 'step' or 'files'")
    return body


def verify(manifest: str, body: dict[str, Any] | None = None, files: Iterable[str] | None = None) -> dict[str, Any]:
    """Check every data file the manifest names (or those in *files*): present, right size, right SHA-256.

    Returns the manifest's body; raises :class:`CheckpointError` naming the
    first file that is missing, truncated or damaged.
    """
    body = load_manifest(manifest) if body is None else body
    directory = os.path.dirname(manifest)
    wanted = None if files is None else set(files)
    for rec in body["files"]:
        if wanted is not None and rec["file"] not in wanted:
            continue
        path = os.path.join(directory, rec["file"])
        if not os.path.exists(path):
            raise CheckpointError(f"{path}: missing (named by {os.path.basename(manifest)})")
        size = os.path.getsize(path)
        if size != rec["bytes"]:
            raise CheckpointError(f"{path}: {size} bytes, the manifest says {rec['bytes']} (partial or overwritten)")
        digest = sha256_file(path)
        if digest != rec["sha256"]:
            raise CheckpointError(f"{path}: checksum mismatch (sha256 {digest[:16]}…, the manifest says {rec['sha256'][:16]}…): the file is damaged")
    return body


def steps(directory: str, prefix: str) -> list[int]:
    """Steps that have a manifest in *directory*, newest first."""
    pattern = re.compile(rf"^{re.escape(prefix)}-(\d+)\.json$")
    found = []
    for path in glob.glob(os.path.join(glob.escape(directory), f"{glob.escape(prefix)}-*.json")):
        m = pattern.match(os.path.basename(path))
        if m:
            found.append(int(m.group(1)))
    return sorted(found, reverse=True)


def newest_valid(directory: str, prefix: str) -> tuple[dict[str, Any] | None, list[str]]:
    """The newest checkpoint whose files all verify, and why each newer one was refused.

    Returns ``(body, refused)``: *body* is the manifest (with ``"path"`` added)
    or None when there is no valid one; *refused* lists one message per
    checkpoint skipped because it failed verification.
    """
    refused = []
    for step in steps(directory, prefix):
        path = manifest_path(directory, prefix, step)
        try:
            body = verify(path)
        except CheckpointError as exc:
            refused.append(str(exc))
            continue
        if body["step"] != step:
            refused.append(f"{path}: manifest says step {body['step']}, its name says {step}")
            continue
        return {**body, "path": path}, refused
    return None, refused


def remove(directory: str, prefix: str, step: int) -> None:
    """Remove one checkpoint of the series: its manifest first (so it stops counting), then its files."""
    path = manifest_path(directory, prefix, step)
    try:
        names = [rec["file"] for rec in load_manifest(path)["files"]]
    except CheckpointError:
        names = []
    os.remove(path)
    for name in names:
        try:
            os.remove(os.path.join(directory, name))
        except FileNotFoundError:
            pass


def prune(directory: str, prefix: str, keep: int) -> None:
    """Remove all but the newest *keep* checkpoints of the series."""
    for step in steps(directory, prefix)[keep:]:
        remove(directory, prefix, step)


def sweep(directory: str, prefix: str) -> list[str]:
    """Remove what killed runs leave behind: temporary files, and data files no manifest names.

    Call it only while no checkpoint of the series is being written. Returns the names removed.
    """
    named = set()
    for step in steps(directory, prefix):
        try:
            named.update(rec["file"] for rec in load_manifest(manifest_path(directory, prefix, step))["files"])
        except CheckpointError:
            pass
    removed = []
    for path in glob.glob(os.path.join(glob.escape(directory), f"{glob.escape(prefix)}-*")):
        name = os.path.basename(path)
        if ".tmp" in name or (name.endswith(".bin") and name not in named):
            try:
                os.remove(path)
                removed.append(name)
            except OSError:
                pass
    return removed
