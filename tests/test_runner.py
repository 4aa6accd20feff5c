"""The test runner's GPU tier (``python -m tests --gpu``) where no GPU is visible: it runs nothing, says why,
and exits 0."""

from __future__ import annotations

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

