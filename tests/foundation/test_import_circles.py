"""No module of loadmaster imports, directly or through others, a module that imports it.

Which imports count: every one, at module level, inside a function and under ``if
TYPE_CHECKING:``. An import moved into a function to dodge a circle still ties the two
modules together (and runs at the first call); a type imported for annotations only
becomes a runtime import the day someone needs it at run time (``isinstance``, a
dataclass or pydantic model evaluating its fields), and two modules that each need the
other's names are one module, or share a third that owns those names.

An import of ``loadmaster.a.b`` (or ``from loadmaster.a import b`` where ``b`` is a module)
is an edge to ``loadmaster.a.b``; ``from loadmaster.a import name`` of anything else is an
edge to the package ``loadmaster.a`` (its ``__init__``). The parent packages Python
initialises on the way are not edges: a submodule importing a sibling while its package's
``__init__`` runs is how packages are built.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "loadmaster"


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node


def _targets(name: str, path: Path, node: ast.Import | ast.ImportFrom, known: set[str]) -> set[str]:
    """The loadmaster modules ``node`` (in module ``name`` at ``path``) imports."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in known}
    if node.level:
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{node.module}" if node.module else package
    else:
        base = node.module or ""
    if base != PACKAGE and not base.startswith(PACKAGE + "."):
        return set()
    out = set()
    for alias in node.names:
        submodule = f"{base}.{alias.name}"
        if submodule in known:
            out.add(submodule)
        elif base in known:
            out.add(base)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        edges: set[str] = set()
        for node in _imports(tree):
            edges |= _targets(name, path, node, known)
        edges.discard(name)
        graph[name] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected component of more than one module (Tarjan's),
    as a path through it that comes back to its start."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(start: str) -> None:
        # Iterative: the graph is deep enough to worry a recursion limit.
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return [_path_through(graph, component) for component in components]


def _path_through(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """The shortest way from the component's first module back to itself."""
    start = min(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & component):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start] if node != start else [start]
                if child not in came_from:
                    came_from[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no way around {sorted(component)}")


def test_the_walk_finds_a_circle_and_names_it() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c", "a"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_walk_sees_imports_in_functions_and_for_type_checking() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from loadmaster import errors\n"
        "else:\n    from loadmaster import shapes\n"
        "def f():\n    from loadmaster.store import engine\n"
        "from . import tiers\n"
    )
    tree = ast.parse(source)
    known = {
        "loadmaster.errors",
        "loadmaster.shapes",
        "loadmaster.store.engine",
        "loadmaster.tiers",
    }
    found = set()
    for node in _imports(tree):
        found |= _targets("loadmaster.x", SRC / PACKAGE / "x.py", node, known)
    assert found == known


def test_no_import_circle() -> None:
    found = circles(import_graph())
    assert not found, "import circles: " + "; ".join(" -> ".join(c) for c in found)
