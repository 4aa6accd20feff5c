"""The targets summary of benchmark JSON files (python -m mpicomm.bench.summary): numbers worked by hand."""

from __future__ import annotations

import json

import pytest

from mpicomm.bench import summary

MiB = 1 << 20


def _row(collective: str, size: int, name: str, us: float, chose: str | None = None, model: float | None = None):
    return {"collective": collective, "size": size, "name": name, "avg_us": us, "chose": chose,
            "meas_over_model": model}


def _write(tmp_path, name: str, p: int, rows: list[dict]) -> str:
    path = tmp_path / name
    path.write_text(json.dumps({"benchmark": rows[0]["collective"], "p": p, "rows": rows}))
    return str(path)


def test_targets_are_judged_from_the_rows(tmp_path):
    rows = [
        _row("allreduce", 8, "native", 4.0), _row("allreduce", 8, "ring", 30.0, model=1.0),
        _row("allreduce", 8, "auto", 20.0, "ring"), _row("allreduce", 8, "persistent", 6.0),
        _row("allreduce", MiB, "native", 100.0), _row("allreduce", MiB, "ring", 90.0, model=2.0),
        _row("allreduce", MiB, "shm", 60.0, model=1.2), _row("allreduce", MiB, "auto", 70.0, "shm"),
        _row("allreduce", MiB, "shm+pool", 10.0),
    ]
    text = summary.summarize([_write(tmp_path, "a.json", 2, rows)])
    assert "### p = 2" in text
    assert ("native 4.0 µs; auto 20.0 µs (5.0x, +16.0 µs per call; target ≤ 1.5 missed); "
            "persistent 6.0 µs (1.5x, +2.0 µs per call; target ≤ 1.2 missed)") in text
    assert "| allreduce | 1048576 | 100.0 | shm | 0.70 | shm | 0.60 | ≤ 0.7 met |" in text  # shm+pool is not ordinary
    assert "auto met its target at 1 of 1 points." in text
    assert "1 of 2 points (50 %" in text  # 8 B: auto 20 against ring 30 is within; 1 MiB: 70 against 60 is not
    assert "allreduce 1048576 B auto (shm) 1.17x of shm" in text
    assert "model within 1.5x of the measurement at ≥ 64 KiB: 1 of 2" in text  # 8 B rows are below 64 KiB


def test_each_collective_is_judged_from_64_kib_against_its_own_target():
    assert summary.target_of("allreduce", 32768) is None
    assert summary.target_of("allreduce", 65536) == 0.8
    assert summary.target_of("allreduce", MiB) == 0.7
    assert summary.target_of("allreduce", 16 * MiB) == 0.6
    assert summary.target_of("alltoall", 65536) == 1.0
    assert summary.target_of("alltoall", 4 * MiB) == 0.8
    assert summary.target_of("reduce", MiB) is None


def test_several_rank_counts_make_several_sections_and_bad_files_are_named(tmp_path):
    a = _write(tmp_path, "a.json", 2, [_row("bcast", MiB, "native", 10.0), _row("bcast", MiB, "auto", 9.0, "linear"),
                                       _row("bcast", MiB, "linear", 9.0)])
    b = _write(tmp_path, "b.json", 4, [_row("bcast", MiB, "native", 10.0), _row("bcast", MiB, "auto", 12.0, "linear"),
                                       _row("bcast", MiB, "linear", 12.0)])
    text = summary.summarize([a, b])
    assert text.index("### p = 2") < text.index("### p = 4")
    assert "| bcast | 1048576 | 10.0 | linear | 0.90 | linear | 0.90 | ≤ 0.8 missed |" in text
    assert "| bcast | 1048576 | 10.0 | linear | 1.20 | linear | 1.20 | ≤ 0.8 missed |" in text
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="bad.json: not a benchmark JSON file"):
        summary.summarize([str(tmp_path / "bad.json")])


@pytest.mark.serial  # under mpiexec only the lowest rank prints a usage error: one process checks it
def test_the_command_refuses_to_replace_a_file_without_force(tmp_path, capsys):
    a = _write(tmp_path, "a.json", 2, [_row("bcast", MiB, "native", 10.0), _row("bcast", MiB, "auto", 9.0, "x")])
    out = tmp_path / "targets.md"
    out.write_text("keep me")
    with pytest.raises(SystemExit):
        summary.main([a, "--out", str(out)])
    assert out.read_text() == "keep me"
    assert summary.main([a, "--out", str(out), "--force"]) == 0
    assert "### p = 2" in out.read_text()


def test_documents_with_rows_under_results_read_alike(tmp_path):
    from mpicomm import cli

    rows = [_row("bcast", MiB, "native", 10.0), _row("bcast", MiB, "auto", 9.0, "linear"),
            _row("bcast", MiB, "linear", 9.0)]
    for row in rows:  # --inplace numbers sit beside the out-of-place ones; the targets read only the latter
        row["in_place"] = {"avg_us": 1.0}
    old = _write(tmp_path, "old.json", 2, rows)
    new = tmp_path / "new.json"
    cli.write_json(str(new), "mpiexec -n 2 python -m mpicomm.bench bcast", rows, benchmark="bcast", p=2)
    assert summary.summarize([str(new)]) == summary.summarize([old])
    assert "| bcast | 1048576 | 10.0 | linear | 0.90 | linear | 0.90 | ≤ 0.8 missed |" in summary.summarize([str(new)])
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"schema": "something-else", "p": 2, "results": rows}))
    with pytest.raises(ValueError, match="has no rows or p"):
        summary.summarize([str(other)])


def test_the_command_appends_with_append(tmp_path):
    a = _write(tmp_path, "a.json", 2, [_row("bcast", MiB, "native", 10.0), _row("bcast", MiB, "auto", 9.0, "x")])
    out = tmp_path / "targets.md"
    out.write_text("earlier\n")
    assert summary.main([a, "--out", str(out), "--append"]) == 0
    text = out.read_text()
    assert text.startswith("earlier\n") and "### p = 2" in text


@pytest.mark.serial  # under mpiexec only the lowest rank prints a usage error: one process checks it
def test_a_file_that_is_not_a_benchmarks_is_a_usage_error(tmp_path, capsys):
    good = _write(tmp_path, "a.json", 2, [_row("bcast", MiB, "native", 10.0), _row("bcast", MiB, "auto", 9.0, "x")])
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(SystemExit) as exc:
        summary.main([good, str(tmp_path / "bad.json")])
    captured = capsys.readouterr()
    assert exc.value.code == 2 and captured.out == ""  # nothing printed before the refusal
    assert f"python -m mpicomm.bench.summary: error: {tmp_path / 'bad.json'}: has no rows or p" in captured.err
