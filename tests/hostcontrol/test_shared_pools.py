"""Hosts registering one shared storage pool: one sharing provider with the pool's
DISK_GB in an aggregate with them, made once however many register at the same moment;
VMs on any of them draw from it; a host that stops naming the pool leaves its aggregate
only; a pool name taken by another provider is refused and changes nothing."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from loadmaster.errors import Conflict, NotFound, ValidationError
from loadmaster.hostcontrol.pools import pool_aggregate
from loadmaster.scheduler import RequestSpec
from loadmaster.service import Loadmaster

POOL = {"name": "nfs-a", "inventories": {"DISK_GB": {"total": 100}}}
OWN = {"VCPU": {"total": 8}, "MEMORY_MB": {"total": 8192}}
OPERATORS = "0a0a0a0a-0000-4000-8000-00000000000a"


def register(lm: Loadmaster, host: str, pool: dict[str, Any] | None = POOL) -> Any:
    return lm.host_agents.register(
        host, hypervisor_uri=f"test:///{host}", inventories=OWN, shared_pool=pool
    )


def test_hosts_of_one_pool_share_one_disk_gb_and_draw_from_it(lm: Loadmaster) -> None:
    for host in ("h1", "h2"):
        register(lm, host)
        register(lm, host)  # again: nothing new
    pool = lm.hosts.get("nfs-a")
    assert pool.inventories["DISK_GB"].total == 100
    assert pool.traits == ("MISC_SHARES_VIA_AGGREGATE",)
    assert pool.aggregates == (pool_aggregate("nfs-a"),)
    for host in ("h1", "h2"):
        record = lm.hosts.get(host)
        assert record.aggregates == (pool_aggregate("nfs-a"),)
        assert "DISK_GB" not in record.inventories
    disk_gb = [h for h in lm.hosts.list() if "DISK_GB" in h.inventories]
    assert [h.name for h in disk_gb] == ["nfs-a"]  # the one DISK_GB of the three
    lm.flavors.create({"name": "d40", "resources": {"VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 40}})
    vms = [lm.vms.create(f"v{i}", "d40").uuid for i in range(3)]
    result = lm.scheduler.schedule([RequestSpec(vms=vms)])
    assert [p.ok for p in result.placements].count(True) == 2
    assert lm.allocations.usages(["nfs-a"])["nfs-a"]["DISK_GB"].pending == 80


def test_hosts_registering_at_once_make_one_pool(lm: Loadmaster) -> None:
    hosts = [f"h{i}" for i in range(4)]
    with ThreadPoolExecutor(len(hosts)) as pool:
        list(pool.map(lambda h: register(lm, h), hosts))
    assert [h.name for h in lm.hosts.list() if h.name.startswith("nfs")] == ["nfs-a"]
    for host in hosts:
        assert pool_aggregate("nfs-a") in lm.hosts.get(host).aggregates


def test_a_host_leaving_the_pool_leaves_its_aggregate_only(lm: Loadmaster) -> None:
    register(lm, "h1")
    register(lm, "h2")
    lm.hosts.set_aggregates("h1", [pool_aggregate("nfs-a"), OPERATORS])
    lm.flavors.create({"name": "d40", "resources": {"VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 40}})
    vm = lm.vms.create("v", "d40")
    lm.allocations.claim(vm.uuid, "h1")
    register(lm, "h1", None)
    assert lm.hosts.get("h1").aggregates == (OPERATORS,)
    assert lm.hosts.get("h2").aggregates == (pool_aggregate("nfs-a"),)
    pool = lm.hosts.get("nfs-a")
    assert pool.inventories["DISK_GB"].total == 100
    assert pool.aggregates == (pool_aggregate("nfs-a"),)
    assert lm.allocations.pending_for_vm(vm.uuid)["nfs-a"] == {"DISK_GB": 40}
    # Another pool instead: the host moves from one aggregate to the other.
    register(lm, "h2", {"name": "nfs-b", "inventories": {"DISK_GB": {"total": 50}}})
    assert lm.hosts.get("h2").aggregates == (pool_aggregate("nfs-b"),)


def test_a_pool_name_of_another_provider_or_no_name_is_refused(lm: Loadmaster) -> None:
    register(lm, "h1", None)
    with pytest.raises(Conflict, match="provider h1 exists and is not a shared pool") as err:
        register(lm, "h2", {"name": "h1", "inventories": {"DISK_GB": {"total": 10}}})
    assert err.value.field == "shared_pool.name"
    with pytest.raises(ValidationError) as bad:
        register(lm, "h2", {"name": "", "inventories": {}})
    assert bad.value.field == "shared_pool.name"
    with pytest.raises(NotFound):
        lm.hosts.get("h2")  # nothing written
    assert "MISC_SHARES_VIA_AGGREGATE" not in lm.hosts.get("h1").traits


def test_capacity_counts_the_pool_once_for_its_hosts(lm: Loadmaster) -> None:
    for host in ("h1", "h2"):
        register(lm, host)
    lm.flavors.create({"name": "d40", "resources": {"VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 40}})
    report = lm.scheduler.capacity("d40")
    # Each host's CPUs and memory would take eight; the pool's 100 GB take two.
    assert report.total == 2
    assert sum(report.per_host.values()) == 2 and set(report.per_host) <= {"h1", "h2"}
    for name, host in (("v", "h2"), ("w", "h1")):
        lm.allocations.claim(lm.vms.create(name, "d40").uuid, host)
    full = lm.scheduler.capacity("d40")
    assert full.total == 0
    assert full.limits["h1"] == "DISK_GB short by 20 in pool nfs-a"
