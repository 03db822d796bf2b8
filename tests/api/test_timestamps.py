"""Every time the API returns or the server logs carries its zone (ISO 8601, UTC, with
its offset); Placement's own formats (its Last-Modified HTTP date) stay Placement's."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from loadmaster.api import create_app
from loadmaster.api.observability import JsonFormatter
from loadmaster.errors import ValidationError
from loadmaster.microversions import CLIENT_HEADERS
from loadmaster.pending import check_as_of

NODE = {"VCPU": {"total": 8}, "MEMORY_MB": {"total": 8192}}


def in_utc(text: str) -> datetime:
    """The time ``text`` names; it must say its zone, and the zone must be UTC."""
    parsed = datetime.fromisoformat(text)
    assert parsed.utcoffset() == timedelta(0), text
    assert text.endswith("+00:00"), text
    return parsed


def test_vm_and_agent_times_carry_their_offset(tmp_path: Path) -> None:
    app = create_app(f"sqlite:///{tmp_path / 'times.db'}", None)
    before = datetime.now(UTC) - timedelta(seconds=1)
    with TestClient(app) as client:
        assert client.put(
            "/hosts/h0/agent", json={"hypervisor_uri": "test:///h0", "inventories": NODE}
        ).is_success
        assert client.post("/flavors", json={"name": "small", "resources": {"VCPU": 1}}).is_success
        vm = client.post("/vms", json={"name": "vm-1", "flavor": "small"}).json()
        shown = client.get(f"/vms/{vm['uuid']}").json()
        listed = client.get("/vms").json()["vms"][0]
        agent = client.get("/hosts/h0/agent").json()
    after = datetime.now(UTC) + timedelta(seconds=1)
    for record in (vm, shown, listed):
        for key in ("created_at", "updated_at"):
            assert before <= in_utc(record[key]) <= after
    assert before <= in_utc(agent["last_seen_at"]) <= after


def test_placement_keeps_its_http_date(tmp_path: Path) -> None:
    app = create_app(f"sqlite:///{tmp_path / 'times.db'}", None)
    with TestClient(app) as client:
        answer = client.get(
            "/resource_providers",
            headers={**CLIENT_HEADERS, "OpenStack-API-Version": "placement 1.15"},
        )
    assert answer.headers["last-modified"].endswith(" GMT")


def test_a_refused_as_of_names_both_times_with_their_offset() -> None:
    with pytest.raises(
        ValidationError, match=r"as_of 2000-01-01T00:00:00\+00:00 is more than"
    ) as info:
        check_as_of(datetime(2000, 1, 1, tzinfo=UTC))
    assert "server's clock (20" in str(info.value) and "+00:00)" in str(info.value)


def test_log_lines_carry_their_offset() -> None:
    record = logging.LogRecord("loadmaster", logging.INFO, __file__, 1, "hello", None, None)
    line = json.loads(JsonFormatter().format(record))
    assert in_utc(line["time"]) == datetime.fromtimestamp(int(record.created), UTC)


def test_the_demo_log_file_writes_times_with_their_zone() -> None:
    from loadmaster.logs import UtcFormatter

    record = logging.LogRecord("loadmaster.agent", logging.INFO, __file__, 1, "up", None, None)
    line = UtcFormatter("%(asctime)s %(name)s %(message)s").format(record)
    stamp, rest = line.split(" ", 1)
    assert rest == "loadmaster.agent up"
    assert abs(in_utc(stamp) - datetime.fromtimestamp(record.created, UTC)) < timedelta(
        milliseconds=1
    )
