"""apps/mapreduce/corpus.py: reproducible, sized, Zipf-shaped, Unicode-bearing, one word per vocabulary entry."""

from __future__ import annotations

import os
from collections import Counter

import pytest

from apps.mapreduce.corpus import STAMP, generate, vocabulary
from apps.mapreduce.wordcount import tokenize


def test_vocabulary_is_reproducible_distinct_and_tokenizes_to_one_word_each():
    words = vocabulary(3000, seed=4, unicode=0.2)
    assert words == vocabulary(3000, seed=4, unicode=0.2) and words != vocabulary(3000, seed=5, unicode=0.2)
    assert len(set(words)) == 3000
    assert all(tokenize(w) == [w] for w in words)
    scripts = sum(not w.isascii() for w in words)
    assert 400 < scripts < 800  # about 20 %
    with pytest.raises(ValueError, match="vocabulary size 0"):
        vocabulary(0)


def test_corpus_is_byte_identical_for_the_same_arguments_and_zipf_shaped(tmp_path):
    a = generate(str(tmp_path / "a"), 300_000, files=3, vocabulary_size=2000, seed=7)
    b = generate(str(tmp_path / "b"), 300_000, files=3, vocabulary_size=2000, seed=7)
    assert [open(x, "rb").read() for x in a] == [open(x, "rb").read() for x in b]
    sizes = [os.path.getsize(x) for x in a]
    assert 300_000 - 3 * 200 < sum(sizes) <= 300_000  # within a line per file
    assert all(open(x, "rb").read().endswith(b"\n") for x in a)
    counts = Counter()
    for x in a:
        counts.update(tokenize(open(x, encoding="utf-8").read(), lowercase=True))
    freq = [n for _, n in counts.most_common()]
    assert freq[0] > 5 * freq[20] > 0 and len(counts) > 500  # heavy head, long tail
    assert any(not w.isascii() for w in list(counts)[:200])
    c = generate(str(tmp_path / "c"), 300_000, files=3, vocabulary_size=2000, seed=8)
    assert open(c[0], "rb").read() != open(a[0], "rb").read()


def test_an_existing_corpus_is_reused_only_when_it_matches(tmp_path):
    d = str(tmp_path / "c")
    paths = generate(d, 50_000, files=2, vocabulary_size=500)
    stamp = os.path.getmtime(os.path.join(d, STAMP))
    assert generate(d, 50_000, files=2, vocabulary_size=500) == paths
    assert os.path.getmtime(os.path.join(d, STAMP)) == stamp
    with open(paths[0], "ab") as f:
        f.write(b"tampered\n")
    generate(d, 50_000, files=2, vocabulary_size=500)
    assert not open(paths[0], "rb").read().endswith(b"tampered\n")
    with pytest.raises(ValueError, match="files >= 1"):
        generate(d, 10, files=0)
