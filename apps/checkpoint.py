"""Checkpoints that are never half-written and never silently wrong: one format for every application.

A checkpoint is a set of data files plus a JSON *manifest* that names them with
their size and SHA-256. Files are written under a temporary name, flushed to
disk (``fsync``) and renamed into place; the manifest is written the same way
**last**, so it is the commit point: a run killed at any moment leaves either a
complete checkpoint or one without a manifest, which is never loaded. Reading
verifies sizes and checksums before any byte is used, and a damaged or partial
checkpoint is refused with a message naming the file and what is wrong.

The manifest protects itself too: it holds the SHA-256 of its own canonical
JSON body (``manifest_sha256``), so one changed byte anywhere in it (an offset,
a dtype, a file name) refuses the checkpoint instead of loading wrong data.
Every field is then checked for type and range, and a manifest that fails any
check raises :class:`CheckpointError`, never a bare ``KeyError``/``TypeError``.

What a manifest may name is fixed by its own name: ``D/<prefix>-<step>.json``
names only files ``<prefix>-<step>.bin`` or ``<prefix>-<step>.<part>.bin`` in
the same directory (plain names: no ``/``, no ``..``). Deletion
(:func:`remove`, :func:`prune`, :func:`sweep`) never trusts names read from a
manifest: it lists the directory and removes only names of the series' own
pattern, so a forged manifest cannot make it delete anything else.

Temporary files are created exclusively under unpredictable names
(``tempfile.mkstemp``: ``O_CREAT|O_EXCL|O_NOFOLLOW``, random suffix, mode
0600), and data files and manifests are opened with ``O_NOFOLLOW``: a symbolic
link planted in the directory is neither written through nor read.

No pickle: data files hold raw array bytes; dtypes and shapes live in the
manifest as text (``numpy.dtype.str`` and lists; object dtypes are refused), so
loading a checkpoint cannot run code.

Layout of a checkpoint directory (``prefix`` names the application's series)::

    D/stencil-00000100.json    manifest: step, files (name, bytes, sha256), arrays, meta, manifest_sha256
    D/stencil-00000100.bin     data (written by one rank, or collectively with MPI-IO)

Who writes what is the application's choice: the stencil writes one global
field collectively with MPI-IO and rank 0 hashes and commits it; map-reduce
writes one file per rank and rank 0 gathers their checksums into the manifest.

Every application checks its checkpoint directory when the run starts, not at
the first checkpoint minutes later: :func:`prepare_directory` (collective)
creates it where missing, and every rank creates, writes, syncs and removes a
probe file in it (:func:`unwritable`); if any rank fails, every rank raises
the same :class:`CheckpointError` naming the directory, the ranks, the cause
and the fix - also when only one node cannot write there.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
import tempfile
import warnings
from collections.abc import Callable, Iterable
from typing import Any, BinaryIO

import numpy as np

__all__ = [
    "CheckpointError",
    "FORMAT",
    "CHECKSUM_KEY",
    "data_path",
    "manifest_path",
    "write_atomic",
    "commit",
    "temporary",
    "fsync_dir",
    "sha256_file",
    "file_record",
    "write_arrays",
    "read_arrays",
    "check_entries",
    "save_manifest",
    "load_manifest",
    "verify",
    "steps",
    "newest_valid",
    "prune",
    "remove",
    "sweep",
    "unwritable",
    "prepare_directory",
]

#: The manifest's format tag; a manifest with another tag is refused.
FORMAT = "mpicomm-checkpoint/2"
#: The manifest key holding the SHA-256 of the manifest's canonical JSON body (without this key).
CHECKSUM_KEY = "manifest_sha256"
_OLD_FORMATS = {"mpicomm-checkpoint/1": "an older version's, whose manifest has no checksum of its own"}
_RESERVED = ("format", "step", "files", CHECKSUM_KEY, "path")
_CHUNK = 1 << 22
_MAX_MANIFEST = 64 << 20  # a manifest larger than this is not ours (and is not read into memory)
_MAX_NDIM = 64
_PART = re.compile(r"^[A-Za-z0-9_-]+$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_BINARY = getattr(os, "O_BINARY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a FIFO planted under a checkpoint name must not block the open


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, partial or damaged (the message says which file and why)."""


# ------------------------------------------------------------------------------------------ names


def _check_prefix(prefix: str) -> None:
    if not isinstance(prefix, str) or not prefix or prefix.startswith(".") or any(c in prefix for c in "/\\\0"):
        raise ValueError(f"checkpoint series prefix {prefix!r}: must be a non-empty plain file name part "
                         f"(no '/', '\\\\', NUL, not starting with '.'), e.g. 'stencil'")


def _check_step(step: Any) -> int:
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise ValueError(f"checkpoint step {step!r}: must be an integer >= 0")
    return int(step)


def manifest_path(directory: str, prefix: str, step: int) -> str:
    """``D/<prefix>-<step:08d>.json``."""
    _check_prefix(prefix)
    return os.path.join(directory, f"{prefix}-{_check_step(step):08d}.json")


def data_path(directory: str, prefix: str, step: int, part: str = "") -> str:
    """``D/<prefix>-<step:08d>[.<part>].bin``: a data file of that checkpoint.

    *part* (letters, digits, ``_``, ``-``) tells apart the files of one
    checkpoint; the manifest may name only files of this pattern.
    """
    _check_prefix(prefix)
    if part and not (isinstance(part, str) and _PART.match(part)):
        raise ValueError(f"checkpoint data part {part!r}: use letters, digits, '_' and '-' only, e.g. 'rank0-run1'")
    return os.path.join(directory, f"{prefix}-{_check_step(step):08d}{'.' + part if part else ''}.bin")


def _stem(manifest: str) -> str:
    name = os.path.basename(manifest)
    return name[:-5] if name.endswith(".json") else name


def _data_name(stem: str) -> re.Pattern:
    """The names a manifest ``<stem>.json`` may give its data files."""
    return re.compile(rf"^{re.escape(stem)}(?:\.[A-Za-z0-9_-]+)?\.bin$")


def _series_name(prefix: str) -> re.Pattern:
    """Every name the series writes: manifests, data files, and their temporary files (group 1: the kind)."""
    return re.compile(rf"^{re.escape(prefix)}-\d+(?:\.[A-Za-z0-9_-]+)?\.(bin|json)(\.tmp[A-Za-z0-9_]*)?$")


# ------------------------------------------------------------------------------------------ files


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


def _open_regular(path: str) -> tuple[BinaryIO, int]:
    """Open *path* for reading without following a symbolic link; (file, size). CheckpointError if not a plain file."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _BINARY | _NONBLOCK)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP or os.path.islink(path):
            raise CheckpointError(f"{path}: is a symbolic link; checkpoint files are plain files this series "
                                  f"wrote (remove the link)") from None
        raise CheckpointError(f"{path}: cannot be opened ({exc.strerror or exc})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise CheckpointError(f"{path}: not a regular file; checkpoint files are plain files (remove it)")
    return os.fdopen(fd, "rb"), st.st_size


def commit(tmp: str, final: str) -> None:
    """Make *tmp* durable and atomically rename it to *final* (then make the rename durable).

    ``os.replace`` replaces a symbolic link at *final* itself, never its target.
    """
    fd = os.open(tmp, os.O_RDONLY | _NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, final)
    fsync_dir(os.path.dirname(final))


def temporary(path: str) -> str:
    """Create an empty temporary file beside *path*, exclusively, under an unpredictable name; its path.

    ``<name>.tmp<random>``, made by ``tempfile.mkstemp`` (``O_CREAT|O_EXCL|O_NOFOLLOW``,
    mode 0600): a file or link planted in advance cannot be written through.
    """
    fd, tmp = _mkstemp(path)
    os.close(fd)
    return tmp


def _mkstemp(path: str) -> tuple[int, str]:
    return tempfile.mkstemp(prefix=os.path.basename(path) + ".tmp", dir=os.path.dirname(path) or ".")


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

    ``f`` has a ``write(bytes-like)`` method. The bytes go to a temporary file
    created exclusively under an unpredictable name beside *path* (see
    :func:`temporary`); a crash leaves at most that ``*.tmp*`` file, never a
    partial *path*. The file keeps ``mkstemp``'s mode, 0600. A system error
    that names no file (a ``write`` or ``fsync`` on a full disk: ``ENOSPC``)
    is raised again naming *path*, the same errno (and OSError subclass).
    """
    fd, tmp = _mkstemp(path)
    try:
        with os.fdopen(fd, "wb") as raw:
            f = _Hashing(raw)
            write(f)
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, path)
        fsync_dir(os.path.dirname(path))
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError) and exc.errno is not None and exc.filename is None:
            raise OSError(exc.errno, exc.strerror, path) from exc
        raise
    return {"file": os.path.basename(path), "bytes": f.bytes, "sha256": f.sha.hexdigest()}


def _hash(f: BinaryIO) -> str:
    sha = hashlib.sha256()
    while chunk := f.read(_CHUNK):
        sha.update(chunk)
    return sha.hexdigest()


def sha256_file(path: str) -> str:
    """The SHA-256 of a plain file (not through a symbolic link), read in 4 MiB chunks."""
    f, _ = _open_regular(path)
    with f:
        return _hash(f)


def file_record(path: str) -> dict[str, Any]:
    """``{file, bytes, sha256}`` of a file already written (e.g. collectively, with MPI-IO)."""
    f, size = _open_regular(path)
    with f:
        return {"file": os.path.basename(path), "bytes": size, "sha256": _hash(f)}


# ------------------------------------------------------------------------------------------ arrays


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _plain_dtype(text: Any, where: str) -> np.dtype:
    """The dtype a manifest names: canonical ``dtype.str`` text of a plain (never object) dtype."""
    if not isinstance(text, str) or len(text) > 32:
        raise CheckpointError(f"{where}: dtype {text!r} is not a dtype string like '<f8'")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            dtype = np.dtype(text)
    except (TypeError, ValueError, SyntaxError, Warning) as exc:
        raise CheckpointError(f"{where}: dtype {text!r} is not a dtype ({exc})") from None
    if dtype.hasobject or dtype.kind == "O":
        raise CheckpointError(f"{where}: dtype {text!r} is an object dtype; checkpoints hold plain numeric/bytes "
                              f"data only (loading objects could run code)")
    if dtype.str != text or dtype.names is not None or dtype.subdtype is not None or dtype.itemsize < 1:
        raise CheckpointError(f"{where}: dtype {text!r} is not a plain dtype in canonical form (numpy.dtype.str)")
    return dtype


def check_entries(entries: Any, size: int | None, where: str) -> list[dict[str, Any]]:
    """Check array entries (as :func:`write_arrays` makes them) against a data file of *size* bytes.

    Every entry must have a unique ``name`` (str), a plain ``dtype``, a
    ``shape`` of non-negative ints, ``bytes`` equal to the shape's product times
    the item size, and an ``offset`` (int >= 0) that keeps it inside the file,
    not overlapping another. Returns *entries*; raises :class:`CheckpointError`
    naming *where* and the bad value otherwise. *size* None skips the bound.
    """
    if not isinstance(entries, list):
        raise CheckpointError(f"{where}: array entries must be a list, not {type(entries).__name__}")
    names, spans = set(), []
    for i, e in enumerate(entries):
        at = f"{where}: array entry {i}"
        if not isinstance(e, dict):
            raise CheckpointError(f"{at} is {type(e).__name__}, not an object")
        missing = [k for k in ("name", "dtype", "shape", "offset", "bytes") if k not in e]
        if missing:
            raise CheckpointError(f"{at} lacks {', '.join(missing)}")
        name = e["name"]
        if not isinstance(name, str) or name in names:
            raise CheckpointError(f"{at}: name {name!r} is not a string, or repeated")
        names.add(name)
        dtype = _plain_dtype(e["dtype"], f"{at} ({name!r})")
        shape, offset, nbytes = e["shape"], e["offset"], e["bytes"]
        if not isinstance(shape, list) or len(shape) > _MAX_NDIM or not all(_is_int(n) and n >= 0 for n in shape):
            raise CheckpointError(f"{at} ({name!r}): shape {shape!r} is not a list of integers >= 0")
        if not _is_int(offset) or offset < 0 or not _is_int(nbytes) or nbytes < 0:
            raise CheckpointError(f"{at} ({name!r}): offset {offset!r} and bytes {nbytes!r} must be integers >= 0")
        expected = dtype.itemsize
        for n in shape:
            expected *= n
        if nbytes != expected:
            raise CheckpointError(f"{at} ({name!r}): {nbytes} bytes, but shape {shape} of {dtype.str} takes {expected}")
        if size is not None and offset + nbytes > size:
            raise CheckpointError(f"{at} ({name!r}): bytes {offset}..{offset + nbytes} lie beyond the file's "
                                  f"{size} bytes")
        spans.append((offset, offset + nbytes, name))
    spans.sort()
    for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
        if start < end:
            raise CheckpointError(f"{where}: arrays {a!r} and {b!r} overlap (at byte {start})")
    return entries


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
    """The arrays :func:`write_arrays` stored (call :func:`verify` on the file first).

    The entries are checked against the file (:func:`check_entries`) before any
    byte is read: a bad one raises :class:`CheckpointError`, never a bare error.
    """
    if not isinstance(entries, (list, dict, str, bytes)):
        entries = list(entries)  # a generator or tuple of entries; a dict or str is refused by check_entries
    try:
        f, size = _open_regular(path)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing; the checkpoint is incomplete") from None
    out = {}
    with f:
        for e in check_entries(entries, size, path):
            f.seek(e["offset"])
            raw = f.read(e["bytes"])
            if len(raw) != e["bytes"]:
                raise CheckpointError(f"{path}: array {e['name']!r} is cut short ({len(raw)} of {e['bytes']} bytes)")
            out[e["name"]] = np.frombuffer(raw, dtype=np.dtype(e["dtype"])).reshape(e["shape"]).copy()
    return out


# ------------------------------------------------------------------------------------------ manifests


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _digest(body: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON of *body* without its checksum key."""
    return hashlib.sha256(_canonical({k: v for k, v in body.items() if k != CHECKSUM_KEY})).hexdigest()


def _check_files(manifest: str, files: Any) -> None:
    """Every record names a plain file of this manifest's own pattern, once, with int size and hex digest."""
    if not isinstance(files, list):
        raise CheckpointError(f"{manifest}: 'files' must be a list, not {type(files).__name__}")
    pattern, seen = _data_name(_stem(manifest)), set()
    for i, rec in enumerate(files):
        if not isinstance(rec, dict) or not all(k in rec for k in ("file", "bytes", "sha256")):
            raise CheckpointError(f"{manifest}: file record {i} is not an object with file, bytes and sha256")
        name = rec["file"]
        if not isinstance(name, str) or not pattern.match(name):
            raise CheckpointError(
                f"{manifest}: file record {i} names {name!r}, not a plain name of this checkpoint "
                f"({_stem(manifest)}[.<part>].bin in the same directory); refused, nothing of it is read or deleted")
        if name in seen:
            raise CheckpointError(f"{manifest}: names {name!r} twice")
        seen.add(name)
        if not _is_int(rec["bytes"]) or rec["bytes"] < 0:
            raise CheckpointError(f"{manifest}: {name}: bytes {rec['bytes']!r} is not an integer >= 0")
        if not isinstance(rec["sha256"], str) or not _HEX64.match(rec["sha256"]):
            raise CheckpointError(f"{manifest}: {name}: sha256 {rec['sha256']!r} is not 64 lowercase hex digits")


def save_manifest(path: str, step: int, files: list[dict[str, Any]], **meta: Any) -> None:
    """Write the manifest (the commit point of a checkpoint) atomically, with its own checksum.

    *files* must name data files of this checkpoint (:func:`data_path` with the
    same prefix and step); *meta* must be JSON-able and must not use the
    reserved keys ``format``, ``step``, ``files``, ``manifest_sha256``, ``path``.
    """
    step = _check_step(step)
    clash = [k for k in meta if k in _RESERVED]
    if clash:
        raise ValueError(f"save_manifest: meta key(s) {', '.join(map(repr, clash))} are reserved; rename them")
    try:
        _check_files(path, files)
    except CheckpointError as exc:
        raise ValueError(f"{exc}; write data files with data_path(directory, prefix, step[, part])") from None
    body: dict[str, Any] = {"format": FORMAT, "step": step, "files": files, **meta}
    try:
        body = json.loads(_canonical(body))  # as a reader will see it: tuples as lists, keys as strings
    except (TypeError, ValueError) as exc:
        raise TypeError(f"checkpoint manifest {path}: meta must be JSON-able ({exc})") from None
    body[CHECKSUM_KEY] = _digest(body)
    text = json.dumps(body, indent=1, sort_keys=True).encode()
    write_atomic(path, lambda f: f.write(text))


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} appears twice")
        out[key] = value
    return out


def load_manifest(path: str) -> dict[str, Any]:
    """Read and check a manifest; :class:`CheckpointError` if it is unreadable, damaged, edited or not ours.

    Checks, in order: a plain file (not a link) of at most 64 MiB, JSON without
    repeated keys, the format tag, the manifest's own SHA-256, ``step`` (an int
    >= 0, equal to the step in the file name) and every file record (a plain
    name of this checkpoint's pattern, once; ``bytes`` an int >= 0; a hex
    ``sha256``).
    """
    try:
        f, size = _open_regular(path)
        with f:
            if size > _MAX_MANIFEST:
                raise CheckpointError(f"{path}: {size} bytes, larger than any manifest ({_MAX_MANIFEST}); not ours")
            body = json.loads(f.read(_MAX_MANIFEST + 1).decode(), object_pairs_hook=_no_duplicates)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"{path}: manifest unreadable ({exc})") from None
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        tag = body.get("format") if isinstance(body, dict) else None
        why = f" ({_OLD_FORMATS[tag]})" if isinstance(tag, str) and tag in _OLD_FORMATS else ""
        raise CheckpointError(f"{path}: not an mpicomm checkpoint manifest (format {tag!r}{why}, expected "
                              f"{FORMAT!r}); remove it or use another directory")
    stored = body.get(CHECKSUM_KEY)
    if not isinstance(stored, str) or not _HEX64.match(stored):
        raise CheckpointError(f"{path}: manifest lacks its checksum {CHECKSUM_KEY!r}; refused")
    try:
        actual = _digest(body)
    except (TypeError, ValueError) as exc:  # e.g. NaN-free JSON only
        raise CheckpointError(f"{path}: manifest body cannot be checked ({exc})") from None
    if actual != stored:
        raise CheckpointError(f"{path}: manifest checksum mismatch (sha256 {actual[:16]}…, it says "
                              f"{stored[:16]}…): the manifest was edited or damaged")
    _check_body(path, body)
    return body


def _check_body(path: str, body: dict[str, Any]) -> None:
    if "step" not in body or "files" not in body:
        raise CheckpointError(f"{path}: manifest lacks 'step' or 'files'")
    step = body["step"]
    if not _is_int(step) or step < 0:
        raise CheckpointError(f"{path}: step {step!r} is not an integer >= 0")
    named = re.match(r"^.*-(\d+)$", _stem(path))
    if named and int(named.group(1)) != step:
        raise CheckpointError(f"{path}: manifest says step {step}, its name says {int(named.group(1))}")
    _check_files(path, body["files"])


def verify(manifest: str, body: dict[str, Any] | None = None, files: Iterable[str] | None = None) -> dict[str, Any]:
    """Check every data file the manifest names (or those in *files*): present, right size, right SHA-256.

    Returns the manifest's body; raises :class:`CheckpointError` naming the
    first file that is missing, truncated, damaged, a link, or (in *files*)
    not named by the manifest at all.
    """
    if body is None:
        body = load_manifest(manifest)
    elif not isinstance(body, dict):
        raise CheckpointError(f"{manifest}: manifest body is {type(body).__name__}, not an object")
    else:
        _check_body(manifest, body)
    directory = os.path.dirname(manifest)
    records = {rec["file"]: rec for rec in body["files"]}
    wanted = list(records) if files is None else list(files)
    for name in wanted:
        rec = records.get(name) if isinstance(name, str) else None
        if rec is None:
            raise CheckpointError(f"{manifest}: does not name data file {name!r}; refused")
        path = os.path.join(directory, name)
        try:
            f, size = _open_regular(path)
        except FileNotFoundError:
            raise CheckpointError(f"{path}: missing (named by {os.path.basename(manifest)})") from None
        with f:
            if size != rec["bytes"]:
                raise CheckpointError(f"{path}: {size} bytes, the manifest says {rec['bytes']} (partial or overwritten)")
            digest = _hash(f)
        if digest != rec["sha256"]:
            raise CheckpointError(f"{path}: checksum mismatch (sha256 {digest[:16]}…, the manifest says "
                                  f"{rec['sha256'][:16]}…): the file is damaged")
    return body


# ------------------------------------------------------------------------------------------ series


def steps(directory: str, prefix: str) -> list[int]:
    """Steps that have a manifest in *directory*, newest first."""
    _check_prefix(prefix)
    pattern = re.compile(rf"^{re.escape(prefix)}-(\d+)\.json$")
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted((int(m.group(1)) for m in map(pattern.match, names) if m), reverse=True)


def newest_valid(directory: str, prefix: str, *,
                 check: Callable[[dict[str, Any]], None] | None = None) -> tuple[dict[str, Any] | None, list[str]]:
    """The newest checkpoint whose manifest and files all verify, and why each newer one was refused.

    Returns ``(body, refused)``: *body* is the manifest (with ``"path"`` added)
    or None when there is no valid one; *refused* lists one message per
    checkpoint skipped because it failed verification. ``check(body)``
    (optional) is the application's own check of its manifest fields (body
    with ``"path"``); a :class:`CheckpointError` it raises refuses that
    checkpoint like any other damage.
    """
    refused = []
    for step in steps(directory, prefix):
        path = manifest_path(directory, prefix, step)
        try:
            body = {**verify(path), "path": path}
            if check is not None:
                check(body)
        except CheckpointError as exc:
            refused.append(str(exc))
            continue
        return body, refused
    return None, refused


def remove(directory: str, prefix: str, step: int) -> None:
    """Remove one checkpoint of the series: its manifest first (so it stops counting), then its data files.

    The data files are found by listing *directory* for the checkpoint's own
    names (``<prefix>-<step>[.<part>].bin``), never by names read from the
    manifest: a forged manifest cannot make this delete anything else.
    """
    path = manifest_path(directory, prefix, step)
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
    pattern = _data_name(_stem(path))
    for name in sorted(os.listdir(directory)):
        if pattern.match(name):
            try:
                os.remove(os.path.join(directory, name))
            except FileNotFoundError:
                pass


def prune(directory: str, prefix: str, keep: int) -> None:
    """Remove all but the newest *keep* checkpoints of the series."""
    if not _is_int(keep) or keep < 0:
        raise ValueError(f"keep {keep!r}: must be an integer >= 0")
    for step in steps(directory, prefix)[keep:]:
        remove(directory, prefix, step)


def sweep(directory: str, prefix: str) -> list[str]:
    """Remove what killed runs leave behind: temporary files, and data files no valid manifest names.

    Only names of the series' own pattern are considered (``<prefix>-<step>…``
    with ``.bin``/``.json`` and their ``.tmp*`` files), so other series and
    other files in *directory* are never touched. Call it only while no
    checkpoint of the series is being written. Returns the names removed.
    """
    named = set()
    for step in steps(directory, prefix):
        try:
            named.update(rec["file"] for rec in load_manifest(manifest_path(directory, prefix, step))["files"])
        except CheckpointError:
            pass
    pattern = _series_name(prefix)
    removed = []
    for name in sorted(os.listdir(directory)):
        m = pattern.match(name)
        if m and (m.group(2) or (m.group(1) == "bin" and name not in named)):
            try:
                os.remove(os.path.join(directory, name))
                removed.append(name)
            except OSError:
                pass
    return removed


# ------------------------------------------------------------------------------------------ directory


def _cause(exc: Exception, directory: str) -> str:
    """The system's reason, and the path it names where that is not *directory* itself."""
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    filename = getattr(exc, "filename", None)
    name = os.fsdecode(filename) if isinstance(filename, (str, bytes)) else ""
    return f"{text}: {name}" if name and os.path.normpath(name) != os.path.normpath(directory) else text


def unwritable(directory: str) -> str | None:
    """Why this process cannot write checkpoints in *directory*, or None when it can.

    Creates *directory* (and its parents) where missing, then creates a probe
    file in it exclusively under an unpredictable name (``.probe-*``, no
    series' pattern), writes and syncs a few bytes and removes it: the steps a
    checkpoint takes. The answer names the step that failed and the system's
    reason, e.g. ``"cannot create it (Not a directory)"``.
    """
    try:
        os.makedirs(directory, exist_ok=True)
    except (OSError, ValueError) as exc:  # ValueError: a name with a NUL byte
        return f"cannot create it ({_cause(exc, directory)})"
    try:
        fd, probe = tempfile.mkstemp(prefix=".probe-", suffix=".tmp", dir=directory)
    except (OSError, ValueError) as exc:
        return f"cannot create a file in it ({_cause(exc, directory)})"
    problem = None
    try:
        os.write(fd, b"mpicomm checkpoint directory probe\n")
        os.fsync(fd)
    except OSError as exc:
        problem = f"cannot write a file in it ({_cause(exc, directory)})"
    finally:
        os.close(fd)
        try:
            os.unlink(probe)
        except OSError as exc:
            problem = problem or f"cannot remove a file in it ({_cause(exc, directory)})"
    return problem


def prepare_directory(comm: Any, directory: str, option: str = "--checkpoint-dir") -> None:
    """Make sure every rank of *comm* can write checkpoints in *directory* before the run starts (collective).

    Every rank runs :func:`unwritable` and the answers are gathered
    (``allgather``), so a directory that one node cannot write (a path on a
    node-local disk, a read-only mount on one host) stops every rank the same
    way: :class:`CheckpointError` on every rank, naming *option*, the
    directory, the ranks that failed and why, and the fix.
    """
    from apps.agree import gather, ranks_text

    failed = gather(comm, unwritable(directory))
    if not failed:
        return
    size = comm.Get_size()
    if size == 1:
        causes = next(iter(failed))
    else:
        causes = "; ".join(f"{ranks_text(ranks)} {problem}" for problem, ranks in failed.items())
    every = "" if size == 1 else " on every rank"
    raise CheckpointError(f"{option} {directory}: checkpoints cannot be written there: {causes}; choose a "
                          f"directory that can be created and written{every} (pass {option} DIR), or fix its "
                          f"permissions")
