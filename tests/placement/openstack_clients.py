"""OpenStack's own clients against a live ``loadmaster serve``: openstackclient with the
osc-placement plugin, and openstacksdk's placement proxy.

They are installed, pinned as loadmaster's ``openstack`` extra pins them (pyproject.toml),
into a throw-away virtual environment under the clone
(``.cache/openstack-clients-venv``), never into loadmaster's own, and driven by
``osc_driver.py`` running in it: all the osc commands of a batch in one process, and a
fixed walk through the SDK's placement calls. The clients authenticate as Keystone-less
deployments do (``admin_token``: a fixed endpoint and an ``X-Auth-Token``).
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".cache" / "openstack-clients-venv"
PINS = tuple(
    tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][
        "openstack"
    ]
)
DRIVER = Path(__file__).with_name("osc_driver.py")


def ensure_venv() -> Path:
    """The environment with the pinned clients; installed once (under a lock, as test
    workers may ask at once), reused after."""
    VENV.parent.mkdir(parents=True, exist_ok=True)
    stamp = VENV / ("." + "-".join(PINS))
    with (VENV.parent / "openstack-clients.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not stamp.exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
            pip = [str(VENV / "bin/pip"), "install", "-q", "--disable-pip-version-check"]
            subprocess.run([*pip, *PINS], check=True)
            stamp.touch()
    return VENV


def _drive(kind: str, payload: Any, url: str, token: str) -> Any:
    env = {**os.environ, "OS_AUTH_TYPE": "admin_token", "OS_ENDPOINT": url, "OS_TOKEN": token}
    done = subprocess.run(
        [str(ensure_venv() / "bin/python"), str(DRIVER), kind],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(f"osc_driver {kind} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def osc(url: str, token: str, *commands: list[str]) -> list[dict[str, Any]]:
    """Each command's exit code, stdout and stderr, run at microversion 1.39 unless the
    command names its own."""
    batch = [
        cmd if "--os-placement-api-version" in cmd else ["--os-placement-api-version", "1.39", *cmd]
        for cmd in commands
    ]
    results: list[dict[str, Any]] = _drive("osc", batch, url, token)
    return results


def sdk(url: str, token: str, ids: dict[str, str]) -> dict[str, Any]:
    """The SDK walk's steps by name: ``{"ok": True, "value": ...}`` or ``{"ok": False,
    "error": ...}``."""
    steps: dict[str, Any] = _drive("sdk", ids, url, token)
    return steps
