"""The agent's three packages depend one way: the host manager and the SLA loop use the
hypervisor package and not each other, drivers use neither, and only ``runner`` joins
the manager and the loop. A driver importing its consumers (a collector class, a
controller's limits) ties every driver to the loop's code."""

from __future__ import annotations

import pytest
from tests.foundation.test_import_circles import import_graph

AGENT = "loadmaster.agent"
# What each agent package may import of the agent besides itself.
ALLOWED = {
    f"{AGENT}.hypervisor": set[str](),
    f"{AGENT}.manager": {f"{AGENT}.hypervisor"},
    f"{AGENT}.sla": {f"{AGENT}.hypervisor"},
}


def _package(module: str) -> str | None:
    """The agent package ``module`` belongs to (the agent's own ``__init__`` and ``runner``
    are none of them)."""
    for package in (*ALLOWED, f"{AGENT}.runner"):
        if module == package or module.startswith(package + "."):
            return package
    return None


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_an_agent_package_imports_only_what_it_builds_on(package: str) -> None:
    crossing = sorted(
        f"{module} -> {target}"
        for module, targets in import_graph().items()
        if _package(module) == package
        for target in targets
        if target.startswith(AGENT + ".") or target == AGENT
        if _package(target) != package and _package(target) not in ALLOWED[package]
    )
    assert crossing == []
