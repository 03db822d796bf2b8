"""SQLAlchemy tables. Usage is never stored: it is always a SUM over ``allocations``."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class ResourceClassRow(Base):
    __tablename__ = "resource_classes"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    kind: Mapped[str] = mapped_column(String(255))
    unit: Mapped[str] = mapped_column(String(255))
    description: Mapped[str] = mapped_column(Text, default="")


class TraitRow(Base):
    __tablename__ = "traits"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)


class HostRow(Base):
    """A resource provider: a compute host, or a child of one (NUMA cell, NIC)."""

    __tablename__ = "hosts"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uuid: Mapped[str] = mapped_column(String(36), unique=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    state: Mapped[str] = mapped_column(String(16), default="up")
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("hosts.id"), nullable=True)
    root_id: Mapped[int | None] = mapped_column(ForeignKey("hosts.id"), nullable=True, index=True)
    generation: Mapped[int] = mapped_column(BigInteger, default=0)
    # The cluster clock's value when anything a scheduler reads of this provider last
    # changed (see ``ClusterClockRow``); a scheduler reloads only what moved past its own.
    changed_seq: Mapped[int] = mapped_column(BigInteger, default=0, index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime)
    updated_at: Mapped[datetime] = mapped_column(DateTime)
    __table_args__ = (CheckConstraint("state IN ('up', 'maintenance', 'down')", name="host_state"),)


class ClusterClockRow(Base):
    """One row: ``seq`` moves with every change to what schedulers read of the hosts, and
    ``layout_seq`` with every change to which providers exist and how they nest. A
    scheduler that saw both values has nothing to reload; one that saw an older ``seq``
    reloads the hosts whose ``changed_seq`` is newer, and only those. The row is locked
    last in every writer (see ``store.locking``), so commits take values in order."""

    __tablename__ = "cluster_clock"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, default=0)
    layout_seq: Mapped[int] = mapped_column(BigInteger, default=0)


class HostTraitRow(Base):
    __tablename__ = "host_traits"
    host_id: Mapped[int] = mapped_column(
        ForeignKey("hosts.id", ondelete="CASCADE"), primary_key=True
    )
    trait_id: Mapped[int] = mapped_column(ForeignKey("traits.id"), primary_key=True, index=True)


class HostAggregateRow(Base):
    __tablename__ = "host_aggregates"
    host_id: Mapped[int] = mapped_column(
        ForeignKey("hosts.id", ondelete="CASCADE"), primary_key=True
    )
    aggregate: Mapped[str] = mapped_column(String(255), primary_key=True, index=True)


class InventoryRow(Base):
    __tablename__ = "inventories"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id", ondelete="CASCADE"))
    resource_class_id: Mapped[int] = mapped_column(ForeignKey("resource_classes.id"), index=True)
    total: Mapped[int] = mapped_column(BigInteger)
    reserved: Mapped[int] = mapped_column(BigInteger, default=0)
    min_unit: Mapped[int] = mapped_column(BigInteger, default=1)
    max_unit: Mapped[int] = mapped_column(BigInteger)
    step_size: Mapped[int] = mapped_column(BigInteger, default=1)
    allocation_ratio: Mapped[float] = mapped_column(Float, default=1.0)
    __table_args__ = (
        UniqueConstraint("host_id", "resource_class_id", name="uq_inventory_host_class"),
    )


class FlavorRow(Base):
    __tablename__ = "flavors"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    resources: Mapped[dict[str, int]] = mapped_column(JSON)
    required_traits: Mapped[list[str]] = mapped_column(JSON)
    forbidden_traits: Mapped[list[str]] = mapped_column(JSON)
    extra_specs: Mapped[dict[str, str]] = mapped_column(JSON)
    # Per class, the traits the provider it is taken from must have (a PCI alias's).
    class_traits: Mapped[dict[str, list[str]]] = mapped_column(
        JSON, default=dict, server_default="{}"
    )


class ImageRow(Base):
    """A base image VMs' disks are made from; its file reaches each host separately (the
    host's agent finds it in its image directory). ``size_bytes``: the size the guest
    sees, which a VM's DISK_GB must hold."""

    __tablename__ = "images"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(DateTime)


class ServerGroupRow(Base):
    __tablename__ = "server_groups"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uuid: Mapped[str] = mapped_column(String(36), unique=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    policy: Mapped[str] = mapped_column(String(32))
    max_per_host: Mapped[int | None] = mapped_column(Integer, nullable=True)


class ConsumerRow(Base):
    """Placement's consumer: whoever holds allocations, named by any uuid. A VM is one
    (``vms.consumer_id``, same uuid) with the lifecycle Placement lacks; a plain consumer
    is written by Placement's clients only. ``generation`` moves with every change to its
    records, whoever makes it, so a Placement client never overwrites what it has not seen."""

    __tablename__ = "consumers"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uuid: Mapped[str] = mapped_column(String(36), unique=True)
    project_id: Mapped[str] = mapped_column(String(255), index=True)
    user_id: Mapped[str] = mapped_column(String(255), index=True)
    consumer_type: Mapped[str] = mapped_column(String(255), default="INSTANCE")
    generation: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime)
    updated_at: Mapped[datetime] = mapped_column(DateTime)


class VmRow(Base):
    """A consumer of resources with a lifecycle. ``host_id`` is where it runs or is headed;
    ``target_host_id`` is the destination of a migration in flight."""

    __tablename__ = "vms"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uuid: Mapped[str] = mapped_column(String(36), unique=True)
    consumer_id: Mapped[int] = mapped_column(
        ForeignKey("consumers.id", ondelete="CASCADE"), unique=True
    )
    name: Mapped[str] = mapped_column(String(255))
    project_id: Mapped[str] = mapped_column(String(255), index=True)
    user_id: Mapped[str] = mapped_column(String(255))
    # NULL only for a deleted VM whose flavor was deleted after it.
    flavor_id: Mapped[int | None] = mapped_column(
        ForeignKey("flavors.id"), nullable=True, index=True
    )
    overrides: Mapped[dict[str, int]] = mapped_column(JSON)
    tags: Mapped[list[str]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16), index=True)
    host_id: Mapped[int | None] = mapped_column(ForeignKey("hosts.id"), nullable=True, index=True)
    target_host_id: Mapped[int | None] = mapped_column(ForeignKey("hosts.id"), nullable=True)
    group_id: Mapped[int | None] = mapped_column(
        ForeignKey("server_groups.id"), nullable=True, index=True
    )
    generation: Mapped[int] = mapped_column(BigInteger, default=0)
    # The generation of its host (root) right after its claim or activation there: a host
    # agent that has read the host at that generation or later knows of it, whatever the
    # clocks say (see ``Ledger.reconcile``).
    host_seq: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # Why the last launch or migration failed, in the host's words; kept until it runs.
    fault: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Hosts that refused or failed to launch it since it was last started, so a retry
    # goes elsewhere (Nova's alternates).
    tried_hosts: Mapped[list[str]] = mapped_column(JSON, default=list)
    created_at: Mapped[datetime] = mapped_column(DateTime)
    updated_at: Mapped[datetime] = mapped_column(DateTime)
    # The base image its disk is an overlay of (None: a blank disk, or none).
    image: Mapped[str | None] = mapped_column(String(100), nullable=True)
    # Its NICs, [{"network": ..., "mac": ...}]: the MAC is chosen once, at creation, and
    # is the same on every host it runs on.
    nics: Mapped[list[dict[str, str]]] = mapped_column(JSON, default=list, server_default="[]")


class VmEventRow(Base):
    """One change of a VM's state, host or migration target, written by the transaction
    that made it (``store.history``): the ledger's account of what happened, which a
    sampler reading the VMs now and then cannot give (a move that begins and ends between
    two reads). Hosts by name: the account outlives a deleted host."""

    __tablename__ = "vm_events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    vm_id: Mapped[int] = mapped_column(ForeignKey("vms.id", ondelete="CASCADE"), index=True)
    at: Mapped[datetime] = mapped_column(DateTime)
    old_state: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16))
    old_host: Mapped[str | None] = mapped_column(String(255), nullable=True)
    host: Mapped[str | None] = mapped_column(String(255), nullable=True)
    old_target: Mapped[str | None] = mapped_column(String(255), nullable=True)
    target: Mapped[str | None] = mapped_column(String(255), nullable=True)
    # The fault the same change set (a refused launch, a failed migration), else null.
    fault: Mapped[str | None] = mapped_column(Text, nullable=True)


class AllocationRow(Base):
    """One record per (consumer, provider, resource class): the pending-resource record of
    oVirt's PRM and the allocation of Placement in one table, told apart by ``state``."""

    __tablename__ = "allocations"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    # Searched by the unique constraint below, which begins with it (no index of its own).
    consumer_id: Mapped[int] = mapped_column(ForeignKey("consumers.id", ondelete="CASCADE"))
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id"))
    resource_class_id: Mapped[int] = mapped_column(ForeignKey("resource_classes.id"))
    amount: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(String(8))
    created_at: Mapped[datetime] = mapped_column(DateTime)
    __table_args__ = (
        UniqueConstraint(
            "consumer_id", "host_id", "resource_class_id", name="uq_allocation_consumer_host_class"
        ),
        CheckConstraint("state IN ('pending', 'active')", name="allocation_state"),
        CheckConstraint("amount > 0", name="allocation_amount_positive"),
        Index("ix_allocations_host_class", "host_id", "resource_class_id", "state", "amount"),
    )


class VmDeviceRow(Base):
    """A host device an agent gave a VM (its PCI address, and for a mediated device its
    uuid), under the device provider the VM's claim holds. Written when the VM comes up;
    shown only while the VM still holds records on that provider."""

    __tablename__ = "vm_devices"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    vm_id: Mapped[int] = mapped_column(ForeignKey("vms.id", ondelete="CASCADE"), index=True)
    provider_id: Mapped[int] = mapped_column(ForeignKey("hosts.id", ondelete="CASCADE"), index=True)
    address: Mapped[str] = mapped_column(String(64))
    mdev_uuid: Mapped[str | None] = mapped_column(String(36), nullable=True)


class HostReportRow(Base):
    """The latest report from a host's agent: measured usage and load, and the VMs it
    listed running in the last report that changed the ledger (written by the
    reconciliation, with ``host_agents.seen_generation``; read by the audit)."""

    __tablename__ = "host_reports"
    host_id: Mapped[int] = mapped_column(
        ForeignKey("hosts.id", ondelete="CASCADE"), primary_key=True
    )
    reported_at: Mapped[datetime] = mapped_column(DateTime)
    usage: Mapped[dict[str, float]] = mapped_column(JSON)
    load: Mapped[dict[str, float]] = mapped_column(JSON)
    running_vms: Mapped[list[str]] = mapped_column(JSON)


class HostAgentRow(Base):
    """The agent managing a host: where its hypervisor is reached (for migrations to it) and
    when it was last heard from, by the server's clock only."""

    __tablename__ = "host_agents"
    host_id: Mapped[int] = mapped_column(
        ForeignKey("hosts.id", ondelete="CASCADE"), primary_key=True
    )
    hypervisor_uri: Mapped[str] = mapped_column(String(1024))
    registered_at: Mapped[datetime] = mapped_column(DateTime)
    last_seen_at: Mapped[datetime] = mapped_column(DateTime)
    # The host generation of the last work list the agent had read when it listed the VMs
    # of ``host_reports.running_vms``.
    seen_generation: Mapped[int] = mapped_column(BigInteger, default=0)
    # When a server process took on fencing the host, its agent silent (compare-and-swap:
    # one process fences a host per silence; NULL: never).
    fence_claimed_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    # Fences of this silence that failed in a row (the next try backs off), and why the
    # last one failed (NULL once one succeeds).
    fence_failures: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    fence_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The run of the host's manager (drawn at each start, ``AGENT_RUN_HEADER``) last heard,
    # and the run that last read the host's work list: the host takes VMs only while they
    # are the same (NULL: a manager that never said its run, judged by silence alone).
    agent_run: Mapped[str | None] = mapped_column(String(64), nullable=True)
    listed_run: Mapped[str | None] = mapped_column(String(64), nullable=True)
