"""Registration checks everything before it writes anything: a refused child leaves its
host as it was, a new child is named under its host, and a bulk request names a refused
field under the host that holds it."""

from __future__ import annotations

from api_helpers import Live, ok, table_rows

NODE = {"VCPU": {"total": 8}, "MEMORY_MB": {"total": 8192}}
BIGGER = {"VCPU": {"total": 16}, "MEMORY_MB": {"total": 8192}, "CUSTOM_NEW": {"total": 1}}


def _register(live: Live, host: str, **body: object) -> object:
    return live.admin.put(
        f"/hosts/{host}/agent", json={"hypervisor_uri": f"test:///{host}", **body}
    )


def test_a_child_named_as_another_host_leaves_the_host_as_it_was(live: Live) -> None:
    ok(_register(live, "h0", inventories=NODE))
    ok(_register(live, "h1", inventories=NODE, children={"h1_numa0": NODE}))
    before = table_rows(live.lm)
    for taken, owner in (("h1", "a root host"), ("h1_numa0", "a child of another host")):
        refused = _register(live, "h0", inventories=BIGGER, children={taken: NODE})
        assert refused.status_code == 409, refused.text
        assert refused.json()["field"] == f"children.{taken}"
        assert owner in refused.json()["detail"]
        # Neither h0's VCPU total, nor its agent's last word, nor a new class: nothing.
        assert table_rows(live.lm) == before
    assert live.lm.hosts.get("h0").inventories["VCPU"].total == 8


def test_a_new_child_is_named_under_its_host(live: Live) -> None:
    before = table_rows(live.lm)
    for name in ("h2", "h0", "h0_", "h0-numa0", "h00_numa0"):
        refused = _register(live, "h0", inventories=BIGGER, children={name: NODE})
        assert refused.status_code == 400, (name, refused.text)
        assert refused.json()["field"] == f"children.{name}"
        assert "h0_numa0" in refused.json()["detail"]
    assert table_rows(live.lm) == before  # h0 was not created either
    made = ok(_register(live, "h0", inventories=NODE, children={"h0_numa0": NODE}))
    child = ok(live.admin.get("/hosts/h0_numa0"))
    assert child["parent_provider_uuid"] == made["host"]["uuid"]


def test_a_child_made_before_the_rule_stays_its_hosts(live: Live) -> None:
    ok(_register(live, "h0", inventories=NODE))
    live.lm.hosts.create("h0-numa0", parent="h0")
    ok(_register(live, "h0", inventories=NODE, children={"h0-numa0": NODE}))
    assert live.lm.hosts.get("h0-numa0").inventories["VCPU"].total == 8


def test_bulk_hosts_names_a_refused_field_under_its_host(live: Live) -> None:
    before = table_rows(live.lm)
    hosts = [
        {"name": "b0", "inventories": NODE},
        {"name": "b1", "inventories": {"CUSTOM_NOPE": {"total": 1}}},
    ]
    refused = live.admin.post("/bulk/hosts", json={"hosts": hosts})
    assert refused.status_code == 404, refused.text
    assert refused.json()["field"] == "hosts[1].inventories.CUSTOM_NOPE"
    assert refused.json()["detail"].startswith("hosts[1].inventories.CUSTOM_NOPE")
    hosts[1] = {"name": "b1", "traits": ["CUSTOM_NO_SUCH_TRAIT"]}
    refused = live.admin.post("/bulk/hosts", json={"hosts": hosts})
    assert refused.status_code == 404, refused.text
    assert refused.json()["field"] == "hosts[1].traits"
    assert table_rows(live.lm) == before


def test_child_traits_over_http_and_a_device_gone_withdrawn(live: Live) -> None:
    """A device child comes with its traits; registered again without it, its inventory
    is withdrawn and the answer says so. Traits for a child not listed: 400, nothing."""
    vf = {"CUSTOM_PCI_8086_10ED": {"total": 4, "max_unit": 4}}
    made = ok(
        _register(
            live,
            "h0",
            inventories=NODE,
            children={"h0_0000:3B:00.0": vf},
            child_traits={"h0_0000:3B:00.0": ["COMPUTE_MANAGED_PCI_DEVICE", "CUSTOM_PHYSNET1"]},
        )
    )
    assert made["withdrawn"] == []
    assert live.lm.hosts.get("h0_0000:3B:00.0").traits == (
        "COMPUTE_MANAGED_PCI_DEVICE",
        "CUSTOM_PHYSNET1",
    )
    before = table_rows(live.lm)
    refused = _register(live, "h0", inventories=NODE, child_traits={"h0_numa0": ["CUSTOM_X"]})
    assert refused.status_code == 400, refused.text
    assert refused.json()["field"] == "child_traits.h0_numa0"
    assert table_rows(live.lm) == before
    gone = ok(_register(live, "h0", inventories=NODE))
    assert gone["withdrawn"] == ["h0_0000:3B:00.0"]
    assert live.lm.hosts.get("h0_0000:3B:00.0").inventories == {}
