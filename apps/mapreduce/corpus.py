"""A reproducible test corpus: Zipf-distributed words in lines, any size, so benchmarks need no download.

Why Zipf: word frequencies in natural text fall off as 1/rank^s (s ≈ 1), which is
what makes a combiner pay: a few words make most of the tokens and the vocabulary
is small beside the text. The generator draws word ranks from a Zipf–Mandelbrot
law ``1/(rank + 2.7)^s`` over a made-up vocabulary of pronounceable ASCII words
and, for a fraction ``unicode`` of the vocabulary, words in accented Latin,
Greek, Cyrillic, Devanagari (with vowel signs, which are combining marks) and
CJK. Lines hold a varying number of words, joined by spaces and now and then
punctuation; the first word of a line is capitalized.

Reproducible: the vocabulary comes from ``seed``, file i from ``(seed, i)``, so the
same arguments give byte-identical files on any machine (NumPy's PCG64 streams),
and files can be made independently. Every vocabulary entry is exactly one word
under :func:`.wordcount.tokenize`.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any, BinaryIO

import numpy as np

__all__ = ["vocabulary", "generate", "corpus_files", "STAMP"]

#: The file in a corpus directory that records how the corpus was made.
STAMP = "corpus.json"

_ONSETS = ["", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z",
           "br", "ch", "cl", "dr", "fl", "gr", "pl", "pr", "sh", "st", "th", "tr"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "ou", "y"]
_CODAS = ["", "", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ck"]
_SCRIPTS = {
    "latin": (list("bcdfglmnprstvz"), list("aeiouéèêëàâäîïôöùûüçñ")),
    "greek": (list("βγδζθκλμνξπρστφχψ"), list("αεηιουω")),
    "cyrillic": (list("бвгджзклмнпрстфхцчш"), list("аеиоуыэюя")),
    "devanagari": (list("कखगघचजटडतदनपबमयरलवसह"), ["", "ा", "ि", "ी", "ु", "ू", "े", "ो", "ं"]),
}
_CJK = (0x4E00, 0x9FA5)
_SEPARATORS = [b" ", b", ", b"; ", b" - ", b": "]
_SEP_WEIGHTS = [0.90, 0.06, 0.015, 0.015, 0.01]
_LINE_ENDS = [b"\n", b".\n", b"?\n", b"!\n"]
_END_WEIGHTS = [0.5, 0.4, 0.05, 0.05]


def _word(rng: np.random.Generator, script: str) -> str:
    syllables = int(rng.integers(1, 4))
    if script == "ascii":
        parts = [_ONSETS[rng.integers(len(_ONSETS))] + _VOWELS[rng.integers(len(_VOWELS))] for _ in range(syllables)]
        return "".join(parts) + _CODAS[rng.integers(len(_CODAS))]
    if script == "cjk":
        return "".join(chr(int(rng.integers(*_CJK))) for _ in range(syllables + 1))
    consonants, vowels = _SCRIPTS[script]
    return "".join(consonants[rng.integers(len(consonants))] + vowels[rng.integers(len(vowels))]
                   for _ in range(syllables + 1))


def vocabulary(size: int, seed: int = 1, unicode: float = 0.05) -> list[str]:
    """*size* distinct words, most frequent first (ASCII, and a fraction *unicode* in other scripts)."""
    if size < 1:
        raise ValueError(f"vocabulary size {size}: must be >= 1")
    if not 0 <= unicode <= 1:
        raise ValueError(f"unicode {unicode}: a fraction in [0, 1]")
    rng = np.random.default_rng([seed, 0xC0FFEE])
    scripts = ["latin", "greek", "cyrillic", "devanagari", "cjk"]
    words, seen = [], set()
    while len(words) < size:
        script = scripts[rng.integers(len(scripts))] if rng.random() < unicode else "ascii"
        w = _word(rng, script)
        if w not in seen:
            seen.add(w)
            words.append(w)
    return words


def corpus_files(directory: str, files: int) -> list[str]:
    """The file names a corpus of *files* files has in *directory*."""
    return [os.path.join(directory, f"corpus-{i:03d}.txt") for i in range(files)]


@contextlib.contextmanager
def _replacing(path: str) -> Iterator[BinaryIO]:
    """Write *path* through a temporary file made exclusively beside it, then rename it into place.

    Why: a corpus directory may be shared or reused, and ``open(path, "wb")``
    would write through a symbolic link planted under a file's name; ``mkstemp``
    (``O_EXCL``, unpredictable name) and ``os.replace`` (which replaces a link
    itself) never touch anything outside the directory.
    """
    directory, name = os.path.split(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory or ".")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o644)  # a corpus is data to read, like any file open() makes
            yield f
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _regular_size(path: str) -> int | None:
    """The size of a plain file (not a link); None for anything else."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def _write_file(path: str, nbytes: int, words: Sequence[bytes], capitals: Sequence[bytes], cdf: np.ndarray,
                rng: np.random.Generator, line_words: int) -> int:
    vocab, caps = np.array(words, dtype=object), np.array(capitals, dtype=object)
    seps, ends = np.array(_SEPARATORS, dtype=object), np.array(_LINE_ENDS, dtype=object)
    written = 0
    with _replacing(path) as f:
        while written < nbytes:
            # tokens for what is left (a token and its separator take about 7 bytes): a small file draws no more
            # than it keeps, a large one draws 2**18 at a time
            n = min(1 << 18, max(1 << 12, (nbytes - written) // 5))
            idx = np.searchsorted(cdf, rng.random(n), side="right")
            idx = np.minimum(idx, len(vocab) - 1)
            sep = seps[rng.choice(len(seps), n, p=_SEP_WEIGHTS)]
            lengths = rng.integers(1, 2 * line_words, n // line_words + 2)
            last = np.cumsum(lengths) - 1
            last = last[last < n]
            sep[last] = ends[rng.choice(len(ends), len(last), p=_END_WEIGHTS)]
            tokens = vocab[idx]
            firsts = np.concatenate([[0], last[:-1] + 1]) if len(last) else np.array([0])
            tokens[firsts] = caps[idx[firsts]]
            stop = int(last[-1]) + 1 if len(last) else n
            parts = np.empty(2 * stop, dtype=object)
            parts[0::2], parts[1::2] = tokens[:stop], sep[:stop]
            chunk = b"".join(parts.tolist())
            if written + len(chunk) > nbytes:
                cut = chunk.rfind(b"\n", 0, nbytes - written) + 1
                chunk = chunk[:cut] if cut > 0 else b""
                if not chunk:
                    break
            f.write(chunk)
            written += len(chunk)
    return written


def generate(directory: str, size: int, files: int = 8, vocabulary_size: int = 100_000, zipf: float = 1.0,
             seed: int = 1, unicode: float = 0.05, line_words: int = 12, reuse: bool = True) -> list[str]:
    """Write the corpus (about *size* bytes over *files* files; each file ends with a whole line).

    Every file is written under a temporary name and renamed into place, so a
    symbolic link planted under a corpus file's name is replaced, never written
    through. With *reuse*, a directory already holding a corpus made with the same
    arguments (its stamp file and sizes) is left as it is.
    """
    if size < 0 or files < 1 or line_words < 1 or zipf <= 0:
        raise ValueError(f"size {size}, files {files}, line_words {line_words}, zipf {zipf}: "
                         f"need size >= 0, files >= 1, line_words >= 1, zipf > 0")
    params: dict[str, Any] = {"size": size, "files": files, "vocabulary": vocabulary_size, "zipf": zipf,
                              "seed": seed, "unicode": unicode, "line_words": line_words}
    paths = corpus_files(directory, files)
    stamp = os.path.join(directory, STAMP)
    if reuse and _regular_size(stamp) is not None:
        try:
            with open(stamp) as f:
                old = json.load(f)
            if (old.get("params") == params and len(old["sizes"]) == len(paths)
                    and all(_regular_size(p) == n for p, n in zip(paths, old["sizes"]))):
                return paths
        except (OSError, ValueError, KeyError, TypeError):
            pass
    os.makedirs(directory, exist_ok=True)
    words = vocabulary(vocabulary_size, seed, unicode)
    encoded = [w.encode() for w in words]
    capitals = [w[:1].upper().encode() + w[1:].encode() for w in words]
    weights = 1.0 / (np.arange(vocabulary_size) + 2.7) ** zipf
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    sizes = []
    for i, path in enumerate(paths):
        share = size // files + (1 if i < size % files else 0)
        rng = np.random.default_rng([seed, i])
        sizes.append(_write_file(path, share, encoded, capitals, cdf, rng, line_words))
    with _replacing(stamp) as f:
        f.write(json.dumps({"params": params, "sizes": sizes}, indent=1).encode())
    return paths
