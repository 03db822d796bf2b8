"""The session's two real-QEMU hosts (see realvm_helpers)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from realvm_helpers import (
    ROOT,
    Launched,
    PrivateLibvirtd,
    RealHosts,
    require_system,
    share_capabilities_cache,
    start_daemon,
    start_network,
    stop_daemon,
    wait_ready,
)

from loadmaster.agent.hypervisor.libvirt import GuestImage
from loadmaster.agent.hypervisor.shaping import TapShaper


@pytest.fixture(scope="session")
def real_hosts() -> Iterator[RealHosts]:
    require_system()
    built = subprocess.run(
        ["bash", str(ROOT / "scripts/guest-image.sh")], capture_output=True, text=True
    )
    if built.returncode != 0:
        pytest.fail(f"building the guest image failed: {built.stderr}")
    image_dir = Path(built.stdout.strip())
    scratch = Path(tempfile.mkdtemp(prefix="lm-rv-"))
    (scratch / "serial").mkdir()
    image = GuestImage(
        kernel=image_dir / "vmlinuz", initrd=image_dir / "initrd.img", log_dir=scratch / "serial"
    )
    run_id = f"rv{os.getpid()}"
    daemons: list[PrivateLibvirtd] = []
    try:
        started = time.monotonic()
        for name in ("a", "b"):
            if daemons:
                # The first daemon's probe of the QEMU binary serves the second (libvirt
                # checks it is still valid): one ~8 s probe instead of two at once.
                share_capabilities_cache(daemons[0], scratch / name)
            daemons.append(start_daemon(name, run_id, scratch))
            wait_ready(daemons[-1], scratch)
            start_network(daemons[-1], run_id)
        print(f"two private libvirtd up in {time.monotonic() - started:.1f} s")
        yield RealHosts(daemons[0], daemons[1], image)
    finally:
        for daemon in daemons:
            stop_daemon(daemon)
        # The ifb devices of NICs shaped by a test that failed half way (their taps are
        # gone with the guests; another run's, whose taps exist, stay).
        TapShaper().sweep()
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.fixture
def launched(real_hosts: RealHosts) -> Iterator[Launched]:
    guests = Launched(real_hosts)
    yield guests
    guests.clean()
