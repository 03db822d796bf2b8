"""Maintenance drain: a host in maintenance gives up every VM in one batch, the server-group
rules hold at every committed moment (even with another client placing members of the same
groups meanwhile), and a VM that fits nowhere is explained, or stopped with ``force``."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

import pytest
from sqlalchemy import select
from tests.foundation.dbstate import dump
from tests.scheduler.conftest import add_hosts, small_flavor

import loadmaster
from loadmaster.cluster import VmRecord
from loadmaster.errors import (
    Conflict,
    InvalidTransition,
    LoadmasterError,
    NotFound,
    ValidationError,
)
from loadmaster.pending import audit, group_rule_problems
from loadmaster.scheduler import RequestSpec
from loadmaster.scheduler.drain import DrainResult
from loadmaster.service import Loadmaster
from loadmaster.store.schema import HostRow, VmRow

PLACED = ("pending", "running", "migrating")


def group_violations(lm: Loadmaster) -> list[str]:
    """Every broken hard rule in the committed state (one snapshot; a migrating member
    counts on both its hosts)."""
    return [f"{p.subject}: {p.detail}" for p in group_rule_problems(lm.store)]


class Checker:
    """Reads the committed state after each step it is told of (and keeps every problem)."""

    def __init__(self, lm: Loadmaster) -> None:
        self.lm = lm
        self.steps = 0
        self.problems: list[str] = []
        self._lock = threading.Lock()

    def step(self, what: str) -> None:
        found = group_violations(self.lm)
        with self._lock:
            self.steps += 1
            self.problems += [f"after {what}: {p}" for p in found]


def vms_on(lm: Loadmaster, host: str) -> list[str]:
    return [v.vm for v in lm.maintenance.status(host).vms_left]


def act_as_agents(
    lm: Loadmaster,
    host: str,
    check: Checker,
    *,
    fails: Callable[[VmRecord], bool],
    meanwhile: Callable[[], None],
) -> int:
    """The host agents carry out what the drain asked: a migration away from ``host``
    completes (activate) or ``fails`` (release the destination); a VM re-placed while
    pending starts on its new host (activate). ``meanwhile`` runs before each migration
    ends (a migration takes a while: others act meanwhile). Returns how many migrations
    failed."""
    aborted = 0
    for vm in lm.vms.list(state="migrating"):
        if vm.host != host:
            continue
        meanwhile()
        if fails(vm):
            lm.allocations.release(vm.uuid, host=vm.target_host)
            aborted += 1
            check.step(f"abort {vm.name}")
        else:
            lm.allocations.activate(vm.uuid)
            check.step(f"activate {vm.name}")
    for vm in lm.vms.list(state="pending"):
        if vm.name.startswith("d-"):  # the drained host's VMs that were only pending
            lm.allocations.activate(vm.uuid)
            check.step(f"start {vm.name}")
    return aborted


def start_on(lm: Loadmaster, vm: str, host: str) -> None:
    lm.allocations.claim(vm, host)
    lm.allocations.activate(vm)


@pytest.fixture
def grouped(lm: Loadmaster) -> Loadmaster:
    """h0 (to drain) runs members of three groups and holds two pending claims. Each host
    has room for 32 small VMs, more than are ever placed here: only the group rules
    decide where a VM may go."""
    add_hosts(lm, 6, vcpu=64, memory=131072)
    small_flavor(lm)
    lm.groups.create("apart", "anti-affinity")
    lm.groups.create("together", "affinity")
    lm.groups.create("capped", "anti-affinity", max_per_host=2)

    def vm(name: str, group: str | None) -> str:
        return lm.vms.create(name, "small", group=group).uuid

    for i in range(3):
        start_on(lm, vm(f"d-apart{i}", "apart") if i == 0 else vm(f"apart{i}", "apart"), f"h{i}")
    for i in range(3):
        start_on(lm, vm(f"d-together{i}", "together"), "h0")
    lm.allocations.claim(vm("d-together-pending", "together"), "h0")  # claimed, not started
    for i in range(2):
        start_on(lm, vm(f"d-capped{i}", "capped"), "h0")
        start_on(lm, vm(f"capped-h1-{i}", "capped"), "h1")
    for i in range(4):
        start_on(lm, vm(f"d-plain{i}", None), "h0")
    lm.allocations.claim(vm("d-plain-pending", None), "h0")
    assert group_violations(lm) == []
    return lm


class Progress:
    """How many cycles the concurrent client has completed; the test waits for more at
    each point where it lets the client act, so that the interleaving does not depend on
    how fast either side runs."""

    def __init__(self) -> None:
        self.cycles = 0
        self.stopped = False
        self._changed = threading.Condition()

    def cycle_done(self) -> None:
        with self._changed:
            self.cycles += 1
            self._changed.notify_all()

    def end(self) -> None:
        with self._changed:
            self.stopped = True
            self._changed.notify_all()

    def wait_for_more(self, cycles: int = 1) -> None:
        with self._changed:
            wanted = self.cycles + cycles
            assert self._changed.wait_for(
                lambda: self.cycles >= wanted or self.stopped, timeout=120
            ), "the concurrent client made no progress"
            assert not self.stopped, "the concurrent client ended early"


def test_drain_keeps_group_rules_at_every_step_against_a_concurrent_client(
    grouped: Loadmaster, db_url: str
) -> None:
    """The client runs in its own thread and service throughout, and completes at least
    one cycle between any two steps of the drain's agents; what it may take is bounded so
    that the drain always has a legal host for each member, whatever the interleaving:
    hosts never fill (see ``grouped``); the one apart member it keeps and the one probe it
    holds at a time leave one of h3..h5 free of the group for d-apart0; the two capped
    members it keeps and a probe leave five of the eight capped places on h2..h5 for the
    two drained ones (h1 is at the cap for good). Probes that break a rule by
    construction (apart or capped on h1, where members stay for good) must be refused;
    the others are checked by the checker after every step."""
    lm = grouped
    check = Checker(lm)
    drained = vms_on(lm, "h0")
    assert len(drained) == 12
    stop = threading.Event()
    progress = Progress()
    client_errors: list[BaseException] = []
    started: list[str] = []
    ready = threading.Event()  # the client's first cycle is done: the drain may start
    landed: list[bool] = []  # probes the rules allowed at that moment (or not, by a race)
    refused: list[bool] = []  # probes on h1, which the rules forbid for good: refused?
    rng_client = random.Random(11)

    def probe(other: Loadmaster, group: str, n: int, host: str) -> bool:
        uuid = other.vms.create(f"p-{group}{n}-{host}", "small", group=group).uuid
        try:
            other.allocations.claim(uuid, host)
            return True
        except LoadmasterError:
            return False
        finally:
            check.step(f"client probe {group} on {host}")
            other.allocations.delete(uuid)
            check.step("client delete")

    def client() -> None:
        """Another client starts members of the same groups while the drain runs: through
        its own scheduler (members it keeps, within ``budget``), and by claiming a host
        directly (a probe it deletes again), so that the ledger alone has to refuse what
        breaks a rule."""
        other = loadmaster.open(db_url, migrate=False)
        budget = {"apart": 1, "capped": 2, "together": 4}
        groups = ("apart", "together", "capped")
        try:
            # Before the drain nothing else moves: the apart member is kept (h3..h5 are
            # free of the group), a capped probe on h2 lands, one on h1 is refused.
            first = other.vms.create("c-apart0", "small", group="apart").uuid
            assert other.scheduler.schedule([RequestSpec(vms=[first])]).ok
            other.allocations.activate(first)
            budget["apart"] -= 1
            started.append(first)
            check.step("client start apart")
            assert probe(other, "capped", 0, "h2")
            assert not probe(other, "capped", 0, "h1")
            progress.cycle_done()
            ready.set()
            n = 0
            while not stop.is_set():
                group = groups[n % 3]
                n += 1
                if budget[group]:
                    uuid = other.vms.create(f"c-{group}{n}", "small", group=group).uuid
                    result = other.scheduler.schedule([RequestSpec(vms=[uuid])])
                    check.step(f"client schedule {group}")
                    if result.ok:
                        budget[group] -= 1
                        other.allocations.activate(uuid)
                        check.step(f"client start {group}")
                        started.append(uuid)
                    else:
                        other.allocations.delete(uuid)
                # Half the probes aim where migrations are headed: the riskiest hosts.
                heading = [v.target_host for v in other.vms.list(state="migrating")]
                target = (
                    rng_client.choice(heading)
                    if heading and n % 2
                    else f"h{rng_client.randrange(2, 6)}"
                )
                landed.append(probe(other, group, n, str(target)))
                if group != "together":
                    refused.append(not probe(other, group, n, "h1"))
                progress.cycle_done()
        except BaseException as exc:  # reported by the main thread
            client_errors.append(exc)
        finally:
            progress.end()
            other.close()

    # A checker that does nothing but read the committed state, as often as it can.
    def watch() -> None:
        while not stop.is_set():
            check.step("watching")

    threads = [threading.Thread(target=client), threading.Thread(target=watch)]
    for t in threads:
        t.start()
    try:
        assert ready.wait(timeout=120), client_errors
        first = lm.maintenance.drain("h0")
        check.step("drain")
        progress.wait_for_more(3)  # the client acts while every migration is under way
        assert first.status.status == "draining"
        assert "h0" not in first.moved.values()
        assert not first.unplaced, [u.to_dict() for u in first.unplaced]
        # In the first round every other migration fails (never an affinity member's: a
        # failure after a sibling switched over would split the group; see docs/drain.md),
        # and the host is drained again.
        aborted_total = 0
        for round_ in range(6):
            turn = iter(range(1_000))
            aborted_total += act_as_agents(
                lm,
                "h0",
                check,
                fails=lambda vm, r=round_, t=turn: (
                    r == 0 and vm.group != "together" and next(t) % 2 == 0
                ),
                meanwhile=progress.wait_for_more,
            )
            if not vms_on(lm, "h0"):
                break
            again = lm.maintenance.drain("h0")
            check.step(f"drain again ({round_})")
            assert not again.unplaced, [u.to_dict() for u in again.unplaced]
            progress.wait_for_more()
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
    assert not client_errors, client_errors
    assert aborted_total > 0, "the test must exercise aborted migrations"
    assert len(started) > 1, "the concurrent client must have started members meanwhile"
    assert len(refused) >= 10 and all(refused), refused
    assert len(landed) >= 10, landed
    assert check.problems == []
    status = lm.maintenance.status("h0")
    assert (status.status, status.vms_left) == ("maintenance", ())
    assert lm.allocations.allocations(host="h0") == []
    assert audit(lm.store) == []
    # Every drained VM runs elsewhere; the affinity group stayed together.
    moved = {v.name: v for v in lm.vms.list() if v.uuid in drained}
    assert {v.state for v in moved.values()} == {"running"}
    assert len({v.host for v in lm.vms.list(group="together") if v.state == "running"}) == 1


def test_the_checker_sees_a_broken_rule(grouped: Loadmaster) -> None:
    """The checker above is not vacuous: a split affinity group and a doubled anti-affinity
    host are reported (written behind the ledger's back)."""
    lm = grouped
    with lm.store.write() as session:
        h1 = session.scalar(select(HostRow.id).where(HostRow.name == "h1"))
        for name in ("d-together0", "d-apart0"):
            session.scalars(select(VmRow).where(VmRow.name == name)).one().host_id = h1
    problems = group_violations(lm)
    assert any(p.startswith("together: affinity group split") for p in problems)
    assert any(p.startswith("apart: anti-affinity: more than 1 per host") for p in problems)


def test_a_vm_that_fits_nowhere_is_explained_then_force_stops_it(lm: Loadmaster) -> None:
    add_hosts(lm, 2, vcpu=8, memory=16384)
    small_flavor(lm)
    small_flavor(lm, "big", vcpu=6, memory=8192)
    big = lm.vms.create("big", "big").uuid
    small = lm.vms.create("small", "small").uuid
    start_on(lm, big, "h0")
    start_on(lm, small, "h0")
    start_on(lm, lm.vms.create("filler", "big").uuid, "h1")
    result = lm.maintenance.drain("h0")
    assert result.moved == {small: "h1"}
    (unplaced,) = result.unplaced
    assert unplaced.vm == big and not unplaced.stopped
    explanation = unplaced.explanation
    assert explanation is not None and explanation.candidates == 0
    assert "no host fits" in explanation.message
    reasons = {r for f in explanation.filters for r in f.reasons}
    assert "maintenance" in reasons and any("VCPU" in r for r in reasons), reasons
    assert result.to_dict()["unplaced"][0]["explanation"]["message"] == explanation.message
    assert (result.status.status, lm.vms.get(big).state) == ("draining", "running")
    lm.allocations.activate(small)  # the agents complete the migration
    # force stops only a VM still on the host: one that moved meanwhile is left alone.
    before = dump(lm)
    with pytest.raises(InvalidTransition):
        lm.allocations.stop(small, if_on="h0")
    assert dump(lm) == before
    forced = lm.maintenance.drain("h0", force=True)
    assert forced.moved == {} and forced.stopped == [big]
    assert lm.vms.get(big).state == "stopped"
    assert (forced.status.status, forced.status.vms_left) == ("maintenance", ())
    assert audit(lm.store) == []


def test_draining_again_changes_nothing_while_migrations_are_in_flight(lm: Loadmaster) -> None:
    add_hosts(lm, 3)
    small_flavor(lm)
    vms = [lm.vms.create(f"v{i}", "small").uuid for i in range(3)]
    for vm in vms:
        start_on(lm, vm, "h0")
    first = lm.maintenance.drain("h0")
    assert set(first.moved) == set(vms) and first.in_flight == ()
    assert {lm.vms.get(v).state for v in vms} == {"migrating"}
    before = dump(lm)
    again = lm.maintenance.drain("h0")
    assert again.moved == {} and again.unplaced == () and set(again.in_flight) == set(vms)
    assert dump(lm) == before
    # One migration aborts: the next drain places that VM again, and only it.
    lm.allocations.release(vms[0], host=first.moved[vms[0]])
    third = lm.maintenance.drain("h0")
    assert list(third.moved) == [vms[0]] and set(third.in_flight) == set(vms[1:])
    get = lm.maintenance.status("h0")
    assert get.status == "draining" and len(get.vms_left) == 3
    for vm in vms:
        lm.allocations.activate(vm)
    assert lm.maintenance.status("h0").status == "maintenance"
    assert lm.hosts.get("h0").state == "maintenance"


def test_a_pending_vm_is_re_placed_not_migrated(lm: Loadmaster) -> None:
    add_hosts(lm, 2)
    small_flavor(lm)
    vm = lm.vms.create("p", "small").uuid
    lm.allocations.claim(vm, "h0")
    result = lm.maintenance.drain("h0")
    assert result.moved == {vm: "h1"}
    record = lm.vms.get(vm)
    assert (record.state, record.host, record.target_host) == ("pending", "h1", None)
    assert [a.host for a in lm.allocations.allocations(vm=vm)] == ["h1", "h1"]
    assert result.status.status == "maintenance"  # nothing is left on h0
    assert audit(lm.store) == []


def test_bad_input_changes_nothing(lm: Loadmaster) -> None:
    add_hosts(lm, 2)
    lm.hosts.create("child", parent="h0")
    lm.hosts.set_state("h1", "down")
    before = dump(lm)
    with pytest.raises(NotFound) as missing:
        lm.maintenance.drain("nosuch")
    assert missing.value.field == "host" and "nosuch" in missing.value.detail
    with pytest.raises(ValidationError) as child:
        lm.maintenance.drain("child")
    assert child.value.field == "host"
    with pytest.raises(Conflict) as down:
        lm.maintenance.drain("h1")
    assert down.value.field == "host"
    with pytest.raises(ValidationError) as force:
        lm.maintenance.drain("h0", force="yes")  # type: ignore[arg-type]
    assert force.value.field == "force"
    assert dump(lm) == before


def test_an_anti_affinity_member_has_nowhere_to_go(lm: Loadmaster) -> None:
    """Three members on three hosts: draining one leaves no host without a member."""
    add_hosts(lm, 3)
    small_flavor(lm)
    lm.groups.create("apart", "anti-affinity")
    members = [lm.vms.create(f"a{i}", "small", group="apart").uuid for i in range(3)]
    for i, vm in enumerate(members):
        start_on(lm, vm, f"h{i}")
    result = lm.maintenance.drain("h0")
    (unplaced,) = result.unplaced
    assert unplaced.explanation is not None
    assert "anti-affinity(group apart)" in unplaced.explanation.message
    assert group_violations(lm) == []
    assert lm.vms.get(members[0]).state == "running"


def test_two_drains_at_once_move_each_vm_once(lm: Loadmaster, db_url: str) -> None:
    add_hosts(lm, 4, vcpu=32, memory=65536)
    small_flavor(lm)
    lm.groups.create("apart", "anti-affinity")
    vms = [lm.vms.create(f"v{i}", "small").uuid for i in range(12)]
    vms.append(lm.vms.create("a", "small", group="apart").uuid)
    for vm in vms:
        start_on(lm, vm, "h0")
    others = [loadmaster.open(db_url, migrate=False) for _ in range(2)]
    results: list[DrainResult] = []
    barrier = threading.Barrier(2)

    errors: list[BaseException] = []

    def drain(other: Loadmaster) -> None:
        barrier.wait()
        try:
            results.append(other.maintenance.drain("h0", force=True))
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=drain, args=(o,)) for o in others]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for o in others:
        o.close()
    assert errors == [] and len(results) == 2
    moved = [vm for r in results for vm in r.moved]
    assert sorted(moved) == sorted(vms)  # each VM placed by exactly one of the drains
    assert all(r.unplaced == () for r in results)  # force stopped nothing
    assert {lm.vms.get(v).state for v in vms} == {"migrating"}
    assert group_violations(lm) == [] and audit(lm.store) == []


def test_an_affinity_member_failing_after_its_sibling_switched_splits_the_group(
    lm: Loadmaster,
) -> None:
    """The known limit: a migration that fails is a fact, not a request the ledger may
    refuse. If one member of an affinity group has already switched to the destination
    when another's migration fails, the group is split until the next drain, which puts
    the straggler back with the group."""
    add_hosts(lm, 3)
    small_flavor(lm)
    lm.groups.create("together", "affinity")
    a, b = (lm.vms.create(n, "small", group="together").uuid for n in ("a", "b"))
    start_on(lm, a, "h0")
    start_on(lm, b, "h0")
    first = lm.maintenance.drain("h0")
    destination = first.moved[a]
    assert first.moved == {a: destination, b: destination}
    lm.allocations.activate(a)
    assert group_violations(lm) == []  # b is on h0 and headed where a is
    lm.allocations.release(b, host=destination)  # b's migration fails
    assert group_violations(lm) != []
    healed = lm.maintenance.drain("h0")
    assert healed.moved == {b: destination}
    assert group_violations(lm) == []
    lm.allocations.activate(b)
    assert lm.maintenance.status("h0").status == "maintenance"
