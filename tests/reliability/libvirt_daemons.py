"""Private ``libvirtd`` instances serving libvirt's test driver, one per simulated host.

Each has its own socket and config in a temporary directory and no other driver loaded;
an agent reaches it as ``test+unix:///default?socket=...``. The guests' state lives in
the daemon and outlives every agent a test kills. Whoever uses one must keep a
connection open for as long as the guests matter: the daemon frees the shared default
host with its last connection.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import libvirt
import pytest

# Failed connection attempts while a daemon starts are expected, not worth printing.
libvirt.registerErrorHandler(lambda _ctx, _err: None, None)

START_TIMEOUT_S = 30.0


def libvirtd_binary() -> str:
    found = shutil.which("libvirtd") or shutil.which("libvirtd", path="/usr/sbin:/sbin")
    if found is None:
        pytest.fail("libvirtd is not installed (scripts/setup.sh installs libvirt-daemon)")
    return found


@contextmanager
def test_driver_daemon(workdir: Path) -> Iterator[str]:
    """A private libvirtd serving the test driver, its files under ``workdir`` (created);
    yields its URI for the agent. Killed on exit."""
    workdir.mkdir(parents=True, exist_ok=True)
    # Unix socket paths are limited to 108 bytes; workdir can be longer.
    sock_dir = Path(tempfile.mkdtemp(prefix="lm-libvirt-"))
    drivers = workdir / "no-drivers"
    drivers.mkdir()
    config = workdir / "libvirtd.conf"
    config.write_text(
        f'unix_sock_dir = "{sock_dir}"\nunix_sock_rw_perms = "0700"\n'
        'auth_unix_rw = "none"\nauth_unix_ro = "none"\n'
    )
    env = {
        **os.environ,
        # No stateful driver (qemu, network, ...): the test driver is all this daemon serves.
        "LIBVIRT_DRIVER_DIR": str(drivers),
        # Where libvirtd keeps its files when not run as root.
        "XDG_RUNTIME_DIR": str(sock_dir),
        "XDG_CONFIG_HOME": str(workdir / "config"),
        "XDG_CACHE_HOME": str(workdir / "cache"),
    }
    log_path = workdir / "libvirtd.log"
    log = log_path.open("wb")
    # --timeout: a daemon left behind by a killed test run exits once idle.
    daemon = subprocess.Popen(
        [libvirtd_binary(), "-f", str(config), "-p", str(workdir / "libvirtd.pid"), "-t", "60"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    uri = f"test+unix:///default?socket={sock_dir}/libvirt-sock"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert daemon.poll() is None, log_path.read_text()
            try:
                libvirt.open(uri).close()
                break
            except libvirt.libvirtError:
                assert time.monotonic() < deadline, "libvirtd did not come up"
                time.sleep(0.05)
        yield uri
    finally:
        # Nothing in this daemon is worth a clean shutdown.
        daemon.kill()
        daemon.wait()
        log.close()
        shutil.rmtree(sock_dir, ignore_errors=True)


test_driver_daemon.__test__ = False  # type: ignore[attr-defined]  # not a test, for pytest
