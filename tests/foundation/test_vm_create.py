"""Creating VMs on the statement driver: the rows are what the ORM wrote, a bad spec
anywhere in a batch writes nothing, and a retry is answered from what was written."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Text, cast, func, select

from loadmaster.cluster import VmSpec
from loadmaster.errors import Conflict, LoadmasterError, NotFound, ValidationError
from loadmaster.service import Loadmaster
from loadmaster.store.locking import clock
from loadmaster.store.schema import ConsumerRow, VmRow

TAKEN = "00000000-0000-4000-8000-0000000000aa"


@pytest.fixture
def cluster(lm: Loadmaster) -> Loadmaster:
    lm.resource_classes.create("CUSTOM_GPU", kind="accelerator", unit="gpu")
    lm.hosts.create("h1", inventories={"VCPU": {"total": 8}, "MEMORY_MB": {"total": 8192}})
    lm.flavors.create({"name": "small", "resources": {"VCPU": 1, "MEMORY_MB": 512}})
    lm.flavors.create(
        {"name": "gpu", "resources": {"CUSTOM_GPU": 1}, "required_traits": ["HW_CPU_X86_AVX2"]}
    )
    lm.groups.create("web", "anti-affinity")
    stamp = lm.vms.create("seed", "small").created_at
    with lm.store.write() as session:
        session.add(
            ConsumerRow(uuid=TAKEN, project_id="p", user_id="u", created_at=stamp, updated_at=stamp)
        )
    return lm


def _stored(lm: Loadmaster, row: type[VmRow] | type[ConsumerRow], uuid: str) -> dict[str, Any]:
    """The row as the database holds it (JSON and timestamps as their text), but for the
    columns that differ between any two VMs."""
    table = row.__table__
    columns = [cast(c, Text).label(c.name) for c in table.columns if c.name not in ("id",)]
    with lm.store.read() as session:
        found = session.execute(select(*columns).where(table.c.uuid == uuid)).mappings().one()
    return {k: v for k, v in found.items() if k not in ("uuid", "consumer_id")}


def _counts(lm: Loadmaster) -> tuple[int, int, int]:
    with lm.store.read() as session:
        return (
            session.scalar(select(func.count()).select_from(VmRow)) or 0,
            session.scalar(select(func.count()).select_from(ConsumerRow)) or 0,
            clock(session)[0],
        )


def test_a_create_writes_what_the_orm_wrote(cluster: Loadmaster) -> None:
    lm = cluster
    before = _counts(lm)
    made = lm.vms.create_many(
        [
            VmSpec(
                "a",
                "small",
                project_id="p1",
                user_id="u1",
                overrides={"MEMORY_MB": 1024, "CUSTOM_GPU": 1},
                tags=["gold", "db"],
                group="web",
                uuid="00000000-0000-4000-8000-000000000001".upper(),
            ),
            VmSpec("b", "gpu"),
        ]
    )
    a, b = made
    # The old path: ORM entities flushed, the same values.
    twin = "00000000-0000-4000-8000-000000000002"
    with lm.store.write() as session:
        consumer = ConsumerRow(
            uuid=twin,
            project_id="p1",
            user_id="u1",
            consumer_type="INSTANCE",
            generation=0,
            created_at=a.created_at,
            updated_at=a.updated_at,
        )
        session.add(consumer)
        session.flush()
        vm = session.scalars(select(VmRow).where(VmRow.uuid == a.uuid)).one()
        session.add(
            VmRow(
                uuid=twin,
                consumer_id=consumer.id,
                name="a",
                project_id="p1",
                user_id="u1",
                flavor_id=vm.flavor_id,
                overrides={"MEMORY_MB": 1024, "CUSTOM_GPU": 1},
                tags=["db", "gold"],
                state="requested",
                group_id=vm.group_id,
                generation=0,
                created_at=a.created_at,
                updated_at=a.updated_at,
                nics=vm.nics,  # its MAC is made up at random
            )
        )
    assert a.uuid == "00000000-0000-4000-8000-000000000001"
    assert _stored(lm, VmRow, a.uuid) == _stored(lm, VmRow, twin)
    assert _stored(lm, ConsumerRow, a.uuid) == _stored(lm, ConsumerRow, twin)
    with lm.store.read() as session:
        pairs = session.execute(
            select(VmRow.uuid, ConsumerRow.uuid).join(
                ConsumerRow, ConsumerRow.id == VmRow.consumer_id
            )
        ).all()
    assert all(vm_uuid == consumer_uuid for vm_uuid, consumer_uuid in pairs)
    # The answers are the records as read back.
    assert [lm.vms.get(a.uuid), lm.vms.get(b.uuid)] == made
    assert a.resources == {"VCPU": 1, "MEMORY_MB": 1024, "CUSTOM_GPU": 1}
    assert (a.group, a.tags, a.required_traits) == ("web", ("db", "gold"), ())
    assert (b.group, b.overrides, b.required_traits) == (None, {}, ("HW_CPU_X86_AVX2",))
    # A VM comes into the history with its first change, not its creation, and nothing a
    # scheduler reads from the clock changed.
    assert lm.vms.events() == []
    assert _counts(lm) == (before[0] + 3, before[1] + 3, before[2])


@pytest.mark.parametrize(
    ("bad", "error", "field"),
    [
        (VmSpec("x", "nope"), NotFound, "vms[1].flavor"),
        (VmSpec("x", "small", group="nope"), NotFound, "vms[1].group"),
        (
            VmSpec("x", "small", overrides={"CUSTOM_NOPE": 1}),
            NotFound,
            "vms[1].overrides.CUSTOM_NOPE",
        ),
        (VmSpec("x", "gpu", overrides={"CUSTOM_GPU": 0}), ValidationError, "vms[1].overrides"),
        (VmSpec("x", "small", uuid="00000000-0000-4000-8000-000000000001"), Conflict, "uuid"),
        (VmSpec("x", "small", uuid=TAKEN), Conflict, "uuid"),
    ],
)
def test_a_bad_spec_anywhere_writes_nothing(
    cluster: Loadmaster, bad: VmSpec, error: type[LoadmasterError], field: str
) -> None:
    lm = cluster
    before = _counts(lm)
    good = VmSpec("ok", "small", uuid="00000000-0000-4000-8000-000000000001")
    with pytest.raises(error) as caught:
        lm.vms.create_many([good, bad, VmSpec("ok2", "gpu")])
    assert caught.value.field == field
    assert _counts(lm) == before
    assert [vm.name for vm in lm.vms.list()] == ["seed"]


def test_a_retry_is_answered_from_what_was_written(cluster: Loadmaster) -> None:
    lm = cluster
    spec = VmSpec("r", "small", tags=["gold"], group="web", uuid=TAKEN.replace("aa", "bb"))
    first = lm.vms.create_many([spec])
    lm.allocations.claim(first[0].uuid, "h1")
    placed = lm.vms.get(first[0].uuid)
    before = _counts(lm)
    # Answered as it is now (its first answer was lost), alongside a new VM.
    again, new = lm.vms.create_many([spec, VmSpec("s", "gpu")])
    assert again == placed and again.created_at == first[0].created_at
    assert new.state == "requested"
    assert _counts(lm)[:2] == (before[0] + 1, before[1] + 1)
    with pytest.raises(Conflict, match="another flavor") as caught:
        lm.vms.create_many([VmSpec("s2", "gpu"), VmSpec("r", "gpu", uuid=spec.uuid)])
    assert caught.value.field == "vms[1].uuid"
    with pytest.raises(Conflict, match="another group"):
        lm.vms.create("r", "small", tags=["gold"], uuid=spec.uuid)
