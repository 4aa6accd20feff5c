"""README.md is the front page and says what the code does: its quick start runs, its test command is CI's, its
table of contents is the documentation's."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys

import pytest

from tests import mpirun

README = os.path.join(mpirun.REPO, "README.md")
DOCS = os.path.join(mpirun.REPO, "docs")


def _text(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def section(title: str) -> str:
    """The README's ``## title`` section, up to the next ``## ``."""
    text = _text(README)
    assert f"\n## {title}\n" in text, f"README.md has no section '## {title}'"
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.M | re.S)


def two_ranks(line: str) -> list[str]:
    """A README command line as argv, at 2 ranks (``mpiexec -n N`` → ``-n 2``), ``python`` this Python."""
    argv = shlex.split(line)
    if argv[:2] == ["mpiexec", "-n"]:
        argv[2] = "2"
    return [sys.executable if word in ("python", "python3") else word for word in argv]


@pytest.mark.serial
def test_the_readme_is_a_front_page():
    text = _text(README)
    assert len(text.splitlines()) <= 300, "README.md is the front page: at most about 300 lines; the rest is in docs/"
    for title in ("Two commands", "Quick start", "Documentation", "Figures"):
        section(title)
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in text


@pytest.mark.serial
def test_the_readme_test_command_is_what_ci_runs():
    readme = _text(README)
    ci = _text(os.path.join(mpirun.REPO, ".ci", "run"))
    command = [line for line in readme.splitlines() if line.rstrip().endswith("python -m tests")]
    assert len(command) == 1, "README.md should have one test command ending in python -m tests"
    steps = [part.strip() for part in command[0].split("&&")]
    ci_line = " ".join(line.rstrip("\\").strip() for line in ci.splitlines() if not line.startswith("#"))
    for step in steps:
        assert step in ci_line, f"README's step {step!r} is not in .ci/run"
    assert "python -m sphinx -W -b html docs docs/_build/html" in steps  # the docs build with warnings as errors


@pytest.mark.serial
def test_the_table_of_contents_is_the_documentation():
    """Every page of the documentation's toctrees is linked from the README, and every link there exists."""
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#[^)]*)?\)", section("Documentation") + section("Two commands"))
    assert links, "README.md links no page of docs/"
    for link in links:
        assert os.path.exists(os.path.join(mpirun.REPO, link)), f"README.md links {link}, which does not exist"
    index = _text(os.path.join(DOCS, "index.md"))
    pages = {page for block in re.findall(r"```\{toctree\}\n(.*?)```", index, re.S)
             for page in block.splitlines() if page and not page.startswith(":")}
    assert {"getting-started", "torch", "reference", "api"} <= pages
    linked = {link[len("docs/"):].removesuffix(".md") for link in links}
    assert pages <= linked, f"pages missing from README.md's table of contents: {sorted(pages - linked)}"


@pytest.mark.launches
@pytest.mark.parametrize("index", range(2))
def test_the_quick_start_programs_run(index, tmp_path):
    programs = blocks(section("Quick start"), "python")
    assert len(programs) == 2, "the quick start shows two programs: mpicomm's and the torch backend's"
    if "torch" in programs[index] and importlib.util.find_spec("torch") is None:
        pytest.skip("PyTorch is not installed (pip install -e '.[torch]')")
    script = tmp_path / "quickstart.py"
    script.write_text(programs[index], encoding="utf-8")
    result = mpirun.run(2, [sys.executable, str(script)], timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    if index == 0:  # rank 0 prints the sum of 1·x and 2·x, x = 0, 1, 2, 3
        assert "[0. 3. 6. 9.]" in result.stdout and "'ring'" in result.stdout, result.stdout
    else:
        assert "sum over ranks: [3.0, 3.0, 3.0, 3.0]" in result.stdout, result.stdout  # 1 + 2 on each element


def run_line(line: str) -> tuple[int, str]:
    """(exit status, output) of one README command line, at 2 ranks when it starts an MPI job."""
    argv = two_ranks(line)
    if argv[0] == "mpiexec":
        result = mpirun.run(2, argv[3:], timeout=300)
        return result.returncode, result.stdout + result.stderr
    done = subprocess.run(argv, cwd=mpirun.REPO, capture_output=True, text=True, timeout=300, env=mpirun.clean_env())
    return done.returncode, done.stdout + done.stderr


@pytest.mark.launches
def test_the_quick_start_commands_and_the_demo_run():
    lines = [line for block in blocks(section("Quick start"), "bash") for line in block.splitlines() if line.strip()]
    demo = [part.strip() for line in blocks(section("Two commands"), "bash")[0].splitlines()
            for part in line.split("&&") if "apps.demo" in part and not line.startswith("#")]
    assert len(lines) >= 1 and len(demo) == 1
    for line in lines + demo:
        returncode, out = run_line(line)
        assert returncode == 0, f"{line}:\n{out[-3000:]}"
        if "apps.stencil" in line:
            assert "verification    PASS" in out, out
        if "apps.demo" in line:
            assert "all checks passed" in out, out
        if "apps.pipeline schedule" in line:
            assert "validated" in out and "rank 3:" in out, out
