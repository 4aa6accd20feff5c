"""mpicomm's modules import downward only: no import cycle, not even through a function-level import.

Every ``import`` statement anywhere in a module counts (one inside a function
still ties the two modules together), except those under ``if TYPE_CHECKING:``,
which exist for annotations only. A cycle is reported with its modules.
"""

from __future__ import annotations

import ast
import os

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "mpicomm")


def _modules(root: str) -> dict[str, str]:
    base = os.path.dirname(root)
    found = {}
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                module = os.path.relpath(path, base)[:-3].replace(os.sep, ".")
                found[module.removesuffix(".__init__")] = path
    return found


def _type_checking_only(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(inner) for inner in ast.walk(node))
    return skip


def _targets(module: str, path: str, node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    assert isinstance(node, ast.ImportFrom)
    parts = module.split(".")
    if not path.endswith("__init__.py"):
        parts = parts[:-1]
    if node.level:
        parts = parts[: len(parts) - node.level + 1]
        target = ".".join(parts) + ("." + node.module if node.module else "")
    else:
        target = node.module or ""
    return [target] + [f"{target}.{alias.name}" for alias in node.names]


def import_graph(root: str = PACKAGE) -> dict[str, set[str]]:
    """Module → the package's modules it imports (a name imported from a package counts as the package)."""
    modules = _modules(root)
    top = os.path.basename(root)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        skip = _type_checking_only(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in skip:
                for target in _targets(module, path, node):
                    while target and target not in modules:
                        target = target.rpartition(".")[0]
                    if target and target != module and target.split(".")[0] == top:
                        graph[module].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_checker_finds_a_cycle(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from . import b\n")
    (package / "b.py").write_text("def f():\n    from .a import g\n")  # function level: still a tie
    (package / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n")
    (package / "d.py").write_text("from .c import x\n")
    graph = import_graph(str(package))
    assert cycles(graph) == [["pkg.a", "pkg.b"]]
    assert graph["pkg.c"] == set() and graph["pkg.d"] == {"pkg.c"}


def test_mpicomm_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 30, "the checker found too few modules; is the package path right?"
    found = cycles(graph)
    assert not found, "import cycles (a module must import only modules below it): " + "; ".join(
        " <-> ".join(c) for c in found)


#: The layers, top to bottom: a module imports modules of its own layer or of layers below it only. A
#: collective call walks down them once: the front reads the arguments and asks the selection (the table of
#: algorithms and its rules) which algorithm runs, the plan layer compiles that algorithm's schedule (coll/),
#: and the engine runs it through the transport.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # mpicomm.cli, the commands' parser and conventions, checks the MPICOMM_* settings against the registry
    ("tools", ("mpicomm.__main__", "mpicomm.verify", "mpicomm.bench", "mpicomm.tune", "mpicomm.torch", "mpicomm.cli",
               "mpicomm.doctor")),
    ("front", ("mpicomm", "mpicomm.comm", "mpicomm.collectives", "mpicomm.p2p", "mpicomm.rma", "mpicomm.rendezvous",
               "mpicomm.shm", "mpicomm.state", "mpicomm.front")),
    ("selection", ("mpicomm.selection", "mpicomm.rules")),
    ("plan", ("mpicomm.plan",)),
    ("algorithms", ("mpicomm.coll",)),
    ("table", ("mpicomm.registry", "mpicomm.model")),
    ("engine", ("mpicomm.engine", "mpicomm.trace")),
    ("transport", ("mpicomm.transport",)),
    ("floor", ("mpicomm.catalogue", "mpicomm.facts", "mpicomm.config", "mpicomm.ops", "mpicomm.schedule", "mpicomm.schedule_file",
               "mpicomm.launcher", "mpicomm.device", "mpicomm.cleanup", "mpicomm.runtime", "mpicomm.validate")),
]


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of *module* (the longest matching prefix names its layer)."""
    best, found = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, found = len(prefix), i
    if found is None:
        raise AssertionError(f"{module} is in no layer of tests/test_imports.py LAYERS; add it where it belongs")
    return found


def test_every_module_imports_only_its_layer_and_the_layers_below():
    graph = import_graph()
    upward = [f"{m} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]})"
              for m in sorted(graph) for t in sorted(graph[m]) if layer_of(t) < layer_of(m) and t != "mpicomm"]
    assert not upward, "imports that go up a layer: " + "; ".join(upward)


def test_the_package_root_imports_nothing_eagerly():
    """``import mpicomm`` starts nothing (the names load when first used); the layers stand on their own."""
    assert import_graph()["mpicomm"] == set()
