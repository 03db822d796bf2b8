"""Hosts, flavors, VMs and the vocabulary describing them (classes, traits)."""

from loadmaster.cluster.catalog import (
    FlavorService,
    ResourceClassService,
    TraitService,
    sync_standard_vocabulary,
)
from loadmaster.cluster.groups import GROUP_POLICIES, GroupService
from loadmaster.cluster.hosts import HostService
from loadmaster.cluster.records import (
    AllocationRecord,
    ClassUsage,
    FlavorRecord,
    GroupRecord,
    HostRecord,
    VmRecord,
)
from loadmaster.cluster.vms import VM_STATES, VmService, VmSpec

__all__ = [
    "GROUP_POLICIES",
    "VM_STATES",
    "AllocationRecord",
    "ClassUsage",
    "FlavorRecord",
    "FlavorService",
    "GroupRecord",
    "GroupService",
    "HostRecord",
    "HostService",
    "ResourceClassService",
    "TraitService",
    "VmRecord",
    "VmService",
    "VmSpec",
    "sync_standard_vocabulary",
]
