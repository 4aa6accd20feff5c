"""The documentation builds with the docs extra alone (docs/development.md's command): a whole Sphinx build, warnings
as errors, in a process where PyTorch cannot be imported - what a contributor without the torch extra has. The
build with torch is CI's own step (.ci/run)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests import mpirun

pytestmark = pytest.mark.serial

def test_the_documentation_builds_without_torch(tmp_path):
    pytest.importorskip("sphinx", reason="the documentation needs the docs extra: pip install -e '.[docs]'")
    pytest.importorskip("myst_parser", reason="the documentation needs the docs extra: pip install -e '.[docs]'")
    env = mpirun.clean_env(mpirun.without_torch(tmp_path / "hook"))
    check = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True, env=env, timeout=60)
    assert check.returncode != 0 and "No module named 'torch'" in check.stderr  # the hook works
    out = tmp_path / "text"
    done = subprocess.run([sys.executable, "-m", "sphinx", "-q", "-E", "-W", "--keep-going", "-b", "text", "docs",
                           str(out)], cwd=mpirun.REPO, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    reference = (out / "reference.txt").read_text(encoding="utf-8")
    assert ("python -m mpicomm.torch.bench needs torch, which is not installed where these pages were built: its "
            "options are listed in a build with pip install -e '.[torch]'") in " ".join(reference.split())
    api = (out / "api.txt").read_text(encoding="utf-8")
    assert 'registers the backend "mpicomm"' in api  # mpicomm.torch's docstring, read with torch mocked
