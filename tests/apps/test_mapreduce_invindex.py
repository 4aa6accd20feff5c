"""apps/mapreduce/invindex.py: the inverted index equals a direct computation, at any N, spilled or not."""

from __future__ import annotations

import os

import pytest

from apps.mapreduce.engine import Budget
from apps.mapreduce.invindex import by_files, escape, invindex, line_format
from apps.mapreduce.wordcount import tokenize

from .conftest import write_docs

TINY = Budget(8 << 20, block=200, store=3000, round=300, group=3000)


def test_escape_and_line_format():
    assert escape("a\tb\nc\\d") == "a\\tb\\nc\\\\d"
    assert line_format(["x.txt", "y\tz"])("word", [0, 1]) == "word\t2\tx.txt\ty\\tz"


@pytest.mark.mpi
@pytest.mark.parametrize("budget", [None, TINY], ids=["default", "tiny"])
def test_invindex_maps_every_word_to_the_files_it_occurs_in(comm, tmp_path_factory, budget):
    directory = comm.bcast(str(tmp_path_factory.mktemp("invindex")) if comm.rank == 0 else None, root=0)
    texts = [" ".join(f"w{(i * j) % 37} Wörd{j % (i + 2)}" for j in range(30 * i)) + "\n" for i in range(7)]
    texts[3] = ""
    paths = write_docs(comm, directory, texts)
    out = os.path.join(directory, "index.tsv")
    best, mr = invindex(comm, paths, lowercase=True, top=4, out=out, budget=budget)
    got = mr.gather()
    mr.close()
    expected: dict[str, list[int]] = {}
    for i, text in enumerate(texts):
        for word in sorted(set(tokenize(text, lowercase=True))):
            expected.setdefault(word, []).append(i)
    if comm.rank == 0:
        assert got == expected
        assert best == sorted(expected.items(), key=by_files)[:4]
        fmt = line_format(paths)
        with open(out, encoding="utf-8") as f:
            assert f.read() == "".join(fmt(w, files) + "\n" for w, files in sorted(expected.items()))
    comm.Barrier()
