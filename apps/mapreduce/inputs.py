"""Input splits: each rank reads only its own byte range of the input files, cut at line boundaries.

Why byte ranges: a rank-0 read-and-scatter makes one process read everything; here
rank r takes bytes [r·T/p, (r+1)·T/p) of the concatenated files (T bytes in all)
and nothing else, so reading scales with the ranks and one huge file splits as well
as many small ones.

The line rule (Hadoop's): a line belongs to the split holding its first byte. A
split's raw range [lo, hi) of a file is read as [adjust(lo), adjust(hi)), where
``adjust(x)`` is 0 for x = 0 and otherwise the position just after the first
``\\n`` at or after byte x − 1 (the file's size if there is none). Consecutive
ranges therefore tile each file exactly, every line is read by exactly one rank,
and since the byte ``0x0A`` never occurs inside a multi-byte UTF-8 sequence, a
split never cuts a character or a word. A rank whose range holds no line start
(more ranks than lines, a file smaller than p bytes) reads nothing.

Inside a split, data is handed to the mapper in blocks of about ``block_size``
bytes that end at a line end. A line longer than a block is cut at its last ASCII
whitespace byte (space, tab, CR, VT, FF) instead; only a run of more than
``block_size`` bytes without any whitespace makes a block grow past its size.

Bad inputs are found before any work starts: :func:`check_inputs` is collective,
every rank checks every path, and every rank raises the same :class:`InputError`
listing every problem found on any rank.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from apps.agree import agree

__all__ = [
    "InputError",
    "Split",
    "Block",
    "parse_size",
    "format_size",
    "check_inputs",
    "plan_splits",
    "adjust",
    "read_blocks",
    "decode",
    "ERRORS",
]

#: Decoding policies for input text: ``strict`` stops the job naming file and byte offset,
#: ``replace`` substitutes U+FFFD for each invalid sequence (a separator for the tokenizer).
ERRORS = ("strict", "replace")

_WHITESPACE = b" \t\r\x0b\x0c"
_SCAN = 1 << 16


class InputError(ValueError):
    """Inputs the job cannot use (missing, unreadable, a directory, invalid UTF-8); the message says which and why."""


@dataclass(frozen=True)
class Split:
    """A raw byte range [start, stop) of input file number *index* (line adjustment happens on reading)."""

    index: int
    path: str
    start: int
    stop: int


@dataclass(frozen=True)
class Block:
    """Bytes handed to a mapper: *data* begins at byte *offset* of input file number *index*."""

    index: int
    path: str
    offset: int
    data: bytes


def parse_size(text: str | int, what: str = "size") -> int:
    """Bytes from ``"512M"``, ``"1.5G"``, ``"64KiB"``, ``"100000"``, ``"1e6"``: :func:`mpicomm.cli.parse_size`.

    The engine's entry point for sizes (``memory_limit``): TypeError for what
    is not a str or an int, ValueError for a text that is not a size or for a
    size below 1 byte.
    """
    from mpicomm import cli

    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise TypeError(f"{what} {text!r}: expected a size such as 512M or a number of bytes, "
                        f"got {type(text).__name__}")
    return cli.parse_size(text, what, minimum=1)  # (the rule's form: --memory-limit must be >= 1, got -5M)


def format_size(n: float) -> str:
    """``1536 → '1.5 KiB'``: a byte count for people."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _problem(path: str) -> tuple[str | None, int]:
    """(what is wrong with *path* or None, its size)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return f"{path!r} does not exist", 0
    except OSError as exc:
        return f"{path!r} cannot be examined ({exc.strerror})", 0
    if stat.S_ISDIR(st.st_mode):
        return f"{path!r} is a directory; give the files in it (e.g. {os.path.join(path, '*')})", 0
    if not stat.S_ISREG(st.st_mode):
        return f"{path!r} is not a regular file", 0
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as exc:
        return f"{path!r} cannot be read ({exc.strerror})", 0
    return None, st.st_size


def check_inputs(comm: Any, paths: Sequence[str]) -> list[int]:
    """Check every input on every rank (collective); return the file sizes, as rank 0 saw them.

    Raises the same :class:`InputError` on every rank, listing each problem
    once with the ranks that saw it, so every rank stops before any work.
    """
    if isinstance(paths, (str, bytes)) or not all(isinstance(p, str) for p in paths):
        raise TypeError(f"paths {paths!r}: expected a list of file names (str)")
    problems, sizes = [], []
    if not paths:
        problems.append("no input files given")
    for path in paths:
        problem, size = _problem(path)
        sizes.append(size)
        if problem:
            problems.append(problem)
    agree(comm, problems, InputError, prefix="bad input: ")
    return comm.bcast(sizes, root=0)


def plan_splits(paths: Sequence[str], sizes: Sequence[int], p: int) -> list[list[Split]]:
    """Raw byte ranges of each of *p* ranks: rank r gets bytes [r·T/p, (r+1)·T/p) of the concatenated files."""
    if p < 1:
        raise ValueError(f"p {p}: need at least one rank")
    if len(paths) != len(sizes):
        raise ValueError(f"{len(paths)} paths but {len(sizes)} sizes: give one size per path")
    total = sum(sizes)
    bounds = [r * total // p for r in range(p + 1)]
    plans: list[list[Split]] = [[] for _ in range(p)]
    base = 0
    for index, (path, size) in enumerate(zip(paths, sizes)):
        for r in range(p):
            lo, hi = max(bounds[r], base), min(bounds[r + 1], base + size)
            if lo < hi:
                plans[r].append(Split(index, path, lo - base, hi - base))
        base += size
    return plans


def adjust(f: Any, x: int, size: int) -> int:
    """The first line start at or after byte *x* of the open binary file *f* (see the module docstring)."""
    if x <= 0:
        return 0
    if x >= size:
        return size
    pos = x - 1
    f.seek(pos)
    while True:
        chunk = f.read(_SCAN)
        if not chunk:
            return size
        at = chunk.find(b"\n")
        if at >= 0:
            return pos + at + 1
        pos += len(chunk)


def _cut(buf: bytes) -> int:
    """Where to end a block inside *buf*: after its last newline, else after its last ASCII whitespace; 0: nowhere."""
    at = buf.rfind(b"\n")
    if at >= 0:
        return at + 1
    return max(buf.rfind(c) for c in (b" ", b"\t", b"\r", b"\x0b", b"\x0c")) + 1


def read_blocks(split: Split, block_size: int, size: int | None = None) -> Iterator[Block]:
    """The blocks of one split: whole lines (see the module docstring), each about *block_size* bytes."""
    if block_size < 1:
        raise ValueError(f"block_size {block_size}: must be >= 1 byte")
    with open(split.path, "rb") as f:
        if size is None:
            size = os.fstat(f.fileno()).st_size
        start, stop = adjust(f, split.start, size), adjust(f, split.stop, size)
        f.seek(start)
        pos, carry = start, b""
        while pos < stop:
            chunk = f.read(min(block_size, stop - pos))
            if not chunk:
                break  # the file shrank while we read it: hand over what there is
            pos += len(chunk)
            buf = carry + chunk if carry else chunk
            if pos >= stop:
                yield Block(split.index, split.path, pos - len(buf), buf)
                return
            cut = _cut(buf)
            if cut == 0:
                carry = buf  # one run of non-whitespace longer than a block: read on
                continue
            yield Block(split.index, split.path, pos - len(buf), buf[:cut])
            carry = buf[cut:]
        if carry:
            yield Block(split.index, split.path, pos - len(carry), carry)


def decode(data: bytes, errors: str, path: str, offset: int) -> str:
    """UTF-8 text of *data* (bytes from *offset* of *path*); an invalid sequence under ``strict`` names the byte."""
    try:
        return data.decode("utf-8", errors)
    except UnicodeDecodeError as exc:
        bad = data[exc.start:exc.start + 4]
        raise InputError(f"{path!r}: byte {offset + exc.start}: invalid UTF-8 ({exc.reason}, bytes {bad!r}); "
                         f"fix the file or decode with --errors replace (U+FFFD for each invalid sequence)") from None
