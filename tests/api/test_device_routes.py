"""What an agent says it gave a VM comes with its ``up``: checked first (a device the
claim does not hold, a malformed address: refused, the VM left pending), then shown by
``GET /vms/{uuid}/devices`` and ``GET /hosts/{host}/devices``."""

from __future__ import annotations

from api_helpers import Live, ok

VF = "CUSTOM_PCI_8086_10ED"
PF = "h0_0000:3B:00.0"


def test_up_with_devices_checked_then_shown(live: Live) -> None:
    ok(
        live.admin.put(
            "/hosts/h0/agent",
            json={
                "hypervisor_uri": "test:///h0",
                "inventories": {"VCPU": {"total": 8}},
                "children": {PF: {VF: {"total": 4}}, "h0_0000:3B:00.1": {VF: {"total": 4}}},
                "child_traits": {PF: ["COMPUTE_MANAGED_PCI_DEVICE"]},
            },
        )
    )
    ok(live.admin.post("/flavors", json={"name": "vf", "resources": {"VCPU": 1, VF: 1}}), 201)
    vm = ok(live.admin.post("/vms", json={"name": "a", "flavor": "vf"}), 201)["uuid"]
    ok(live.admin.put(f"/vms/{vm}/allocations", json={"host": "h0"}))
    assert live.lm.allocations.pending_for_vm(vm)[PF] == {VF: 1}
    for devices, status, field in (
        ([{"provider": "h0_0000:3B:00.1", "address": "0000:3b:03.0"}], 409, "devices[0].provider"),
        ([{"provider": PF, "address": "3b:02.0"}], 400, "devices[0].address"),
        (
            [{"provider": PF, "address": "0000:3b:02.0", "mdev_uuid": "x"}],
            400,
            "devices[0].mdev_uuid",
        ),
    ):
        refused = live.admin.post(f"/vms/{vm}/up", json={"host": "h0", "devices": devices})
        assert refused.status_code == status, refused.text
        assert refused.json()["field"] == field
        assert live.lm.vms.get(vm).state == "pending"
    refused = live.admin.post(f"/vms/{vm}/up", json={"devices": []})
    assert refused.status_code == 400 and refused.json()["field"] == "host"
    given = [{"provider": PF, "address": "0000:3b:02.1", "mdev_uuid": None}]
    ok(live.admin.post(f"/vms/{vm}/up", json={"host": "h0", "devices": given}))
    assert ok(live.admin.get(f"/vms/{vm}/devices")) == {"devices": given}
    [shown, other] = ok(live.reader.get("/hosts/h0/devices"))["devices"]
    assert (shown["provider"], shown["used"], shown["traits"]) == (
        PF,
        1,
        ["COMPUTE_MANAGED_PCI_DEVICE"],
    )
    assert shown["holders"] == [
        {"vm": vm, "name": "a", "amount": 1, "state": "active", "devices": given}
    ]
    assert other["holders"] == []
    # Stopped, it holds nothing: no device is shown as its any more.
    ok(live.admin.post(f"/vms/{vm}/stop"))
    assert ok(live.admin.get(f"/vms/{vm}/devices")) == {"devices": []}
    assert ok(live.reader.get("/hosts/h0/devices"))["devices"][0]["holders"] == []
