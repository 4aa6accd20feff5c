"""Every program the guide shows (``docs/examples/*.py``) runs under ``mpiexec -n 2`` and checks its own results."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys

import pytest

from tests import mpirun

EXAMPLES = os.path.join(mpirun.REPO, "docs", "examples")
DOCS = os.path.join(mpirun.REPO, "docs")


def programs() -> list[str]:
    """The example programs: files whose docstring says how to run them (``Run: mpiexec ...``)."""
    found = []
    for name in sorted(os.listdir(EXAMPLES)):
        if name.endswith(".py") and not name.startswith("_"):
            with open(os.path.join(EXAMPLES, name), encoding="utf-8") as f:
                if re.search(r"^Run: .*mpiexec -n \d+ python docs/examples/" + re.escape(name), f.read(), re.M):
                    found.append(name)
    return found


def test_the_examples_are_found():
    assert {"quickstart.py", "dropin.py", "push.py", "torch_ddp.py"} <= set(programs())
    assert "torus_allreduce.py" not in programs()  # a module of user algorithms, tested by tests/test_main.py


@pytest.mark.launches
@pytest.mark.parametrize("name", programs())
def test_example_runs_at_two_ranks(name, tmp_path):
    if name.startswith("torch") and importlib.util.find_spec("torch") is None:
        pytest.skip("PyTorch is not installed (pip install -e '.[torch]')")
    env = {"MPICOMM_TRACE": str(tmp_path / "trace.json")} if name == "tracing.py" else None
    result = mpirun.run(2, [sys.executable, os.path.join("docs", "examples", name)], timeout=180, env=env)
    assert result.returncode == 0, f"{name}:\n{result.stdout}\n{result.stderr}"
    assert ": ok" in result.stdout, result.stdout
    if name == "tracing.py":  # the spans the example annotates are in the trace, on both ranks
        events = json.loads((tmp_path / "trace.json").read_text())
        events = events["traceEvents"] if isinstance(events, dict) else events
        spans = [e for e in events if e.get("name") == "update" and e.get("cat") == "user"]
        assert len(spans) == 6 and {e["args"]["step"] for e in spans} == {0, 1, 2}
        assert all(e["args"]["cells"] == 1000 for e in spans)


@pytest.mark.serial
def test_every_example_is_shown_on_a_page():
    pages = "".join(open(os.path.join(DOCS, page), encoding="utf-8").read()
                    for page in os.listdir(DOCS) if page.endswith(".md"))
    shown = set(re.findall(r"```\{literalinclude\} examples/(\S+)", pages))
    assert set(programs()) <= shown, f"examples no page shows: {sorted(set(programs()) - shown)}"
    assert all(os.path.exists(os.path.join(EXAMPLES, name)) for name in shown), shown


@pytest.mark.serial
def test_the_pages_show_python_only_from_example_programs():
    """A Python block written into a page would go stale unseen: the pages include example programs instead."""
    inline = [page for page in os.listdir(DOCS) if page.endswith(".md")
              and re.search(r"^```(?:python|py)\s*$", open(os.path.join(DOCS, page), encoding="utf-8").read(), re.M)]
    assert not inline, f"pages with Python code blocks (move them into docs/examples/): {inline}"
