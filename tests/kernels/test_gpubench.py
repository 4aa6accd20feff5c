"""kernels/gpubench.py: the GPU benchmark end to end at tiny sizes (numba's simulator here, the GPU where one is
visible): every kernel next to its bound, the table, --out and --json; its usage errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kernels import gpubench
from tests.kernels.conftest import simt_module

pytestmark = pytest.mark.serial  # no MPI: the serial pass runs it


def _rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("|")]


def test_tiny_run_measures_every_kernel_against_its_bound(tmp_path, capsys):
    xp = simt_module()
    out, js = tmp_path / "g.md", tmp_path / "g.json"
    argv = ["--tiny", "--iters", "1", "--repeat", "1", "--out", str(out), "--json", str(js)]
    argv += ["--simulator"] if xp is np else []
    assert gpubench.main(argv) == 0
    captured = capsys.readouterr()
    rows = _rows(captured.out)
    assert rows[0] == gpubench.HEADER
    body = rows[2:]
    pairs = {(r[0], r[6]) for r in body}
    bounds = {"copy", "numpy.matmul", "numpy CSR"} if xp is np else {"copy", "cuBLAS", "cuSPARSE"}
    assert {r[6] for r in body} == bounds
    expected = {("halo", "copy"), ("bias_gelu", "copy"), ("spmv", "copy")}
    assert expected <= pairs and any(k == "matmul" for k, _ in pairs) and len(pairs) == 5
    assert {r[1] for r in body if r[0] == "spmv"} == {"SIMT scalar", "SIMT warp"}
    if xp is not np:
        assert {"heat", "star"} <= {r[0] for r in body}
    for r in body:
        assert float(r[4]) > 0 and float(r[5].split()[0]) > 0 and float(r[8].split()[0]) > 0, r
    assert f"kernels.gpubench [{len(body)}/{len(body)}]" in captured.err
    written = out.read_text()
    assert written.startswith("## GPU kernels against their bounds") and "Command: `python -m kernels.gpubench" in written
    assert ("simulator" in written) == (xp is np)
    results = json.loads(js.read_text())["results"]
    assert [(r["kernel"], r["form"]) for r in results["rows"]] == [(r[0], r[1]) for r in body]


@pytest.mark.parametrize("argv, message", [
    (["--kernels", "fft"], "--kernels must be all or a comma-separated list of heat, star, halo, bias_gelu, matmul, "
                           "spmv; got 'fft'"),
    (["--simulator", "--kernels", "heat,matmul"], "--kernels: heat are CUDA C kernels and need a GPU; leave them out "
                                                  "with --simulator"),
    (["--simulator", "--iters", "0"], "--iters must be >= 1, got 0"),
    (["--append"], "--append needs --out FILE.md"),
])
def test_bad_options_are_named(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        gpubench.main(argv)
    assert exc.value.code == 2
    assert f"python -m kernels.gpubench: error: {message}" in capsys.readouterr().err


def test_without_a_gpu_it_names_the_simulator(capsys, monkeypatch):
    from mpicomm import device

    monkeypatch.setattr(device, "visible_devices", lambda: 0)  # as on a machine without a GPU
    with pytest.raises(SystemExit):
        gpubench.main(["--kernels", "matmul"])
    err = capsys.readouterr().err
    assert "no GPU is visible" in err and "pass --simulator --tiny" in err
