"""The test runner's GPU tier (``python -m tests --gpu``): where no GPU is visible it runs nothing, says why, and
exits 0; its passes, run here as on a GPU machine, select the tier's tests."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests import mpirun
from tests.__main__ import gpu_missing


@pytest.mark.serial
def test_without_a_gpu_the_tier_says_why_and_passes():
    reason = gpu_missing()
    if reason is None:
        pytest.skip("a GPU is visible: the tier would run (python -m tests --gpu)")
    result = subprocess.run([sys.executable, "-m", "tests", "--gpu"], cwd=mpirun.REPO, env=mpirun.clean_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"GPU tier: nothing ran: {reason}."
    assert "mpicomm tests" not in result.stdout  # no pass started



@pytest.mark.launches
def test_a_gpu_pass_runs_the_selected_tests(monkeypatch, capfd):
    """The tier's passes as they run on a GPU machine (the probe told there is one): here the selected test
    skips, saying why, and the pass passes; a -k after -- narrows the tier's selection, and the torch run is
    left out when no test named after -- is in tests/torch."""
    import tests.__main__ as runner

    monkeypatch.setattr(runner, "gpu_missing", lambda: None)
    code = runner.main(["--gpu", "--ranks", "1", "--", "tests/test_device.py", "-k", "binding", "-rs"])
    out = capfd.readouterr().out
    assert code == 0, out
    assert "mpicomm tests (cupy) at 1 rank" in out
    assert "torch-cuda" not in out
    # of the binding tests, only the one marked gpu is in the tier; it skips here, saying why
    assert re.search(r"= 1 skipped, \d+ deselected in ", out), out
    assert "no CUDA device" in out or "CuPy is not installed" in out
    assert re.search(r"^1 cupy +passed ", out, re.M), out


@pytest.mark.serial
@pytest.mark.parametrize("ours, theirs, expected", [
    (["-k", "cupy or gpu"], [], ["-k", "cupy or gpu"]),
    (["-k", "cupy or gpu"], ["-x", "-k", "ring"], ["-x", "-k", "(cupy or gpu) and (ring)"]),
    ([], ["-kring", "-q"], ["-q", "-k", "ring"]),
])
def test_keyword_selections_are_combined(ours, theirs, expected):
    from tests.__main__ import _and_keywords

    assert _and_keywords(ours, theirs) == expected
