"""apps/mapreduce/check.py: --check passes on the engine's own answer and names what differs on another one."""

from __future__ import annotations

import pytest

from apps.mapreduce.check import check, difference, reference
from apps.mapreduce.invindex import invindex
from apps.mapreduce.wordcount import wordcount

from .conftest import write_docs


def test_difference_names_the_words_that_differ_and_how():
    assert difference({"a": 2, "b": [0, 1]}, {"a": 2, "b": [1, 0]}) is None  # file lists in any order
    said = difference({"a": 3, "c": 1, "x": 5}, {"a": 2, "b": 4, "x": 5})
    assert said == ("the engine's answer differs from one process's count of the same files (3 words): "
                    "1 word(s) with another value ('a': 3 against 2); 1 word(s) missing ('b'); "
                    "1 word(s) one process does not find ('c')")


@pytest.mark.mpi
def test_the_check_passes_on_the_engines_answer_and_fails_on_another(comm, tmp_path_factory):
    directory = comm.bcast(str(tmp_path_factory.mktemp("check")) if comm.rank == 0 else None, root=0)
    texts = [" ".join(f"w{(i * j + comm.size) % 23} Wörd{j % (i + 2)}" for j in range(40 + 9 * i)) + "\n"
             for i in range(5)]
    paths = write_docs(comm, directory, texts)
    _, mr = wordcount(comm, paths, top=0)
    try:
        assert check(comm, "wordcount", mr, paths) is None
        doubled = check(comm, "wordcount", mr, paths + paths)  # one process counts every file twice
    finally:
        mr.close()
    assert doubled is not None and doubled.startswith("the engine's answer differs from one process's count")
    assert f"{len(reference('wordcount', paths))} word(s) with another value" in doubled
    _, mr = invindex(comm, paths, top=0)
    try:
        assert check(comm, "invindex", mr, paths) is None
        shifted = check(comm, "invindex", mr, paths[1:] + paths[:1])  # the same files, numbered otherwise
    finally:
        mr.close()
    assert shifted is not None and "with another value" in shifted
