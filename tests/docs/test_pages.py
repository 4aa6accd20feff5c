"""The pages' command lines use options their commands have, and the configuration reference lists every command.

Both read the commands' ``--help``, collected in one process by the documentation's own extension
(``docs/_ext/mpicomm_docs.py --collect``), as the build does.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from tests import mpirun

pytestmark = pytest.mark.serial

DOCS = os.path.join(mpirun.REPO, "docs")
EXTENSION = os.path.join(DOCS, "_ext", "mpicomm_docs.py")
MARK = "\n--- mpicomm-docs help ---\n"
#: Programs with a main that are not commands a user runs (the test suite's own helpers).
INTERNAL = {"python -m tests.programs", "python -m tests.jobs.nodes_probe"}


def pages() -> dict[str, str]:
    """Every Markdown page of the documentation, the README, and the files the documentation includes."""
    found = {name: open(os.path.join(mpirun.REPO, name), encoding="utf-8").read()
             for name in ("README.md", "BENCHMARKS.md", os.path.join("jobs", "README.md"))}
    for folder, dirs, files in os.walk(DOCS):
        dirs[:] = sorted(d for d in dirs if not d.startswith("_"))  # not _build, _ext
        for name in sorted(files):
            if name.endswith(".md"):
                path = os.path.join(folder, name)
                found[os.path.relpath(path, mpirun.REPO)] = open(path, encoding="utf-8").read()
    return found


def entry_points() -> set[str]:
    """``python -m PKG`` for every package with a ``__main__``, ``python -m MOD`` for every module with a main, and
    ``python jobs/X.py`` for the scripts of jobs/."""
    found = {"python -m tests"}
    for top in ("mpicomm", "apps", "kernels"):
        for folder, _, files in os.walk(os.path.join(mpirun.REPO, top)):
            module = os.path.relpath(folder, mpirun.REPO).replace(os.sep, ".")
            for name in files:
                if not name.endswith(".py"):
                    continue
                if name == "__main__.py":
                    found.add(f"python -m {module}")
                    continue
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    if re.search(r'^if __name__ == "__main__":', f.read(), re.M):
                        found.add(f"python -m {module}.{name[:-3]}")
    for name in os.listdir(os.path.join(mpirun.REPO, "jobs")):
        if name.endswith(".py"):
            found.add(f"python jobs/{name}")
    return found - INTERNAL


def extension():
    """docs/_ext/mpicomm_docs.py as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("mpicomm_docs", EXTENSION)
    module = importlib.util.module_from_spec(spec)
    sys.modules["mpicomm_docs"] = module
    spec.loader.exec_module(module)
    return module


def collect(commands: list[str]) -> dict[str, tuple[int, str]]:
    """``COMMAND --help`` of each, in one process (the extension's collector)."""
    pytest.importorskip("sphinx", reason="the documentation's extension needs the docs extra: pip install -e '.[docs]'")
    done = subprocess.run([sys.executable, EXTENSION, "--collect", *commands], cwd=mpirun.REPO, capture_output=True,
                          text=True, timeout=300, env=mpirun.clean_env({"COLUMNS": "100"}))
    assert MARK in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    return {command: (code, text) for command, (code, text) in json.loads(done.stdout.split(MARK, 1)[1]).items()}


def subcommands(help_text: str) -> list[str]:
    """The sub-commands an argparse help lists: the 4-space-indented names under its sub-parsers' entry."""
    section = help_text.split("positional arguments:", 1)[1].split("\n\n", 1)[0] if "positional arguments:" in \
        help_text else ""
    return re.findall(r"^    ([a-z][\w-]*)(?:\s|$)", section, re.M)


@pytest.fixture(scope="module")
def helps() -> dict[str, tuple[int, str]]:
    tops = sorted(entry_points())
    found = collect(tops)
    subs = [f"{top} {sub}" for top in tops for sub in subcommands(found[top][1])]
    found.update(collect(subs))
    return found


def reference_commands() -> set[str]:
    return set(re.findall(r"^<!-- generated: command-help (.+?) -->$", pages()["docs/reference.md"], re.M))


def test_the_reference_shows_each_command_s_current_help(helps):
    """The page's copy of each --help (what a plain Markdown viewer shows) is the command's help now."""
    ext = extension()
    stale = [argument for kind, argument, body in ext.regions(pages()["docs/reference.md"])
             if kind == "command-help" and body != "```text\n" + helps[argument][1].rstrip("\n") + "\n```\n"]
    assert not stale, f"docs/reference.md shows an old --help of {', '.join(stale)}: run {ext.WRITE}"


def test_subcommands_are_read_from_the_help():
    text = "usage: x\n\npositional arguments:\n  {train,bench}\n    train   train it\n    bench   time it\n\noptions:\n"
    assert subcommands(text) == ["train", "bench"]
    assert subcommands("usage: x\n\noptions:\n    --flag  no\n") == []


def test_the_reference_lists_every_command_and_sub_command(helps):
    listed = reference_commands()
    assert {"python -m apps.sgd train", "python -m mpicomm.bench pingpong", "python jobs/collect.py"} <= listed
    for command, (code, text) in helps.items():
        assert code == 0, f"{command} --help exited with {code}:\n{text[-1000:]}"
        assert command in listed, f"docs/reference.md does not list {command} (add a command-help block)"
    assert listed <= set(helps), f"docs/reference.md lists commands that do not exist: {sorted(listed - set(helps))}"


def shell_blocks(text: str) -> list[str]:
    """The contents of the page's bash/sh/console (or unlabelled) fenced blocks, each fence paired with its own
    closing one (a closing fence is never taken for an opening)."""
    blocks, language, body = [], None, []
    for line in text.splitlines():
        if language is None and line.startswith("```"):
            language, body = line[3:].strip(), []
        elif language is not None and line.strip() == "```":
            if language in ("bash", "sh", "console", ""):
                blocks.append("\n".join(body) + "\n")
            language = None
        elif language is not None:
            body.append(line)
    return blocks


def command_lines(text: str) -> list[str]:
    """Each shell command of the page: its bash/sh (or unlabelled) code blocks, comments dropped, and its inline
    code that runs a command (`` `mpiexec -n 2 python -m ...` ``); split at && ; |."""
    lines = []
    for block in shell_blocks(text):
        for line in block.replace("\\\n", " ").splitlines():
            lines.append(re.sub(r"(^|\s)#.*$", "", line.lstrip("$ ")))
    lines += re.findall(r"(?<!`)`((?:mpiexec|python|OMP_NUM_THREADS|MPICOMM_)[^`\n]*)`(?!`)", text)
    return [part.strip() for line in lines for part in re.split(r"&&|;|\|", line) if part.strip()]


def options_used(line: str, known: set[str]) -> tuple[str, list[str]] | None:
    """(command, its --options) of a shell line that runs one of the *known* commands, else None."""
    try:
        words = shlex.split(line)
    except ValueError:
        return None
    for i, word in enumerate(words):
        if word not in ("python", "python3") or i + 1 >= len(words):
            continue
        rest = words[i + 1:]
        head = f"python {' '.join(rest[:2])}" if rest[0] == "-m" else f"python {rest[0]}"
        used = rest[2:] if rest[0] == "-m" else rest[1:]
        if used and f"{head} {used[0]}" in known:
            head, used = f"{head} {used[0]}", used[1:]
        if head not in known:
            return None
        return head, [w.strip("[]").split("=")[0] for w in used if w.strip("[").startswith("--")]
    return None


def test_options_are_found_in_a_help():
    known = {"python -m apps.sgd", "python -m apps.sgd train"}
    assert options_used("mpiexec -n 2 python -m apps.sgd train --mode zero2 [--restart]", known) == (
        "python -m apps.sgd train", ["--mode", "--restart"])
    assert options_used("pip install -e '.[docs]'", known) is None
    assert command_lines("```bash\nA=1 python -m x --y 1 && ls  # --z\n```\n") == ["A=1 python -m x --y 1", "ls"]
    assert command_lines("run `mpiexec -n 2 python -m x --y` or ``python -m z``") == ["mpiexec -n 2 python -m x --y"]


def test_every_command_line_shown_uses_options_the_command_has(helps):
    wrong = []
    for page, text in pages().items():
        for line in command_lines(text):
            found = options_used(line, set(helps))
            if found is None:
                continue
            command, options = found
            for option in options:
                if not re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", helps[command][1]):
                    wrong.append(f"{page}: {line!r}: {command} has no {option}")
    assert not wrong, "\n".join(wrong)
