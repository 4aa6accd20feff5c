"""apps/mapreduce/corpus.py: reproducible, sized, Zipf-shaped, Unicode-bearing, one word per vocabulary entry."""

from __future__ import annotations

import os
import stat
import tempfile
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


def _sentinel(path):
    with open(path, "wb") as f:
        f.write(b"keep me")
    os.utime(path, ns=(10**18, 10**18))


def _unchanged(path):
    assert open(path, "rb").read() == b"keep me" and os.stat(path).st_mtime_ns == 10**18, f"{path} was written"


def test_generate_never_writes_through_a_planted_link(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    _sentinel(tmp_path / "sentinel")
    for name in ("corpus-000.txt", "corpus-001.txt", STAMP):
        os.symlink(tmp_path / "sentinel", d / name)
    paths = generate(str(d), 20_000, files=2, vocabulary_size=100)
    _unchanged(tmp_path / "sentinel")
    assert all(os.path.isfile(p) and not os.path.islink(p) for p in paths) and not os.path.islink(d / STAMP)
    assert sorted(os.listdir(d)) == sorted(["corpus-000.txt", "corpus-001.txt", STAMP])  # no temporary left
    # a link with the right size is not taken for a corpus file either
    os.replace(paths[0], tmp_path / "moved.txt")
    os.symlink(tmp_path / "moved.txt", paths[0])
    again = generate(str(d), 20_000, files=2, vocabulary_size=100)
    assert not os.path.islink(again[0])


def test_the_benchmark_corpus_lives_in_a_private_directory(tmp_path, monkeypatch):
    from apps.mapreduce.bench import corpus_directory, private_cache

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    planted = tmp_path / "mapreduce-corpus-5000"  # the fixed name the benchmark used before
    planted.mkdir()
    _sentinel(tmp_path / "sentinel")
    os.symlink(tmp_path / "sentinel", planted / "corpus-000.txt")
    directory, throwaway = corpus_directory(None, 5000)
    assert not throwaway and os.path.dirname(directory) == private_cache() == str(tmp_path / f"mpicomm-{os.getuid()}")
    st = os.lstat(private_cache())
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid()
    generate(directory, 5000, files=1, vocabulary_size=50)
    _unchanged(tmp_path / "sentinel")
    assert corpus_directory(str(tmp_path / "mine"), 5000) == (str(tmp_path / "mine"), False)


@pytest.mark.parametrize("spoil", ["link", "open-mode", "file"])
def test_an_untrustworthy_cache_directory_is_not_used(tmp_path, monkeypatch, spoil):
    from apps.mapreduce.bench import corpus_directory, private_cache

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    cache = tmp_path / "tmp" / f"mpicomm-{os.getuid()}"
    if spoil == "link":
        (tmp_path / "theirs").mkdir()
        os.symlink(tmp_path / "theirs", cache)
    elif spoil == "open-mode":
        cache.mkdir()
        os.chmod(cache, 0o777)
    else:
        cache.write_bytes(b"")
    assert private_cache() is None
    directory, throwaway = corpus_directory(None, 5000)
    assert throwaway and not directory.startswith(str(cache)) and stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    os.rmdir(directory)
    if spoil == "link":
        assert os.listdir(tmp_path / "theirs") == []
