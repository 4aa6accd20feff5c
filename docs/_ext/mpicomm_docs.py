"""mpicomm's own Sphinx extension: facts the pages show are generated from their one home at build time.

Directives (in Markdown pages: ```` ```{name} argument ```` ````):

* ``algorithm-table`` - every registered (collective, algorithm) with its
  restrictions and α-β-γ cost: the rows of ``python -m mpicomm algorithms``
  (:func:`mpicomm.__main__.algorithm_rows`, from :mod:`mpicomm.registry`);
* ``selection-rules`` - the default rules ``auto`` follows, one line per
  collective, as ``python -m mpicomm algorithms`` prints them;
* ``algorithm-reference`` - each algorithm's docstring (its steps and
  restrictions) through autodoc, grouped by the module that holds it, with its
  cost as its cost function's docstring states it (:attr:`mpicomm.registry.Algorithm.cost`);
Generated regions (``<!-- generated: KIND [ARGUMENT] -->`` ... ``<!-- end generated -->`` in a page, filled
afresh by the build and written into the pages by ``python docs/_ext/mpicomm_docs.py --write``, so that the
pages read the same in a plain Markdown viewer: :data:`REGION`): ``command-help COMMAND``,
``config-variables`` and ``install-extras``, as below.

* ``command-help COMMAND`` - ``COMMAND --help`` (``python -m apps.sgd train``
  shows ``python -m apps.sgd train --help``), every one of the pages run in one
  Python process beside the build (:func:`collect_help`);
* ``config-variables`` - the table of ``MPICOMM_*`` variables in
  :mod:`mpicomm.config`'s docstring (``tests/test_reliability.py`` keeps it
  complete);
* ``install-extras`` - the extras of ``setup.cfg`` with their packages and comments.

A build with the ``docs`` extra alone works too: a command whose optional package (PyTorch, say) is missing gets
a line naming the extra instead of its ``--help``, and ``conf.py`` has autodoc mock torch.

Roles: ``{value}`module.NAME``` writes the value of a module's constant
(``mpicomm.p2p.INLINE_BYTES``); ``{collectives-with}`shm``` lists the
collectives that have an algorithm of that name.

Events: ``include-read`` makes the links of a Markdown file included from
outside the documentation (``BENCHMARKS.md``, ``jobs/README.md``) point at
the repository's files; ``autodoc-process-docstring`` turns the Markdown
tables some docstrings hold into reST tables and separates an inline literal
from a letter that follows it (````put``s``).
"""

from __future__ import annotations

import configparser
import importlib
import json
import os
import re
import shlex
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective, SphinxRole

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"

#: The environment the build started with, before autodoc imported anything (``import mpicomm.torch`` sets
#: PyTorch's ``RANK``, ``WORLD_SIZE``... in this process): what the ``--help`` subprocesses get.
_START_ENV = dict(os.environ)


# ---------------------------------------------------------------- small helpers


_INLINE = re.compile(r"``(.+?)``|:[a-z]+:`~?\.?([^`]+)`|`([^`]+)`")


def inline(text: str) -> list[nodes.Node]:
    """Text with reST/Markdown inline literals (````x````, ``:mod:`x```, `` `x` ``) as docutils nodes."""
    out: list[nodes.Node] = []
    at = 0
    for match in _INLINE.finditer(text):
        if match.start() > at:
            out.append(nodes.Text(text[at:match.start()]))
        code = next(group for group in match.groups() if group is not None)
        out.append(nodes.literal(code, code))
        at = match.end()
    if at < len(text):
        out.append(nodes.Text(text[at:]))
    return out


def table(header: list[str], rows: list[list[str]], widths: list[int] | None = None) -> nodes.table:
    """A docutils table of *header* and *rows* (cells: text with inline literals)."""
    tbl = nodes.table(classes=["mpicomm-table"])
    group = nodes.tgroup(cols=len(header))
    tbl += group
    for width in widths or [1] * len(header):
        group += nodes.colspec(colwidth=width)

    def row_of(cells: list[str]) -> nodes.row:
        row = nodes.row()
        for cell in cells:
            entry = nodes.entry()
            entry += nodes.paragraph("", "", *inline(cell))
            row += entry
        return row

    head = nodes.thead()
    head += row_of(header)
    body = nodes.tbody()
    for cells in rows:
        body += row_of(cells)
    group += head
    group += body
    return tbl


def markdown_table(lines: list[str]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of a Markdown pipe table given as its lines (the ``|---|`` line second)."""
    cells = [[cell.strip() for cell in line.strip()[1:-1].split("|")] for line in lines]  # (empty cells too)
    return cells[0], [row for row in cells[2:]]


# ---------------------------------------------------------------- algorithms


class AlgorithmTable(SphinxDirective):
    """Every registered algorithm: collective, name, restrictions, cost."""

    def run(self) -> list[nodes.Node]:
        from mpicomm.__main__ import algorithm_rows

        rows = [[c, n, r, cost] for c, n, r, cost in algorithm_rows()]
        return [table(["collective", "algorithm", "restrictions", "cost"], rows, [3, 4, 6, 12])]


class SelectionRules(SphinxDirective):
    """The default rules of ``auto``, one line per collective (as ``python -m mpicomm algorithms`` prints them)."""

    def run(self) -> list[nodes.Node]:
        from mpicomm import selection
        from mpicomm.catalogue import COLLECTIVES
        from mpicomm.rules import describe

        rows = []
        for collective in COLLECTIVES:
            rules = selection.SELECTION.get(collective) or []
            rows.append([collective, "; ".join(f"{i + 1}. {describe(rule)}" for i, rule in enumerate(rules))])
        return [table(["collective", "default rules, tried in order"], rows, [2, 10])]


class AlgorithmReference(SphinxDirective):
    """Each algorithm's docstring through autodoc, under the collectives that register it, and its cost (the
    docstring of its cost function: one line for all of them where they share it, else one per collective)."""

    def run(self) -> list[nodes.Node]:
        from mpicomm import registry
        from mpicomm.catalogue import COLLECTIVES

        found: dict[str, dict[str, list[str]]] = {}  # module -> function -> collectives/names
        costs: dict[str, dict[str, list[tuple[str, str]]]] = {}  # module -> function -> (collective, cost)
        order: list[str] = []
        for collective in COLLECTIVES:
            for name, algorithm in sorted(registry.table().get(collective, {}).items()):
                module, function = algorithm.steps.__module__, algorithm.steps.__qualname__
                if not module.startswith("mpicomm."):
                    continue  # a user algorithm (MPICOMM_ALGORITHM_MODULES): not mpicomm's
                if module not in found:
                    found[module] = {}
                    order.append(module)
                found[module].setdefault(function, []).append(f"``{collective}`` ``{name}``")
                costs.setdefault(module, {}).setdefault(function, []).append((collective, algorithm.cost))
        text = []
        for module in order:
            title = importlib.import_module(module).__doc__ or module
            text += [f"## `{module}`", "", title.strip().splitlines()[0], ""]
            for function, names in found[module].items():
                stated = costs[module][function]
                lines = [f"   Cost: {stated[0][1]}"]
                if len({cost for _, cost in stated}) > 1:  # (a v-form with a cost function of its own)
                    lines = []
                    for collective, cost in stated:
                        lines += [f"   Cost of ``{collective}``: {cost}", ""]
                text += ["```{eval-rst}", f".. autofunction:: {module}.{function}", "", "   Registered as "
                         f"{', '.join(names)}.", "", *lines, "```", ""]
        return self.parse_text_to_nodes("\n".join(text))


# ---------------------------------------------------------------- commands


_HELP: dict[str, tuple[int, str]] = {}
_HELP_DIRECTIVE = re.compile(r"^(?:```\{command-help\}\s+|<!-- generated: command-help )(.+?)(?: -->)?\s*$",
                             re.MULTILINE)


def _run(argv: list[str]) -> tuple[int, str]:
    """(exit status, output) of *argv* run from the repository root, with the checkout first on the path and
    100 columns for argparse."""
    env = {**_START_ENV, "COLUMNS": "100", "PYTHONPATH": os.pathsep.join(
        [str(REPO)] + ([_START_ENV["PYTHONPATH"]] if _START_ENV.get("PYTHONPATH") else []))}
    try:
        done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 1, str(exc)
    return done.returncode, done.stdout + done.stderr


def _run_help(command: str) -> tuple[int, str]:
    """``COMMAND --help`` in a process of its own (``python`` is this Python)."""
    argv = shlex.split(command)
    if argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    return _run(argv + ["--help"])


def help_text(command: str) -> tuple[int, str]:
    """``COMMAND --help``'s (status, output), run once per build."""
    for batch in _BATCH:
        batch.join()
    if command not in _HELP:
        _HELP[command] = _run_help(command)
    return _HELP[command]


_BATCH: list[threading.Thread] = []


def prefetch_help(app: Sphinx) -> None:
    """Start the batch of every ``command-help`` of the pages (:func:`_batch`), beside the reading of the pages."""
    thread = threading.Thread(target=_batch, args=(Path(app.srcdir),), name="command-help", daemon=True)
    thread.start()
    _BATCH.append(thread)


def _batch(srcdir: Path) -> None:
    """Run every ``command-help`` of the pages in one Python process (:func:`collect_help`): each command alone
    would start Python and import NumPy, mpi4py and some torch again. A command the batch did not answer runs
    alone later."""
    commands = sorted({c for page in srcdir.rglob("*.md") if "_build" not in page.parts
                       for c in _HELP_DIRECTIVE.findall(page.read_text(encoding="utf-8"))})
    if not commands:
        return
    _, text = _run([sys.executable, __file__, "--collect", *commands])
    found = text.split(_MARK, 1)[1] if _MARK in text else "{}"
    for command, (code, output) in json.loads(found).items():
        _HELP[command] = (code, output)


_MARK = "\n--- mpicomm-docs help ---\n"


def collect_help(commands: list[str]) -> dict[str, tuple[int, str]]:
    """``COMMAND --help`` of each ``python -m MODULE [SUB]`` or ``python SCRIPT`` in this process
    (:func:`mpicomm.cli.run_main`): its exit status and its output."""
    from mpicomm.cli import run_main

    results: dict[str, tuple[int, str]] = {}
    for command in commands:
        argv = shlex.split(command)[1:]
        target, rest = (argv[1], argv[2:]) if argv[0] == "-m" else (argv[0], argv[1:])
        code, out, err = run_main(target, [*rest, "--help"])
        results[command] = (code, out + err)
    return results


#: The optional packages a command may need (the import name: the setup.cfg extra that installs it).
OPTIONAL = {"torch": "torch", "cupy": "cuda12", "numba": "compiled", "sklearn": "digits", "matplotlib": "plot"}


def missing_optional(output: str) -> tuple[str, str] | None:
    """(package, extra) where *output* ends in an import of an optional package that is not installed here."""
    found = re.findall(r"ModuleNotFoundError: No module named '(\w+)", output)
    if not found or found[-1] not in OPTIONAL:
        return None
    package = found[-1]
    try:
        importlib.import_module(package)
    except ImportError:
        return package, OPTIONAL[package]
    return None  # installed: the command failed for another reason, a warning


def command_help(command: str) -> str:
    """``COMMAND --help`` as a Markdown ``text`` block; where the command's optional package is not installed here,
    a line naming the extra that installs it (a build with the docs extra alone); any other failure is a warning."""
    status, text = help_text(command)
    missing = missing_optional(text) if status != 0 else None
    if missing:
        package, extra = missing
        return (f"{command} needs {package}, which is not installed where these pages were built: its options are "
                f"listed in a build with pip install -e '.[{extra}]' (as CI's).\n")
    if status != 0:
        log.warning(f"{command} --help exited with status {status}: {text.strip()[-400:]}")
    return "```text\n" + text.rstrip("\n") + "\n```\n"


class CommandHelp(SphinxDirective):
    """``COMMAND --help`` as a literal block (the page gives it a heading)."""

    required_arguments = 1
    final_argument_whitespace = True

    def run(self) -> list[nodes.Node]:
        command = self.arguments[0].strip()
        status, text = help_text(command)
        missing = missing_optional(text) if status != 0 else None
        if missing:  # a build with the docs extra alone: the command's package is not here, which is not an error
            package, extra = missing
            text = (f"{command} needs {package}, which is not installed where these pages were built: its options "
                    f"are listed in a build with pip install -e '.[{extra}]' (as CI's).")
        elif status != 0:
            log.warning(f"{command} --help exited with status {status}: {text.strip()[-400:]}",
                        location=self.get_location())
        return [nodes.literal_block(text, text, language="text")]


# ---------------------------------------------------------------- settings


def _markdown(text: str) -> str:
    """A docstring's reST inline markup as Markdown: ````x```` and ``:mod:`x``` become ```x```."""
    return re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text.replace("``", "`"))


def config_variables() -> str:
    """The ``MPICOMM_*`` table of :mod:`mpicomm.config`'s docstring, as a Markdown list: one item a variable, so it
    fits any width (as a four-column table its long names and values ran past a 1280-pixel window)."""
    import mpicomm.config

    lines = [line for line in (mpicomm.config.__doc__ or "").splitlines() if line.startswith("|")]
    if len(lines) < 3:
        raise ValueError("mpicomm.config's docstring has no variable table")
    _, rows = markdown_table(lines)
    items = []
    for variable, values, default, effect in ((row + ["", "", ""])[:4] for row in rows):
        settings = "; ".join(part for part in (values and f"takes {values}", default and f"default {default}") if part)
        items.append(f"- {_markdown(variable)}" + (f" ({_markdown(settings)})" if settings else "")
                     + f": {_markdown(effect)}")
    return "\n".join(items) + "\n"


def extras(setup_cfg: Path = REPO / "setup.cfg") -> list[tuple[str, list[str], str]]:
    """(extra, requirements, the comment right above it) for every extra of setup.cfg, in the file's order."""
    parser = configparser.ConfigParser()
    parser.read(setup_cfg, encoding="utf-8")
    section = parser["options.extras_require"]
    comments: dict[str, str] = {}
    pending: list[str] = []
    inside = False
    for line in setup_cfg.read_text(encoding="utf-8").splitlines():
        if line.startswith("["):
            inside = line.strip() == "[options.extras_require]"
            pending = []
        elif inside and line.startswith("#"):
            pending.append(line.lstrip("# ").rstrip())
        elif inside and re.match(r"^[\w-]+\s*=", line):
            comments[line.split("=")[0].strip()] = " ".join(pending)
            pending = []
    return [(name, [r for r in section[name].split("\n") if r.strip()], comments.get(name, "")) for name in section]


def install_extras() -> str:
    """The extras of setup.cfg as a Markdown table: the extra, what it installs, what for."""
    lines = ["| extra | installs | what for |", "|---|---|---|"]
    lines += [f"| `{name}` | {', '.join(f'`{r}`' for r in reqs)} | {comment} |" for name, reqs, comment in extras()]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- generated regions of the pages


#: A region of a page generated from the fact's home, so that the page reads the same in a plain Markdown viewer
#: and in the built site: ``<!-- generated: KIND [ARGUMENT] -->``, the generated Markdown, ``<!-- end generated
#: -->``. The build fills every region afresh (:func:`fill_regions`, at ``source-read``): the site is always
#: current. ``python docs/_ext/mpicomm_docs.py --write`` writes the same into the pages;
#: ``tests/docs/test_pages.py`` and ``tests/docs/test_extension.py`` fail, naming that command, when a page's
#: copy is out of date.
REGION = re.compile(r"^<!-- generated: ([\w-]+)(?: ([^\n]+?))? -->\n(.*?)^<!-- end generated -->$", re.M | re.S)
GENERATORS = {
    "command-help": command_help,
    "config-variables": lambda _: config_variables(),
    "install-extras": lambda _: install_extras(),
}
WRITE = "python docs/_ext/mpicomm_docs.py --write"


def regions(text: str) -> list[tuple[str, str, str]]:
    """(kind, argument, the page's current content) of every generated region of *text*."""
    return [(kind, argument or "", body) for kind, argument, body in REGION.findall(text)]


def fill_regions(text: str) -> str:
    """*text* with every generated region's content made afresh."""

    def fill(match: re.Match[str]) -> str:
        kind, argument = match.group(1), match.group(2) or ""
        if kind not in GENERATORS:
            raise ValueError(f"a generated region of unknown kind {kind!r}; known: {', '.join(GENERATORS)}")
        head = f"<!-- generated: {kind}{' ' + argument if argument else ''} -->"
        return f"{head}\n{GENERATORS[kind](argument)}<!-- end generated -->"

    return REGION.sub(fill, text)


def source_read(app: Sphinx, docname: str, source: list[str]) -> None:
    """Fill the page's generated regions before it is parsed."""
    if "<!-- generated: " in source[0]:
        source[0] = fill_regions(source[0])


def write_pages(srcdir: Path = DOCS) -> list[Path]:
    """Rewrite the pages whose generated regions are out of date; the pages rewritten."""
    _batch(srcdir)
    changed = []
    for page in sorted(srcdir.rglob("*.md")):
        if "_build" in page.parts:
            continue
        text = page.read_text(encoding="utf-8")
        if "<!-- generated: " in text and fill_regions(text) != text:
            page.write_text(fill_regions(text), encoding="utf-8")
            changed.append(page)
    return changed


# ---------------------------------------------------------------- roles


class ValueRole(SphinxRole):
    """``{value}`module.NAME```: the constant's value, as a literal."""

    def run(self) -> tuple[list[nodes.Node], list[nodes.system_message]]:
        module, _, name = self.text.rpartition(".")
        try:
            value = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            log.warning(f"{{value}}: {self.text}: {exc}", location=self.get_location())
            value = "?"
        return [nodes.literal(str(value), str(value))], []


class CollectivesWithRole(SphinxRole):
    """``{collectives-with}`shm```: the collectives that have an algorithm of that name."""

    def run(self) -> tuple[list[nodes.Node], list[nodes.system_message]]:
        from mpicomm import registry
        from mpicomm.catalogue import COLLECTIVES

        table_ = registry.table()
        names = [c for c in COLLECTIVES if self.text in table_.get(c, {})]
        if not names:
            log.warning(f"{{collectives-with}}: no collective has an algorithm {self.text!r}",
                        location=self.get_location())
        out: list[nodes.Node] = []
        for i, name in enumerate(names):
            if i:
                out.append(nodes.Text(", "))
            out.append(nodes.literal(name, name))
        return out, []


# ---------------------------------------------------------------- events


_LINK = re.compile(r"(?<!!)\[([^\]]*)\]\(([^)\s]+)\)")


def repository_links(app: Sphinx, relative_path: Path, parent_docname: str, content: list[str]) -> None:
    """In a Markdown file included from outside docs/, point relative links at the repository's files.

    A link such as ``[targets](jobs/results/targets.md)`` in ``BENCHMARKS.md`` names a file relative to
    ``BENCHMARKS.md``; included into a page it would be read as a document of the site. It becomes a
    ``path:`` link (the file, copied beside the page); a fragment is dropped (files are not pages).
    """
    source = (Path(app.srcdir) / relative_path).resolve()
    if DOCS in source.parents or source.suffix != ".md":
        return
    page_dir = (Path(app.srcdir) / parent_docname).parent

    def rewrite(match: re.Match) -> str:
        text, target = match.groups()
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            return match.group(0)
        path = (source.parent / target.split("#", 1)[0]).resolve()
        if not path.exists():
            return match.group(0)  # left as written: the build reports the broken link
        return f"[{text}](path:{os.path.relpath(path, page_dir)})"

    content[0] = _LINK.sub(rewrite, content[0])


_LITERAL = re.compile(r"(?<![`\w])``(?!\s)[^`]*?(?<!\s)``")


def _separate_literals(line: str) -> str:
    """````put``s`` → ````put``\\ s``: reST ends an inline literal only before a space or punctuation."""
    return _LITERAL.sub(lambda m: m.group(0) + ("\\ " if m.string[m.end():m.end() + 1].isalnum() else ""), line)


def docstring_tables(app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    """Markdown pipe tables in a docstring become reST list tables; ````x``s`` becomes ````x``\\ s``."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("|") and i + 1 < len(lines) and re.match(r"^\s*\|[-:| ]+\|\s*$", lines[i + 1]):
            block = []
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                block.append(lines[i])
                i += 1
            header, rows = markdown_table(block)
            out += ["", ".. list-table::", "   :header-rows: 1", ""]
            for cells in [header] + rows:
                out += [f"   * - {cells[0] or ' '}"] + [f"     - {cell or ' '}" for cell in cells[1:]]
            out.append("")
            continue
        out.append(_separate_literals(line))
        i += 1
    lines[:] = out


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("algorithm-table", AlgorithmTable)
    app.add_directive("selection-rules", SelectionRules)
    app.add_directive("algorithm-reference", AlgorithmReference)
    app.add_directive("command-help", CommandHelp)
    app.add_role("value", ValueRole())
    app.add_role("collectives-with", CollectivesWithRole())
    app.connect("builder-inited", prefetch_help)
    app.connect("source-read", source_read)
    app.connect("include-read", repository_links)
    app.connect("autodoc-process-docstring", docstring_tables)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__" and sys.argv[1:2] == ["--collect"]:
    answers = collect_help(sys.argv[2:])
    sys.__stdout__.write(_MARK + json.dumps(answers))
elif __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    for written in write_pages():
        print(f"rewrote {written.relative_to(REPO)}")
