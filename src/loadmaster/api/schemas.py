"""Request bodies. Types and unknown keys are checked here (``extra="forbid"``, strict
types: ``"4"`` is not a number); the rules (ranges, names, capacity) stay in the domain,
which checks them for Python callers too. A body that is a domain shape as it is (a VM to
create, a scheduling request) is the domain's own dataclass, not a copy of it here."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic import ValidationError as PydanticValidationError

from loadmaster.cluster.vms import Tag
from loadmaster.errors import ValidationError
from loadmaster.resources import Inventory
from loadmaster.scheduler import RequestSpec
from loadmaster.shapes import MAX_INT, Amount, Generation, Name


def _text_only(value: object) -> object:
    if not isinstance(value, str):
        raise ValueError("must be an ISO 8601 date-time string")
    return value


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    def fields(self) -> dict[str, Any]:
        """What the client sent, so domain defaults apply to what it left out."""
        return self.model_dump(exclude_unset=True)


class ResourceClassFields(Body):
    kind: Name = "custom"
    unit: Name = "unit"
    description: Annotated[str, Field(max_length=255)] = ""


class ResourceClassCreate(ResourceClassFields):
    name: Name


# Placement's schema for a custom class's name.
CLASS_NAME_PATTERN = r"^CUSTOM_[A-Z0-9_]+$"
PlacementClassName = Annotated[str, Field(max_length=255, pattern=CLASS_NAME_PATTERN)]


class PlacementClassCreate(Body):
    name: PlacementClassName


def check_class_name(name: str) -> None:
    """A class name in a path, checked as Placement's schema checks it in a body."""
    try:
        PlacementClassCreate(name=name)
    except PydanticValidationError as exc:
        error = exc.errors()[0]
        keyword = "maxLength" if error["type"] == "string_too_long" else "pattern"
        raise ValidationError(
            f"JSON does not validate: {name!r} does not match {CLASS_NAME_PATTERN!r} or is "
            f"longer than 255. Failed validating {keyword!r}",
            field="name",
        ) from None


class RootHostCreate(Body):
    name: Name
    uuid: Name | None = None
    state: Name = "up"
    inventories: dict[str, Inventory] = {}
    traits: list[Name] = []
    aggregates: list[Name] = []


class HostCreate(RootHostCreate):
    parent_provider_uuid: Name | None = None


class HostsCreate(Body):
    """``POST /bulk/hosts``: many root hosts at once, all or none; a cloud of 10,000
    hosts registers in one request instead of 10,000."""

    hosts: Annotated[list[RootHostCreate], Field(min_length=1, max_length=10_000)]


class HostTraitsPut(Body):
    traits: list[Name]
    resource_provider_generation: Generation | None = None


class HostAggregatesPut(Body):
    aggregates: list[Name]
    resource_provider_generation: Generation | None = None


class HostUpdate(Body):
    state: Name
    resource_provider_generation: Generation | None = None


# Placement's schema: a provider's name is at most 200 characters.
ProviderName = Annotated[str, Field(min_length=1, max_length=200)]


class ProviderCreate(Body):
    """Placement's body: a provider is created bare; inventories, traits and aggregates
    are written on their own paths."""

    name: ProviderName
    uuid: Name | None = None
    parent_provider_uuid: Name | None = None


class ProviderPut(Body):
    name: ProviderName
    parent_provider_uuid: Name | None = None


class InventoriesPut(Body):
    resource_provider_generation: Generation
    inventories: dict[str, Inventory]


class ReshaperIn(Body):
    """``POST /reshaper``: providers' whole inventory sets and consumers' allocations (in
    ``POST /allocations``'s form), replaced together."""

    inventories: dict[str, InventoriesPut]
    allocations: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class InventoryPost(Inventory):
    resource_class: Name
    resource_provider_generation: Generation | None = None


@dataclass(frozen=True, kw_only=True)
class InventoryPut(Inventory):
    resource_provider_generation: Generation


class TraitsPut(Body):
    resource_provider_generation: Generation
    traits: list[Name]


class AggregatesPut(Body):
    resource_provider_generation: Generation
    aggregates: list[Name]


class FlavorCreate(Body):
    name: Name
    resources: dict[str, Amount] = {}
    required_traits: list[Name] = []
    forbidden_traits: list[Name] = []
    extra_specs: dict[str, Annotated[str, Field(max_length=255)]] = {}
    # What an extra spec loadmaster does not know does: refuse the flavor or warn (kept,
    # not applied, named in the answer's warnings). Default: the server's setting.
    unknown_specs: Literal["refuse", "warn"] | None = None


class ImagePut(Body):
    size_bytes: int = Field(
        gt=0, description="the size the guest sees (a qcow2's virtual size), in bytes"
    )


class VmStart(Body):
    policy: Name | None = None
    host: Name | None = Field(
        None,
        description="start it on this host (admin only); every filter but the choice of "
        "host still applies, and a host that does not fit is refused with the reasons",
    )


class VmMigrate(Body):
    host: Name | None = None
    reason: Annotated[str, Field(max_length=1024)] | None = None
    policy: Name | None = None


class Claim(Body):
    host: Name
    resource_provider_generation: Generation | None = None


class GroupCreate(Body):
    name: Name
    policy: Name
    max_per_host: Annotated[int, Field(ge=1, le=MAX_INT)] | None = None


class ScheduleIn(Body):
    requests: Annotated[list[RequestSpec], Field(min_length=1, max_length=1000)]
    gang: bool = False
    dry_run: bool = False
    policy: Name | None = None
    # Replays a decision: the seed a result reports, given again on the same state.
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] | None = None


class HostReport(Body):
    # Left out: a report of measurements only; the ledger is not reconciled.
    running_vms: list[Name] | None = None
    # VMs the host's agent is starting: never taken for gone, however long it takes.
    launching: list[Name] = []
    # The host generation of the last work list the agent read before listing its VMs;
    # with it the report is judged by sequence, not by clocks.
    seen_generation: Generation | None = None
    usage: dict[str, Annotated[float, Field(ge=0)]] = {}
    load: dict[str, Annotated[float, Field(ge=0, le=1)]] = {}
    # ISO 8601 text only: not strict (which refuses text) and not lax (which takes numbers).
    as_of: Annotated[datetime, Field(strict=False), BeforeValidator(_text_only)] | None = None


class SharedPoolIn(Body):
    """A storage pool the host mounts with others: its name, the same on each of them,
    and its inventory (DISK_GB), which their sharing provider of that name offers."""

    name: Name
    inventories: dict[str, Inventory] = {}


class AgentRegistration(Body):
    """What a host's agent discovered: the root's inventories and its children's (NUMA
    cells, devices), by child provider name."""

    hypervisor_uri: Annotated[str, Field(min_length=1, max_length=1024)]
    inventories: dict[str, Inventory] = {}
    children: dict[Name, dict[str, Inventory]] = {}
    # Traits of some of the children (devices: their class's traits), replacing theirs.
    child_traits: dict[Name, list[Name]] = {}
    # A child's parent among the other children (a device under its NUMA node); the
    # others are the host's own.
    child_parents: dict[Name, Name] = {}
    # Absent: the host mounts no shared pool (it leaves the one it was in).
    shared_pool: SharedPoolIn | None = None


class HostFailure(Body):
    """A host's word that it could not do what the ledger asked of it."""

    host: Name
    reason: Annotated[str, Field(min_length=1, max_length=2000)]


class VmTags(Body):
    tags: list[Tag]


class DrainRequest(Body):
    force: bool = False


class EvacuateRequest(Body):
    confirm_down: bool = Field(
        default=False,
        description="the operator confirms the host is off (powered down, its VMs dead)",
    )
    force: bool = Field(
        default=False,
        description="with confirm_down: evacuate at once, even if the host's agent was heard "
        "within the silence threshold",
    )


class GivenDevice(Body):
    provider: Name
    address: Annotated[str, Field(min_length=1, max_length=64)]
    mdev_uuid: Annotated[str, Field(max_length=36)] | None = None


class VmUp(Body):
    host: Name | None = None
    # The host devices its agent gave it (with ``host``); left out: unchanged.
    devices: Annotated[list[GivenDevice], Field(max_length=64)] | None = None
