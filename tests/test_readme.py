"""README.md says what the code does: the algorithm table is the registry's, the test command is CI's."""

from __future__ import annotations

import os

import pytest

from mpicomm.__main__ import README_MARKERS, algorithm_markdown, update_readme
from tests import mpirun

pytestmark = pytest.mark.serial
README = os.path.join(mpirun.REPO, "README.md")


def _text(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def test_algorithm_table_is_the_registry():
    text = _text(README)
    begin, end = README_MARKERS
    block = text.split(begin, 1)[1].split(end, 1)[0].strip()
    assert block == algorithm_markdown(), "README.md's algorithm table is stale: python -m mpicomm algorithms --readme README.md"
    for kind in ("shm", "hierarchical"):
        assert f"| allreduce | {kind} |" in block


def test_update_readme_rewrites_only_the_table(tmp_path):
    begin, end = README_MARKERS
    doc = tmp_path / "doc.md"
    doc.write_text(f"before\n{begin}\nold\n{end}\nafter\n", encoding="utf-8")
    assert update_readme(str(doc)) is True
    text = doc.read_text(encoding="utf-8")
    assert text.startswith("before\n") and text.endswith("\nafter\n") and algorithm_markdown() in text
    assert update_readme(str(doc)) is False  # already current
    (tmp_path / "none.md").write_text("no markers\n")
    with pytest.raises(ValueError, match="markers"):
        update_readme(str(tmp_path / "none.md"))


def test_the_readme_test_command_is_what_ci_runs():
    readme = _text(README)
    ci = _text(os.path.join(mpirun.REPO, ".ci", "run"))
    command = [line for line in readme.splitlines() if line.rstrip().endswith("python -m tests")]
    assert len(command) == 1, "README.md should have one test command ending in python -m tests"
    steps = [part.strip() for part in command[0].split("&&")]
    ci_line = " ".join(line.rstrip("\\").strip() for line in ci.splitlines() if not line.startswith("#"))
    for step in steps:
        assert step in ci_line, f"README's step {step!r} is not in .ci/run"
