"""Images, disks and NICs through the API: the image catalogue, a VM's image (its own, else
its flavor's ``lm:image``), its NIC's network (its own, else ``lm:network``, else
``default``) and MAC, what a VM shows of them, what its host's work list says, and bad
input refused naming the field with nothing written."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from api_helpers import Live, ok, table_rows

from loadmaster.cluster import VmSpec
from loadmaster.errors import NotFound

GIB = 1024**3
TINY = 32 * 1024 * 1024


def catalogue(admin: httpx.Client) -> None:
    ok(admin.put("/images/tiny", json={"size_bytes": TINY}), 201)
    ok(admin.put("/images/big", json={"size_bytes": 30 * GIB}), 201)
    ok(admin.post("/hosts", json={"name": "h0", "inventories": HOST}), 201)
    flavor = {"name": "disk1", "resources": {"VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 1}}
    ok(admin.post("/flavors", json=flavor), 201)
    spec = {"lm:image": "tiny", "lm:network": "lan"}
    ok(admin.post("/flavors", json={**flavor, "name": "booted", "extra_specs": spec}), 201)
    plain = {"name": "plain", "resources": {"VCPU": 1, "MEMORY_MB": 512}}
    ok(admin.post("/flavors", json=plain), 201)


HOST = {"VCPU": {"total": 8}, "MEMORY_MB": {"total": 8192}, "DISK_GB": {"total": 100}}


def create(admin: httpx.Client, **fields: Any) -> httpx.Response:
    return admin.post("/vms", json={"name": "vm", **fields})


def test_image_catalogue_put_is_idempotent_and_size_conflicts(live: Live) -> None:
    admin = live.admin
    first = ok(admin.put("/images/tiny", json={"size_bytes": TINY}), 201)
    assert (first["name"], first["size_bytes"]) == ("tiny", TINY)
    ok(admin.put("/images/tiny", json={"size_bytes": TINY}), 200)
    other = admin.put("/images/tiny", json={"size_bytes": TINY + 1})
    assert other.status_code == 409 and other.json()["field"] == "size_bytes"
    assert [i["name"] for i in ok(admin.get("/images"))["images"]] == ["tiny"]
    bad = admin.put("/images/no%20spaces", json={"size_bytes": TINY})
    assert bad.status_code == 400 and bad.json()["field"] == "name"
    assert live.reader.put("/images/x", json={"size_bytes": 1}).status_code == 403


def test_vm_image_disk_and_nic_shown_and_kept(live: Live) -> None:
    admin = live.admin
    catalogue(admin)
    vm = ok(create(admin, flavor="disk1", image="tiny"), 201)
    assert vm["image"] == "tiny"
    assert vm["disks"] == [
        {"image": "tiny", "size_bytes": GIB, "volume": f"loadmaster/{vm['uuid']}.qcow2"}
    ]
    [nic] = vm["nics"]
    assert nic["network"] == "default"
    assert re.fullmatch(r"52:54:00(:[0-9a-f]{2}){3}", nic["mac"])
    assert ok(admin.get(f"/vms/{vm['uuid']}"))["nics"] == [nic]  # chosen once, kept

    # The flavor's image and network when the VM names none; the VM's own win.
    by_flavor = ok(create(admin, flavor="booted"), 201)
    assert (by_flavor["image"], by_flavor["nics"][0]["network"]) == ("tiny", "lan")
    ok(admin.put("/images/other", json={"size_bytes": TINY}), 201)
    own = ok(create(admin, flavor="booted", image="other", network="wan"), 201)
    assert (own["image"], own["nics"][0]["network"]) == ("other", "wan")
    assert own["nics"][0]["mac"] != by_flavor["nics"][0]["mac"]

    # DISK_GB without an image: a blank disk; neither: no disk, still a NIC.
    blank = ok(create(admin, flavor="disk1"), 201)
    assert blank["disks"][0]["image"] is None and blank["disks"][0]["size_bytes"] == GIB
    assert ok(create(admin, flavor="plain"), 201)["disks"] == []


def test_work_list_carries_disk_and_nics(live: Live) -> None:
    admin = live.admin
    catalogue(admin)
    vm = ok(create(admin, flavor="booted"), 201)
    ok(admin.post(f"/vms/{vm['uuid']}/start", json={}))
    [item] = [i.to_dict() for i in live.lm.host_agents.work("h0").items]
    assert item["disk"] == {"image": "tiny", "size_bytes": GIB}
    assert item["nics"] == vm["nics"]


def test_work_list_carries_the_flavors_quota_and_bad_quota_is_refused(live: Live) -> None:
    admin = live.admin
    catalogue(admin)
    before = table_rows(live.lm)
    base = {"name": "q", "resources": {"VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 1}}
    bad = admin.post("/flavors", json={**base, "extra_specs": {"quota:disk_read_iops_sec": "x"}})
    assert bad.status_code == 400, bad.text
    assert bad.json()["field"] == "extra_specs.quota:disk_read_iops_sec"
    assert "'x'" in bad.json()["detail"]
    assert table_rows(live.lm) == before
    specs = {"quota:disk_total_bytes_sec": "1048576", "quota:vif_outbound_average": "256"}
    ok(admin.post("/flavors", json={**base, "extra_specs": specs}), 201)
    vm = ok(create(admin, flavor="q"), 201)
    ok(admin.post(f"/vms/{vm['uuid']}/start", json={}))
    [item] = ok(admin.get("/hosts/h0/work"))["items"]
    assert item["quota"] == {
        "disk": {"total_bytes_sec": 1048576},
        "vif": {"outbound.average": 256},
        "cpu": {},
    }


def test_unknown_or_oversized_image_refused_nothing_written(live: Live) -> None:
    admin = live.admin
    catalogue(admin)
    before = table_rows(live.lm)
    missing = create(admin, flavor="disk1", image="nope")
    assert missing.status_code == 404, missing.text
    assert missing.json()["field"] == "image" and "'nope'" in missing.json()["detail"]
    big = create(admin, flavor="disk1", image="big")
    assert big.status_code == 400, big.text
    assert big.json()["field"] == "image"
    assert "image 'big'" in big.json()["detail"] and "DISK_GB of 1" in big.json()["detail"]
    with pytest.raises(NotFound) as batch:
        live.lm.vms.create_many([VmSpec("a", "disk1"), VmSpec("b", "disk1", image="nope")])
    assert batch.value.field == "vms[1].image"
    bad_name = create(admin, flavor="disk1", network="a b")
    assert bad_name.status_code == 400 and bad_name.json()["field"] == "network"
    assert table_rows(live.lm) == before


def test_flavor_naming_an_unknown_image_refused(live: Live) -> None:
    admin = live.admin
    before = table_rows(live.lm)
    flavor = {
        "name": "f",
        "resources": {"VCPU": 1, "DISK_GB": 1},
        "extra_specs": {"lm:image": "nope"},
    }
    refused = admin.post("/flavors", json=flavor)
    assert refused.status_code == 404 and refused.json()["field"] == "extra_specs.lm:image"
    assert table_rows(live.lm) == before


def test_image_in_use_cannot_be_deleted(live: Live) -> None:
    admin = live.admin
    catalogue(admin)
    vm = ok(create(admin, flavor="disk1", image="tiny"), 201)
    in_use = admin.delete("/images/tiny")
    assert in_use.status_code == 409 and in_use.json()["field"] == "name"
    ok(admin.delete(f"/vms/{vm['uuid']}"), 204)
    ok(admin.delete("/images/big"), 204)
    assert admin.get("/images/big").status_code == 404


def test_a_retried_create_keeps_the_first_mac_and_another_image_conflicts(live: Live) -> None:
    admin = live.admin
    catalogue(admin)
    ok(admin.put("/images/other", json={"size_bytes": TINY}), 201)
    uuid = "0c6f3a52-9d1e-4f7a-8b2c-3d4e5f607182"
    first = ok(create(admin, flavor="disk1", image="tiny", uuid=uuid), 201)
    again = ok(create(admin, flavor="disk1", image="tiny", uuid=uuid), 201)
    assert again["nics"] == first["nics"]  # the first attempt's MAC, not a new one
    for changed in ({"image": "other"}, {"image": "tiny", "network": "lan"}):
        refused = create(admin, flavor="disk1", uuid=uuid, **changed)
        assert refused.status_code == 409 and refused.json()["field"] == "uuid", refused.text
