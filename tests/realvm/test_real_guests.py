"""The hypervisor interface on real QEMU guests: launch, balloon, CPU tune, tags, stop,
remove, live migration between two libvirtd "hosts" and its rollback.

Every guest is the tiny initramfs guest of scripts/guest-image.sh, which prints
"lm-guest: up" on its serial console once its init runs (virtio_balloon loaded) and
"lm-guest: power off" when the ACPI power button reaches it. Timings are printed
(``pytest -s``) for the figures in the docs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import libvirt
import pytest
from realvm_helpers import (
    BALLOON_S,
    MIB,
    STOP_S,
    Launched,
    RealHosts,
    actual_balloon,
    booted,
    defined,
    new_spec,
    running,
    serial,
    wait_for,
)

from loadmaster.agent.hypervisor.base import GuestSpec, HypervisorError
from loadmaster.agent.hypervisor.libvirt import METADATA_NS, LibvirtHypervisor, parse_metadata

pytestmark = [pytest.mark.realvm, pytest.mark.xdist_group("realvm")]


@pytest.fixture
def hv_a(real_hosts: RealHosts) -> Iterator[LibvirtHypervisor]:
    hv = real_hosts.hypervisor(real_hosts.a)
    yield hv
    hv.close()


@pytest.fixture
def hv_b(real_hosts: RealHosts) -> Iterator[LibvirtHypervisor]:
    hv = real_hosts.hypervisor(real_hosts.b)
    yield hv
    hv.close()


@pytest.fixture(scope="module")
def gold_guest(real_hosts: RealHosts) -> Iterator[GuestSpec]:
    """One 256 MiB guest on host a, shared by the tests that only tune it."""
    spec = new_spec(256, "gold")
    guests = Launched(real_hosts)
    hv = real_hosts.hypervisor(real_hosts.a)
    try:
        print(f"boot of a 256 MiB guest: {guests.launch(hv, spec):.1f} s")
        yield spec
    finally:
        hv.close()
        guests.clean()


def test_launched_guest_boots_and_is_listed_as_managed(
    hv_a: LibvirtHypervisor, gold_guest: GuestSpec
) -> None:
    hv_a.launch_guest(gold_guest)  # running already: nothing happens
    guest = running(hv_a)[gold_guest.uuid]
    assert guest.name == gold_guest.name
    assert guest.managed and guest.tags == {"gold"}
    info = hv_a.balloon_info(gold_guest.uuid)
    assert info.current == info.maximum == 256 * MIB
    stats = hv_a.memory_stats(gold_guest.uuid)
    # Figures from the guest's own balloon driver, not made up by a test driver.
    assert 0 < stats["unused"] < stats["available"] <= 256 * MIB
    assert hv_a.cpu_stats(gold_guest.uuid).cpu_time_ns > 0


def test_host_info_from_the_real_host(hv_a: LibvirtHypervisor) -> None:
    info = hv_a.host_info()
    assert info.cpus == os.cpu_count()
    assert info.numa_cells and sum(c.cpus for c in info.numa_cells) == info.cpus
    # libvirt counts memory from the NUMA nodes' sysfs meminfo, which on these sandboxed
    # machines is less than /proc/meminfo shows (and moves): consistent with itself, then.
    lines = Path("/proc/meminfo").read_text().splitlines()
    meminfo = {line.split(":")[0]: int(line.split()[1]) for line in lines}
    assert 0 < info.memory_kib <= meminfo["MemTotal"]
    cells_kib = sum(c.memory_kib for c in info.numa_cells)
    assert abs(info.memory_kib - cells_kib) <= 0.05 * info.memory_kib
    assert 0 < info.free_memory_kib < info.memory_kib


def test_balloon_target_reached(hv_a: LibvirtHypervisor, gold_guest: GuestSpec) -> None:
    uuid = gold_guest.uuid
    unused_before = hv_a.memory_stats(uuid)["unused"]
    target = 160 * MIB
    started = time.monotonic()
    hv_a.set_memory(uuid, target)
    reached = wait_for(
        "balloon at 160 MiB", lambda: actual_balloon(hv_a, uuid) == target, BALLOON_S
    )
    # info() follows QEMU's balloon-change events, which QEMU sends at most once a second:
    # it can lag the "actual" of the memory stats by that much.
    wait_for("balloon_info at 160 MiB", lambda: hv_a.balloon_info(uuid).current == target, 5)
    # The guest really gave the memory up: its own free memory fell by most of the 96 MiB.
    freed = wait_for(
        "guest's unused memory down",
        lambda: hv_a.memory_stats(uuid)["unused"] <= unused_before - 64 * MIB,
        BALLOON_S,
    )
    print(
        f"balloon 256 -> 160 MiB: actual reached in {reached:.1f} s, "
        f"guest stats showing it {time.monotonic() - started:.1f} s after the call ({freed:.1f})"
    )
    hv_a.set_memory(uuid, 256 * MIB)
    wait_for("balloon back at 256 MiB", lambda: actual_balloon(hv_a, uuid) == 256 * MIB, BALLOON_S)


def test_cpu_quota_and_shares_applied(
    hv_a: LibvirtHypervisor, gold_guest: GuestSpec, real_hosts: RealHosts
) -> None:
    before = hv_a.cpu_tune(gold_guest.uuid)
    assert (before.quota, before.shares) == (-1, 1024)  # unlimited, the default weight
    hv_a.set_cpu_tune(gold_guest.uuid, quota=50_000, period=100_000, shares=512)
    tune = hv_a.cpu_tune(gold_guest.uuid)
    assert (tune.quota, tune.period, tune.shares) == (50_000, 100_000, 512)
    # And in the kernel: the guest's cgroups under its daemon's own cgroup.
    groups = (real_hosts.a.base / "cgroups").read_text().split()
    [cpu] = [g for g in groups if "/cpu/" in g]
    [domain] = Path(cpu).glob(f"machine/*{gold_guest.name}.libvirt-qemu")
    assert (domain / "vcpu0" / "cpu.cfs_quota_us").read_text().strip() == "50000"
    assert (domain / "cpu.shares").read_text().strip() == "512"
    hv_a.set_cpu_tune(gold_guest.uuid, quota=-1, period=None, shares=1024)


def test_tags_rewritten_live_and_persistent(
    hv_a: LibvirtHypervisor, gold_guest: GuestSpec, real_hosts: RealHosts
) -> None:
    hv_a.set_tags(gold_guest.uuid, frozenset({"platinum", "prio:2"}))
    guest = running(hv_a)[gold_guest.uuid]
    assert guest.tags == {"platinum", "prio:2"} and guest.managed
    conn = libvirt.open(real_hosts.a.uri)
    try:
        dom = conn.lookupByUUIDString(gold_guest.uuid)
        config = dom.metadata(
            libvirt.VIR_DOMAIN_METADATA_ELEMENT, METADATA_NS, libvirt.VIR_DOMAIN_AFFECT_CONFIG
        )
    finally:
        conn.close()
    assert parse_metadata(config)[0] == {"platinum", "prio:2"} and "managed" in config
    hv_a.set_tags(gold_guest.uuid, gold_guest.tags)


def test_stop_graceful_and_forced_then_remove(
    hv_a: LibvirtHypervisor, launched: Launched, real_hosts: RealHosts
) -> None:
    gentle, hard = new_spec(128), new_spec(128)
    hv_a.launch_guest(hard)  # both boot at once
    launched.launch(hv_a, gentle)
    booted(real_hosts, hard)
    launched.uuids.append(hard.uuid)

    hv_a.stop_guest(gentle.uuid, force=False)
    took = wait_for("graceful shutdown", lambda: gentle.uuid not in running(hv_a), STOP_S)
    assert "lm-guest: power off" in serial(real_hosts, gentle)  # the guest shut itself down
    hv_a.stop_guest(hard.uuid, force=True)
    assert hard.uuid not in running(hv_a)
    print(f"graceful shutdown (ACPI power button): {took:.1f} s")

    # Stopped, still defined: a launch starts it again.
    assert defined(real_hosts.a, gentle.uuid) and defined(real_hosts.a, hard.uuid)
    hv_a.launch_guest(hard)
    assert running(hv_a)[hard.uuid].managed

    for spec in (gentle, hard):
        hv_a.remove_guest(spec.uuid)
        hv_a.remove_guest(spec.uuid)  # absent: no-op
        assert not defined(real_hosts.a, spec.uuid)


def test_live_migration_between_two_libvirtd(
    hv_a: LibvirtHypervisor, hv_b: LibvirtHypervisor, launched: Launched, real_hosts: RealHosts
) -> None:
    spec = new_spec(128, "silver")
    launched.launch(hv_a, spec)
    hv_a.set_memory(spec.uuid, 100 * MIB)
    wait_for("balloon at 100 MiB", lambda: actual_balloon(hv_a, spec.uuid) == 100 * MIB, BALLOON_S)

    started = time.monotonic()
    hv_a.migrate_guest(spec.uuid, real_hosts.b.uri)
    took = time.monotonic() - started
    print(f"live migration of a 128 MiB guest: {took:.1f} s")

    assert spec.uuid not in running(hv_a) and not defined(real_hosts.a, spec.uuid)
    guest = running(hv_b)[spec.uuid]
    assert guest.managed and guest.tags == {"silver"}
    # Live, not a restart: the balloon it had is kept, and the guest booted only once.
    assert actual_balloon(hv_b, spec.uuid) == 100 * MIB
    assert serial(real_hosts, spec).count("lm-guest: up") == 1
    # It runs there: its balloon driver answers the destination.
    hv_b.set_memory(spec.uuid, 112 * MIB)
    wait_for("balloon on b", lambda: actual_balloon(hv_b, spec.uuid) == 112 * MIB, BALLOON_S)


def test_failed_migrations_leave_the_guest_running_here(
    hv_a: LibvirtHypervisor, hv_b: LibvirtHypervisor, launched: Launched, real_hosts: RealHosts
) -> None:
    spec = new_spec(128)
    launched.launch(hv_a, spec)

    def still_here() -> None:
        assert spec.uuid in running(hv_a)
        conn = libvirt.open(real_hosts.a.uri)
        try:
            state, _reason = conn.lookupByUUIDString(spec.uuid).state()
        finally:
            conn.close()
        assert state == libvirt.VIR_DOMAIN_RUNNING
        assert not defined(real_hosts.b, spec.uuid)

    # 1. The destination cannot be reached.
    with pytest.raises(HypervisorError, match="cannot connect to the destination"):
        hv_a.migrate_guest(spec.uuid, "qemu+unix:///system?socket=/nonexistent/libvirt-sock")
    still_here()

    # 2. The destination refuses it: a different guest of that name is defined there.
    conn = libvirt.open(real_hosts.b.uri)
    try:
        squatter = conn.defineXML(
            f"<domain type='qemu'><name>{spec.name}</name><memory>65536</memory>"
            "<os><type arch='x86_64' machine='pc'>hvm</type></os></domain>"
        )
        with pytest.raises(HypervisorError, match="live migration failed"):
            hv_a.migrate_guest(spec.uuid, real_hosts.b.uri)
        squatter.undefine()
    finally:
        conn.close()
    still_here()

    # 3. Half way: the destination prepared the guest but cannot receive its memory (an
    #    address it cannot listen on); libvirt tears the destination down.
    unreachable = real_hosts.hypervisor(real_hosts.a, migration_uri="tcp://192.0.2.1")
    try:
        started = time.monotonic()
        with pytest.raises(HypervisorError, match="live migration failed"):
            unreachable.migrate_guest(spec.uuid, real_hosts.b.uri)
        print(f"failed migration rolled back in {time.monotonic() - started:.1f} s")
    finally:
        unreachable.close()
    still_here()
    # Still alive, not only "running": its balloon driver answers.
    hv_a.set_memory(spec.uuid, 100 * MIB)
    wait_for(
        "balloon after rollback", lambda: actual_balloon(hv_a, spec.uuid) == 100 * MIB, BALLOON_S
    )
