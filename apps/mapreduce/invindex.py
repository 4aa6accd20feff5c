"""An inverted index on the engine: for every word, the input files it occurs in.

It uses the engine differently from word count: values are *sets* of file numbers
(the ``union`` combiner, packed as sorted int lists of any length), the mapper
needs to know which file a block came from (``block.index``), and the output is
sorted by word rather than by a value. Words are those of
:mod:`.wordcount`'s tokenizer (same policy, same ``--lowercase``).

Output lines: ``word<TAB>number of files<TAB>file<TAB>file…`` with the files in
command-line order; a tab, newline or backslash inside a file name is written as
``\\t``, ``\\n``, ``\\\\``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .combine import Union
from .engine import Budget, KeyValue, MapReduce
from .inputs import Block
from .wordcount import canonicalizer
from .wordcount import mapper as words_mapper

__all__ = ["mapper", "escape", "line_format", "by_word", "by_files", "invindex"]


def mapper(lowercase: bool = False, errors: str = "strict") -> Callable[[bytes, KeyValue, Block], None]:
    """The map function: each distinct raw piece of a block, with the block's file number."""
    return words_mapper(lowercase, errors, per_file=True)


def escape(text: str) -> str:
    """A file name safe inside a TSV line."""
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")


def line_format(paths: Sequence[str]) -> Callable[[str, list[int]], str]:
    """``fmt(word, files)`` for the output lines (file numbers become names)."""
    names = [escape(p) for p in paths]

    def fmt(word: str, files: list[int]) -> str:
        return "\t".join([word, str(len(files))] + [names[i] for i in files])

    return fmt


def by_word(pair: tuple[str, list[int]]) -> str:
    """Output order: by word (code points)."""
    return pair[0]


def by_files(pair: tuple[str, list[int]]) -> tuple[int, str]:
    """Summary order: words in the most files first, then by word."""
    return -len(pair[1]), pair[0]


def invindex(comm: Any, paths: Sequence[str], *, lowercase: bool = False, errors: str = "strict",
             top: int = 20, out: str | None = None, memory_limit: int | str = 512 << 20,
             spill_dir: str | None = None, checkpoint_dir: str | None = None, restart: bool = False,
             progress: Any = None, budget: Budget | None = None) -> tuple[list | None, MapReduce]:
    """Index the words of *paths*; returns (the *top* words in most files, on rank 0; the finished job)."""
    mr = MapReduce(comm, key="str", value="ints", combine="union", memory_limit=memory_limit,
                   spill_dir=spill_dir, progress=progress, name="invindex", budget=budget)
    try:
        mr.map_files(paths, mapper(lowercase, errors), text=False, errors=errors,
                     canonicalize=canonicalizer(lowercase, errors, Union().add),
                     checkpoint_dir=checkpoint_dir, restart=restart, fingerprint={"lowercase": lowercase})
        mr.collate()
        mr.reduce()
        best = mr.top(top, by_files)
        if out is not None:
            mr.write_sorted(out, by_word, line_format(paths))
    except BaseException:
        mr.close()
        raise
    return best, mr
