"""kernels/bench.py: the benchmark end to end at a tiny size (the table's shape, positive numbers, --out, --json)."""

from __future__ import annotations

import json

import pytest

import kernels
from kernels import bench

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
    for r in body:
        numbers = [float(r[3]), float(r[4]), float(r[5].rstrip("*")), float(r[6]), float(r[7].rstrip(" %"))]
        assert all(x > 0 for x in numbers), r
    assert "write-allocate" in captured.out
    assert "repeat 2/2" in captured.err  # progress
    written = out.read_text()
    assert "Command: `python -m kernels.bench --paths" in written and "Machine: " in written
    assert _rows(written) == rows
    document = json.loads(js.read_text())
    assert [(row["path"], row["dims"]) for row in document["rows"]] == [(p, d) for p in paths for d in (2, 3)]
    assert all(row["mlups"] > 0 and row["triad_gbs"] > 0 and 0 < row["fraction"] for row in document["rows"])


def test_append_and_residual(tmp_path, capsys):
    out = tmp_path / "k.md"
    for _ in range(2):
        bench.main(["--paths", "numpy", "--dims", "2", "--size", "8", "--iters", "1", "--repeat", "1", "--residual",
                    "--quiet", "--out", str(out), "--append"])
    captured = capsys.readouterr()
    assert captured.err == ""
    assert "with the fused residual" in captured.out
    assert out.read_text().count("## Kernel sweeps") == 2


def test_3d_side_defaults_to_as_many_points_as_2d():
    assert bench._sizes("4096") == {2: 4096, 3: 256}  # the defaults agree with the rule
    assert bench._sizes("2048") == {2: 2048, 3: 161}
    assert bench._sizes("100,7") == {2: 100, 3: 7}


@pytest.mark.parametrize("argv, message", [
    (["--paths", "fortran"], "unknown path 'fortran'"),
    (["--dims", "4"], "--dims '4'"),
    (["--size", "0"], "--size: '0': expected N or N,M"),
    (["--size", "8,x"], "expected N or N,M"),
    (["--iters", "0"], "--iters 0"),
    (["--append"], "--append needs --out"),
])
def test_bad_options_are_named(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
