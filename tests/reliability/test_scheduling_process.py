"""``serve --workers N`` on PostgreSQL: the workers hand their placements to one
scheduling process (scheduler/remote.py), decide themselves while it cannot be reached,
and hand them to its replacement once the supervisor has started one.

The process is stopped (SIGSTOP) to show who decides: a call the process holds does not
answer until it runs again; a call a worker decides itself answers meanwhile."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

import harness
import loadmaster
from harness import ServedApi, wait_until
from loadmaster.api import scheduling_process, supervisor
from loadmaster.cluster import VmSpec
from loadmaster.pending import audit
from loadmaster.scheduler import remote

# Longer than a placement takes on a loaded machine, short enough to keep the test quick.
HELD_S = 2.0
WAIT_S = 120.0


def _setup(url: str, vms: int) -> list[str]:
    with loadmaster.open(url) as lm:
        inventories = {"VCPU": {"total": 64}, "MEMORY_MB": {"total": 65536}}
        lm.hosts.create_many([{"name": f"h{i}", "inventories": inventories} for i in range(4)])
        lm.flavors.create({"name": "f", "resources": {"VCPU": 1, "MEMORY_MB": 512}})
        specs = [VmSpec(f"vm{i}", "f") for i in range(vms)]
        return [v.uuid for v in lm.vms.create_many(specs)]


class Call(threading.Thread):
    """One ``POST /schedule`` of one VM, answered in the background."""

    def __init__(self, api: ServedApi, vm: str) -> None:
        super().__init__(daemon=True)
        self.api, self.vm = api, vm
        self.answer: httpx.Response | None = None
        self.start()

    def run(self) -> None:
        with self.api.client(timeout=WAIT_S) as http:
            self.answer = http.post("/schedule", json={"requests": [{"vms": [self.vm]}]})

    def answered(self) -> httpx.Response:
        self.join(timeout=WAIT_S)
        assert self.answer is not None, "no answer"
        return self.answer


def _serving_lines(log: Path) -> int:
    return log.read_text(errors="replace").count("scheduling process serving on")


def _state(url: str, vm: str) -> str:
    with loadmaster.open(url, migrate=False) as lm:
        return lm.vms.get(vm).state


@pytest.mark.postgres
def test_workers_hand_placements_to_one_process_and_decide_without_it(
    pg_url: str, tmp_path: Path
) -> None:
    vms = _setup(pg_url, 6)
    log = tmp_path / "serve.log"
    with ServedApi(pg_url, workers=2, log_path=log) as api:
        wait_until(lambda: _serving_lines(log) == 1, WAIT_S, "the scheduling process serves")
        first = api.scheduling_pid()
        assert first is not None and first not in api.worker_pids()

        # Held while the process is stopped: the worker waits for the process's answer.
        os.kill(first, signal.SIGSTOP)
        held = Call(api, vms[0])
        held.join(timeout=HELD_S)
        assert held.is_alive(), "a worker decided a placement the process should have"
        os.kill(first, signal.SIGCONT)
        assert held.answered().status_code == 200
        assert _state(pg_url, vms[0]) == "pending"

        # The process ends while it holds a call: that call is not decided again, and says
        # so (503); nothing was claimed for it.
        os.kill(first, signal.SIGSTOP)
        cut = Call(api, vms[1])
        cut.join(timeout=HELD_S)
        os.kill(api.process.pid, signal.SIGSTOP)  # no replacement until we say
        try:
            os.kill(first, signal.SIGKILL)
            answer = cut.answered()
            if answer.status_code == 503:
                assert answer.json()["code"] == "loadmaster.scheduler_unavailable"
                assert answer.headers["Retry-After"]
                assert _state(pg_url, vms[1]) == "requested"
            else:
                # A worker not yet connected was still in the connection's handshake when
                # the process died: nothing was asked, and it decided itself.
                assert answer.status_code == 200, answer.text
                assert _state(pg_url, vms[1]) == "pending"
            # Nothing listens now: each worker decides itself, for every worker's clients.
            for vm in vms[2:4]:
                assert Call(api, vm).answered().status_code == 200
                assert _state(pg_url, vm) == "pending"
        finally:
            os.kill(api.process.pid, signal.SIGCONT)

        # The supervisor starts a replacement, and the workers hand their calls to it.
        wait_until(lambda: _serving_lines(log) == 2, WAIT_S, "a replacement serves")
        second = api.scheduling_pid()
        assert second is not None and second != first
        os.kill(second, signal.SIGSTOP)
        try:
            again = Call(api, vms[4])
            again.join(timeout=HELD_S)
            assert again.is_alive(), "the workers went on deciding after the replacement served"
        finally:
            os.kill(second, signal.SIGCONT)
        assert again.answered().status_code == 200
        assert f"scheduling process [{first}] ended" in log.read_text()
    # The supervisor ended it with the workers.
    assert not Path(f"/proc/{second}").exists() or "Z" in Path(f"/proc/{second}/stat").read_text()
    with loadmaster.open(pg_url, migrate=False) as lm:
        assert audit(lm.store) == []
        states = [lm.vms.get(v).state for v in vms]
        assert states[:1] + states[2:] == ["pending"] * 4 + ["requested"]


def test_the_harness_knows_the_scheduling_process_by_its_command() -> None:
    assert harness.SCHEDULING_MODULE == supervisor.SCHEDULING_MODULE == scheduling_process.__name__


@pytest.mark.postgres
def test_a_hung_scheduling_process_is_replaced(pg_url: str, tmp_path: Path) -> None:
    """Stopped (as a hung process would be), it holds every worker's placements: the
    supervisor, which pings it, replaces it once it has not answered for HEALTHCHECK_S,
    and the held call is answered (503 if the process had it; decided by the worker if
    the worker was still connecting)."""
    vms = _setup(pg_url, 2)
    log = tmp_path / "serve.log"
    with ServedApi(pg_url, workers=2, log_path=log) as api:
        wait_until(lambda: _serving_lines(log) == 1, WAIT_S, "the scheduling process serves")
        hung = api.scheduling_pid()
        assert hung is not None
        # Answered a ping at least once: only such a process is judged.
        time.sleep(supervisor.SCHEDULING_CHECK_EVERY_S * 2)
        os.kill(hung, signal.SIGSTOP)
        held = Call(api, vms[0])
        wait_until(
            lambda: f"scheduling process [{hung}] did not answer" in log.read_text(),
            WAIT_S,
            "the supervisor replaced the hung process",
        )
        answer = held.answered()
        assert answer.status_code in (200, 503), answer.text
        assert _state(pg_url, vms[0]) == ("pending" if answer.status_code == 200 else "requested")
        wait_until(lambda: _serving_lines(log) == 2, WAIT_S, "a replacement serves")
        assert Call(api, vms[1]).answered().status_code == 200
        assert _state(pg_url, vms[1]) == "pending"
        assert api.scheduling_pid() not in (None, hung)


def _stop_the_next(api: ServedApi, before: int, ready: Callable[[int], bool]) -> int:
    """SIGSTOP the scheduling process started after ``before`` (killed here) as soon as
    ``ready(its pid)``; its pid."""
    os.kill(before, signal.SIGKILL)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        pid = api.scheduling_pid()
        if pid not in (None, before) and ready(pid):
            os.kill(pid, signal.SIGSTOP)
            return pid
        time.sleep(0.005)
    raise AssertionError("no replacement started")


def _decided_meanwhile(api: ServedApi, vm: str, url: str) -> None:
    """A placement while the scheduling process cannot answer: the worker decides it."""
    call = Call(api, vm)
    call.join(timeout=remote.HANDSHAKE_S * 6)
    assert not call.is_alive(), "the placement waited for a process that does not answer"
    assert call.answered().status_code == 200
    assert _state(url, vm) == "pending"


@pytest.mark.postgres
def test_a_replacement_that_does_not_answer_holds_no_placement_and_is_replaced(
    pg_url: str, tmp_path: Path
) -> None:
    """Stopped while it starts, before it listens: the workers decide, and the supervisor
    replaces it once SCHEDULING_START_S passed. Stopped once its socket listens: the
    workers give up on the connection's handshake (HANDSHAKE_S) and decide, and it is
    replaced as well. Before, each placement waited for as long as the process was."""
    vms = _setup(pg_url, 3)
    log = tmp_path / "serve.log"
    with ServedApi(pg_url, workers=2, log_path=log) as api:
        wait_until(lambda: _serving_lines(log) == 1, WAIT_S, "the scheduling process serves")
        first = api.scheduling_pid()
        assert first is not None

        starting = _stop_the_next(api, first, lambda _pid: True)
        _decided_meanwhile(api, vms[0], pg_url)
        wait_until(
            lambda: (
                f"scheduling process [{starting}] did not start serving within" in log.read_text()
            ),
            supervisor.SCHEDULING_START_S + WAIT_S,
            "the supervisor replaced the process that never started",
        )
        wait_until(lambda: _serving_lines(log) == 2, WAIT_S, "a replacement serves")

        third = api.scheduling_pid()
        assert third is not None and third != starting
        # It logs that it serves once its socket listens.
        listening = _stop_the_next(api, third, lambda _pid: _serving_lines(log) == 3)
        _decided_meanwhile(api, vms[1], pg_url)
        wait_until(
            lambda: f"scheduling process [{listening}] did not" in log.read_text(),
            supervisor.SCHEDULING_START_S + supervisor.HEALTHCHECK_S + WAIT_S,
            "the supervisor replaced the process that listened without answering",
        )
        wait_until(lambda: _serving_lines(log) == 4, WAIT_S, "a replacement serves")
        assert Call(api, vms[2]).answered().status_code == 200
        assert _state(pg_url, vms[2]) == "pending"
