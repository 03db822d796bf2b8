"""Fixture folders for /proc and /sys, and a libvirt test-driver host."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_helpers import FIXTURES, NODE_XML

from loadmaster.agent.hypervisor.libvirt import LibvirtHypervisor


@pytest.fixture
def proc_dir(tmp_path: Path) -> Path:
    return Path(shutil.copytree(FIXTURES / "proc", tmp_path / "proc"))


@pytest.fixture
def sys_dir(tmp_path: Path) -> Path:
    return Path(shutil.copytree(FIXTURES / "sys", tmp_path / "sys"))


@pytest.fixture
def node_hv(sys_dir: Path) -> Iterator[LibvirtHypervisor]:
    """Five VMs, one per tier, on libvirt's test driver (a fresh host per connection)."""
    hv = LibvirtHypervisor(f"test://{NODE_XML}", sys_root=sys_dir)
    yield hv
    hv.close()


@pytest.fixture
def default_hv() -> Iterator[LibvirtHypervisor]:
    """The process's shared default test host, as a migration destination sees it."""
    hv = LibvirtHypervisor("test:///default")
    yield hv
    for guest in hv.list_guests():
        if guest.managed:
            hv.remove_guest(guest.uuid)
    hv.close()
