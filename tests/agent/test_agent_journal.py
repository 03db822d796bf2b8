"""The applied-controls journal: framing, torn records, compaction, the lock, and the agent
recording a control only after the hypervisor accepted it."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from agent_helpers import FakePolicy
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from loadmaster.agent.hypervisor.base import HypervisorError
from loadmaster.agent.hypervisor.simulated import GIB, SimulatedHypervisor
from loadmaster.agent.sla import AppliedJournal, JournalError, read_journal
from loadmaster.agent.sla.controllers import Action
from loadmaster.agent.sla.journal import JOURNAL_FILE, agent_running, parse_journal
from loadmaster.agent.sla.simulated import simulated_agent
from loadmaster.cli import app
from loadmaster.policy import PolicyError

VM1, VM2 = "11111111-1111-4111-8111-111111111111", "22222222-2222-4222-8222-222222222222"


def balloon(uuid: str, value: int) -> Action:
    return Action("balloon", f"vm-{uuid[:4]}", "balloon_target", value, uuid)


def ksm(knob: str, value: int) -> Action:
    return Action("ksm", "host", f"ksm_{knob}", value)


def last_values(state_dir: Path) -> dict[tuple[str, str], Any]:
    return {key: record.value for key, record in read_journal(state_dir).last.items()}


def test_framed_cycles_and_last_state(tmp_path: Path) -> None:
    journal = AppliedJournal(tmp_path)
    journal.cycle_start(1, "digest-a")
    journal.applied(1, balloon(VM1, 100))
    journal.applied(1, ksm("run", 1))
    journal.cycle_end(1, 2, 0)
    journal.cycle_start(2, "digest-a")
    journal.applied(2, balloon(VM1, 90))
    journal.cycle_end(2, 1, 0)
    journal.close()

    state = read_journal(tmp_path)
    assert last_values(tmp_path) == {(VM1, "balloon_target"): 90, ("host", "ksm_run"): 1}
    assert state.last[(VM1, "balloon_target")].cycle == 2
    assert state.last[("host", "ksm_run")].uuid is None
    assert state.cycles_ended == 2 and state.interrupted == [] and state.open_cycle is None
    lines = [json.loads(line) for line in (tmp_path / JOURNAL_FILE).read_text().splitlines()]
    assert [line["kind"] for line in lines] == [
        "cycle-start",
        "applied",
        "applied",
        "cycle-end",
        "cycle-start",
        "applied",
        "cycle-end",
    ]


def test_cycles_that_never_ended_are_interrupted(tmp_path: Path) -> None:
    journal = AppliedJournal(tmp_path)
    journal.cycle_start(1, "a")
    journal.applied(1, balloon(VM1, 100))
    journal.applied(1, balloon(VM2, 100))
    # killed here: the next agent starts counting again
    journal.cycle_start(1, "b")
    journal.cycle_end(1, 0, 0)
    journal.cycle_start(2, "b")
    journal.applied(2, balloon(VM1, 50))
    journal.close()

    state = read_journal(tmp_path)
    assert [(c.cycle, c.policy, c.applied) for c in state.interrupted] == [(1, "a", 2), (2, "b", 1)]
    assert state.open_cycle is state.interrupted[-1]
    assert state.cycles_ended == 1


def test_a_torn_last_record_is_ignored_then_cut_off(tmp_path: Path) -> None:
    journal = AppliedJournal(tmp_path)
    journal.cycle_start(1, "a")
    journal.applied(1, balloon(VM1, 100))
    journal.close()
    path = tmp_path / JOURNAL_FILE
    whole = path.read_bytes()
    torn = json.dumps({"kind": "applied", "cycle": 1, "value": 7}).encode()[:25]
    path.write_bytes(whole + torn)

    state = read_journal(tmp_path)
    assert last_values(tmp_path) == {(VM1, "balloon_target"): 100}
    assert state.torn_bytes == len(torn) and state.valid_bytes == len(whole)

    journal = AppliedJournal(tmp_path)
    assert path.read_bytes() == whole
    journal.applied(1, balloon(VM2, 5))
    journal.close()
    assert last_values(tmp_path) == {(VM1, "balloon_target"): 100, (VM2, "balloon_target"): 5}


def test_a_complete_last_line_that_does_not_parse_counts_as_torn(tmp_path: Path) -> None:
    # After a power cut some file systems show the lost tail as zero bytes.
    journal = AppliedJournal(tmp_path)
    journal.applied(1, balloon(VM1, 100))
    journal.close()
    path = tmp_path / JOURNAL_FILE
    path.write_bytes(path.read_bytes() + b"\0\0\0\0\n")
    assert last_values(tmp_path) == {(VM1, "balloon_target"): 100}
    assert read_journal(tmp_path).torn_bytes == 5


def test_damage_before_the_last_record_is_an_error_and_the_agent_starts_afresh(
    tmp_path: Path,
) -> None:
    path = tmp_path / JOURNAL_FILE
    journal = AppliedJournal(tmp_path)
    journal.applied(1, balloon(VM1, 100))
    journal.close()
    good = path.read_bytes()
    path.write_bytes(b"{not json\n" + good)
    with pytest.raises(JournalError, match="line 1"):
        read_journal(tmp_path)

    journal = AppliedJournal(tmp_path)
    journal.applied(1, balloon(VM2, 1))
    journal.close()
    assert last_values(tmp_path) == {(VM2, "balloon_target"): 1}
    [aside] = tmp_path.glob(f"{JOURNAL_FILE}.damaged-*")
    assert aside.read_bytes() == b"{not json\n" + good


def test_compaction_keeps_the_last_state_and_the_interrupted_cycles(tmp_path: Path) -> None:
    journal = AppliedJournal(tmp_path)
    for cycle in range(1, 30):
        journal.cycle_start(cycle, "a")
        for i, uuid in enumerate((VM1, VM2)):
            journal.applied(cycle, balloon(uuid, cycle * 10 + i))
        journal.applied(cycle, ksm("pages_to_scan", cycle))
        if cycle % 10:
            journal.cycle_end(cycle, 3, 0)
    journal.close()
    before = read_journal(tmp_path)
    size = (tmp_path / JOURNAL_FILE).stat().st_size

    journal = AppliedJournal(tmp_path, compact_bytes=size - 1)
    compacted = (tmp_path / JOURNAL_FILE).read_bytes()
    assert len(compacted.splitlines()) == 1 + 3  # the header, then one line per control
    after = read_journal(tmp_path)
    assert after.last == before.last
    assert [c.cycle for c in after.interrupted] == [10, 20]
    assert after.open_cycle is None  # carried over as history: no agent is in it now
    journal.cycle_start(1, "b")
    journal.applied(1, balloon(VM1, 1))
    journal.cycle_end(1, 1, 0)
    journal.close()
    assert last_values(tmp_path)[(VM1, "balloon_target")] == 1
    assert not list(tmp_path.glob(".*compacting"))


def test_one_agent_per_state_directory(tmp_path: Path) -> None:
    assert not agent_running(tmp_path)
    journal = AppliedJournal(tmp_path)
    assert agent_running(tmp_path)
    with pytest.raises(JournalError, match="another agent"):
        AppliedJournal(tmp_path)
    journal.close()
    assert not agent_running(tmp_path)
    AppliedJournal(tmp_path).close()


def test_an_unusable_state_directory_is_a_journal_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(JournalError, match="cannot use state directory"):
        AppliedJournal(tmp_path / "file" / "state")


class RefusingSim(SimulatedHypervisor):
    """Refuses some balloon calls, and checks at every call that the journal holds each
    earlier accepted call and nothing of this one."""

    state_dir: Path
    refuse: set[str]
    accepted: list[str]

    def set_memory(self, uuid: str, kib: int) -> None:
        journalled = {key[0] for key in read_journal(self.state_dir).last}
        assert uuid not in journalled
        assert journalled == set(self.accepted)
        if uuid in self.refuse:
            raise HypervisorError(f"setMemory {uuid}: refused")
        super().set_memory(uuid, kib)
        self.accepted.append(uuid)


def test_a_control_is_journalled_right_after_its_call_and_only_if_it_succeeded(
    tmp_path: Path,
) -> None:
    sim = RefusingSim.mixed(6, seed=2)
    guests = sim.list_guests()
    sim.state_dir, sim.accepted = tmp_path / "state", []
    sim.refuse = {guests[1].uuid, guests[4].uuid}
    policy = FakePolicy(guest_controls={g.name: {"balloon_target": GIB} for g in guests})
    journal = AppliedJournal(sim.state_dir)
    agent = simulated_agent(sim, tmp_path, policy_loader=policy.loader, journal=journal)
    refused_balloon = sim.balloon_info(guests[1].uuid).current
    report = agent.run_cycle()
    journal.close()

    assert len(sim.accepted) == 4
    assert sorted(f.target for f in report.failures) == sorted([guests[1].name, guests[4].name])
    state = read_journal(sim.state_dir)
    assert last_values(sim.state_dir) == {
        (a.uuid, a.control): a.value for a in report.actions if a.uuid is not None
    }
    assert {r.target for r in state.last.values()} == {
        g.name for g in guests if g.uuid in sim.accepted
    }
    assert state.cycles_ended == 1 and state.interrupted == []
    assert sim.balloon_info(guests[1].uuid).current == refused_balloon


def test_a_journal_that_cannot_be_written_does_not_stop_the_controls(tmp_path: Path) -> None:
    sim = SimulatedHypervisor.mixed(2, seed=3)
    journal = AppliedJournal(tmp_path / "state")
    policy = FakePolicy(guest_controls={"vm-0001": {"balloon_target": GIB}})
    agent = simulated_agent(sim, tmp_path, policy_loader=policy.loader, journal=journal)
    journal.close()  # every write now fails
    report = agent.run_cycle()
    assert [(a.target, a.value) for a in report.actions] == [("vm-0001", GIB)]
    assert [f.controller for f in report.failures] == ["journal"] * 3
    assert sim.balloon_info(sim.list_guests()[1].uuid).current == GIB


def test_cycles_that_run_no_controller_are_not_framed(tmp_path: Path) -> None:
    sim = SimulatedHypervisor.mixed(1)
    broken = FakePolicy(error=PolicyError("a.policy", 1, 1, "undefined symbol x"))
    journal = AppliedJournal(tmp_path / "state")
    agent = simulated_agent(sim, tmp_path, policy_loader=broken.loader, journal=journal)
    assert agent.run_cycle().policy_error is not None
    sim.broken.add("list_guests")
    agent.run_cycle()
    journal.close()
    # Only the explanation of the failed cycle: no cycle-start or cycle-end frame.
    lines = (tmp_path / "state" / JOURNAL_FILE).read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [(r["kind"], r["target"], r["control"]) for r in records] == [("not-applied", "*", "*")]
    assert records[0]["reason"] == "policy error: a.policy:1:1: undefined symbol x"
    assert read_journal(tmp_path / "state").explained == 1


# -- properties ----------------------------------------------------------------------

TARGETS = (VM1, VM2, None)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("start")),
        st.tuples(st.just("end")),
        st.tuples(
            st.just("applied"),
            st.sampled_from(TARGETS),
            st.sampled_from(("balloon_target", "vcpu_quota")),
            st.integers(-(2**40), 2**40),
        ),
        st.tuples(st.just("reopen"), st.booleans()),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(operations)
def test_the_last_state_is_the_fold_of_the_records_through_reopens_and_compactions(
    ops: list[tuple[Any, ...]],
) -> None:
    last: dict[tuple[str, str], int] = {}
    interrupted, in_cycle = 0, False
    with tempfile.TemporaryDirectory() as directory:
        state_dir = Path(directory)
        journal = AppliedJournal(state_dir)
        for op in ops:
            if op[0] == "start":
                interrupted += in_cycle
                in_cycle = True
                journal.cycle_start(1, "p")
            elif op[0] == "end":
                in_cycle = False
                journal.cycle_end(1, 0, 0)
            elif op[0] == "applied":
                _, uuid, control, value = op
                action = Action("c", uuid or "host", control, value, uuid)
                journal.applied(1, action)
                last[(uuid or "host", control)] = value
            else:
                journal.close()
                compact = op[1]
                if compact:
                    interrupted += in_cycle
                    in_cycle = False
                journal = AppliedJournal(state_dir, compact_bytes=0 if compact else 2**30)
        journal.close()
        state = read_journal(state_dir)
    assert {key: record.value for key, record in state.last.items()} == last
    assert len(state.interrupted) == interrupted + in_cycle
    assert (state.open_cycle is not None) == in_cycle


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 10**9), min_size=1, max_size=12), st.data())
def test_a_journal_cut_anywhere_reads_as_the_records_before_the_cut(
    values: list[int], data: st.DataObject
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        # A fixed clock: the drawn cut must not depend on how long a time stamp prints.
        journal = AppliedJournal(Path(directory), clock=lambda: 1.5)
        ends = []
        for value in values:
            journal.applied(1, balloon(VM1, value))
            ends.append(journal.path.stat().st_size)
        journal.close()
        raw = journal.path.read_bytes()
    cut = data.draw(st.integers(0, len(raw)))
    state = parse_journal(raw[:cut])
    whole = [v for v, end in zip(values, ends, strict=True) if end <= cut]
    expected = {(VM1, "balloon_target"): whole[-1]} if whole else {}
    assert {key: record.value for key, record in state.last.items()} == expected
    assert state.valid_bytes == (ends[len(whole) - 1] if whole else 0)


# -- command line --------------------------------------------------------------------


def test_agent_state_dir_and_agent_journal_command(tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "shrink.policy").write_text(
        '(with Guests guest (guest.Control "balloon_target" (- guest.balloon_max 65536)))\n'
    )
    state_dir = tmp_path / "state"
    runner = CliRunner()
    ran = runner.invoke(
        app,
        [
            "agent",
            "--hypervisor",
            "test:///default",
            "--policy-dir",
            str(policies),
            "--interval",
            "0",
            "--cycles",
            "2",
            "--state-dir",
            str(state_dir),
        ],
    )
    assert ran.exit_code == 0, ran.output
    # Interrupt a cycle by hand, as a kill would.
    with (state_dir / JOURNAL_FILE).open("a") as journal:
        journal.write('{"cycle":3,"kind":"cycle-start","policy":"abc","time":0}\n')

    shown = runner.invoke(app, ["agent-journal", "--state-dir", str(state_dir), "--json"])
    assert shown.exit_code == 0, shown.output
    data = json.loads(shown.stdout)
    [applied] = data["applied"]
    assert (applied["target"], applied["control"]) == ("test", "balloon_target")
    assert applied["value"] == 8 * GIB - 65536
    assert applied["cycle"] == 1  # the second cycle found nothing to change
    assert data["cycles_ended"] == 2 and data["agent_running"] is False
    assert [c["cycle"] for c in data["interrupted"]] == [3] == [data["open_cycle"]["cycle"]]

    table = runner.invoke(app, ["agent-journal", "--state-dir", str(state_dir)])
    assert table.exit_code == 0
    assert "balloon_target" in table.stdout and "Cycles that never ended" in table.stdout

    missing = runner.invoke(app, ["agent-journal", "--state-dir", str(tmp_path / "nope")])
    assert missing.exit_code == 2
