"""A small cluster builder shared by the scheduler tests."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

import loadmaster
from loadmaster.cluster import VmSpec
from loadmaster.service import Loadmaster


@pytest.fixture
def slm(tmp_path: Path) -> Iterator[Loadmaster]:
    """SQLite only: for behaviour that does not depend on the backend."""
    service = loadmaster.open(f"sqlite:///{tmp_path / 'sched.db'}")
    try:
        yield service
    finally:
        service.close()


def add_hosts(
    lm: Loadmaster,
    count: int,
    *,
    prefix: str = "h",
    vcpu: int = 8,
    memory: int = 16384,
    extra: Mapping[str, Mapping[str, object]] | None = None,
    **fields: object,
) -> list[str]:
    names = [f"{prefix}{i}" for i in range(count)]
    lm.hosts.create_many(
        [
            {
                "name": name,
                "inventories": {
                    "VCPU": {"total": vcpu},
                    "MEMORY_MB": {"total": memory},
                    **(extra or {}),
                },
                **fields,
            }
            for name in names
        ]
    )
    return names


def add_vms(
    lm: Loadmaster,
    count: int,
    flavor: str = "small",
    *,
    group: str | None = None,
    prefix: str = "vm",
) -> list[str]:
    specs = [VmSpec(f"{prefix}{i}", flavor, group=group) for i in range(count)]
    return [v.uuid for v in lm.vms.create_many(specs)]


def small_flavor(lm: Loadmaster, name: str = "small", vcpu: int = 2, memory: int = 4096) -> str:
    lm.flavors.create({"name": name, "resources": {"VCPU": vcpu, "MEMORY_MB": memory}})
    return name
