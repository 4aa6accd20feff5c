"""kernels/bench.py: the benchmark end to end at a tiny size (the table's shape, the JSON's figures printed, --out, --json),
its size forms, and the warm-up before every timed loop."""

from __future__ import annotations

import json
import re

import pytest

import kernels
from kernels import bench
from mpicomm import cli

pytestmark = pytest.mark.serial  # no MPI: the serial pass runs it


def _rows(text: str) -> list[list[str]]:
    lines = [line for line in text.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def test_tiny_run_prints_the_table_and_writes_files(tmp_path, capsys):
    paths = [p for p in ("numpy", "compiled") if kernels.available(p)[0]]
    out, js = tmp_path / "k.md", tmp_path / "k.json"
    argv = ["--paths", ",".join(paths), "--dims", "2,3", "--size", "12,6", "--iters", "2", "--repeat", "2",
            "--out", str(out), "--json", str(js)]
    assert bench.main(argv) == 0
    captured = capsys.readouterr()
    rows = _rows(captured.out)
    assert rows[0] == bench.HEADER
    assert set(rows[1][0]) <= set(":-")  # the rule
    body = rows[2:]
    sides = {2: "12", 3: "6"}
    assert [(r[0], r[1], r[2]) for r in body] == [(p, f"{d}-D", "x".join([sides[d]] * d)) for p in paths for d in (2, 3)]
    for r in body:  # printed figures are numbers; how a tiny run's rate rounds (0 at 12x12) is not tested
        numbers = [r[3], r[4], r[5].rstrip("*"), r[6], r[7].removesuffix(" %")]
        assert all(re.fullmatch(r"\d+(\.\d)?", x) for x in numbers), r
    assert "write-allocate" in captured.out
    assert "repeat 2/2" in captured.err  # progress
    total = 2 * len(paths) * 2
    assert f"kernels.bench [{total}/{total}]" in captured.err and "elapsed" in captured.err
    written = out.read_text()
    assert "Command: `python -m kernels.bench --paths" in written and "Machine: " in written
    assert _rows(written) == rows
    document = json.loads(js.read_text())
    assert {"schema", "schema_version", "command", "machine", "versions", "date", "results"} <= document.keys()
    assert document["schema"] == cli.SCHEMA and document["command"] == "python -m kernels.bench " + " ".join(argv)
    results = document["results"]
    assert {"machine", "method", "residual", "rows"} <= results.keys() and results["residual"] is False
    assert [(row["path"], row["dims"]) for row in results["rows"]] == [(p, d) for p in paths for d in (2, 3)]
    assert all(row["mlups"] > 0 and row["triad_gbs"] > 0 and row["fraction"] > 0 for row in results["rows"])
    # the table prints the JSON's unrounded figures, rounded
    assert _rows(bench.table([bench.Row(**row) for row in results["rows"]]))[2:] == body


def test_append_and_residual(tmp_path, capsys):
    out = tmp_path / "k.md"
    for _ in range(2):
        bench.main(["--paths", "numpy", "--dims", "2", "--size", "8", "--iters", "1", "--repeat", "1", "--residual",
                    "--quiet", "--out", str(out), "--append"])
    captured = capsys.readouterr()
    assert captured.err == ""
    assert "with the fused residual" in captured.out
    assert out.read_text().count("## Kernel sweeps") == 2


def test_an_existing_report_needs_append_or_force(tmp_path, capsys):
    out = tmp_path / "k.md"
    out.write_text("kept\n")
    argv = ["--paths", "numpy", "--dims", "2", "--size", "8", "--iters", "1", "--repeat", "1", "--quiet",
            "--out", str(out)]
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    assert exc.value.code == 2 and f"--out {out} exists" in capsys.readouterr().err
    assert out.read_text() == "kept\n"
    assert bench.main(argv + ["--force"]) == 0
    assert out.read_text().startswith("## Kernel sweeps")


def test_3d_side_defaults_to_as_many_points_as_2d():
    assert bench._sizes("4096") == {2: 4096, 3: 256}  # the defaults agree with the rule
    assert bench._sizes("2048") == {2: 2048, 3: 161}
    assert bench._sizes("100,7") == {2: 100, 3: 7}


def test_sides_take_the_size_forms_of_mpicomm_cli():
    assert bench._sizes("4K") == {2: 4096, 3: 256}
    assert bench._sizes("2e3,1.28e2") == {2: 2000, 3: 128}
    assert bench._sizes("1KiB,8") == {2: 1024, 3: 8}


@pytest.mark.parametrize("residual", [False, True])
def test_every_kernel_is_warmed_up_before_the_first_timed_loop(monkeypatch, residual):
    """Structural: the sweep (with the timed residual flag) and the triad run once before any timed loop."""
    log: list = []
    heat, triad = kernels.Kernels.heat, kernels.Kernels.triad

    def logged_heat(self, u, v, c, box, residual=True):
        log.append(("heat", bool(residual)))
        return heat(self, u, v, c, box, residual)

    def logged_triad(self, a, b, c, s):
        log.append(("triad", None))
        return triad(self, a, b, c, s)

    timed, warm_up = bench._timed, bench.warm_up
    monkeypatch.setattr(kernels.Kernels, "heat", logged_heat)
    monkeypatch.setattr(kernels.Kernels, "triad", logged_triad)
    monkeypatch.setattr(bench, "_timed", lambda *args: log.append("timed") or timed(*args))
    monkeypatch.setattr(bench, "warm_up", lambda *args: log.append("warm-up") or warm_up(*args))
    row = bench.measure("numpy", 2, 8, 2, 2, residual=residual)
    assert row.mlups > 0
    assert log.count("warm-up") == 1 and log.index("warm-up") < log.index("timed")
    first_timed = log.index("timed")
    warmed = set(log[:first_timed]) - {"warm-up"}
    later = {entry for entry in log[first_timed:] if entry != "timed"}
    assert later and later <= warmed, f"first called inside a timed loop: {later - warmed}"
    assert ("heat", residual) in warmed and ("triad", None) in warmed


@pytest.mark.parametrize("argv, message", [
    (["--paths", "fortran"], "--paths must be all or a comma-separated list of numpy, compiled, cupy; got 'fortran'"),
    (["--dims", "4"], "--dims must be 2, 3 or 2,3; got '4'"),
    (["--size", "0"], "--size must be N or N,M, sides >= 1 such as 2048, 2K or 1e3 (e.g. 2048 or "
                      "2048,128); got '0'"),
    (["--size", "1,2,3"], "--size must be N or N,M"),
    (["--size", "8,x"], "--size must be N or N,M"),
    (["--iters", "0"], "--iters must be >= 1, got 0"),
    (["--repeat", "0"], "--repeat must be >= 1, got 0"),
    (["--append"], "--append needs --out FILE.md"),
    (["--force"], "--force needs --out FILE.md"),
])
def test_bad_options_are_named(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    assert exc.value.code == 2
    assert f"python -m kernels.bench: error: {message}" in capsys.readouterr().err


def test_repeat_reports_the_median_of_the_repeats(monkeypatch):
    """Five repeats timed 3, 1, 9, 2, 5 s: the rate and the time per sweep come from the median, 3 s."""
    sweeps = iter([3.0, 1.0, 9.0, 2.0, 5.0])
    triads = iter([4.0, 8.0, 6.0, 7.0, 5.0])
    calls = [0]

    def fake(k, fn, iters):
        calls[0] += 1
        return next(triads) if calls[0] % 2 else next(sweeps)  # each repeat: the triad, then the sweep

    monkeypatch.setattr(bench, "_timed", fake)
    row = bench.measure("numpy", 2, 10, 4, 5)
    assert row.seconds == pytest.approx(3.0 / 4)
    assert row.mlups == pytest.approx(10 ** 2 * 4 / 3.0 / 1e6)
    elements = 12 ** 2
    assert row.triad_gbs == pytest.approx(elements * bench.BYTES_PER_ELEMENT * 8 * 4 / 6.0 / 1e9)  # median: 6 s


def test_help_says_median_and_per_size():
    text = " ".join(bench.parser().format_help().split())
    assert "run the timed sweeps and triads of each path and size N times and report the median" in text
    assert "timed sweeps (and triads) per size" in text
