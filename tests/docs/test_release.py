"""The pages users look for exist and say what is true: the version in one place (mpicomm.__version__, read by
setup.cfg, named by CHANGES.md), the citation's licence the package's, the platforms page's Linux facts, the
troubleshooting page's errors, and the README's clone step before its two commands."""

from __future__ import annotations

import configparser
import os
import re

import pytest

import mpicomm
from tests import mpirun

pytestmark = pytest.mark.serial


def _read(*parts: str) -> str:
    with open(os.path.join(mpirun.REPO, *parts), encoding="utf-8") as f:
        return f.read()


def _setup() -> configparser.ConfigParser:
    cfg = configparser.ConfigParser()
    cfg.read_string(_read("setup.cfg"))
    return cfg


def test_the_version_lives_in_one_place():
    assert _setup()["metadata"]["version"] == "attr: mpicomm.__version__"
    assert re.fullmatch(r"\d+\.\d+\.\d+", mpicomm.__version__)
    assert not re.search(r"^version:", _read("CITATION.cff"), re.M)  # (a second place to forget)
    released = re.findall(r"^## (\d+\.\d+\.\d+) - \d{4}-\d\d-\d\d$", _read("CHANGES.md"), re.M)
    assert released and released[0] == mpicomm.__version__, (
        f"CHANGES.md's newest release is {released[:1]}, mpicomm.__version__ {mpicomm.__version__!r}: release "
        f"both in one commit (CHANGES.md says how)")


def test_the_changelog_says_how_to_release_and_tag():
    text = _read("CHANGES.md")
    assert text.index("## Unreleased") < text.index(f"## {mpicomm.__version__} ")
    assert 'git tag -a vX.Y.Z -m "mpicomm X.Y.Z"' in text


def test_citation_and_licence_agree_with_the_package():
    citation = _read("CITATION.cff")
    assert re.search(r"^cff-version: 1\.2\.0$", citation, re.M) and re.search(r"^title: ", citation, re.M)
    licence = _setup()["metadata"]["license"]
    assert re.search(rf"^license: {re.escape(licence)}$", citation, re.M)
    assert _read("LICENSE").startswith("BSD 3-Clause License") and licence == "BSD-3-Clause"
    assert "CITATION.cff" in _read("docs", "citing.md") and "CITATION.cff" in _read("README.md")


def test_the_platforms_page_names_what_ties_mpicomm_to_linux():
    page = _read("docs", "platforms.md")
    assert "| Operating system | Linux |" in page
    for used in ("/dev/shm", "process_vm_readv"):
        assert used in page and used in _read("README.md")
    assert "process_vm_readv" in _read("mpicomm", "transport", "cma.py")  # what the page says is used, is


@pytest.mark.parametrize("heading", ["MPI is not found", "More ranks than cores (oversubscription)",
                                     "Stale shared memory", "Slurm: every task is rank 0 of 1",
                                     "Multi-node TCP: the wrong network interface"])
def test_troubleshooting_has_each_error_with_its_fix(heading):
    page = _read("docs", "troubleshooting.md")
    assert f"\n## {heading}\n" in page
    section = page.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    assert "**Symptom.**" in section and "**Cause.**" in section and "**Fix.**" in section


def test_the_readme_clones_before_its_two_commands():
    block = re.search(r"## Two commands\n.*?```bash\n(.*?)```", _read("README.md"), re.S).group(1)
    lines = [line for line in block.splitlines() if line and not line.startswith("#")]
    assert lines[0].startswith("git clone ") and lines[0].endswith("&& cd mpicomm")
    assert "pip install -e '.[mpich,apps]'" in lines[1]  # what the applications' default runs need
    apps = _setup()["options.extras_require"]["apps"].split()
    assert {re.split(r"[<>=]", r)[0] for r in apps} == {"numba", "scikit-learn"}
