"""Two hosts with real QEMU guests on one machine: two private libvirtd instances with the
QEMU driver (scripts/private-libvirtd.sh: own mount and cgroup namespaces, sockets, state,
virtlogd), and the tiny guest image (scripts/guest-image.sh). Started once per test
session and torn down at its end; guests are TCG (nested KVM does not work on these
machines) and boot in about two seconds.

Needs root and the packages ``scripts/setup.sh full`` installs; without them the tests fail
rather than skip, so CI cannot go green without having run a real guest.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid as uuidlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import libvirt
import pytest

from loadmaster.agent.hypervisor.base import GuestInfo, GuestSpec, HypervisorError
from loadmaster.agent.hypervisor.libvirt import GuestImage, LibvirtHypervisor
from loadmaster.agent.hypervisor.storage import StorageConfig

ROOT = Path(__file__).resolve().parents[2]
# The first start of a libvirtd probes the QEMU binary's capabilities (~8 s on 2 cores).
DAEMON_START_S = 90.0
# Each daemon gets its own range of incoming migration (and disk copy) ports, below the
# kernel's range for outgoing connections (32768-60999): inside it, the local ends of
# other tests' connections (and their TIME_WAIT) took all 16 ports once, and QEMU found
# none to listen on ("Failed to find an available port"). The ranges of a test process
# are a block held for its whole life (``migration_port_min``), so two test runs on one
# machine never share one either.
PORTS_PER_DAEMON = 20
DAEMON_NAMES = ("a", "b", "c")
PORT_BLOCKS = range(31300, 32768 - len(DAEMON_NAMES) * PORTS_PER_DAEMON, 100)
_held_block: list[tuple[int, IO[bytes]]] = []
# Where the destination QEMU listens for a migration: both "hosts" are this machine.
MIGRATION_URI = "tcp://127.0.0.1"
AGENT_FIXTURES = ROOT / "tests" / "agent" / "fixtures"
# Every host has it (start_network).
NETWORK = "default"
# Where a host's storage pool is as its private libvirtd sees it (its /var/lib/libvirt is
# BASE/lib on the machine).
POOL_DIR = Path("/var/lib/libvirt/images/loadmaster")
# Free 10 % of the host: under the shipped 20 % pressure threshold, above the 5 % critical.
UNDER_PRESSURE = (
    "MemTotal: 32768000 kB\nMemFree: 3276800 kB\nBuffers: 0 kB\nCached: 0 kB\n"
    "AnonPages: 29000000 kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n"
)

libvirt.registerErrorHandler(lambda _ctx, _err: None, None)


@dataclass(frozen=True)
class PrivateLibvirtd:
    name: str
    base: Path
    uri: str
    process: subprocess.Popen[bytes]

    @property
    def log(self) -> Path:
        return self.base / "log" / "libvirtd.log"


@dataclass(frozen=True)
class RealHosts:
    a: PrivateLibvirtd
    b: PrivateLibvirtd
    image: GuestImage

    def hypervisor(self, daemon: PrivateLibvirtd, **kwargs: object) -> LibvirtHypervisor:
        options: dict[str, object] = {"guest_image": self.image, "migration_uri": MIGRATION_URI}
        options.update(kwargs)
        return LibvirtHypervisor(daemon.uri, **options)  # type: ignore[arg-type]

    @property
    def images(self) -> Path:
        """The disk images (busybox.qcow2) built with the guest image."""
        return self.image.kernel.parent / "images"

    def storage(self, pool_dir: Path = POOL_DIR, shared: str | None = None) -> StorageConfig:
        """A host's storage: its pool at ``pool_dir``, its disk images ``images``."""
        return StorageConfig(pool_dir=pool_dir, image_dir=self.images, shared=shared)


def fixture_sys(where: Path) -> Path:
    """A /sys for the agent's KSM writes: never the machine's own."""
    return Path(shutil.copytree(AGENT_FIXTURES / "sys", where))


def pressured_proc(where: Path) -> Path:
    """A /proc whose meminfo puts the host under memory pressure (the machine's own is not):
    the policy then reclaims memory from the real guests' balloons."""
    proc = Path(shutil.copytree(AGENT_FIXTURES / "proc", where))
    (proc / "meminfo").write_text(UNDER_PRESSURE)
    return proc


def require_system() -> None:
    if os.geteuid() != 0:
        pytest.fail("the real-guest tests need root (a privileged libvirtd with cgroups)")
    missing = [
        tool
        for tool in ("libvirtd", "virtlogd", "qemu-system-x86_64", "unshare", "cpio")
        if shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None
    ]
    if missing:
        pytest.fail(f"missing {missing}: run scripts/setup.sh full (as root)")


def migration_port_min(name: str) -> int:
    """The first of the 16 incoming migration ports of daemon ``name`` (a, b or c): in a
    block this process reserved, the first time it asked, under a lock file that other
    processes find held (released when this process ends), and not in use when chosen."""
    if not _held_block:
        for base in PORT_BLOCKS:
            lock = Path(tempfile.gettempdir()) / f"loadmaster-realvm-ports-{base}.lock"
            held = lock.open("wb")
            try:
                fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held.close()
                continue
            if all(
                _free(port) for port in range(base, base + PORTS_PER_DAEMON * len(DAEMON_NAMES))
            ):
                _held_block.append((base, held))
                break
            held.close()
        else:
            pytest.fail(f"no free block of migration ports in {PORT_BLOCKS}")
    return _held_block[0][0] + PORTS_PER_DAEMON * DAEMON_NAMES.index(name)


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def start_daemon(name: str, run_id: str, scratch: Path) -> PrivateLibvirtd:
    base = scratch / name
    # Unix socket paths are limited to 108 bytes: the scratch directory is short.
    sock = scratch / f"{name}-sock"
    log = (scratch / f"{name}.out").open("wb")
    process = subprocess.Popen(
        [
            "bash",
            str(ROOT / "scripts/private-libvirtd.sh"),
            f"{run_id}-{name}",
            str(base),
            str(sock),
            str(migration_port_min(name)),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        # Its own process group: a Ctrl-C of pytest does not kill it before the teardown.
        start_new_session=True,
    )
    log.close()
    return PrivateLibvirtd(name, base, f"qemu+unix:///system?socket={sock}/libvirt-sock", process)


def wait_ready(daemon: PrivateLibvirtd, scratch: Path) -> None:
    deadline = time.monotonic() + DAEMON_START_S
    while True:
        if daemon.process.poll() is not None:
            out = (scratch / f"{daemon.name}.out").read_text(errors="replace")
            pytest.fail(f"private libvirtd {daemon.name} exited: {out[-2000:]}")
        try:
            conn = libvirt.open(daemon.uri)
            # The first call that needs the QEMU capabilities: it waits for the probe.
            conn.getCapabilities()
            conn.close()
            return
        except libvirt.libvirtError:
            if time.monotonic() > deadline:
                pytest.fail(f"private libvirtd {daemon.name} did not come up")
            time.sleep(0.1)


def start_network(daemon: PrivateLibvirtd, run_id: str) -> None:
    """The host's network ``default``, which VMs' NICs join unless they name another:
    isolated (a bridge without an address, so nothing for dnsmasq to serve). Its bridge is
    on the machine itself, so it is named after the run and the daemon."""
    conn = libvirt.open(daemon.uri)
    try:
        try:
            net = conn.networkLookupByName("default")  # a daemon restarted on its state
        except libvirt.libvirtError:
            bridge = f"lm{run_id}{daemon.name}"[:15]
            net = conn.networkDefineXML(
                "<network><name>default</name>"
                f"<bridge name='{bridge}' stp='off' delay='0'/></network>"
            )
        if not net.isActive():
            net.create()
    finally:
        conn.close()


def stop_daemon(daemon: PrivateLibvirtd) -> None:
    """Guests destroyed through libvirt (which removes their cgroups), its networks (their
    bridges and firewall rules are the machine's), then the daemons this fixture started,
    by pid, then the cgroups the launcher made."""
    with contextlib.suppress(libvirt.libvirtError):
        conn = libvirt.open(daemon.uri)
        for dom in conn.listAllDomains():
            with contextlib.suppress(libvirt.libvirtError):
                if dom.isActive():
                    dom.destroy()
        for net in conn.listAllNetworks():
            with contextlib.suppress(libvirt.libvirtError):
                if net.isActive():
                    net.destroy()
        conn.close()
    daemon.process.terminate()
    try:
        daemon.process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        daemon.process.kill()
        daemon.process.wait()
    # A guest libvirt could not stop (a crashed test run), and virtlogd.
    for pid_file in [*daemon.base.glob("run/qemu/*.pid"), daemon.base / "run/virtlogd.pid"]:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)
    time.sleep(0.2)
    cgroups = daemon.base / "cgroups"
    if cgroups.exists():
        for top in cgroups.read_text().split():
            for path, _dirs, _files in sorted(os.walk(top), key=lambda w: -len(w[0])):
                with contextlib.suppress(OSError):
                    os.rmdir(path)


def share_capabilities_cache(probed: PrivateLibvirtd, base: Path) -> None:
    """Copies a running daemon's QEMU capabilities cache into the base directory of one
    not yet started."""
    cache = probed.base / "cache" / "qemu" / "capabilities"
    if cache.is_dir():
        shutil.copytree(cache, base / "cache" / "qemu" / "capabilities", dirs_exist_ok=True)


# -- guests --------------------------------------------------------------------------

MIB = 1024  # KiB
BOOT_S = 60.0
BALLOON_S = 30.0
STOP_S = 30.0


def wait_for(what: str, check: Callable[[], bool], timeout: float) -> float:
    """Seconds until ``check()`` holds; fails the test naming ``what`` after ``timeout``."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            pytest.fail(f"{what}: not after {timeout:.0f} s")
        time.sleep(0.1)
    return time.monotonic() - started


def new_spec(memory_mib: int, *tags: str) -> GuestSpec:
    uuid = str(uuidlib.uuid4())
    return GuestSpec(uuid, f"rv-{uuid[:8]}", memory_mib * MIB, 1, frozenset(tags))


def serial(hosts: RealHosts, spec: GuestSpec) -> str:
    assert hosts.image.log_dir is not None
    path = hosts.image.log_dir / f"{spec.name}.serial"
    return path.read_text(errors="replace") if path.exists() else ""


def booted(hosts: RealHosts, spec: GuestSpec) -> float:
    return wait_for(f"{spec.name} booting", lambda: "lm-guest: up" in serial(hosts, spec), BOOT_S)


def running(hv: LibvirtHypervisor) -> dict[str, GuestInfo]:
    return {g.uuid: g for g in hv.list_guests()}


def defined(daemon: PrivateLibvirtd, uuid: str) -> bool:
    conn = libvirt.open(daemon.uri)
    try:
        conn.lookupByUUIDString(uuid)
        return True
    except libvirt.libvirtError as exc:
        assert exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN, exc
        return False
    finally:
        conn.close()


def actual_balloon(hv: LibvirtHypervisor, uuid: str) -> int:
    return int(hv.memory_stats(uuid).get("actual", -1))


def settled(hv: LibvirtHypervisor, uuid: str) -> bool:
    """The balloon the policy reads (info) agrees with the one QEMU reports."""
    return hv.balloon_info(uuid).current == hv.memory_stats(uuid).get("actual")


class Launched:
    """Launches guests and removes them from both hosts after the test."""

    def __init__(self, hosts: RealHosts) -> None:
        self.hosts = hosts
        self.uuids: list[str] = []

    def launch(self, hv: LibvirtHypervisor, spec: GuestSpec) -> float:
        """Seconds from the launch call until the guest's init runs."""
        self.uuids.append(spec.uuid)
        started = time.monotonic()
        hv.launch_guest(spec)
        booted(self.hosts, spec)
        return time.monotonic() - started

    def clean(self) -> None:
        # In parallel: stopping a QEMU takes libvirt a second or two, mostly waiting.
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(
                pool.map(
                    lambda job: self._remove(*job),
                    [(d, u) for d in (self.hosts.a, self.hosts.b) for u in self.uuids],
                )
            )

    def _remove(self, daemon: PrivateLibvirtd, uuid: str) -> None:
        hv = self.hosts.hypervisor(daemon)
        try:
            with contextlib.suppress(HypervisorError):
                hv.remove_guest(uuid)
        finally:
            hv.close()
