"""What loadmaster's own routes answer, as typed models: the OpenAPI document describes
every answer from them, and schemathesis checks answers against it.

Each model forbids keys it does not declare, so an answer that grows a key without its
model fails the tests (a 500 on response validation) instead of drifting from the
document. The views (``views.py``) build these models from the domain's records.

This module holds the answer models, one per answer shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from loadmaster.cluster.vms import VM_STATES
from loadmaster.resources import Inventory
from loadmaster.store.locking import iso_utc


def _iso(value: object) -> object:
    return iso_utc(value) if isinstance(value, datetime) else value


# A record's time as ISO 8601 text with its offset (+00:00).
IsoText = Annotated[str, BeforeValidator(_iso)]


class Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HealthOut(Out):
    status: Literal["ok"]


class ErrorOut(Out):
    code: str
    title: str
    detail: str
    field: str | None = None
    explanation: dict[str, Any] | None = None


class DiskOut(Out):
    image: str | None = Field(description="its base image; null: a blank disk")
    size_bytes: int
    volume: str = Field(description="POOL/VOLUME on the host it runs on")


class NicOut(Out):
    network: str = Field(description="the libvirt network of its host it joins")
    mac: str = Field(description="chosen when the VM was created, kept on every host")


class VmOut(Out):
    uuid: str
    name: str
    project_id: str | None
    user_id: str | None
    flavor: str | None
    state: str = Field(description=f"one of {', '.join(VM_STATES)}")
    host: str | None = Field(description="where it runs or is claimed to run")
    target_host: str | None = Field(description="where a migration in flight goes")
    group: str | None
    tags: list[str]
    resources: dict[str, int]
    overrides: dict[str, int]
    generation: int
    fault: str | None
    tried_hosts: list[str] = Field(
        description="hosts that refused its launch, while it is placed again (empty once "
        "it runs or the launch was given up)"
    )
    created_at: IsoText = Field(description="ISO 8601, UTC, with its offset")
    updated_at: IsoText = Field(description="ISO 8601, UTC, with its offset")
    image: str | None
    disks: list[DiskOut]
    nics: list[NicOut]


class VmDetail(VmOut):
    host_agent: Literal["ok", "silent", "none"] | None = Field(
        description="its host's agent: ok, silent (not heard from; the claim is kept) or "
        "none; null when the VM is on no host"
    )


class VmList(Out):
    vms: list[VmOut]
    warnings: list[str] = Field(
        description="claims of these VMs pending too long on a host whose agent is silent "
        "or absent (LOADMASTER_PENDING_WARN_AFTER); they are kept"
    )


class HostScoreOut(Out):
    host: str
    total: float
    by_weigher: dict[str, float]


class PlacementOut(Out):
    vm: str
    host: str | None
    error: ErrorOut | None
    decision_seconds: float
    attempts: int
    scores: list[HostScoreOut] = Field(
        description="dry runs: the chosen host's score per weigher, then the runners-up's"
    )


class ScheduledVm(Out):
    vm: VmOut
    placement: PlacementOut
    seed: int | None = None


class ProviderAllocationOut(Out):
    name: str
    generation: int
    resources: dict[str, int]
    active: dict[str, int]
    pending: dict[str, int]


class VmAllocations(Out):
    allocations: dict[str, ProviderAllocationOut] = Field(description="by provider uuid")
    project_id: str | None
    user_id: str | None
    state: str


class ClassUsageOut(Out):
    capacity: int
    active: int
    pending: int
    used: int
    free: int


class HostUsages(Out):
    hosts: dict[str, dict[str, ClassUsageOut]] = Field(description="host -> class -> usage")


class FlavorOut(Out):
    name: str
    resources: dict[str, int]
    required_traits: list[str]
    forbidden_traits: list[str]
    extra_specs: dict[str, str]
    warnings: list[str] = Field(description="extra specs ignored (unknown_specs=warn)")


class FlavorList(Out):
    flavors: list[FlavorOut]


class ImageOut(Out):
    name: str
    size_bytes: int = Field(description="the size its guest sees, which DISK_GB must hold")
    created_at: IsoText = Field(description="ISO 8601, UTC, with its offset")


class ImageList(Out):
    images: list[ImageOut]


class GroupOut(Out):
    uuid: str
    name: str
    policy: str
    max_per_host: int | None


class GroupDetail(GroupOut):
    members: list[str] = Field(description="the uuids of its VMs")


class GroupList(Out):
    server_groups: list[GroupOut]


class HostOut(Out):
    uuid: str
    name: str
    generation: int
    state: str = Field(description="up, maintenance or down")
    parent_provider_uuid: str | None
    root_provider_uuid: str
    traits: list[str]
    aggregates: list[str]


class HostList(Out):
    hosts: list[HostOut]


class VmLeftOut(Out):
    vm: str
    name: str
    state: str
    host: str | None
    target_host: str | None


class DrainStatusOut(Out):
    host: str
    state: str
    status: str = Field(description="the host's state, or draining while VMs are left")
    vms_left: int
    migrating: int
    vms: list[VmLeftOut]
    warnings: list[str] = Field(
        description="the host's agent is silent or absent while VMs are left (and what to "
        "do), and claims pending on it too long; nothing is ended"
    )


class HostDetail(HostOut):
    status: str = Field(description="the host's state, or draining while VMs are left")
    drain: DrainStatusOut | None


class UnplacedOut(Out):
    vm: str
    reason: str
    code: str
    explanation: dict[str, Any] | None
    stopped: bool


class DrainOut(DrainStatusOut):
    moved: dict[str, str] = Field(description="VM uuid -> destination claimed by this call")
    unplaced: list[UnplacedOut]
    stopped: list[str]
    in_flight: list[str]
    seconds: float
    seed: int | None
    names: dict[str, str]


class EvacuationOut(Out):
    host: str
    known_down: str = Field(
        description="fenced, confirmed (by the operator), or already (down before this call)"
    )
    moved: dict[str, str] = Field(description="VM uuid -> host it now starts on")
    unplaced: list[UnplacedOut] = Field(
        description="VMs that fit nowhere: they keep their claim on the dead host"
    )
    taken_over: dict[str, str] = Field(
        description="migrations from or to the host, VM uuid -> aborted (back on its "
        "source: the destination is down) or landed (started on its destination: the source "
        "is down; also in moved)"
    )
    deferred: list[str] = Field(
        description="VMs not tagged ha left for a later pass while hosts holding ha VMs are "
        "on their way to being fenced (automatic evacuation only)"
    )
    order: list[str] = Field(description="the VMs in the order placed, highly available first")
    seconds: float
    names: dict[str, str]


class ProblemOut(Out):
    kind: str = Field(
        description="over_capacity, orphaned, partial_claim, state_mismatch or group_rule"
    )
    subject: str
    detail: str


class AuditOut(Out):
    problems: list[ProblemOut]
    warnings: list[str] = Field(
        description="claims pending too long on hosts whose agent is silent or absent; "
        "not broken promises (they are kept), but an operator should look"
    )


class FailureReasonOut(Out):
    code: str
    reason: str
    vms: int


class ScheduleOut(Out):
    ok: bool
    gang: bool
    dry_run: bool
    policy: str
    seed: int | None
    placed: int
    failed: int
    conflicts: int = Field(description="claims lost to other schedulers and decided again")
    seconds: float
    by_host: dict[str, int]
    errors: dict[str, int] = Field(description="error code -> VMs")
    failure_reasons: list[FailureReasonOut]
    listed: int = Field(description="how many placements are listed (a dry run shows 100)")
    placements: list[PlacementOut]


class FilterCountOut(Out):
    filter: str
    removed: int
    reasons: dict[str, int]


class ExplanationOut(Out):
    vm: str
    hosts: int
    candidates: int
    headline: str | None
    message: str
    filters: list[FilterCountOut]
    ranking: list[HostScoreOut]


class CapacityOut(Out):
    flavor: str
    group: str | None
    total: int
    per_host: dict[str, int]
    limits: dict[str, str] = Field(description="host -> why not one more fits there")


class WeigherSettingOut(Out):
    name: str
    multiplier: float
    options: dict[str, Any]


class PolicyOut(Out):
    name: str
    description: str
    sample: int | None
    disabled_filters: list[str]
    filters: list[str] | None
    weighers: list[WeigherSettingOut]


class PolicyList(Out):
    default: str
    policies: list[PolicyOut]


class AgentOut(Out):
    status: Literal["none", "ok", "silent"]
    hypervisor_uri: str | None
    last_seen_at: str | None = Field(description="ISO 8601, UTC, with its offset")
    fence_failures: int = Field(
        0, description="fences of the host's current silence that failed in a row"
    )
    fence_error: str | None = Field(None, description="why the last fence failed")


class RegistrationOut(Out):
    host: HostOut
    refused: dict[str, str] = Field(description="class -> why its new inventory was refused")
    withdrawn: list[str] = Field(
        default=[], description="child providers no longer discovered: inventory withdrawn"
    )
    agent: AgentOut


class WorkDiskOut(Out):
    image: str | None = Field(description="its base image; null: a blank disk")
    size_bytes: int


class WorkQuotaOut(Out):
    disk: dict[str, int] = Field(description="the disk's <iotune>, by libvirt's names")
    vif: dict[str, int] = Field(description="each NIC's limits (inbound.average, ...)")
    cpu: dict[str, int] = Field(description="the domain's <cputune> (shares, period, quota)")


class WorkNicOut(NicOut):
    vnic_type: Literal["direct"] | None = Field(
        default=None,
        description="direct: the NIC is one of the VM's VFs (its flavor's lm:vnic_type), "
        "written as <interface type='hostdev'>; absent: virtio on the host's network",
    )


class WorkItemOut(Out):
    vm: str
    name: str
    action: Literal["launch", "run", "migrate_out", "migrate_in"]
    memory_mb: int
    vcpus: int
    tags: list[str]
    resources: dict[str, int]
    target_host: str | None
    target_uri: str | None
    disk: WorkDiskOut | None = Field(description="the disk its host makes; null: none")
    nics: list[WorkNicOut]
    quota: WorkQuotaOut = Field(description="its flavor's quota: extra specs")
    providers: dict[str, dict[str, int]] = Field(
        default={},
        description="what the claim holds on the host's child providers (NUMA nodes, "
        "devices), by provider: on a launch, an arrival (migrate_in) and, for a VM asking "
        "devices, run",
    )


class WorkListOut(Out):
    host: str
    generation: int
    state: str
    items: list[WorkItemOut]


class ReconcileOut(Out):
    activated: list[str]
    released: list[str]
    stopped: list[str]
    unexpected: list[str]


class HostFailureOut(Out):
    vm: VmOut
    ended: str | None = Field(description="what the failure ended: the claim, the migration")
    placement: PlacementOut | None = None


# -- Placement's shapes. Keys a microversion lacks are left out of the answer, not
# nulled: these routes serialise with ``response_model_exclude_unset``. ----------------


class LinkOut(Out):
    rel: str
    href: str


class VersionOut(Out):
    id: str
    max_version: str
    min_version: str
    status: str
    links: list[LinkOut]


class VersionsOut(Out):
    versions: list[VersionOut]


class ProviderOut(Out):
    uuid: str
    name: str
    generation: int
    links: list[LinkOut]
    parent_provider_uuid: str | None = Field(default=None, description="1.14 and later")
    root_provider_uuid: str | None = Field(default=None, description="1.14 and later")


class ProviderList(Out):
    resource_providers: list[ProviderOut]


class InventoriesOut(Out):
    resource_provider_generation: int
    inventories: dict[str, Inventory]


@dataclass(frozen=True, kw_only=True)
class OneInventoryOut(Inventory):
    resource_provider_generation: int


class ProviderTraitsOut(Out):
    resource_provider_generation: int
    traits: list[str]


class AggregatesOut(Out):
    aggregates: list[str]
    resource_provider_generation: int | None = Field(default=None, description="1.19 and later")


class ProviderUsagesOut(Out):
    resource_provider_generation: int
    usages: dict[str, int] = Field(description="used per class, pending claims counted")


class HostClassUsages(Out):
    resource_provider_generation: int
    classes: dict[str, ClassUsageOut] = Field(
        description="per class: capacity, active, pending, used and free"
    )


class PlacementClassOut(Out):
    name: str
    links: list[LinkOut]


class PlacementClassList(Out):
    resource_classes: list[PlacementClassOut]


class ResourceClassOut(Out):
    name: str
    kind: str
    unit: str
    description: str
    standard: bool


class ResourceClassList(Out):
    classes: list[ResourceClassOut]


class TraitList(Out):
    traits: list[str]


class ResourcesOut(Out):
    resources: dict[str, int]


class HeldOut(ResourcesOut):
    generation: int | None = Field(default=None, description="the provider's generation")


class ConsumerAllocationsOut(Out):
    allocations: dict[str, HeldOut] = Field(description="by provider uuid")
    project_id: str | None = Field(default=None, description="1.12 and later")
    user_id: str | None = Field(default=None, description="1.12 and later")
    consumer_generation: int | None = Field(default=None, description="1.28 and later")
    consumer_type: str | None = Field(default=None, description="1.38 and later")


class ConsumerHoldingOut(ResourcesOut):
    consumer_generation: int | None = Field(default=None, description="from 1.28")


class ProviderAllocationsOut(Out):
    resource_provider_generation: int
    allocations: dict[str, ConsumerHoldingOut] = Field(description="by consumer uuid")


class UsagesOut(Out):
    usages: dict[str, int] | dict[str, dict[str, int]] = Field(
        description="class -> amount; from 1.38 consumer type -> class -> amount, with "
        "consumer_count"
    )


class UuidOut(Out):
    uuid: str


class ListFormAllocation(Out):
    resource_provider: UuidOut
    resources: dict[str, int]


class ListFormRequest(Out):
    allocations: list[ListFormAllocation]


class DictFormRequest(Out):
    allocations: dict[str, ResourcesOut]
    mappings: dict[str, list[str]] | None = Field(default=None, description="1.34 and later")


class CapacityUsedOut(Out):
    capacity: int
    used: int


class SummaryOut(Out):
    resources: dict[str, CapacityUsedOut]
    traits: list[str] | None = Field(default=None, description="1.17 and later")
    parent_provider_uuid: str | None = Field(default=None, description="1.29 and later")
    root_provider_uuid: str | None = Field(default=None, description="1.29 and later")


class CandidatesOut(Out):
    allocation_requests: list[DictFormRequest] | list[ListFormRequest] = Field(
        description="a list of providers and amounts before 1.12, keyed by provider from it"
    )
    provider_summaries: dict[str, SummaryOut]


class GivenDeviceOut(Out):
    provider: str
    address: str = Field(description="the device's PCI address (a mediated device's parent)")
    mdev_uuid: str | None = Field(description="a mediated device's uuid, else null")


class DeviceHolderOut(Out):
    vm: str
    name: str
    amount: int
    state: Literal["pending", "active"]
    devices: list[GivenDeviceOut] = Field(description="which devices its agent gave it")


class DeviceProviderOut(Out):
    provider: str
    parent: str = Field(description="the host, or the NUMA node the devices are on")
    resource_class: str
    total: int
    used: int = Field(description="pending counted")
    traits: list[str]
    holders: list[DeviceHolderOut]


class HostDevicesOut(Out):
    devices: list[DeviceProviderOut]


class VmDevicesOut(Out):
    devices: list[GivenDeviceOut]
