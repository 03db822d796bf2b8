"""NIC limits where the kernel cannot take libvirt's (agent/hypervisor/shaping.py), without QEMU: the
once-per-host probe choosing tc or libvirt, the tc shaping of a tap on libvirt's test
driver (its guests' interfaces stand for taps), nothing half-made when a command fails,
ifb devices of gone taps swept, and IO limits on the guest's real disk targets.

``FakeTc`` stands for tc and ip on a kernel like these machines' (htb, ingress, u32,
mirred, ifb; no sfq, fw or police unless told): it keeps each device's qdiscs, class and
redirect, lists devices as sysfs does under a scratch directory, and prints what tc
prints for what the shaper reads. The real commands are run by tests/realvm.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import libvirt
import pytest
from agent_helpers import NODE_XML

from loadmaster.agent.hypervisor.base import NET_KEYS, HypervisorError
from loadmaster.agent.hypervisor.libvirt import METADATA_NS, LibvirtHypervisor
from loadmaster.agent.hypervisor.shaping import (
    IFB_PREFIX,
    PROBE_PREFIX,
    ShapingError,
    TapShaper,
    htb_args,
    libvirt_can_shape,
    parse_rate,
    parse_size,
)
from loadmaster.agent.sla.collectors.io import GuestIoCollector
from loadmaster.agent.sla.collectors.net import GuestNetCollector

KIB = 1024


@dataclass
class Dev:
    root_htb: bool = False
    htb_class: str | None = None
    ingress: bool = False
    redirect: str | None = None


@dataclass
class FakeTc:
    sys_net: Path
    libvirt_modules: bool = False
    fail: Callable[[Sequence[str]], bool] = lambda _argv: False
    commands: list[str] = field(default_factory=list)
    devs: dict[str, Dev] = field(default_factory=dict)
    next_index: int = 40

    def add_link(self, name: str) -> None:
        (self.sys_net / name).mkdir(parents=True)
        (self.sys_net / name / "ifindex").write_text(f"{self.next_index}\n")
        self.next_index += 1
        self.devs[name] = Dev()

    def del_link(self, name: str) -> None:
        shutil.rmtree(self.sys_net / name)
        del self.devs[name]

    def changes(self) -> list[str]:
        return [c for c in self.commands if " show " not in c]

    def __call__(self, argv: Sequence[str]) -> str:
        line = " ".join(argv)
        self.commands.append(line)
        if self.fail(argv):
            raise ShapingError(f"{line}: injected failure")
        words = list(argv)
        if words[:2] == ["ip", "link"]:
            return self._ip(words[2:], line)
        if words[0] != "tc":
            raise AssertionError(line)
        words = [w for w in words[1:] if w not in ("-j", "-iec")]
        dev = self.devs.get(words[words.index("dev") + 1])
        if dev is None:
            raise ShapingError(f"{line}: Cannot find device")
        if not self.libvirt_modules and ("sfq" in words or "fw" in words or "police" in words):
            raise ShapingError(f"{line}: Error: Specified qdisc kind is unknown.")
        return self._tc(words, dev, line)

    def _ip(self, words: list[str], line: str) -> str:
        if words[0] == "add":
            if (self.sys_net / words[1]).exists():
                raise ShapingError(f"{line}: File exists")
            self.add_link(words[1])
        elif words[0] == "del":
            self.del_link(words[1])
        elif words[3] == "alias":
            (self.sys_net / words[2] / "ifalias").write_text(words[4] + "\n")
        return ""

    def _tc(self, words: list[str], dev: Dev, line: str) -> str:
        what, verb = words[0], words[1]
        if verb == "show":
            return self._show(what, dev)
        if what == "qdisc" and "ingress" in words:
            if verb == "del":
                dev.ingress, dev.redirect = False, None
            elif dev.ingress:
                raise ShapingError(f"{line}: Exclusivity flag on, cannot modify")
            else:
                dev.ingress = True
        elif what == "qdisc" and "root" in words:
            dev.root_htb = verb != "del"
            dev.htb_class = None
        elif what == "class":
            rate = words[words.index("rate") + 1]
            ceil = words[words.index("ceil") + 1] if "ceil" in words else rate
            burst = f"{words[words.index('burst') + 1][:-2]}Kb" if "burst" in words else "1599b"
            dev.htb_class = f"class htb 1:1 root prio 0 rate {rate} ceil {ceil} burst {burst}"
        elif what == "filter" and "redirect" in words:
            dev.redirect = words[-1]
        return ""

    def _show(self, what: str, dev: Dev) -> str:
        if what == "qdisc":
            qdiscs = [{"kind": "htb" if dev.root_htb else "noqueue", "root": True}]
            return json.dumps(qdiscs + ([{"kind": "ingress"}] if dev.ingress else []))
        if what == "class":
            return (dev.htb_class or "") + " cburst 1599b\n"
        action = {"kind": "mirred", "to_dev": dev.redirect}
        return json.dumps([{"options": {"actions": [action]}}] if dev.redirect else [])


@pytest.fixture
def fake_tc(tmp_path: Path) -> FakeTc:
    tc = FakeTc(tmp_path / "net")
    for tap in ("testnet0", "testnet1"):
        tc.add_link(tap)
    return tc


@pytest.fixture
def shaped_hv(fake_tc: FakeTc, sys_dir: Path) -> LibvirtHypervisor:
    return LibvirtHypervisor(
        f"test://{NODE_XML}", sys_root=sys_dir, tap_shaper=TapShaper(fake_tc, fake_tc.sys_net)
    )


def gold(hv: LibvirtHypervisor) -> str:
    return next(g.uuid for g in hv.list_guests() if g.name == "db-gold")


# -- the probe ------------------------------------------------------------------------


def test_probe_finds_libvirt_limits_missing_and_leaves_no_scratch_device(
    fake_tc: FakeTc,
) -> None:
    assert libvirt_can_shape(fake_tc) is False
    assert any("sfq" in c for c in fake_tc.commands)
    assert not list(fake_tc.sys_net.glob(f"{PROBE_PREFIX}*"))


def test_probe_finds_libvirt_limits_where_the_kernel_has_them(fake_tc: FakeTc) -> None:
    fake_tc.libvirt_modules = True
    assert libvirt_can_shape(fake_tc) is True
    assert any("police" in c for c in fake_tc.commands)  # every module libvirt needs, tried
    assert not list(fake_tc.sys_net.glob(f"{PROBE_PREFIX}*"))


def test_probe_that_cannot_make_its_device_leaves_limits_to_libvirt(fake_tc: FakeTc) -> None:
    fake_tc.fail = lambda argv: list(argv[:3]) == ["ip", "link", "add"]
    assert libvirt_can_shape(fake_tc) is True


def test_libvirt_limits_are_used_where_the_kernel_takes_them(
    fake_tc: FakeTc, shaped_hv: LibvirtHypervisor
) -> None:
    fake_tc.libvirt_modules = True
    uuid = gold(shaped_hv)
    shaped_hv.set_interface_bandwidth(uuid, "testnet0", {"inbound.average": 300})
    assert shaped_hv.interface_bandwidth(uuid, "testnet0")["inbound.average"] == 300
    # Only the probe ran commands, once.
    assert [c for c in fake_tc.changes() if PROBE_PREFIX not in c] == []
    shaped_hv.interface_bandwidth(uuid, "testnet1")
    assert sum(c.startswith("ip link add") for c in fake_tc.commands) == 1


# -- shaping by tc ----------------------------------------------------------------------


def test_limits_go_to_tc_and_are_read_back_from_it(
    fake_tc: FakeTc, shaped_hv: LibvirtHypervisor
) -> None:
    uuid = gold(shaped_hv)
    limits = {
        "inbound.average": 256,
        "inbound.peak": 512,
        "inbound.burst": 64,
        "outbound.average": 128,
        "outbound.peak": 0,
        "outbound.burst": 0,
    }
    shaped_hv.set_interface_bandwidth(uuid, "testnet1", limits)
    assert shaped_hv.interface_bandwidth(uuid, "testnet1") == limits
    assert shaped_hv.interface_bandwidth(uuid, "testnet0") == dict.fromkeys(NET_KEYS, 0)
    # libvirt was never asked: its own parameters are untouched.
    dom = shaped_hv._domain(uuid)
    assert dom.interfaceParameters("testnet1", 0)["inbound.average"] == 0
    ifb = f"{IFB_PREFIX}41"  # testnet1's ifindex
    assert fake_tc.devs["testnet1"].redirect == ifb
    assert (fake_tc.sys_net / ifb / "ifalias").read_text().strip() == "testnet1"

    # The collector reports the tc state, whoever changed it.
    fake_tc.devs[ifb].htb_class = fake_tc.devs[ifb].htb_class.replace("1024Kibit", "2048Kibit")  # type: ignore[union-attr]
    [guest] = [g for g in shaped_hv.list_guests() if g.uuid == uuid]
    stats, properties = GuestNetCollector(shaped_hv).collect(guest)
    assert properties["net_bandwidth"]["testnet1"]["outbound.average"] == 256
    assert stats["net_inbound_average"] == 0  # the first interface, testnet0

    # A changed limit changes the class in place; an average of 0 removes the direction.
    shaped_hv.set_interface_bandwidth(uuid, "testnet1", {"inbound.average": 512})
    assert shaped_hv.interface_bandwidth(uuid, "testnet1")["inbound.average"] == 512
    assert any(c.startswith("tc class change dev testnet1") for c in fake_tc.commands)
    shaped_hv.set_interface_bandwidth(
        uuid, "testnet1", {"outbound.average": 0, "outbound.peak": 0, "outbound.burst": 0}
    )
    assert fake_tc.devs["testnet1"].ingress is False and ifb not in fake_tc.devs
    shaped_hv.set_interface_bandwidth(uuid, "testnet1", {"inbound.average": 0})
    assert fake_tc.devs["testnet1"] == Dev()


def test_only_the_guests_own_interfaces_and_libvirts_parameters(
    fake_tc: FakeTc, shaped_hv: LibvirtHypervisor
) -> None:
    uuid = gold(shaped_hv)
    fake_tc.add_link("eth0")  # the host's own NIC: not the guest's to shape
    for interface, limits, reason in (
        ("eth0", {"inbound.average": 1}, "the guest has no interface 'eth0'"),
        ("testnet0", {"inbound.floor": 1}, r"unknown parameters \['inbound.floor'\]"),
    ):
        with pytest.raises(HypervisorError, match=reason):
            shaped_hv.set_interface_bandwidth(uuid, interface, limits)
    with pytest.raises(HypervisorError, match="no interface 'eth0'"):
        shaped_hv.interface_bandwidth(uuid, "eth0")
    assert [c for c in fake_tc.changes() if PROBE_PREFIX not in c] == []


@pytest.mark.parametrize(
    ("failing", "direction"),
    [
        ("tc class add dev lmifb", "outbound"),
        ("tc filter add dev testnet0", "outbound"),
        ("ip link set dev lmifb40 up", "outbound"),
        ("tc class add dev testnet0", "inbound"),
    ],
)
def test_a_failed_change_leaves_no_half_made_shaping(
    fake_tc: FakeTc, shaped_hv: LibvirtHypervisor, failing: str, direction: str
) -> None:
    uuid = gold(shaped_hv)
    other = "inbound" if direction == "outbound" else "outbound"
    shaped_hv.set_interface_bandwidth(uuid, "testnet0", {f"{other}.average": 100})
    fake_tc.fail = lambda argv: " ".join(argv).startswith(failing)
    with pytest.raises(HypervisorError, match="injected failure"):
        shaped_hv.set_interface_bandwidth(uuid, "testnet0", {f"{direction}.average": 200})
    fake_tc.fail = lambda _argv: False
    tap = fake_tc.devs["testnet0"]
    if direction == "outbound":
        assert not tap.ingress and tap.redirect is None
        assert not list(fake_tc.sys_net.glob(f"{IFB_PREFIX}*"))
    else:
        assert not tap.root_htb and tap.htb_class is None
    # The other direction is as it was, and the read-back says what is in force.
    got = shaped_hv.interface_bandwidth(uuid, "testnet0")
    assert (got[f"{direction}.average"], got[f"{other}.average"]) == (0, 100)


def test_a_half_made_shaping_by_libvirt_is_replaced(
    fake_tc: FakeTc, shaped_hv: LibvirtHypervisor
) -> None:
    # What libvirt's failed call leaves: an htb root without its class, an ingress.
    fake_tc.devs["testnet0"] = Dev(root_htb=True, ingress=True)
    uuid = gold(shaped_hv)
    assert shaped_hv.interface_bandwidth(uuid, "testnet0") == dict.fromkeys(NET_KEYS, 0)
    shaped_hv.set_interface_bandwidth(
        uuid, "testnet0", {"inbound.average": 64, "outbound.average": 32}
    )
    got = shaped_hv.interface_bandwidth(uuid, "testnet0")
    assert (got["inbound.average"], got["outbound.average"]) == (64, 32)


def test_ifb_of_a_gone_tap_is_swept(fake_tc: FakeTc, shaped_hv: LibvirtHypervisor) -> None:
    uuid = gold(shaped_hv)
    for tap in ("testnet0", "testnet1"):
        shaped_hv.set_interface_bandwidth(uuid, tap, {"outbound.average": 100})
    fake_tc.del_link("testnet0")  # its guest went away: the tap with it
    fake_tc.add_link("testnet0")  # a new tap of that name: another device
    shaped_hv.list_guests()
    assert sorted(p.name for p in fake_tc.sys_net.glob(f"{IFB_PREFIX}*")) == [f"{IFB_PREFIX}41"]
    shaped_hv.remove_guest(uuid)
    fake_tc.del_link("testnet1")
    shaped_hv.list_guests()
    assert not list(fake_tc.sys_net.glob(f"{IFB_PREFIX}*"))


def test_tc_units_round_trip() -> None:
    for kib in (1, 256, 768, 12_800, 25_600, 10**7):
        limits = {"average": kib, "peak": 0, "burst": 0}
        assert parse_rate(htb_args(limits)[1]) == kib * KIB
    assert parse_rate("2097Kbit") == 262_125  # tc without -iec rounds
    assert parse_rate("100Mibit") == 100 * 1024 * 1024 // 8
    assert parse_size("10Kb") == 10 * KIB and parse_size("1Mb") == KIB * KIB
    assert parse_size("1599b") is None  # htb's own burst: none given
    with pytest.raises(ShapingError, match="unexpected rate"):
        parse_rate("fast")


def test_a_flavors_nic_quota_is_shaped_by_tc_when_the_guest_is_first_seen(
    fake_tc: FakeTc, shaped_hv: LibvirtHypervisor
) -> None:
    """The quota a launch wrote in the guest's metadata, applied by an agent that had not
    seen the guest run (after a migration in, or its own restart) to each of its taps."""
    dom = shaped_hv._conn.lookupByName("db-gold")
    meta = "<vm><nic-limit inbound.average='256' inbound.burst='64' outbound.average='128'/></vm>"
    dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, meta, "lm", METADATA_NS, 0)
    uuid = gold(shaped_hv)
    want = {**dict.fromkeys(NET_KEYS, 0), "inbound.average": 256, "inbound.burst": 64}
    want["outbound.average"] = 128
    for tap in ("testnet0", "testnet1"):
        assert fake_tc.devs[tap].root_htb and fake_tc.devs[tap].redirect
        assert shaped_hv.interface_bandwidth(uuid, tap) == want
    # Applied once: a later look at the guests leaves the shaping alone.
    changes = len(fake_tc.changes())
    shaped_hv.list_guests()
    assert len(fake_tc.changes()) == changes


# -- IO limits on the real disk ----------------------------------------------------------


def test_io_limits_follow_the_guests_real_disks(node_hv: LibvirtHypervisor) -> None:
    """An ``io-limit`` naming a disk by its file applies to its target; one naming a disk
    the guest lacks is no limit (a call on it would fail every cycle)."""
    guest = next(g for g in node_hv.list_guests() if g.name == "db-gold")
    dom = node_hv._domain(guest.uuid)
    assert "/var/lib/images/db-gold-vdb.qcow2" in dom.XMLDesc(0)
    meta = (
        "<vm><io-limit dev='/var/lib/images/db-gold-vdb.qcow2' total_bytes_sec='1048576'/>"
        "<io-limit dev='vdz' total_iops_sec='5'/></vm>"
    )
    dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, meta, "lm", METADATA_NS, 0)
    guest = next(g for g in node_hv.list_guests() if g.name == "db-gold")
    assert set(guest.io_limits) == {"vdb"}
    node_hv.set_io_tune(guest.uuid, "vdb", {"total_bytes_sec": 1_048_576})
    _stats, properties = GuestIoCollector(node_hv).collect(guest)
    [entry] = properties["io_tune"]
    assert entry["name"] == "vdb" and entry["current"]["total_bytes_sec"] == 1_048_576
