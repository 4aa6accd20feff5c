"""python -m apps.mapreduce as users run it: output, --json, bad input on every rank, restart, the memory limit, the
corpus, the benchmark and its --out."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import tempfile
from collections import Counter

import pytest

from apps.mapreduce.wordcount import fmt, order, tokenize
from mpicomm import cli
from tests import mpirun

pytestmark = pytest.mark.launches


def _run(n: int, args: list[str], timeout: float = 60, prefix: tuple[str, ...] = ()) -> mpirun.Result:
    return mpirun.run(n, [*prefix, sys.executable, "-m", "apps.mapreduce", *args], timeout=timeout)


def _corpus(directory) -> tuple[list[str], Counter]:
    texts = {
        "a.txt": "The quick brown fox, the lazy dog.\r\nnaïve café — हिन्दी 日本語\n" * 40,
        "b.txt": "",
        "c.txt": "x",
        "d.txt": " ".join(f"w{i % 97}" for i in range(3000)),  # one long line
    }
    paths, counts = [], Counter()
    for name, text in texts.items():
        path = os.path.join(directory, name)
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        paths.append(path)
        counts.update(tokenize(text, lowercase=True))
    return paths, counts


def _document(path) -> dict:
    """A --json document, checked for the fields every mpicomm command writes."""
    with open(path) as f:
        doc = json.load(f)
    assert {"schema", "schema_version", "command", "machine", "versions", "date", "results"} <= doc.keys()
    assert doc["schema"] == cli.SCHEMA and doc["schema_version"] == cli.SCHEMA_VERSION
    return doc


def _each_rank_says(result: mpirun.Result, n: int, command: str, text: str) -> None:
    """Found once the job runs, by every rank alike: said once per job, every rank exits with status 2."""
    assert not result.timed_out and result.seconds < 45, f"took {result.seconds:.0f} s"
    assert result.returncode == 2
    assert result.stderr.count(f"python -m apps.mapreduce {command}: error: ") == 1, result.stderr
    assert text in result.stderr and f" of {n}: " not in result.stderr, result.stderr


def _usage_error(result: mpirun.Result, n: int, command: str, text: str) -> None:
    """Found before the work starts: argparse's usage error, once per job (status 2 on every rank)."""
    assert not result.timed_out and result.seconds < 45, f"took {result.seconds:.0f} s"
    assert result.returncode == 2
    line = f"python -m apps.mapreduce {command}: error: {text}"
    assert result.stderr.count(line) == 1 and result.stderr.count("usage:") == 1, result.stderr
    assert "rank 0 of 1" not in result.stderr


def test_wordcount_prints_the_top_words_and_writes_the_sorted_counts(tmp_path):
    paths, counts = _corpus(str(tmp_path))
    out, js = str(tmp_path / "counts.tsv"), str(tmp_path / "wc.json")
    result = _run(4, ["wordcount", *paths, "--lowercase", "--top", "3", "--output", out, "--json", js,
                      "--memory-limit", "64MiB", "--check"])
    assert result.returncode == 0, result.stderr
    best = sorted(counts.items(), key=order)
    assert f"{sum(counts.values())} words, {len(counts)} distinct" in result.stdout
    for word, count in best[:3]:
        assert f"{count:>10}  {word}" in result.stdout
    assert "phases (seconds, max and min over ranks)" in result.stdout and "shuffle" in result.stdout
    assert "wordcount [1/3] map:" in result.stderr and "keys moved" in result.stderr  # progress from rank 0
    assert "wordcount [3/3] reduce:" in result.stderr and "elapsed" in result.stderr
    with open(out, encoding="utf-8") as f:
        assert f.read() == "".join(fmt(w, c) + "\n" for w, c in best)
    doc = _document(js)
    assert doc["command"].startswith("mpiexec -n 4 python -m apps.mapreduce wordcount ")
    report = doc["results"]
    assert {"command", "ranks", "words", "keys", "top", "summary", "memory", "memory_limit", "restored_from"} \
        <= report.keys()
    assert report["ranks"] == 4 and len(report["summary"]) == 4 and report["keys"] == len(counts)
    assert report["memory_limit"] == 64 << 20 and report["words"] == sum(counts.values()) and report["checked"]
    assert "check passed: every word's count equals one process's answer for the same files" in result.stdout


def test_the_default_run_counts_a_generated_corpus_and_checks_its_answer(tmp_path):
    """``mpiexec -n 2 python -m apps.mapreduce wordcount``, no FILE: what a newcomer runs after the README's first
    command. A second job (the inverted index) reuses the corpus."""
    env = {"TMPDIR": str(tmp_path)}  # the corpus goes to <temp>/mpicomm-<uid>/: this test's own
    result = mpirun.run(2, [sys.executable, "-m", "apps.mapreduce", "wordcount", "--top", "3"], timeout=120, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    corpus = tmp_path / f"mpicomm-{os.getuid()}" / "mapreduce-default-corpus"
    paths = sorted(str(p) for p in corpus.glob("corpus-*.txt"))
    assert len(paths) == 8 and abs(sum(map(os.path.getsize, paths)) - (4 << 20)) < 1000
    counts: Counter = Counter()
    for path in paths:
        with open(path, encoding="utf-8") as f:
            counts.update(tokenize(f.read()))
    said = result.stdout.splitlines()
    assert said[0].startswith(f"wordcount: no FILE given: a generated corpus of 8 files, 4.0 MiB (Zipf s = 1 over "
                              f"20000 words, seed 1) in {corpus} (made in "), said[0]
    assert f"2 rank(s): {sum(counts.values())} words, {len(counts)} distinct" in result.stdout
    for word, count in sorted(counts.items(), key=order)[:3]:
        assert f"{count:>10}  {word}" in result.stdout
    assert "check passed: every word's count equals one process's answer for the same files" in result.stdout
    again = mpirun.run(2, [sys.executable, "-m", "apps.mapreduce", "invindex", "--quiet"], timeout=120, env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"in {corpus} (reused)" in again.stdout and f"{len(counts)} distinct words" in again.stdout
    assert "check passed: every word's file list equals" in again.stdout and again.stderr == ""


def test_invindex_cli(tmp_path):
    paths, _ = _corpus(str(tmp_path))
    out = str(tmp_path / "index.tsv")
    refused = _run(2, ["invindex", *paths, "--out", out, "--quiet", "--top", "2"])  # --output's earlier name
    _usage_error(refused, 2, "invindex", "--out: renamed --output (--out is for Markdown reports)")
    result = _run(2, ["invindex", *paths, "--output", out, "--quiet", "--top", "2"])
    assert result.returncode == 0, result.stderr
    lines = open(out, encoding="utf-8").read().splitlines()
    assert lines == sorted(lines, key=lambda line: line.split("\t")[0])
    assert "the\t1\t" + paths[0] in lines and "w5\t1\t" + paths[3] in lines
    assert result.stderr == ""
    again = _run(2, ["invindex", *paths, "--output", out, "--quiet"])  # a data file is never replaced silently
    _usage_error(again, 2, "invindex", f"--output {out} exists; add --force to replace it")
    assert _run(2, ["invindex", *paths, "--output", out, "--quiet", "--force"]).returncode == 0


def test_missing_files_and_directories_are_reported_once_for_every_rank(tmp_path):
    paths, _ = _corpus(str(tmp_path))
    missing = str(tmp_path / "nope.txt")
    result = _run(3, ["wordcount", paths[0], missing, str(tmp_path)])
    _each_rank_says(result, 3, "wordcount", f"{missing!r} does not exist")
    assert result.stderr.count(f"{str(tmp_path)!r} is a directory") == 1


def test_an_unreadable_file_is_reported_by_every_rank():
    directory = tempfile.mkdtemp(prefix="mapreduce-unreadable-")
    try:
        os.chmod(directory, 0o755)
        good, secret = os.path.join(directory, "good.txt"), os.path.join(directory, "secret.txt")
        for path in (good, secret):
            with open(path, "w") as f:
                f.write("words here\n")
        os.chmod(good, 0o644)
        os.chmod(secret, 0)
        prefix: tuple[str, ...] = ()
        if os.geteuid() == 0:  # root reads anything: run the ranks as nobody
            setpriv = shutil.which("setpriv")
            if setpriv is None:
                pytest.skip("running as root and no setpriv to drop privileges with")
            prefix = (setpriv, "--reuid=65534", "--regid=65534", "--clear-groups")
        result = _run(2, ["wordcount", good, secret], prefix=prefix)
        _each_rank_says(result, 2, "wordcount", f"{secret!r} cannot be read (Permission denied)")
    finally:
        os.chmod(os.path.join(directory, "secret.txt"), stat.S_IRUSR | stat.S_IWUSR)
        shutil.rmtree(directory)


def test_invalid_utf8_is_reported_by_every_rank_with_file_and_byte(tmp_path):
    bad = str(tmp_path / "bad.txt")
    with open(bad, "wb") as f:
        f.write(b"fine line\n" * 300 + b"broken \xe2\x28\xa1 here\n" + b"fine line\n" * 300)
    result = _run(3, ["invindex", bad])
    _each_rank_says(result, 3, "invindex", f"{bad!r}: byte {10 * 300 + 7}: invalid UTF-8")
    replaced = _run(3, ["wordcount", bad, "--errors", "replace", "--quiet"])
    assert replaced.returncode == 0 and "602 fine" not in replaced.stdout and "600  fine" in replaced.stdout


def test_a_bad_memory_limit_is_reported_by_every_rank():
    result = _run(2, ["wordcount", "whatever.txt", "--memory-limit", "lots"])
    _usage_error(result, 2, "wordcount", "--memory-limit must be a whole number with an optional unit")
    small = _run(2, ["wordcount", "whatever.txt", "--memory-limit", "16M"])
    _usage_error(small, 2, "wordcount", "--memory-limit must be >= 32.0 MiB, got 16.0 MiB")


def test_restart_skips_the_map_and_writes_identical_output(tmp_path):
    paths, _ = _corpus(str(tmp_path))
    ckpt = str(tmp_path / "ckpt")
    first = _run(3, ["wordcount", *paths, "--output", str(tmp_path / "1.tsv"), "--checkpoint-dir", ckpt,
                     "--checkpoint-every", "1", "--quiet"])
    assert first.returncode == 0, first.stderr
    assert any(name.endswith(".json") for name in os.listdir(ckpt))
    second = _run(2, ["wordcount", *paths, "--output", str(tmp_path / "2.tsv"), "--checkpoint-dir", ckpt,
                      "--restart"])
    assert second.returncode == 0, second.stderr
    assert "map output restored from" in second.stdout and "wordcount [1/3] restart:" in second.stderr
    assert "map skipped" in second.stderr
    assert open(tmp_path / "1.tsv", "rb").read() == open(tmp_path / "2.tsv", "rb").read()


def test_peak_memory_stays_under_the_limit_while_spilling(tmp_path):
    """RSS high-water mark (VmHWM) above the RSS just before the job, per rank, against --memory-limit.

    500,000 distinct words need about 75 MiB per rank held in Python dicts; with a
    32 MiB limit the engine must spill on both sides of the shuffle and still count right.
    """
    if not os.path.exists("/proc/self/clear_refs"):
        pytest.skip("needs Linux /proc to read the RSS high-water mark")
    path = str(tmp_path / "unique.txt")
    words = [f"u{(i * 7919) % 500_009:07d}" for i in range(500_000)]
    with open(path, "w") as f:
        for i in range(0, len(words), 10):
            f.write(" ".join(words[i:i + 10]) + "\n")
    out, js = str(tmp_path / "u.tsv"), str(tmp_path / "u.json")
    result = _run(2, ["wordcount", path, "--memory-limit", "32M", "--output", out, "--json", js, "--quiet",
                      "--spill-dir", str(tmp_path)], timeout=120)
    assert result.returncode == 0, result.stderr
    report = _document(js)["results"]
    if not all(m["measured_from_start"] for m in report["memory"]):
        pytest.skip("this kernel does not let a process reset its RSS high-water mark (/proc/self/clear_refs)")
    limit = 32 << 20
    for rank, m in enumerate(report["memory"]):
        grown = m["peak"] - m["baseline"]
        assert 0 < grown <= limit, f"rank {rank}: peak RSS grew by {grown / 2**20:.1f} MiB, limit 32 MiB"
    counters = [s["counters"] for s in report["summary"]]
    assert sum(c["map_spills"] for c in counters) > 0 and max(c["buckets"] for c in counters) > 1
    assert open(out).read() == "".join(fmt(w, 1) + "\n" for w in sorted(set(words)))
    assert [name for name in os.listdir(tmp_path) if name.startswith("mapreduce-")] == []  # spill dirs removed


def test_the_benchmark_writes_its_table_with_the_command(tmp_path):
    out, js = str(tmp_path / "bench.md"), str(tmp_path / "bench.json")
    args = ["bench", "--size", "600K", "--files", "2", "--vocabulary", "2000", "--repeat", "2",
            "--dir", str(tmp_path / "corpus"), "--out", out, "--json", js]
    result = _run(2, args, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    table = open(out).read()
    assert "mpiexec -n 2 python -m apps.mapreduce bench --size 600K" in table
    assert "| `Counter`, 1 process |" in table and "| engine, 2 ranks |" in table and "| shuffle |" in table
    assert "rank 0:" in table and "rank 1:" in table
    assert "bench [1/2] Counter " in result.stderr and "bench [2/2] Counter " in result.stderr  # progress
    doc = _document(js)
    results = doc["results"]
    assert doc["command"] == table.split("```bash\n", 1)[1].split("\n", 1)[0]
    assert len(results["counter"]["seconds"]) == 2 and len(results["engine"]["phases"]) == 2
    assert results["speedup"] > 0 and abs(results["bytes"] - (600 << 10)) < 1000 and results["ranks"] == 2
    # an existing report is kept unless --append or --force: every rank says so before any work
    refused = _run(2, args, timeout=60)
    _usage_error(refused, 2, "bench", f"--out {out} exists; add --append")
    assert open(out).read() == table


def test_the_corpus_takes_any_size_form_and_writes_json(tmp_path):
    for size, expect in (("64KiB", 64 << 10), ("1e5", 100_000)):
        js = str(tmp_path / f"{size}.json")
        result = mpirun.run(1, [sys.executable, "-m", "apps.mapreduce", "corpus", str(tmp_path / size), "--size", size,
                                "--files", "2", "--json", js], timeout=60)
        assert result.returncode == 0, result.stderr
        doc = _document(js)
        assert doc["command"] == (f"python -m apps.mapreduce corpus {tmp_path / size} --size {size} --files 2 "
                                  f"--json {js}")
        results = doc["results"]
        assert results["size"] == expect and len(results["files"]) == 2
        assert abs(results["bytes"] - expect) < 1000  # files end at whole lines


def test_the_corpus_is_refused_as_several_ranks_naming_them(tmp_path):
    """One process writes the corpus; under mpiexec the job says so once (under sbatch, without a launcher, it
    runs)."""
    result = _run(2, ["corpus", str(tmp_path / "c"), "--size", "10K"])
    _usage_error(result, 2, "corpus", "run corpus without mpiexec (one process writes the files)")
    assert not (tmp_path / "c").exists()


def test_the_benchmark_never_writes_through_a_link_planted_in_the_shared_temporary_directory(tmp_path):
    """The corpus used to go to a fixed <temp>/mapreduce-corpus-<bytes>: anyone could plant a link there first."""
    planted = tmp_path / "mapreduce-corpus-20480"
    planted.mkdir()
    sentinel = tmp_path / "sentinel"
    sentinel.write_bytes(b"keep me")
    os.utime(sentinel, ns=(10**18, 10**18))
    os.symlink(sentinel, planted / "corpus-000.txt")
    result = mpirun.run(1, [sys.executable, "-m", "apps.mapreduce", "bench", "--size", "20K", "--files", "1",
                            "--vocabulary", "200", "--repeat", "1", "--quiet"], timeout=60,
                        env={"TMPDIR": str(tmp_path)})
    assert result.returncode == 0, result.stdout + result.stderr
    assert sentinel.read_bytes() == b"keep me" and sentinel.stat().st_mtime_ns == 10**18
    assert f"mpicomm-{os.getuid()}" in result.stdout
