"""``GET /resource_providers`` with ``name``, ``uuid`` or ``in_tree`` asks the database
for those providers only: Nova asks it for one provider at a time, and answering from
every host made the call take seconds at 100,000 hosts."""

from __future__ import annotations

import uuid as uuidlib

from api_helpers import Live, ok
from sqlalchemy import event


def _names(live: Live, query: str) -> list[str]:
    answer = ok(live.admin.get(f"/resource_providers?{query}"))
    return sorted(p["name"] for p in answer["resource_providers"])


def test_name_uuid_and_in_tree_filter_in_the_database(live: Live) -> None:
    lm = live.lm
    for i in range(30):
        lm.hosts.create(f"h{i:02d}", inventories={"VCPU": {"total": 4}})
    lm.hosts.create("numa-0", parent="h07", inventories={"VCPU": {"total": 2}})
    lm.hosts.create("numa-1", parent="h07", inventories={"VCPU": {"total": 2}})
    by_name = {h.name: h.uuid for h in lm.hosts.list()}

    # Upper-case uuids are the same provider.
    assert _names(live, f"uuid={by_name['h03'].upper()}") == ["h03"]
    assert _names(live, "name=h12") == ["h12"]
    assert _names(live, f"in_tree={by_name['numa-1']}") == ["h07", "numa-0", "numa-1"]
    assert _names(live, f"in_tree={by_name['h07']}&name=numa-0") == ["numa-0"]
    assert _names(live, f"in_tree={uuidlib.uuid4()}") == []
    assert _names(live, f"uuid={uuidlib.uuid4()}") == []

    # One provider asked for: no statement reads the hosts table unfiltered.
    reads: list[str] = []

    def seen(_conn, _cursor, statement, _params, _context, _many) -> None:  # type: ignore[no-untyped-def]
        if "FROM hosts" in statement:
            reads.append(" ".join(statement.split()))

    event.listen(lm.store.engine, "after_cursor_execute", seen)
    try:
        answer = live.admin.get(f"/resource_providers?uuid={by_name['h21']}")
    finally:
        event.remove(lm.store.engine, "after_cursor_execute", seen)
    assert [p["name"] for p in ok(answer)["resource_providers"]] == ["h21"]
    assert reads and all("WHERE" in r.split("FROM hosts", 1)[1] for r in reads), reads
