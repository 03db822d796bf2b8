"""The scheduling process's socket (scheduler/remote.py), in one process: a scheduler
serving on it from a thread, another scheduler handing its claims to it. The processes of
``serve --workers N`` are tested in tests/reliability/test_scheduling_process.py."""

from __future__ import annotations

import pickle
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.scheduler.conftest import add_hosts, add_vms, small_flavor

from loadmaster.errors import Busy, NotFound, SchedulerUnavailable, ValidationError
from loadmaster.scheduler import RequestSpec, Scheduler
from loadmaster.scheduler.core.results import NoHostFits, ScheduleResult
from loadmaster.scheduler.remote import (
    HANDSHAKE_S,
    SOCKET_NAME,
    NotReached,
    SchedulingClient,
    SchedulingServer,
    answers,
    prepare,
)
from loadmaster.service import Loadmaster


class Counting(Scheduler):
    """A scheduler that counts the calls it decided (the one serving on the socket)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.calls = 0

    def schedule(self, requests, **options):  # type: ignore[no-untyped-def,override]
        self.calls += 1
        return super().schedule(requests, **options)


@pytest.fixture
def served(slm: Loadmaster, tmp_path: Path) -> Iterator[tuple[Counting, Path]]:
    directory = tmp_path / "scheduling"
    prepare(directory)
    deciding = Counting(slm.store)
    server = SchedulingServer(deciding, directory)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield deciding, directory
    finally:
        server.close()
        thread.join(timeout=10)


def test_claims_go_to_the_process_and_reads_stay(
    slm: Loadmaster, served: tuple[Counting, Path]
) -> None:
    deciding, directory = served
    add_hosts(slm, 2)
    small_flavor(slm)
    vms = add_vms(slm, 3)
    slm.scheduler.hand_claims_to(SchedulingClient(directory))

    placed = slm.scheduler.schedule([RequestSpec(vms=vms[:2])])
    assert [p.host for p in placed.placements if p.error is None] != []
    assert deciding.calls == 1
    assert {slm.vms.get(v).state for v in vms[:2]} == {"pending"}
    # A dry run claims nothing: answered here, from this scheduler's own snapshot.
    slm.scheduler.schedule([RequestSpec(vms=[vms[2]])], dry_run=True)
    assert deciding.calls == 1
    started = slm.scheduler.start(vms[2])  # a start is a claim: the process decides it
    assert started.placements[0].error is None
    assert deciding.calls == 2


def test_errors_cross_the_socket_with_their_kind_and_fields(
    slm: Loadmaster, served: tuple[Counting, Path]
) -> None:
    _, directory = served
    add_hosts(slm, 1, vcpu=2)
    small_flavor(slm, vcpu=4)
    (vm,) = add_vms(slm, 1)
    client = SchedulingClient(directory)

    refused = client.schedule([RequestSpec(vms=[vm])])
    error = refused.placements[0].error
    assert isinstance(error, NoHostFits)
    assert error.field == "vm"
    assert error.explanation.vm == vm and error.explanation.to_dict()["filters"]
    with pytest.raises(ValidationError) as bad_policy:
        client.schedule([RequestSpec(vms=[vm])], policy="no-such-policy")
    assert bad_policy.value.field == "policy"
    with pytest.raises(NotFound):
        client.schedule([RequestSpec(vms=["00000000-0000-4000-8000-000000000000"])])
    # The connection that carried the errors serves the next call as well.
    assert client.schedule([RequestSpec(vms=[vm])]).placements[0].error is not None


def test_a_scheduler_that_cannot_reach_the_process_decides_itself(
    slm: Loadmaster, tmp_path: Path
) -> None:
    add_hosts(slm, 2)
    small_flavor(slm)
    vms = add_vms(slm, 2)
    directory = tmp_path / "nobody-listens"
    prepare(directory)
    slm.scheduler.hand_claims_to(SchedulingClient(directory))
    result = slm.scheduler.schedule([RequestSpec(vms=vms)])
    assert all(p.error is None for p in result.placements)
    assert {slm.vms.get(v).state for v in vms} == {"pending"}


def test_a_replaced_process_is_reached_on_a_fresh_connection(
    slm: Loadmaster, tmp_path: Path
) -> None:
    """The worker's kept connection died with the process it led to; the call goes to the
    replacement on a new one, not to the worker's own scheduler."""
    add_hosts(slm, 2)
    small_flavor(slm)
    vms = add_vms(slm, 2)
    directory = tmp_path / "scheduling"
    prepare(directory)
    client = SchedulingClient(directory)
    for vm in vms:
        deciding = Counting(slm.store)
        server = SchedulingServer(deciding, directory)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        assert client.schedule([RequestSpec(vms=[vm])]).placements[0].error is None
        assert deciding.calls == 1
        server.close()
        thread.join(timeout=10)
    client.close()


def test_every_error_pickles_with_its_fields() -> None:
    """Subclasses take other arguments than ``(detail,)``: pickle's way for exceptions
    would call them with the wrong ones."""
    busy = pickle.loads(pickle.dumps(Busy("try later", retry_after_s=7, field="vms")))
    assert isinstance(busy, Busy)
    assert (busy.detail, busy.retry_after_s, busy.field) == ("try later", 7, "vms")
    assert str(busy) == "try later"


def test_a_call_the_process_held_when_it_ended_is_not_decided_again(
    slm: Loadmaster, tmp_path: Path
) -> None:
    add_hosts(slm, 2)
    small_flavor(slm)
    (vm,) = add_vms(slm, 1)
    directory = tmp_path / "scheduling"
    prepare(directory)
    holding, release = threading.Event(), threading.Event()

    class Holding(Scheduler):
        def schedule(self, requests, **options):  # type: ignore[no-untyped-def,override]
            holding.set()
            release.wait(timeout=60)
            raise AssertionError("the process was ended; its answer must not arrive")

    server = SchedulingServer(Holding(slm.store), directory)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    slm.scheduler.hand_claims_to(SchedulingClient(directory))
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            slm.scheduler.schedule([RequestSpec(vms=[vm])])
        except BaseException as exc:
            outcome.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    assert holding.wait(timeout=60)
    server.close()  # as the process dying: its connections end
    caller.join(timeout=60)
    release.set()
    assert len(outcome) == 1 and isinstance(outcome[0], SchedulerUnavailable), outcome
    assert "whether it claimed is in each VM's state" in outcome[0].detail
    assert slm.vms.get(vm).state == "requested"  # not decided again by the caller's side


def test_the_process_answers_a_ping_without_its_scheduler(slm: Loadmaster, tmp_path: Path) -> None:
    directory = tmp_path / "scheduling"
    prepare(directory)
    assert not answers(directory, 1.0)  # nothing listens

    class Refusing(Scheduler):
        def schedule(self, requests, **options):  # type: ignore[no-untyped-def,override]
            raise AssertionError("a ping must not reach the scheduler")

    server = SchedulingServer(Refusing(slm.store), directory)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert answers(directory, 10.0)
    finally:
        server.close()


def _within(seconds: float, call: Callable[[], object]) -> object:
    """What ``call()`` returned or raised, failing if it takes over ``seconds``."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:
            outcome.append(exc)

    caller = threading.Thread(target=run, daemon=True)
    caller.start()
    caller.join(seconds)
    assert outcome, f"no answer within {seconds} s"
    return outcome[0]


def test_a_socket_that_listens_but_never_answers_is_not_waited_for(
    slm: Loadmaster, tmp_path: Path
) -> None:
    """As a replacement process that is stopped, hung, or loading its snapshot with its
    socket open: the worker gives up on the key's challenge and decides itself."""
    add_hosts(slm, 2)
    small_flavor(slm)
    (vm,) = add_vms(slm, 1)
    directory = tmp_path / "scheduling"
    prepare(directory)
    with socket.socket(socket.AF_UNIX) as mute:
        mute.bind(str(directory / SOCKET_NAME))
        mute.listen(8)  # connections queue; none is ever accepted
        client = SchedulingClient(directory)
        refused = _within(HANDSHAKE_S * 4, lambda: client.schedule([RequestSpec(vms=[vm])]))
        assert isinstance(refused, NotReached), refused
        slm.scheduler.hand_claims_to(SchedulingClient(directory))
        placed = _within(HANDSHAKE_S * 4, lambda: slm.scheduler.schedule([RequestSpec(vms=[vm])]))
        assert isinstance(placed, ScheduleResult), placed
        assert placed.placements[0].error is None
        assert slm.vms.get(vm).state == "pending"
        assert not _within(HANDSHAKE_S * 4, lambda: answers(directory, 1.0))


def test_a_peer_silent_in_the_keys_challenge_holds_up_no_other(
    slm: Loadmaster, served: tuple[Counting, Path]
) -> None:
    deciding, directory = served
    add_hosts(slm, 2)
    small_flavor(slm)
    (vm,) = add_vms(slm, 1)
    with socket.socket(socket.AF_UNIX) as silent:
        silent.connect(str(directory / SOCKET_NAME))  # and says nothing
        client = SchedulingClient(directory)
        placed = _within(HANDSHAKE_S * 4, lambda: client.schedule([RequestSpec(vms=[vm])]))
        assert isinstance(placed, ScheduleResult), placed
        assert placed.placements[0].error is None and deciding.calls == 1
