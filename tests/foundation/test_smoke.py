from loadmaster.service import Loadmaster


def test_claim_then_usage(lm: Loadmaster) -> None:
    lm.hosts.create("h1", inventories={"VCPU": {"total": 4}, "MEMORY_MB": {"total": 4096}})
    lm.flavors.create({"name": "small", "resources": {"VCPU": 2, "MEMORY_MB": 1024}})
    vm = lm.vms.create("vm1", "small")
    lm.allocations.claim(vm.uuid, "h1")
    usage = lm.allocations.usages()["h1"]
    assert usage["VCPU"].pending == 2
    assert usage["MEMORY_MB"].free == 3072
