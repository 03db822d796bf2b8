"""``loadmaster agent``'s log as an operator reads it after an incident: each line stamped
in UTC with its offset (text, or JSON with ``--log-format json``), a line for what the
host did (a launch here) and a clean one for a stop on SIGTERM."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import httpx
from cli_helpers import ADMIN, LOADMASTER

from loadmaster.policy import shipped_policy_dir

STAMPED = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00 (INFO|WARNING|ERROR) \S")


def agent(*args: str) -> list[str]:
    return [
        LOADMASTER,
        "agent",
        "--hypervisor",
        "test:///default",
        "--policy-dir",
        str(shipped_policy_dir()),
        *args,
    ]


def env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("LOADMASTER_")}


def test_every_line_is_stamped_in_utc_and_the_run_starts_and_ends_with_one() -> None:
    ran = subprocess.run(
        agent("--host-name", "log-1", "--cycles", "2", "--interval", "0"),
        capture_output=True,
        text=True,
        env=env(),
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    lines = ran.stderr.splitlines()
    assert lines and all(STAMPED.match(line) for line in lines), ran.stderr
    assert "agent of host log-1 starting: hypervisor test:///default" in lines[0]
    assert lines[-1].endswith("agent of host log-1 stopped after 2 cycles")


def test_log_format_json_writes_one_object_a_line() -> None:
    ran = subprocess.run(
        agent("--host-name", "log-2", "--cycles", "1", "--interval", "0", "--log-format", "json"),
        capture_output=True,
        text=True,
        env=env(),
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    entries = [json.loads(line) for line in ran.stderr.splitlines()]
    assert all(e["time"].endswith("+00:00") and e["level"] for e in entries), entries
    assert any(e["message"].startswith("agent of host log-2 starting") for e in entries)


def test_a_launch_is_logged_and_sigterm_ends_the_agent_cleanly(server: str) -> None:
    api = httpx.Client(base_url=server, headers={"Authorization": f"Bearer {ADMIN}"})
    process = subprocess.Popen(
        agent("--url", server, "--token", ADMIN, "--host-name", "log-3", "--interval", "1"),
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
    )
    try:
        deadline = time.monotonic() + 60
        while api.get("/hosts/log-3/agent").status_code != 200:
            assert process.poll() is None and time.monotonic() < deadline, "never registered"
            time.sleep(0.1)
        flavor = {"name": "log-tiny", "resources": {"VCPU": 1, "MEMORY_MB": 256}}
        assert api.post("/flavors", json=flavor).status_code == 201
        vm = api.post("/vms", json={"name": "log-web", "flavor": "log-tiny"}).json()["uuid"]
        assert api.post(f"/vms/{vm}/start", json={"host": "log-3"}).status_code == 200
        while api.get(f"/vms/{vm}").json()["state"] != "running":
            assert process.poll() is None and time.monotonic() < deadline, "never launched"
            time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
        api.close()
    assert process.returncode == 0, stderr
    lines = stderr.splitlines()
    assert all(STAMPED.match(line) for line in lines), stderr
    assert [line for line in lines if f"launched VM log-web ({vm})" in line], stderr
    assert "agent of host log-3 stopped on SIGTERM" in lines[-1], stderr
    assert not [line for line in lines if "failed" in line or "closed" in line], stderr
