"""The documentation builds with the docs extra alone (docs/development.md's command): a whole Sphinx build, warnings
as errors, in a process where PyTorch cannot be imported - what a contributor without the torch extra has. The
build with torch is CI's own step (.ci/run)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests import mpirun

pytestmark = pytest.mark.serial

#: Put first on PYTHONPATH, it makes ``import torch`` fail as where torch is not installed (in every process the
#: build starts too: the ``--help`` of each command runs beside it).
BLOCK_TORCH = '''import importlib.abc
import importlib.machinery
import sys


class _NoTorch(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        return importlib.machinery.ModuleSpec(name, self) if name.split(".")[0] == "torch" else None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        raise ModuleNotFoundError(f"No module named {module.__name__!r}", name=module.__name__)


sys.meta_path.insert(0, _NoTorch())
'''


def test_the_documentation_builds_without_torch(tmp_path):
    pytest.importorskip("sphinx", reason="the documentation needs the docs extra: pip install -e '.[docs]'")
    pytest.importorskip("myst_parser", reason="the documentation needs the docs extra: pip install -e '.[docs]'")
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(BLOCK_TORCH, encoding="utf-8")
    env = mpirun.clean_env()
    env["PYTHONPATH"] = os.pathsep.join([str(hook), mpirun.REPO] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
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
