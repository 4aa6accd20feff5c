"""Checkpoint files of a training run, never half-written, never silently wrong.

``--checkpoint-dir DIR`` holds one file per checkpointed step,
``DIR/torchddp-<step>.ckpt`` (8 digits), the newest ``--keep`` of them
(:func:`prune`); a restart reads the newest one that verifies (:func:`newest`).
Layout of each file::

    MPICOMM-TORCHDDP-CHECKPOINT 1\\n      the magic line (format and version)
    {"bytes": N, "sha256": "…", "step": s, "identity": {…}, …,
     "header_sha256": "…"}\\n                       one JSON line: the header
    <N bytes>                             the payload: torch.save({"model": …, "optimizer": …})

Writing (:func:`write`) goes through :func:`apps.checkpoint.write_atomic`: the
file is built in a temporary file created in DIR exclusively (``O_EXCL``) under
an unpredictable name, flushed to disk (``fsync``), renamed over the old
checkpoint (``os.replace``, atomic) and the rename made durable (``fsync`` of
DIR). A run killed at any moment leaves the previous checkpoints and the new one
whole or absent, plus at most a stray ``torchddp-<step>.ckpt.tmp*`` file. The checkpoint keeps
``mkstemp``'s mode, 0600: readable by its owner only.

The header carries the SHA-256 of its own canonical JSON (``header_sha256``),
so an edited step or identity is refused like a damaged payload.

Reading (:func:`read`) opens the file without following a symbolic link, checks
the magic line, the header (its checksum, then every field's type), the
payload's length and its SHA-256 before anything is unpickled, and the payload is then loaded
with ``torch.load(weights_only=True)``: tensors and plain containers only, so a
checkpoint cannot run code. Anything wrong raises :class:`CheckpointError`
naming the file and the fault. Whether the checkpoint belongs to *this* run
(same model, optimizer, data...) is :func:`mismatch`'s question.

These functions touch files only; who calls them (rank 0) and how the verdict
reaches every rank is :mod:`apps.torchddp.train`'s business.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import stat
from typing import Any

import torch

from apps.checkpoint import write_atomic

__all__ = ["CheckpointError", "FORMAT", "PREFIX", "MAGIC", "path_in", "steps", "write", "read", "newest", "prune",
           "load_payload", "dump_payload", "mismatch"]

#: The format tag in the magic line and the header.
FORMAT = "mpicomm-torchddp-checkpoint/2"
#: The checkpoint files inside ``--checkpoint-dir DIR``: ``torchddp-<step>.ckpt``.
PREFIX = "torchddp"
_NAME = re.compile(rf"^{PREFIX}-(\d{{8,}})\.ckpt$")
MAGIC = b"MPICOMM-TORCHDDP-CHECKPOINT 1\n"
_HEADER_LIMIT = 1 << 20  # a header longer than this is not ours
#: The header key holding the SHA-256 of the header's canonical JSON (without this key).
HEADER_CHECKSUM = "header_sha256"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used: missing, damaged, of another format or of another run."""


def path_in(directory: str, step: int) -> str:
    """``DIR/torchddp-<step>.ckpt`` (the step in 8 digits, so names sort as steps do)."""
    return os.path.join(directory, f"{PREFIX}-{step:08d}.ckpt")


def steps(directory: str) -> list[int]:
    """The steps that have a checkpoint file in *directory*, newest first (none when it does not exist)."""
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted((int(m.group(1)) for m in map(_NAME.match, names) if m), reverse=True)


def prune(directory: str, keep: int) -> None:
    """Remove all but the newest *keep* checkpoint files (only names of the series' own pattern)."""
    for step in steps(directory)[keep:]:
        try:
            os.remove(path_in(directory, step))
        except FileNotFoundError:
            pass


def dump_payload(state: dict[str, Any]) -> bytes:
    """*state* (state dicts of tensors and plain values) as ``torch.save`` bytes."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def load_payload(payload: bytes) -> dict[str, Any]:
    """The state :func:`dump_payload` wrote (``weights_only``: no code runs while loading)."""
    return torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)


def _header_digest(header: dict[str, Any]) -> str:
    body = {k: v for k, v in header.items() if k != HEADER_CHECKSUM}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write(directory: str, header: dict[str, Any], payload: bytes, keep: int | None = None) -> str:
    """Write ``DIR/torchddp-<step>.ckpt`` atomically: *header* (plus size and SHA-256) and *payload*; its path.

    Files of later steps (an abandoned run's, which a restart went back
    behind) are removed first, so that *keep* (when given: :func:`prune`
    after writing) never drops the one just written.
    """
    step = header["step"]
    for later in steps(directory):
        if later > step:
            os.remove(path_in(directory, later))
    body = {**header, "format": FORMAT, "bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
    body = json.loads(json.dumps(body))  # as a reader will see it (tuples as lists)
    body[HEADER_CHECKSUM] = _header_digest(body)
    line = json.dumps(body, sort_keys=True).encode() + b"\n"
    final = path_in(directory, step)

    def put(f: Any) -> None:
        f.write(MAGIC)
        f.write(line)
        f.write(payload)

    write_atomic(final, put)
    if keep is not None:
        prune(directory, keep)
    return final


def newest(directory: str) -> tuple[tuple[dict[str, Any], bytes, str] | None, list[str]]:
    """The newest checkpoint in *directory* that verifies, ``(header, payload, path)`` or None when there is none,
    and why each newer one was refused.

    Damaged files are passed over for an older one; when every file is
    damaged, :class:`CheckpointError` says why each was refused.
    """
    refused = []
    for step in steps(directory):
        path = path_in(directory, step)
        try:
            header, payload = read(path)
        except CheckpointError as exc:
            refused.append(str(exc))
            continue
        if header.get("step") != step:
            refused.append(f"checkpoint {path}: its header says step {header.get('step')!r}")
            continue
        return (header, payload, path), refused
    if refused:
        raise CheckpointError(f"no valid checkpoint in {directory}: " + "; ".join(refused)
                              + "; remove the damaged files, or run without --restart")
    return None, refused


def read(path: str) -> tuple[dict[str, Any], bytes]:
    """The header and the verified payload of a checkpoint file; :class:`CheckpointError` if it is not sound."""
    try:
        # no link followed; O_NONBLOCK: a FIFO planted under the name is refused below, not waited on
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise CheckpointError(f"checkpoint {path}: not a regular file (remove it)")
        with os.fdopen(fd, "rb") as f:
            magic = f.read(len(MAGIC))
            line = f.readline(_HEADER_LIMIT)
            payload = f.read()
    except OSError as exc:
        raise CheckpointError(f"checkpoint {path}: cannot read it ({exc.strerror or exc})") from None
    if magic != MAGIC:
        raise CheckpointError(f"checkpoint {path}: not an apps.torchddp checkpoint (it does not start with "
                              f"{MAGIC.decode().strip()!r})")
    try:
        header = json.loads(line.decode())
        if not isinstance(header, dict):
            raise ValueError("not an object")
        size, digest = header["bytes"], header["sha256"]
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"checkpoint {path}: damaged header ({exc}); the file cannot be trusted") from None
    if header.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path}: format {header.get('format')!r}, this program reads {FORMAT!r}")
    stored = header.get(HEADER_CHECKSUM)
    if not isinstance(stored, str) or stored != _header_digest(header):
        raise CheckpointError(f"checkpoint {path}: damaged header (its checksum {HEADER_CHECKSUM} does not match: "
                              f"edited or damaged); the file cannot be trusted")
    if (isinstance(size, bool) or not isinstance(size, int) or size < 0 or not isinstance(digest, str)
            or not _HEX64.match(digest)):
        raise CheckpointError(f"checkpoint {path}: damaged header (bytes {size!r}, sha256 {digest!r}); the file "
                              f"cannot be trusted")
    if len(payload) != size:
        raise CheckpointError(f"checkpoint {path}: the payload has {len(payload)} bytes, the header says {size} "
                              f"(cut short or overwritten)")
    actual = hashlib.sha256(payload).hexdigest()
    if actual != digest:
        raise CheckpointError(f"checkpoint {path}: checksum mismatch (sha256 {actual[:16]}…, the header says "
                              f"{digest[:16]}…): the file is damaged")
    return header, payload


def mismatch(path: str, saved: dict[str, Any], current: dict[str, Any]) -> str | None:
    """Why a checkpoint whose header has identity *saved* cannot continue a run of identity *current* (or None)."""
    keys = sorted(set(saved) | set(current))
    differ = [k for k in keys if saved.get(k) != current.get(k)]
    if not differ:
        return None
    listed = "; ".join(f"{k}: {_show(current.get(k))} here, {_show(saved.get(k))} in the checkpoint" for k in differ)
    return (f"checkpoint {path} belongs to another run ({listed}); run with the checkpoint's settings, or use another "
            f"--checkpoint-dir")


def _show(value: Any) -> str:
    return "(unset)" if value is None else str(value)
