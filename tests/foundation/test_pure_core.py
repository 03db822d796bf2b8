"""The scheduler's core (``loadmaster.scheduler.core``) decides and does no I/O: none of
its modules imports, directly or through other loadmaster modules, the storage, the
ledger, the scheduler's own I/O shell, or a library that reaches a database, a socket or a
process. What counts as an import is what ``test_import_circles`` counts (every import
statement, in functions and under ``if TYPE_CHECKING:`` too; a parent package's
``__init__`` is not an edge)."""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

from tests.foundation.test_import_circles import PACKAGE, SRC, import_graph

CORE = f"{PACKAGE}.scheduler.core"
# loadmaster modules the core must not reach: the database and the ledger over it, and
# the scheduler's shell around the core (snapshot source, request resolution, claims).
FORBIDDEN_MODULES = (f"{PACKAGE}.store", f"{PACKAGE}.pending", f"{PACKAGE}.scheduler")
# Libraries that talk to a database, the network, a hypervisor or another process.
FORBIDDEN_LIBRARIES = frozenset(
    {
        "alembic",
        "fastapi",
        "http",
        "httpx",
        "libvirt",
        "multiprocessing",
        "psycopg",
        "psycopg2",
        "socket",
        "sqlalchemy",
        "sqlite3",
        "starlette",
        "subprocess",
        "urllib",
        "uvicorn",
    }
)


def _in_core(name: str) -> bool:
    return name == CORE or name.startswith(CORE + ".")


def _forbidden_module(name: str) -> bool:
    if _in_core(name) or name == f"{PACKAGE}.scheduler":
        # The scheduler package itself is where the core lives: importing a sibling of
        # the core goes through it, which the walk does not count (see the docstring).
        return False
    return any(name == bad or name.startswith(bad + ".") for bad in FORBIDDEN_MODULES)


def libraries(tree: ast.AST) -> set[str]:
    """The top-level names of the libraries (not loadmaster) a module's source imports."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name.partition(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.partition(".")[0])
    found.discard(PACKAGE)
    return found


def impurities(
    graph: dict[str, set[str]], libraries_of: dict[str, set[str]], roots: list[str]
) -> list[str]:
    """Each forbidden import reachable from ``roots``, as the chain of imports from a root
    that reaches it (breadth first: the shortest chain)."""
    came_from: dict[str, str | None] = {root: None for root in roots}
    queue = deque(roots)
    found = []

    def chain(name: str) -> str:
        links = [name]
        while (before := came_from[links[-1]]) is not None:
            links.append(before)
        return " -> ".join(reversed(links))

    while queue:
        name = queue.popleft()
        if _forbidden_module(name):
            found.append(chain(name))
            continue
        for library in sorted(libraries_of.get(name, set()) & FORBIDDEN_LIBRARIES):
            found.append(f"{chain(name)} -> {library}")
        for child in sorted(graph.get(name, set())):
            if child not in came_from:
                came_from[child] = name
                queue.append(child)
    return found


def test_the_walk_names_the_chain_to_a_forbidden_import() -> None:
    graph = {
        f"{CORE}.a": {f"{PACKAGE}.helpers"},
        f"{PACKAGE}.helpers": {f"{PACKAGE}.store.schema"},
        f"{PACKAGE}.store.schema": set(),
        f"{CORE}.b": {f"{PACKAGE}.scheduler"},
        f"{PACKAGE}.scheduler": set(),
    }
    found = impurities(graph, {f"{CORE}.b": {"numpy", "httpx"}}, [f"{CORE}.a", f"{CORE}.b"])
    assert found == [
        f"{CORE}.b -> httpx",
        f"{CORE}.a -> {PACKAGE}.helpers -> {PACKAGE}.store.schema",
    ]
    assert libraries(ast.parse("import sqlalchemy.orm\nfrom . import x\n")) == {"sqlalchemy"}


def test_the_core_does_no_io() -> None:
    graph = import_graph()
    roots = sorted(name for name in graph if _in_core(name))
    assert f"{CORE}.decide" in roots
    libraries_of = {}
    for name in graph:
        parts = name.split(".")
        path = SRC.joinpath(*parts)
        source = path / "__init__.py" if path.is_dir() else Path(f"{path}.py")
        libraries_of[name] = libraries(ast.parse(source.read_text(), filename=str(source)))
    found = impurities(graph, libraries_of, roots)
    assert not found, "the scheduler's core reaches I/O: " + "; ".join(found)
