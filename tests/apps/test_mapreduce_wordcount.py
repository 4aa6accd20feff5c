"""apps/mapreduce/wordcount.py: the tokenizer, and word count on the engine equal to collections.Counter at any N."""

from __future__ import annotations

import os
import random
from collections import Counter

import pytest

from apps.mapreduce.combine import Sum
from apps.mapreduce.engine import Budget, KeyValue
from apps.mapreduce.inputs import Block, InputError
from apps.mapreduce.wordcount import canonicalizer, count_files, fmt, mapper, order, tokenize, wordcount

#: Forces every spill path on small inputs: map-side spills, reduce buckets, spilled results, many rounds.
TINY = Budget(8 << 20, block=256, store=4000, round=512, group=4000)


def test_the_tokenizer_policy_on_literal_examples():
    assert tokenize("Hello, world! don't x_y 42nd") == ["Hello", "world", "don", "t", "x_y", "42nd"]
    assert tokenize("हिन्दी नमस्ते ไทย") == ["हिन्दी", "नमस्ते", "ไทย"]  # vowel signs are marks: one word each
    assert tokenize("naïve e\u0301te café") == ["naïve", "e\u0301te", "café"]
    assert tokenize("日本語の文章。Ελληνικά—Кириллица") == ["日本語の文章", "Ελληνικά", "Кириллица"]
    assert tokenize("a\u00a0b\u3000c\ufffdd\u200be") == ["a", "b", "c", "d", "e"]  # NBSP, ideographic space, U+FFFD, ZWSP
    assert tokenize("ΟΔΟΣ İstanbul STRASSE", lowercase=True) == ["οδος", "i̇stanbul", "strasse"]
    assert tokenize("") == [] and tokenize(" ,.;\n\r\t ") == []
    with pytest.raises(TypeError, match="decode bytes first"):
        tokenize(b"bytes")  # type: ignore[arg-type]


def _random_text(rng: random.Random, n: int) -> str:
    alphabet = ("abcXYZ019_ ,.;:'!?-\n\r\t\u00a0éüß" "ΣσςΩ" "абвЖ" "हिन्दीा" "日本語" "\u0301\u0308" "İ" "🙂" "\u3000" "\ufffd")
    return "".join(rng.choice(alphabet) for _ in range(n))


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("lowercase", [False, True])
def test_the_fast_path_counts_exactly_what_the_tokenizer_finds(seed, lowercase):
    rng = random.Random(seed)
    text = _random_text(rng, 3000)
    data = text.encode()
    kv = KeyValue(Sum())
    cut = data.find(b" ", rng.randrange(len(data))) + 1  # two blocks, cut after whitespace as the reader does
    for part in (data[:cut], data[cut:]):
        mapper(lowercase)(part, kv, Block(0, "t.txt", 0, part))
    canonicalizer(lowercase)(kv.store)
    assert all(isinstance(k, bytes) for k in kv.store)
    assert {k.decode(): v for k, v in kv.store.items()} == Counter(tokenize(text, lowercase))


def test_canonicalizer_policy_for_invalid_utf8():
    store = {b"ab\xffcd": 2, b"ab": 1}
    canonicalizer(errors="replace")(store)
    assert store == {b"ab": 3, b"cd": 2}
    with pytest.raises(UnicodeDecodeError):
        canonicalizer(errors="strict")({b"ab\xffcd": 1})
    with pytest.raises(ValueError, match="use one of strict, replace"):
        canonicalizer(errors="ignore")


# --------------------------------------------------------------------------------------------- corpora

def _files(case: str) -> dict[str, bytes]:
    rng = random.Random(case)
    words = ["the", "The", "naïve", "हिन्दी", "Straße", "don't", "x_y", "日本語", "ÉCOLE", "école", "e\u0301te",
             "ΟΔΟΣ", "οδός", "İzmir", "𠀀𠀁"] + [f"w{i}" for i in range(300)]

    def lines(n: int, end: str = "\n") -> str:
        return "".join(" ".join(rng.choices(words, k=rng.randint(0, 12))) + rng.choice(["", ".", ","]) + end
                       for _ in range(n))

    if case == "unicode":
        return {"u1.txt": lines(300).encode(), "u2.txt": lines(200).encode()}
    if case == "empty":
        return {"e0.txt": b"", "e1.txt": lines(50).encode(), "e2.txt": b"", "e3.txt": b"", "e4.txt": b"x\n"}
    if case == "tiny":  # files smaller than the number of ranks
        return {"t0.txt": b"a", "t1.txt": b"b\n", "t2.txt": b"", "t3.txt": "é".encode(), "t4.txt": b"a b"}
    if case == "giant_line":  # no newline at all, and a word longer than a block
        return {"g.txt": (lines(400, end=" ") + "z" * 3000 + " tail").encode()}
    if case == "many_small":
        return {f"s{i:03d}.txt": lines(rng.randint(0, 3)).encode() for i in range(60)}
    if case == "crlf":
        return {"c1.txt": lines(200, end="\r\n").encode(), "c2.txt": (lines(10, end="\r\n") + "no end\r").encode()}
    if case == "multibyte_split":
        # 4-byte characters: the byte ranges of 2, 3 and 4 ranks begin inside a character (checked below)
        body = "".join("𠀀" * rng.randint(1, 9) + rng.choice([" ", "\n", " 𠀁 "]) for _ in range(200))
        data = body.encode()
        while any((data[(r * len(data)) // p] & 0xC0) != 0x80 for p in (2, 3, 4) for r in range(1, p)):
            data += "𠀀".encode()
        return {"m.txt": data}
    raise ValueError(case)


CASES = ["unicode", "empty", "tiny", "giant_line", "many_small", "crlf", "multibyte_split"]


@pytest.fixture
def shared(comm, tmp_path_factory):
    """A directory every rank sees (made by rank 0)."""
    path = comm.bcast(str(tmp_path_factory.mktemp("wordcount")) if comm.rank == 0 else None, root=0)
    yield path
    comm.Barrier()


def _make(comm, directory: str, case: str) -> tuple[list[str], dict[str, bytes]]:
    files = _files(case)
    if comm.rank == 0:
        for name, data in files.items():
            with open(os.path.join(directory, name), "wb") as f:
                f.write(data)
    comm.Barrier()
    return [os.path.join(directory, name) for name in files], files


@pytest.mark.mpi
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("budget", [None, TINY], ids=["default", "tiny"])
def test_wordcount_equals_counter_and_sorted_output_is_the_same_at_any_n(comm, shared, case, budget):
    paths, files = _make(comm, shared, case)
    lowercase = case in ("unicode", "crlf")
    expected = Counter()
    for data in files.values():
        expected.update(tokenize(data.decode("utf-8"), lowercase))
    out = os.path.join(shared, "counts.tsv")
    best, mr = wordcount(comm, paths, lowercase=lowercase, top=5, out=out, budget=budget)
    try:
        got = mr.gather()
        summary = mr.summary()
    finally:
        mr.close()
    if comm.rank == 0:
        assert got == dict(expected)
        assert best == sorted(expected.items(), key=order)[:5]
        with open(out, encoding="utf-8") as f:
            assert f.read() == "".join(fmt(w, c) + "\n" for w, c in sorted(expected.items(), key=order))
    if budget is not None and sum(expected.values()) > 1000:
        assert sum(s["counters"]["map_spills"] for s in summary) > 0
        assert max(s["counters"]["buckets"] for s in summary) > 1


def test_count_files_is_the_single_process_reference(tmp_path):
    files = _files("unicode")
    paths = []
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        paths.append(str(tmp_path / name))
    expected = Counter()
    for data in files.values():
        expected.update(tokenize(data.decode(), True))
    assert count_files(paths, lowercase=True, block_size=100) == expected


@pytest.mark.mpi
def test_invalid_utf8_stops_every_rank_or_is_replaced(comm, shared):
    paths, files = _make(comm, shared, "unicode")
    bad = os.path.join(shared, "bad.txt")
    if comm.rank == 0:
        with open(bad, "wb") as f:
            f.write(b"good words\n" * 50 + b"bad \xc3( byte\n" + b"more words\n" * 50)
    comm.Barrier()
    message = None
    try:
        wordcount(comm, paths + [bad], top=1)
    except InputError as exc:
        message = str(exc)
    assert message is not None and f"{bad!r}: byte {11 * 50 + 4}: invalid UTF-8" in message
    assert comm.allgather(message) == [message] * comm.size
    best, mr = wordcount(comm, [bad], errors="replace", top=3)
    got = mr.gather()
    mr.close()
    if comm.rank == 0:
        assert got == Counter(tokenize((b"good words\n" * 50 + b"bad \xc3( byte\n" + b"more words\n" * 50)
                                       .decode("utf-8", "replace")))
