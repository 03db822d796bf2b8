"""Guest lifecycle and host discovery (launch, remove, tags, migration, host info) on the
simulator and on libvirt's test driver. The real-QEMU versions are in tests/realvm.

The test driver cannot migrate, so ``migrate_guest`` makes a cold move there. Every
``test:///default`` connection of a process shares one host (a ``test://FILE`` connection
gets a private one), so the default host serves as the destination a second
``LibvirtHypervisor`` can see.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid as uuidlib
import xml.etree.ElementTree as ET
from typing import Any

import pytest

from loadmaster.agent.hypervisor.base import CpuTune, GuestSpec, HypervisorError
from loadmaster.agent.hypervisor.libvirt import (
    METADATA_NS,
    GuestImage,
    LibvirtHypervisor,
    domain_xml,
    is_managed,
    with_tags,
)
from loadmaster.agent.hypervisor.simulated import GIB, SimGuestSpec, SimulatedHypervisor
from loadmaster.quota import flavor_quota

SPEC = GuestSpec(
    uuid="6f2c1d9e-3b7a-4c55-9a0e-1d2b3c4d5e6f",
    name="lm-launched",
    memory_kib=2 * GIB,
    vcpus=2,
    tags=frozenset({"gold", "prio:3"}),
)


def by_uuid(hv: Any) -> dict[str, Any]:
    return {g.uuid: g for g in hv.list_guests()}


# -- the simulator ------------------------------------------------------------------------


def sim(**kwargs: Any) -> SimulatedHypervisor:
    existing = SimGuestSpec(name="pre-existing", memory_kib=4 * GIB, min_kib=GIB)
    return SimulatedHypervisor([existing], host_memory_kib=16 * GIB, cpus=8, **kwargs)


def test_sim_launch_is_managed_tagged_and_idempotent() -> None:
    hv = sim()
    hv.launch_guest(SPEC)
    hv.launch_guest(SPEC)  # running already: nothing more
    guests = by_uuid(hv)
    assert len(guests) == 2
    launched = guests[SPEC.uuid]
    assert (launched.name, launched.tags, launched.managed) == (SPEC.name, SPEC.tags, True)
    assert [g.managed for g in guests.values() if g.uuid != SPEC.uuid] == [False]
    info = hv.balloon_info(SPEC.uuid)
    assert (info.current, info.maximum, info.minimum) == (2 * GIB, 2 * GIB, GIB // 2)
    assert hv.cpu_stats(SPEC.uuid).vcpu_count == 2
    # The default demand curve gives it memory use once time moves.
    hv.advance()
    assert 0 < hv.memory_stats(SPEC.uuid)["rss"] < 2 * GIB


def test_sim_launch_restarts_a_guest_that_is_shutting_down() -> None:
    hv = sim()
    hv.launch_guest(SPEC)
    hv.stop_guest(SPEC.uuid, force=False)
    hv.launch_guest(SPEC)
    hv.advance()
    assert SPEC.uuid in by_uuid(hv)


def test_sim_failing_and_slow_launches() -> None:
    hv = sim(failing_launches={"doomed"}, launch_delay=0.2)
    with pytest.raises(HypervisorError, match="launch doomed"):
        hv.launch_guest(GuestSpec("d0000000-0000-4000-8000-000000000000", "doomed", GIB, 1))
    started = time.monotonic()
    hv.launch_guest(SPEC)
    assert time.monotonic() - started >= 0.2
    # Known launches return at once: the delay is the boot, not the check.
    started = time.monotonic()
    hv.launch_guest(SPEC)
    assert time.monotonic() - started < 0.1
    assert {g.name for g in hv.list_guests()} == {"pre-existing", SPEC.name}  # no "doomed"


def test_sim_concurrent_launches_of_one_guest_make_one_guest() -> None:
    hv = sim(launch_delay=0.05)
    threads = [threading.Thread(target=hv.launch_guest, args=(SPEC,)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [g.uuid for g in hv.list_guests()].count(SPEC.uuid) == 1


def test_sim_launches_from_threads_while_the_agent_reads_and_time_moves() -> None:
    hv = sim(launch_delay=0.001)
    specs = [
        GuestSpec(str(uuidlib.UUID(int=i, version=4)), f"mass-{i:03d}", GIB, 1) for i in range(200)
    ]
    errors: list[BaseException] = []

    def launch_all(part: list[GuestSpec]) -> None:
        try:
            for spec in part:
                hv.launch_guest(spec)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=launch_all, args=(specs[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    # What the agent does meanwhile: read every guest, and the simulation steps.
    while any(t.is_alive() for t in threads):
        for guest in hv.list_guests():
            hv.memory_stats(guest.uuid)
        hv.advance()
    for t in threads:
        t.join()
    assert errors == []
    assert len(hv.list_guests()) == 201


def test_sim_remove_and_tags() -> None:
    hv = sim()
    hv.launch_guest(SPEC)
    hv.set_tags(SPEC.uuid, frozenset({"platinum"}))
    assert by_uuid(hv)[SPEC.uuid].tags == {"platinum"}
    used = hv.host_info().free_memory_kib
    hv.remove_guest(SPEC.uuid)
    hv.remove_guest(SPEC.uuid)  # absent: no-op
    assert SPEC.uuid not in by_uuid(hv)
    assert hv.host_info().free_memory_kib >= used
    with pytest.raises(HypervisorError, match=SPEC.uuid):
        hv.set_tags(SPEC.uuid, frozenset())


def test_sim_host_info() -> None:
    hv = sim(hostname="rack1-h7", numa_nodes=2)
    info = hv.host_info()
    assert (info.hostname, info.cpus, info.memory_kib) == ("rack1-h7", 8, 16 * GIB)
    assert 0 < info.free_memory_kib < info.memory_kib
    assert [(c.id, c.cpus, c.memory_kib) for c in info.numa_cells] == [
        (0, 4, 8 * GIB),
        (1, 4, 8 * GIB),
    ]


def test_sim_migration_moves_the_guest_with_its_state() -> None:
    source = sim(uri="sim://source-mig")
    destination = sim(uri="sim://dest-mig")
    source.launch_guest(SPEC)
    source.set_memory(SPEC.uuid, GIB)
    source.migrate_guest(SPEC.uuid, "sim://dest-mig")
    assert SPEC.uuid not in by_uuid(source)
    moved = by_uuid(destination)[SPEC.uuid]
    assert moved.managed and moved.tags == SPEC.tags
    assert destination.balloon_info(SPEC.uuid).current == GIB


def test_sim_launch_applies_the_flavors_quota_and_migration_keeps_it() -> None:
    source = sim(uri="sim://source-quota")
    destination = sim(uri="sim://dest-quota")
    specs = {"quota:disk_total_iops_sec": "500", "quota:cpu_shares": "512"}
    source.launch_guest(dataclasses.replace(SPEC, quota=flavor_quota(specs)))
    source.migrate_guest(SPEC.uuid, "sim://dest-quota")
    assert destination.io_tune(SPEC.uuid, "vda")["total_iops_sec"] == 500
    assert destination.cpu_tune(SPEC.uuid) == CpuTune(quota=-1, period=100_000, shares=512)


@pytest.mark.parametrize("failure", ["unknown destination", "destination refuses", "source"])
def test_sim_failed_migration_leaves_the_guest_here(failure: str) -> None:
    source = sim(uri=f"sim://source-{failure}")
    destination = sim(uri=f"sim://dest-{failure}")
    source.launch_guest(SPEC)
    uri = f"sim://dest-{failure}"
    if failure == "unknown destination":
        uri = "sim://nowhere"
    elif failure == "destination refuses":
        destination.broken.add("receive_guest")
    else:
        source.broken.add("migrate_guest")
    with pytest.raises(HypervisorError):
        source.migrate_guest(SPEC.uuid, uri)
    assert SPEC.uuid in by_uuid(source)
    assert SPEC.uuid not in by_uuid(destination)


# -- libvirt's test driver ----------------------------------------------------------------


def test_domain_xml_for_qemu_is_a_tcg_kernel_boot_with_a_stats_balloon(tmp_path: Any) -> None:
    image = GuestImage(tmp_path / "vmlinuz", tmp_path / "initrd.img", log_dir=tmp_path)
    dom = ET.fromstring(domain_xml(SPEC, "QEMU", image))
    assert dom.get("type") == "qemu"  # TCG
    assert dom.findtext("os/kernel") == str(tmp_path / "vmlinuz")
    assert dom.findtext("os/initrd") == str(tmp_path / "initrd.img")
    assert dom.find("devices/memballoon[@model='virtio']/stats").get("period") == "2"  # type: ignore[union-attr]
    assert dom.find("devices/serial/source").get("path") == str(tmp_path / "lm-launched.serial")  # type: ignore[union-attr]
    assert dom.find("devices/disk") is None
    assert dom.findtext("memory") == str(2 * GIB) and dom.findtext("vcpu") == "2"
    with pytest.raises(HypervisorError, match="no guest kernel"):
        domain_xml(SPEC, "QEMU", None)


def test_metadata_helpers_keep_other_facts() -> None:
    meta = f"<lm:vm xmlns:lm='{METADATA_NS}'><lm:managed/><lm:tag>gold</lm:tag><lm:vcpu-limit>50</lm:vcpu-limit></lm:vm>"
    assert is_managed(meta) and not is_managed(None)
    assert not is_managed(f"<lm:vm xmlns:lm='{METADATA_NS}'><lm:tag>gold</lm:tag></lm:vm>")
    rewritten = with_tags(meta, frozenset({"silver", "prio:1"}))
    assert is_managed(rewritten) and "vcpu-limit>50<" in rewritten
    assert "gold" not in rewritten and rewritten.index("prio:1") < rewritten.index("silver")


def test_launch_on_the_test_driver(node_hv: LibvirtHypervisor) -> None:
    node_hv.launch_guest(SPEC)
    node_hv.launch_guest(SPEC)  # running already: nothing more
    guests = by_uuid(node_hv)
    assert len(guests) == 6
    launched = guests[SPEC.uuid]
    assert (launched.name, launched.tags, launched.managed) == (SPEC.name, SPEC.tags, True)
    assert not any(g.managed for u, g in guests.items() if u != SPEC.uuid)
    info = node_hv.balloon_info(SPEC.uuid)
    assert (info.current, info.maximum) == (2 * GIB, 2 * GIB)
    assert node_hv.cpu_stats(SPEC.uuid).vcpu_count == 2


def test_launch_that_loses_a_race_leaves_the_guest_running_and_defined(
    node_hv: LibvirtHypervisor, monkeypatch: pytest.MonkeyPatch
) -> None:
    node_hv.launch_guest(SPEC)
    # A concurrent launch: it looked the guest up before this one's define, so it defines
    # it too and finds it running when it starts it.
    monkeypatch.setattr(node_hv, "_lookup", lambda _uuid: None)
    node_hv.launch_guest(SPEC)
    monkeypatch.undo()
    assert by_uuid(node_hv)[SPEC.uuid].managed
    node_hv.stop_guest(SPEC.uuid, force=True)
    node_hv.launch_guest(SPEC)  # still defined: the loser of the race did not undefine it
    assert SPEC.uuid in by_uuid(node_hv)


def test_launch_starts_a_defined_guest_that_is_off(node_hv: LibvirtHypervisor) -> None:
    node_hv.launch_guest(SPEC)
    node_hv.stop_guest(SPEC.uuid, force=True)
    assert SPEC.uuid not in by_uuid(node_hv)
    node_hv.launch_guest(SPEC)  # defined persistently, so it starts again
    assert by_uuid(node_hv)[SPEC.uuid].managed


def test_failed_launch_leaves_nothing_defined(node_hv: LibvirtHypervisor) -> None:
    # The name of a running guest: the definition is refused, named in the error.
    clash = GuestSpec("0badc0de-0000-4000-8000-000000000000", "web-platinum", GIB, 1)
    with pytest.raises(HypervisorError, match="launch web-platinum"):
        node_hv.launch_guest(clash)
    assert node_hv._lookup(clash.uuid) is None  # not even defined


def test_remove_guest_destroys_and_undefines(node_hv: LibvirtHypervisor) -> None:
    node_hv.launch_guest(SPEC)
    node_hv.remove_guest(SPEC.uuid)
    node_hv.remove_guest(SPEC.uuid)  # absent: no-op
    assert SPEC.uuid not in by_uuid(node_hv)
    # Undefined too: a launch defines it afresh, with the tags of the new spec.
    node_hv.launch_guest(GuestSpec(SPEC.uuid, SPEC.name, GIB, 1, frozenset({"silver"})))
    assert by_uuid(node_hv)[SPEC.uuid].tags == {"silver"}
    assert node_hv.balloon_info(SPEC.uuid).maximum == GIB


def test_set_tags_live_and_persistent(node_hv: LibvirtHypervisor) -> None:
    gold = next(g for g in node_hv.list_guests() if g.name == "db-gold")
    node_hv.set_tags(gold.uuid, frozenset({"platinum", "prio:9"}))
    after = by_uuid(node_hv)[gold.uuid]
    assert after.tags == {"platinum", "prio:9"}
    # The other facts of its metadata stay.
    assert after.io_limits == gold.io_limits and after.vcpu_user_limit == gold.vcpu_user_limit
    node_hv.launch_guest(SPEC)
    node_hv.set_tags(SPEC.uuid, frozenset({"silver"}))
    node_hv.stop_guest(SPEC.uuid, force=True)
    node_hv.launch_guest(SPEC)  # boots from the persistent definition
    restarted = by_uuid(node_hv)[SPEC.uuid]
    assert restarted.tags == {"silver"} and restarted.managed
    with pytest.raises(HypervisorError, match="no such guest"):
        node_hv.set_tags("00000000-0000-4000-8000-00000000dead", frozenset())


def test_host_info_on_the_test_driver(node_hv: LibvirtHypervisor) -> None:
    info = node_hv.host_info()
    assert info.cpus == 8 and info.memory_kib == 33_554_432 and info.hostname
    default = LibvirtHypervisor("test:///default")
    try:
        info = default.host_info()
    finally:
        default.close()
    # The default test host's figures: 16 CPUs, two NUMA cells. Its free memory is all of
    # it (the driver answers in KiB, not bytes: read as bytes it was 3 MiB, and the host's
    # final say refused every launch); the real value is checked in tests/realvm.
    assert info.cpus == 16 and info.free_memory_kib == info.memory_kib == 3 * 1024 * 1024
    assert [(c.id, c.cpus, c.memory_kib) for c in info.numa_cells] == [
        (0, 8, 2_097_152),
        (1, 8, 4_194_304),
    ]


def test_cold_move_between_test_hosts(
    node_hv: LibvirtHypervisor, default_hv: LibvirtHypervisor
) -> None:
    node_hv.launch_guest(SPEC)
    node_hv.migrate_guest(SPEC.uuid, "test:///default")
    assert SPEC.uuid not in by_uuid(node_hv)
    moved = by_uuid(default_hv)[SPEC.uuid]
    assert moved.managed and moved.tags == SPEC.tags
    # Gone from the source for good, not only stopped.
    node_hv.launch_guest(GuestSpec(SPEC.uuid, "other-name", GIB, 1))
    assert by_uuid(node_hv)[SPEC.uuid].name == "other-name"


def test_failed_migrations_leave_the_guest_running_here(
    node_hv: LibvirtHypervisor, default_hv: LibvirtHypervisor
) -> None:
    node_hv.launch_guest(SPEC)
    with pytest.raises(HypervisorError, match="cannot connect to the destination"):
        node_hv.migrate_guest(SPEC.uuid, "test:///no/such/node.xml")
    # The destination has a guest of that name: defining it there fails, half way through.
    default_hv.launch_guest(GuestSpec("0badc0de-0000-4000-8000-000000000001", SPEC.name, GIB, 1))
    with pytest.raises(HypervisorError, match="cold move"):
        node_hv.migrate_guest(SPEC.uuid, "test:///default")
    assert by_uuid(node_hv)[SPEC.uuid].managed
    assert SPEC.uuid not in by_uuid(default_hv)
    with pytest.raises(HypervisorError, match="no running guest"):
        node_hv.migrate_guest("00000000-0000-4000-8000-00000000dead", "test:///default")


def test_cold_move_never_touches_a_guest_running_there_under_that_uuid(
    node_hv: LibvirtHypervisor, default_hv: LibvirtHypervisor
) -> None:
    node_hv.launch_guest(SPEC)
    default_hv.launch_guest(GuestSpec(SPEC.uuid, "already-there", GIB, 1))
    with pytest.raises(HypervisorError, match="already runs on the destination"):
        node_hv.migrate_guest(SPEC.uuid, "test:///default")
    assert by_uuid(default_hv)[SPEC.uuid].name == "already-there"
    assert by_uuid(node_hv)[SPEC.uuid].name == SPEC.name


def test_a_cold_move_killed_half_way_is_finished_not_undone(
    node_hv: LibvirtHypervisor, default_hv: LibvirtHypervisor
) -> None:
    """The mover was killed after starting the guest on the destination, before stopping
    it here: the next move of that guest stops it here, and leaves no definition."""
    node_hv.launch_guest(SPEC)
    dom = node_hv._conn.lookupByUUIDString(SPEC.uuid)
    default_hv._conn.defineXML(dom.XMLDesc(2)).create()  # VIR_DOMAIN_XML_INACTIVE
    node_hv.migrate_guest(SPEC.uuid, "test:///default")
    assert SPEC.uuid not in by_uuid(node_hv)
    assert SPEC.uuid not in {d.UUIDString() for d in node_hv._conn.listAllDomains(0)}
    assert by_uuid(default_hv)[SPEC.uuid].managed


def test_a_guest_gone_while_listed_is_left_out(
    node_hv: LibvirtHypervisor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker moved or removed a guest between the listing and the read of its XML:
    the others are still listed (a failed listing made the host's manager skip a whole
    pass), and the gone one is not."""
    node_hv.launch_guest(SPEC)
    conn = node_hv._conn
    listed = conn.listAllDomains(0)
    node_hv.remove_guest(SPEC.uuid)
    monkeypatch.setattr(conn, "listAllDomains", lambda _flags=0: listed)
    guests = by_uuid(node_hv)
    assert SPEC.uuid not in guests
    assert len(guests) == len(listed) - 1 > 0
