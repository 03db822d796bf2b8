"""What the agent tells its operator: each failure with its reason, a repeating failure
as the same one, and API refusals in the operator's terms."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from loadmaster.agent.runner import ApiClient
from loadmaster.agent.sla.controllers import Failure
from loadmaster.agent.sla.loop import CycleReport
from loadmaster.agent.sla.narration import CycleNarrator
from loadmaster.apiclient import ApiError

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def test_a_failure_that_repeats_is_told_as_the_same_one() -> None:
    narrator = CycleNarrator()
    balloon = Failure("balloon", "vm-1", "domain not found")
    first = narrator.lines(CycleReport(cycle=1, guests=8, failures=[balloon]), T0)
    assert first[0].startswith("cycle 1: 8 guests, 0 actions, 1 failures")
    assert first[1:] == ["failed: balloon on vm-1: domain not found"]

    later = T0 + timedelta(seconds=30)
    third = narrator.lines(CycleReport(cycle=2, failures=[balloon]), later)
    assert third[1:] == [
        "still failing since cycle 1 (2026-01-01T12:00:00+00:00), 2 cycles: "
        "balloon on vm-1: domain not found"
    ]
    # Healed, then failing again: a new failure.
    narrator.lines(CycleReport(cycle=3), later)
    again = narrator.lines(CycleReport(cycle=4, failures=[balloon]), later)
    assert again[1:] == ["failed: balloon on vm-1: domain not found"]


def test_a_cycle_that_reloaded_its_policy_or_left_a_guest_out_is_told() -> None:
    """The reload and the guest left out are the loop's own log lines; the cycle's is its
    counts."""
    report = CycleReport(
        cycle=5,
        policy_reloaded=True,
        policy_file_errors=["02-balloon.policy:3:1: unexpected )"],
        left_out={"vm-9": "no balloon stats yet"},
    )
    [line] = CycleNarrator().lines(report, T0)
    assert line.startswith("cycle 5: 0 guests") and "1 guests left out" in line


def test_an_unknown_host_is_named_with_how_to_register_it() -> None:
    agent = ApiClient("http://127.0.0.1:9")
    body = {"code": "loadmaster.not_found", "detail": "no host named 'h9'"}
    path = "/hosts/h9/report"
    error = ApiError("POST", path, 404, body, hint=agent.hint("POST", path, 404))
    message = str(error)
    assert "does not know host 'h9'" in message
    assert "loadmaster host create h9" in message and "--host-name" in message
    assert "http" not in message.split("(")[0]  # no library text or doc link up front
    plain = ApiError(
        "POST", "/vms/x/up", 409, {"detail": "moved"}, hint=agent.hint("POST", "/vms/x/up", 409)
    )
    assert str(plain) == "POST /vms/x/up: 409 moved"
