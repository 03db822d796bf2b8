"""The SLA policy's IO and network controls on a real QEMU guest's devices, through the
controllers and collectors the agent runs (see docs/real-guests.md):

- ``iotune``: ``blkdeviotune`` on the guest's disk (an overlay of the busybox image), read
  back by the collector; the guest itself, writing 2 MiB rounds to its disk
  (``lm.write``), sees its throughput fall to the limit.
- ``nettune``: this machine's kernel lacks what libvirt's interface limits need, so the tap
  is shaped by tc (htb; an ifb for the guest's outbound traffic); the limits are read back
  from the tc state and measured with TCP transfers between the host (an address on the
  network's bridge) and the guest's services (``lm.ip``).
"""

from __future__ import annotations

import dataclasses
import re
import socket
import subprocess
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import libvirt
import pytest
from realvm_helpers import NETWORK, Launched, RealHosts, new_spec, serial, wait_for
from tests.agent.agent_helpers import collected_context

from loadmaster.agent.hypervisor.base import (
    DEFAULT_GUEST_CMDLINE,
    DiskSpec,
    GuestSpec,
    HypervisorError,
    NicSpec,
)
from loadmaster.agent.hypervisor.libvirt import METADATA_NS, LibvirtHypervisor, disk_targets
from loadmaster.agent.hypervisor.shaping import IFB_PREFIX
from loadmaster.agent.sla.collectors.io import GuestIoCollector
from loadmaster.agent.sla.collectors.net import GuestNetCollector
from loadmaster.agent.sla.controllers import ControlContext
from loadmaster.agent.sla.controllers.iotune import IoTuneController
from loadmaster.agent.sla.controllers.nettune import NetTuneController
from loadmaster.images import GIB

pytestmark = [pytest.mark.realvm, pytest.mark.xdist_group("realvm")]

MIB_BYTES = 1024 * 1024
WRITE_KIB = 2048  # each round of the guest's writer (scripts/guest-image.sh)
ROUND = re.compile(r"lm-guest: write (\d+) 2048 KiB ([\d.]+) ([\d.]+)")
# The guest's services: 5001 answers how many bytes it read, 5002 sends 1.5 MiB.
SINK_PORT, SOURCE_PORT = 5001, 5002
SOURCE_BYTES = 24 * 64 * 1024
NET_LIMIT_KIB = 768  # KiB/s each way: the 1.5 MiB transfers take about 2 s under it
TRANSFER_S = 60.0


def hypervisor(hosts: RealHosts, options: str) -> LibvirtHypervisor:
    """Host a, booting guests with ``options`` on their kernel command line."""
    image = dataclasses.replace(hosts.image, cmdline=f"{DEFAULT_GUEST_CMDLINE} {options}")
    return hosts.hypervisor(hosts.a, guest_image=image, storage=hosts.storage())


def context(hv: LibvirtHypervisor, controls: Mapping[str, Mapping[str, Any]]) -> ControlContext:
    """A cycle's context whose snapshots come from the agent's collectors."""
    guests = [g for g in hv.list_guests() if g.name in controls]
    return collected_context(guests, (GuestIoCollector(hv), GuestNetCollector(hv)), controls)


# -- IO -------------------------------------------------------------------------------


def write_rounds(hosts: RealHosts, spec: GuestSpec) -> dict[int, float]:
    """The guest's finished write rounds: number -> seconds it took."""
    return {
        int(n): max(float(end) - float(start), 0.01)
        for n, start, end in ROUND.findall(serial(hosts, spec))
    }


def give_io_limit(hv: LibvirtHypervisor, uuid: str, disk_file: str, total_bytes_sec: int) -> None:
    """What an operator does to put a guest's disk under the IO policy: an ``io-limit`` in
    its loadmaster metadata, here naming the disk by its file."""
    dom = hv._domain(uuid)
    flags = libvirt.VIR_DOMAIN_AFFECT_LIVE
    meta = ET.fromstring(dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, METADATA_NS, flags))
    for el in meta.iter():
        el.tag = el.tag.rsplit("}", 1)[-1]
    ET.SubElement(meta, "io-limit", dev=disk_file, total_bytes_sec=str(total_bytes_sec))
    xml = ET.tostring(meta, encoding="unicode")
    dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, xml, "lm", METADATA_NS, flags)


def test_io_limit_on_the_real_disk_slows_the_guests_writes(
    real_hosts: RealHosts, launched: Launched
) -> None:
    hv = hypervisor(real_hosts, "lm.write")
    try:
        spec = new_spec(128)
        spec = dataclasses.replace(spec, disk=DiskSpec("busybox", GIB))
        started = time.monotonic()
        launched.launch(hv, spec)
        wait_for("two write rounds", lambda: len(write_rounds(real_hosts, spec)) >= 2, 60)
        free = write_rounds(real_hosts, spec)

        desc = ET.fromstring(hv._domain(spec.uuid).XMLDesc(0))
        disk_file = next(k for k, v in disk_targets(desc).items() if k != v)
        give_io_limit(hv, spec.uuid, disk_file, MIB_BYTES)
        [guest] = [g for g in hv.list_guests() if g.uuid == spec.uuid]
        assert guest.io_limits["vda"]["total_bytes_sec"] == MIB_BYTES  # the file's target

        cap = {"io_tune": [{"name": "vda", "ioTune": {"total_bytes_sec": MIB_BYTES}}]}
        outcome = IoTuneController(hv).apply(context(hv, {spec.name: cap}))
        assert outcome.failures == [] and len(outcome.actions) == 1
        set_after = max(write_rounds(real_hosts, spec))
        # Read back by the collector from what QEMU has in force.
        [entry] = context(hv, {spec.name: {}}).snapshots[spec.name].properties["io_tune"]
        assert entry["name"] == "vda" and entry["current"]["total_bytes_sec"] == MIB_BYTES

        # The round running when the limit came may have begun before it: the next counts.
        limited_round = set_after + 2
        wait_for(
            "a limited write round", lambda: limited_round in write_rounds(real_hosts, spec), 60
        )
        limited = write_rounds(real_hosts, spec)[limited_round]

        lift = {"io_tune": [{"name": "vda", "ioTune": {"total_bytes_sec": 0}}]}
        assert IoTuneController(hv).apply(context(hv, {spec.name: lift})).failures == []
        assert hv.io_tune(spec.uuid, "vda")["total_bytes_sec"] == 0
        elapsed = time.monotonic() - started
    finally:
        hv.close()

    free_rate = WRITE_KIB / 1024 / min(free[n] for n in (1, 2))  # the faster of two, MiB/s
    limited_rate = WRITE_KIB / 1024 / limited
    print(
        f"guest writes: {free_rate:.1f} MiB/s free (rounds {free}), {limited_rate:.2f} MiB/s "
        f"under 1 MiB/s; test {elapsed:.1f} s"
    )
    assert limited_rate < free_rate / 2, (free, limited)
    # QEMU lets a burst of a tenth of the rate through at once: well under 1.5 MiB/s.
    assert limited_rate < 1.5, limited


# -- network --------------------------------------------------------------------------


def run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def bridge_address(real_hosts: RealHosts) -> Iterator[tuple[str, str]]:
    """An address for this machine on host a's network bridge, in a /24 no other
    interface has (another test run's bridge may have one): (bridge, subnet prefix)."""
    conn = libvirt.open(real_hosts.a.uri)
    try:
        bridge = conn.networkLookupByName(NETWORK).bridgeName()
    finally:
        conn.close()
    used = run("ip", "-4", "-o", "addr", "show")
    subnet = next(f"10.213.{n}" for n in range(20, 250) if f" 10.213.{n}." not in used)
    run("ip", "addr", "add", f"{subnet}.1/24", "dev", bridge)
    try:
        yield bridge, subnet
    finally:
        subprocess.run(["ip", "addr", "del", f"{subnet}.1/24", "dev", bridge], check=False)


def connect(bridge: str, address: str, port: int) -> socket.socket:
    """A TCP connection to the guest over the bridge (whatever other bridge has the same
    subnet), retried while the guest's service is not up yet."""
    deadline = time.monotonic() + TRANSFER_S
    while True:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, bridge.encode())
        sock.settimeout(TRANSFER_S)
        try:
            sock.connect((address, port))
            return sock
        except OSError:
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def send_rate(bridge: str, address: str, size: int) -> float:
    """KiB/s of ``size`` bytes sent to the guest, until it answered that it read them all."""
    with connect(bridge, address, SINK_PORT) as sock:
        started = time.monotonic()
        sock.sendall(b"\0" * size)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while not answer.endswith(b"\n"):
            chunk = sock.recv(64)
            if not chunk:
                break
            answer += chunk
        seconds = time.monotonic() - started
    assert answer.strip() == str(size).encode(), answer
    return size / 1024 / seconds


def receive_rate(bridge: str, address: str) -> float:
    """KiB/s of what the guest sends, from its connection to its end."""
    with connect(bridge, address, SOURCE_PORT) as sock:
        started = time.monotonic()
        received = 0
        while chunk := sock.recv(65536):
            received += len(chunk)
        seconds = time.monotonic() - started
    assert received == SOURCE_BYTES
    return received / 1024 / seconds


def tap_state(tap: str) -> str:
    return run("tc", "qdisc", "show", "dev", tap)


def ifbs() -> set[str]:
    return {p.name for p in Path("/sys/class/net").glob(f"{IFB_PREFIX}*")}


def test_network_limit_is_shaped_read_back_and_measured(
    real_hosts: RealHosts, launched: Launched, bridge_address: tuple[str, str]
) -> None:
    bridge, subnet = bridge_address
    guest_address = f"{subnet}.2"
    hv = hypervisor(real_hosts, f"lm.ip={guest_address}/24")
    try:
        spec = dataclasses.replace(new_spec(128), nics=(NicSpec(NETWORK, "52:54:00:5a:17:37"),))
        started = time.monotonic()
        launched.launch(hv, spec)
        [tap] = next(g for g in hv.list_guests() if g.uuid == spec.uuid).interfaces
        free_in = send_rate(bridge, guest_address, SOURCE_BYTES)
        free_out = receive_rate(bridge, guest_address)

        limit = {"net_inbound_average": NET_LIMIT_KIB, "net_outbound_average": NET_LIMIT_KIB}
        outcome = NetTuneController(hv).apply(context(hv, {spec.name: limit}))
        assert outcome.failures == [], outcome.failures
        ifb = f"{IFB_PREFIX}{Path(f'/sys/class/net/{tap}/ifindex').read_text().strip()}"
        # libvirt's own limits fail on this kernel: the tap is shaped by tc.
        assert "htb 1: root" in tap_state(tap) and "ingress" in tap_state(tap)
        assert ifb in ifbs()
        # Read back from the tc state by the collector.
        snapshot = context(hv, {spec.name: {}}).snapshots[spec.name]
        assert snapshot.stats["net_inbound_average"] == NET_LIMIT_KIB
        assert snapshot.stats["net_outbound_average"] == NET_LIMIT_KIB
        limited_in = send_rate(bridge, guest_address, SOURCE_BYTES)
        limited_out = receive_rate(bridge, guest_address)

        lift = {"net_inbound_average": 0, "net_outbound_average": 0}
        assert NetTuneController(hv).apply(context(hv, {spec.name: lift})).failures == []
        assert "htb" not in tap_state(tap) and "ingress" not in tap_state(tap)
        assert ifb not in ifbs()
        assert all(v == 0 for v in hv.interface_bandwidth(spec.uuid, tap).values())

        # Limited again, then the guest goes: its ifb goes with it.
        hv.set_interface_bandwidth(spec.uuid, tap, {"outbound.average": NET_LIMIT_KIB})
        assert ifb in ifbs()
        hv.remove_guest(spec.uuid)
        assert ifb not in ifbs()
        with pytest.raises(HypervisorError):
            hv.interface_bandwidth(spec.uuid, tap)
        elapsed = time.monotonic() - started
    finally:
        hv.close()

    print(
        f"host->guest {free_in:.0f} KiB/s free, {limited_in:.0f} under {NET_LIMIT_KIB}; "
        f"guest->host {free_out:.0f} KiB/s free, {limited_out:.0f} under {NET_LIMIT_KIB}; "
        f"test {elapsed:.1f} s"
    )
    for free, limited in ((free_in, limited_in), (free_out, limited_out)):
        assert 0.3 * NET_LIMIT_KIB < limited < 1.2 * NET_LIMIT_KIB, (free, limited)
        assert free > 2 * NET_LIMIT_KIB, (free, limited)
