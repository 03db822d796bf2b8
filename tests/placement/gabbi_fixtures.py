"""loadmaster's equivalents of Placement's data fixtures (``placement/tests/functional/
fixtures/gabbits.py``, openstack-placement 16.0.0): the same providers, inventories,
traits, aggregates and allocations, built through loadmaster's HTTP API, and the same
environment values, so the gabbi files that name these fixtures run unchanged.

Each Python call of Placement's fixture is one HTTP call here, so provider and consumer
generations come out as the files expect them: creating a provider leaves it at 0, each
``add_inventory`` and ``set_traits`` moves it by one, setting aggregates does not (the
fixture writes them below 1.19, as Placement's pre-1.19 ``PUT`` does), and each
``set_allocation`` moves the provider and makes the consumer's generation 1.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import httpx

LATEST = {"OpenStack-API-Version": "placement 1.39"}
UNVERSIONED_AGGREGATES = {"OpenStack-API-Version": "placement 1.1"}
OWNED_ALLOCATIONS = {"OpenStack-API-Version": "placement 1.28"}  # no consumer type
SHARES = "MISC_SHARES_VIA_AGGREGATE"


class Builder:
    """Placement's ``tb`` helpers (``create_provider``, ``add_inventory``, ...) over HTTP."""

    def __init__(self, http: httpx.Client, env: dict[str, str]) -> None:
        self.http = http
        self.env = env
        self.user = str(uuid.uuid4())  # the fixtures' default user and project
        self.project = str(uuid.uuid4())

    def _ok(self, answer: httpx.Response) -> Any:
        if answer.status_code >= 300:
            raise RuntimeError(f"{answer.request.method} {answer.request.url}: {answer.text}")
        return answer.json() if answer.content else None

    def _generation(self, rp: str) -> int:
        return int(
            self._ok(self.http.get(f"/resource_providers/{rp}", headers=LATEST))["generation"]
        )

    def provider(
        self, name: str, *aggregates: str, parent: str | None = None, rp: str | None = None
    ) -> str:
        body = {"name": name, "uuid": rp or str(uuid.uuid4())}
        if parent is not None:
            body["parent_provider_uuid"] = parent
        created = self._ok(self.http.post("/resource_providers", json=body, headers=LATEST))
        if aggregates:
            self.aggregates(created["uuid"], *aggregates)
        return str(created["uuid"])

    def aggregates(self, rp: str, *aggregates: str) -> None:
        path = f"/resource_providers/{rp}/aggregates"
        self._ok(self.http.put(path, json=list(aggregates), headers=UNVERSIONED_AGGREGATES))

    def inventory(self, rp: str, resource_class: str, total: int, **fields: Any) -> None:
        if resource_class.startswith("CUSTOM_"):
            self.http.put(f"/resource_classes/{resource_class}", headers=LATEST)
        body = {
            "resource_class": resource_class,
            "total": total,
            "max_unit": total,
            **fields,
            "resource_provider_generation": self._generation(rp),
        }
        self._ok(self.http.post(f"/resource_providers/{rp}/inventories", json=body, headers=LATEST))

    def traits(self, rp: str, *traits: str) -> None:
        for trait in traits:
            if trait.startswith("CUSTOM_"):
                self.http.put(f"/traits/{trait}", headers=LATEST)
        body = {"resource_provider_generation": self._generation(rp), "traits": list(traits)}
        self._ok(self.http.put(f"/resource_providers/{rp}/traits", json=body, headers=LATEST))

    def allocation(
        self,
        rp: str,
        amounts: dict[str, int],
        *,
        user: str | None = None,
        project: str | None = None,
        consumer: str | None = None,
    ) -> str:
        consumer = consumer or str(uuid.uuid4())
        body = {
            "allocations": {rp: {"resources": amounts}},
            "project_id": project or self.project,
            "user_id": user or self.user,
            "consumer_generation": None,
        }
        self._ok(self.http.put(f"/allocations/{consumer}", json=body, headers=OWNED_ALLOCATIONS))
        return consumer

    def export(self, **values: str) -> None:
        self.env.update(values)


def allocation_fixture(b: Builder) -> None:
    """Three consumers on one provider: DISK_GB 1000; VCPU 6; and another user's VCPU 1,
    DISK_GB 20."""
    b.export(ALT_USER_ID=str(uuid.uuid4()))
    user, project = b.env["USER_ID"], b.env["PROJECT_ID"]
    rp = b.provider(b.env["RP_NAME"], rp=b.env["RP_UUID"])
    b.inventory(rp, "DISK_GB", 2048, step_size=10, min_unit=10, max_unit=1000)
    b.inventory(rp, "VCPU", 10, max_unit=10)
    b.export(CONSUMER_0=b.allocation(rp, {"DISK_GB": 1000}, user=user, project=project))
    b.export(CONSUMER_ID=b.allocation(rp, {"VCPU": 6}, user=user, project=project))
    alt = b.allocation(rp, {"DISK_GB": 20, "VCPU": 1}, user=b.env["ALT_USER_ID"], project=project)
    b.export(ALT_CONSUMER_ID=alt, ALT_RP_UUID=str(uuid.uuid4()), ALT_RP_NAME=str(uuid.uuid4()))


def shared_storage_fixture(b: Builder) -> None:
    """Two compute nodes (the first without disk), each with two NUMA nodes with a PF
    each, and two sharing storage providers, all in one aggregate."""
    agg = str(uuid.uuid4())
    cn1, cn2 = b.provider("cn1", agg), b.provider("cn2", agg)
    ss, ss2 = b.provider("ss", agg), b.provider("ss2", agg)
    numa = {
        "1_1": b.provider("numa1_1", parent=cn1),
        "1_2": b.provider("numa1_2", parent=cn1),
        "2_1": b.provider("numa2_1", parent=cn2),
        "2_2": b.provider("numa2_2", parent=cn2),
    }
    pf = {key: b.provider(f"pf{key}", parent=parent) for key, parent in numa.items()}
    b.export(AGG_UUID=agg, CN1_UUID=cn1, CN2_UUID=cn2, SS_UUID=ss, SS2_UUID=ss2)
    b.export(**{f"NUMA{k}_UUID": v for k, v in numa.items()})
    b.export(**{f"PF{k}_UUID": v for k, v in pf.items()})
    for cn in (cn1, cn2):
        b.inventory(cn, "VCPU", 24, allocation_ratio=16.0)
        b.inventory(cn, "MEMORY_MB", 128 * 1024, allocation_ratio=1.5)
    b.traits(cn1, "HW_CPU_X86_SSE", "HW_CPU_X86_SSE2")
    b.inventory(cn2, "DISK_GB", 2000, reserved=100, allocation_ratio=1.0)
    for shared in (ss, ss2):
        b.inventory(shared, "DISK_GB", 2000, reserved=100, allocation_ratio=1.0)
        b.traits(shared, SHARES)
    for provider in pf.values():
        b.inventory(provider, "SRIOV_NET_VF", 8, allocation_ratio=1.0)


def numa_aggregate_fixture(b: Builder) -> None:
    """Two compute nodes without resources, their VCPU on two NUMA nodes each; ss1 shares
    with both through aggA, ss2 with one NUMA node of cn1 through aggC."""
    agg_a, agg_b, agg_c = (str(uuid.uuid4()) for _ in range(3))
    cn1 = b.provider("cn1", agg_a)
    cn2 = b.provider("cn2", agg_a, agg_b)
    ss1, ss2 = b.provider("ss1", agg_a), b.provider("ss2", agg_c)
    numa = {
        "1_1": b.provider("numa1_1", agg_c, parent=cn1),
        "1_2": b.provider("numa1_2", parent=cn1),
        "2_1": b.provider("numa2_1", parent=cn2),
        "2_2": b.provider("numa2_2", parent=cn2),
    }
    b.export(AGGA_UUID=agg_a, AGGB_UUID=agg_b, AGGC_UUID=agg_c)
    b.export(CN1_UUID=cn1, CN2_UUID=cn2, SS1_UUID=ss1, SS2_UUID=ss2)
    b.export(**{f"NUMA{k}_UUID": v for k, v in numa.items()})
    for provider in numa.values():
        b.inventory(provider, "VCPU", 24, allocation_ratio=16.0)
    for shared in (ss1, ss2):
        b.inventory(shared, "DISK_GB", 2000, reserved=100, allocation_ratio=1.0)
        b.traits(shared, SHARES)


def numa_network_fixture(b: Builder, cn1: str | None = None, cn2: str | None = None) -> None:
    """cn1 without inventory: two NUMA nodes (VCPU, MEMORY_MB with unit rules, FPGAs, a
    pGPU), an SR-IOV agent and an OVS agent with their devices; cn2 with VCPU, MEMORY_MB
    and DISK_GB and three NICs of PFs; ss1 sharing DISK_GB with both through aggA.
    ``cn1``/``cn2``: providers made beforehand (DeepNUMANetworkFixture's)."""
    agg_a = str(uuid.uuid4())
    b.export(AGGA_UUID=agg_a)
    ss1 = b.provider("ss1", agg_a)
    b.traits(ss1, SHARES)
    b.inventory(ss1, "DISK_GB", 2000)
    b.export(SS1_UUID=ss1)
    cn1 = cn1 or b.provider("cn1", agg_a)
    b.aggregates(cn1, agg_a)
    b.traits(cn1, "COMPUTE_VOLUME_MULTI_ATTACH")
    b.export(CN1_UUID=cn1)
    numas = []
    for i in (0, 1):
        numa = b.provider(f"numa{i}", parent=cn1)
        b.traits(numa, "HW_NUMA_ROOT", *(["CUSTOM_FOO"] if i == 1 else []))
        b.inventory(numa, "VCPU", 4)
        numas.append(numa)
        b.export(**{f"NUMA{i}_UUID": numa})
    b.inventory(numas[0], "MEMORY_MB", 2048, min_unit=512, step_size=256)
    b.inventory(numas[1], "MEMORY_MB", 2048, min_unit=256, max_unit=1024)
    numa_user, numa_project = "numafx-user", "numafx-project"
    b.allocation(numas[0], {"VCPU": 2}, user=numa_user, project=numa_project)
    fpga = b.provider("fpga0", parent=numas[0])
    b.inventory(fpga, "FPGA", 1)
    b.export(FPGA0_UUID=fpga)
    pgpu = b.provider("pgpu0", parent=numas[0])
    b.inventory(pgpu, "VGPU", 8)
    b.export(PGPU0_UUID=pgpu)
    for i in (0, 1):
        fpga = b.provider(f"fpga1_{i}", parent=numas[1])
        b.inventory(fpga, "FPGA", 1)
        b.export(**{f"FPGA1_{i}_UUID": fpga})
    agent = b.provider("sriov_agent", parent=cn1)
    b.traits(agent, "CUSTOM_VNIC_TYPE_DIRECT")
    b.export(SRIOV_AGENT_UUID=agent)
    for i in (1, 2):
        dev = b.provider(f"esn{i}", parent=agent)
        b.traits(dev, f"CUSTOM_PHYSNET{i}")
        b.inventory(dev, "NET_BW_EGR_KILOBIT_PER_SEC", 10000 * i)
        b.export(**{f"ESN{i}_UUID": dev})
    agent = b.provider("ovs_agent", parent=cn1)
    b.traits(agent, "CUSTOM_VNIC_TYPE_NORMAL")
    b.export(OVS_AGENT_UUID=agent)
    dev = b.provider("br_int", parent=agent)
    b.traits(dev, "CUSTOM_PHYSNET0")
    b.inventory(dev, "NET_BW_EGR_KILOBIT_PER_SEC", 1000)
    b.export(BR_INT_UUID=dev)
    cn2 = cn2 or b.provider("cn2")
    b.aggregates(cn2, agg_a)
    b.inventory(cn2, "VCPU", 8)
    b.allocation(cn2, {"VCPU": 3}, user=numa_user, project=numa_project)
    b.inventory(cn2, "MEMORY_MB", 2048, min_unit=1024, step_size=128)
    b.inventory(cn2, "DISK_GB", 1000)
    b.traits(cn2, "CUSTOM_FOO")
    b.export(CN2_UUID=cn2)
    nics = []
    for i in (1, 2, 3):
        nic = b.provider(f"nic{i}", parent=cn2)
        b.traits(nic, "CUSTOM_HW_NIC_ROOT")
        nics.append(nic)
        b.export(**{f"NIC{i}_UUID": nic})
    pfs = [(f"1_{i}", nics[0], i, 4) for i in (1, 2)]
    pfs += [(f"2_{i + 1}", nics[1], i % 2 + 1, 2) for i in range(4)]
    pfs += [("3_1", nics[2], 1, 8)]
    for suffix, nic, physnet, vfs in pfs:
        pf = b.provider(f"pf{suffix}", parent=nic)
        b.traits(pf, f"CUSTOM_PHYSNET{physnet}")
        b.inventory(pf, "CUSTOM_VF", vfs)
        b.export(**{f"PF{suffix}_UUID": pf})


def deep_numa_network_fixture(b: Builder) -> None:
    """NUMANetworkFixture with cn1 and cn2 under p1 and p2, both under gp1."""
    gp1 = b.provider("gp1")
    p1, p2 = b.provider("p1", parent=gp1), b.provider("p2", parent=gp1)
    cn1, cn2 = b.provider("cn1", parent=p1), b.provider("cn2", parent=p2)
    numa_network_fixture(b, cn1, cn2)


def non_shared_storage_fixture(b: Builder) -> None:
    """Three compute nodes with VCPU, MEMORY_MB and local DISK_GB; three aggregates no
    provider is in yet."""
    b.export(**{f"AGG{x}_UUID": str(uuid.uuid4()) for x in "ABC"})
    nodes = [b.provider(f"cn{i}") for i in (1, 2, 3)]
    b.export(**{f"CN{i}_UUID": cn for i, cn in enumerate(nodes, 1)})
    for cn in nodes:
        b.inventory(cn, "VCPU", 24)
        b.inventory(cn, "MEMORY_MB", 128 * 1024)
        b.inventory(cn, "DISK_GB", 2000)


def granular_fixture(b: Builder) -> None:
    """cn_left, cn_middle and cn_right with their traits; shr_disk_1 (SSD) and shr_disk_2
    sharing DISK_GB, shr_net sharing VFs and bandwidth, through aggA, aggB and aggC."""
    b.http.put("/resource_classes/CUSTOM_NET_MBPS", headers=LATEST)
    agg = {x: str(uuid.uuid4()) for x in "ABC"}
    b.export(AGGA=agg["A"], AGGB=agg["B"], AGGC=agg["C"])
    left = b.provider("cn_left", agg["A"])
    b.export(CN_LEFT=left)
    for rc, total in (
        ("VCPU", 8),
        ("MEMORY_MB", 4096),
        ("DISK_GB", 500),
        ("VGPU", 8),
        ("SRIOV_NET_VF", 8),
        ("CUSTOM_NET_MBPS", 4000),
    ):
        b.inventory(left, rc, total)
    b.traits(
        left, "HW_CPU_X86_AVX", "HW_CPU_X86_AVX2", "HW_GPU_API_DXVA", "HW_NIC_DCB_PFC", "CUSTOM_FOO"
    )
    middle = b.provider("cn_middle", agg["A"], agg["B"])
    b.export(CN_MIDDLE=middle)
    for rc, total in (
        ("VCPU", 8),
        ("MEMORY_MB", 4096),
        ("SRIOV_NET_VF", 8),
        ("CUSTOM_NET_MBPS", 4000),
    ):
        b.inventory(middle, rc, total)
    b.traits(middle, "HW_CPU_X86_AVX", "HW_CPU_X86_AVX2", "HW_CPU_X86_SSE", "HW_NIC_ACCEL_TLS")
    right = b.provider("cn_right", agg["B"], agg["C"])
    b.export(CN_RIGHT=right)
    b.inventory(right, "VCPU", 8)
    b.inventory(right, "MEMORY_MB", 4096)
    b.inventory(right, "DISK_GB", 500)
    b.inventory(right, "VGPU", 8, max_unit=2)
    b.traits(right, "HW_CPU_X86_MMX", "HW_GPU_API_DXVA", "CUSTOM_DISK_SSD")
    disk1 = b.provider("shr_disk_1", agg["A"])
    b.export(SHR_DISK_1=disk1)
    b.inventory(disk1, "DISK_GB", 1000)
    b.traits(disk1, SHARES, "CUSTOM_DISK_SSD")
    disk2 = b.provider("shr_disk_2", agg["A"], agg["B"])
    b.export(SHR_DISK_2=disk2)
    b.inventory(disk2, "DISK_GB", 1000)
    b.traits(disk2, SHARES)
    net = b.provider("shr_net", agg["C"])
    b.export(SHR_NET=net)
    b.inventory(net, "SRIOV_NET_VF", 16)
    b.inventory(net, "CUSTOM_NET_MBPS", 40000)
    b.traits(net, SHARES)


_VNIC_DIRECT = (
    "CUSTOM_VNIC_TYPE_DIRECT",
    "CUSTOM_VNIC_TYPE_DIRECT_PHYSICAL",
    "CUSTOM_VNIC_TYPE_MACVTAP",
)


def neutron_qos_multi_segment_fixture(b: Builder) -> None:
    """Four computes with an OVS agent (packet rate) and its bridges, and an SR-IOV agent
    and its PFs (bandwidth), on physnets OTHER, MSN_S1, MSN_S2 and both (compute3, with
    little bandwidth)."""
    bridges = {
        0: [("br-ex", "br_ex", "CUSTOM_PHYSNET_OTHER", 5000)],
        1: [("br-ex", "br_ex", "CUSTOM_PHYSNET_MSN_S1", 5000)],
        2: [("br-ex", "br_ex", "CUSTOM_PHYSNET_MSN_S2", 5000)],
        3: [
            ("br-ex", "br_ex", "CUSTOM_PHYSNET_MSN_S1", 1000),
            ("br-ex2", "br_ex2", "CUSTOM_PHYSNET_MSN_S2", 1000),
        ],
    }
    pfs = {
        0: [("enp129s0f0", "pf0", "CUSTOM_PHYSNET_OTHER", 10000)],
        1: [("enp129s0f0", "pf0", "CUSTOM_PHYSNET_MSN_S1", 10000)],
        2: [("enp129s0f0", "pf0", "CUSTOM_PHYSNET_MSN_S2", 10000)],
        3: [
            ("enp129s0f0", "pf0", "CUSTOM_PHYSNET_MSN_S1", 1000),
            ("enp129s0f1", "pf1", "CUSTOM_PHYSNET_MSN_S2", 1000),
        ],
    }
    sriov_agents = {}
    for i in range(4):
        name = f"compute{i}"
        compute = b.provider(name)
        b.export(**{name: compute})
        b.inventory(compute, "VCPU", 8)
        b.inventory(compute, "MEMORY_MB", 4096)
        b.inventory(compute, "DISK_GB", 500)
        ovs = b.provider(f"{name}:Open vSwitch agent", parent=compute)
        b.export(**{f"{name}:ovs_agent": ovs})
        b.inventory(ovs, "NET_PACKET_RATE_KILOPACKET_PER_SEC", 1000)
        b.traits(ovs, "CUSTOM_VNIC_TYPE_NORMAL")
        for device, key, physnet, bandwidth in bridges[i]:
            bridge = b.provider(f"{name}:Open vSwitch agent:{device}", parent=ovs)
            b.export(**{f"{name}:{key}": bridge})
            b.inventory(bridge, "NET_BW_EGR_KILOBIT_PER_SEC", bandwidth)
            b.inventory(bridge, "NET_BW_IGR_KILOBIT_PER_SEC", bandwidth)
            b.traits(bridge, "CUSTOM_VNIC_TYPE_NORMAL", physnet)
        sriov = b.provider(f"{name}:NIC Switch agent", parent=compute)
        sriov_agents[i] = sriov
        # Placement's fixture exports compute2's agent as compute3's too; kept, as the
        # files read it so.
        b.export(**{f"{name}:sriov_agent": sriov_agents[2 if i == 3 else i]})
        b.traits(sriov, *_VNIC_DIRECT)
        for device, key, physnet, bandwidth in pfs[i]:
            pf = b.provider(f"{name}:NIC Switch agent:{device}", parent=sriov)
            b.export(**{f"{name}:{key}": pf})
            b.inventory(pf, "NET_BW_EGR_KILOBIT_PER_SEC", bandwidth)
            b.inventory(pf, "NET_BW_IGR_KILOBIT_PER_SEC", bandwidth)
            b.traits(pf, *_VNIC_DIRECT, physnet)


FIXTURES: dict[str, Callable[[Builder], None]] = {
    "AllocationFixture": allocation_fixture,
    "SharedStorageFixture": shared_storage_fixture,
    "NUMAAggregateFixture": numa_aggregate_fixture,
    "NUMANetworkFixture": numa_network_fixture,
    "DeepNUMANetworkFixture": deep_numa_network_fixture,
    "NonSharedStorageFixture": non_shared_storage_fixture,
    "GranularFixture": granular_fixture,
    "NeutronQoSMultiSegmentFixture": neutron_qos_multi_segment_fixture,
}


def build(name: str, url: str, token: str, env: dict[str, str]) -> dict[str, str]:
    """Fixture ``name``'s data on the server at ``url``; ``env``: the basic fixture's
    values, returned with this fixture's added."""
    env = dict(env)
    with httpx.Client(base_url=url, headers={"x-auth-token": token}, timeout=30) as http:
        FIXTURES[name](Builder(http, env))
    return env
