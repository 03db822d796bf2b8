"""``loadmaster serve`` as an operator runs it: workers that start slowly are waited for,
workers die with their supervisor, and SIGHUP reloads the tokens while it serves."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
import uvicorn
from cli_helpers import run_cli

from harness import ServedApi, free_port, wait_until
from loadmaster.api.auth import AuthConfig
from loadmaster.api.server import StoppingServer
from loadmaster.api.uvicorn_workers import Worker
from loadmaster.errors import ValidationError
from loadmaster.microversions import CLIENT_HEADERS

# A spawned worker imports its parent's main module first (as ``__mp_main__``): this one
# does so as slowly as a loaded machine imports the API (11 s measured at load 8-16),
# past uvicorn's 5 s health check.
SLOW_MAIN = """
import os, time
if __name__ == "__mp_main__":
    time.sleep(float(os.environ["SLOW_IMPORT_S"]))
from loadmaster.cli import main
if __name__ == "__main__":
    main()
"""


def _log_lines(path: Path) -> list[dict[str, object]]:
    lines = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            lines.append(json.loads(line))
    return lines


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state == "Z"


def _refused(url: str) -> bool:
    try:
        httpx.get(f"{url}/healthz", timeout=2)
    except httpx.ConnectError:
        return True
    except httpx.TransportError:
        return False
    return False


@pytest.mark.postgres
def test_slow_starting_workers_are_waited_for_not_killed(pg_url: str, tmp_path: Path) -> None:
    main = tmp_path / "slow_main.py"
    main.write_text(SLOW_MAIN)
    log = tmp_path / "serve.log"
    env = {**os.environ, "SLOW_IMPORT_S": "8"}
    with ServedApi(pg_url, 2, log, env, command=[sys.executable, str(main)]) as api:
        first = api.worker_pids()
        # The supervisor learns of a worker's start at its next look, after the worker's
        # first answer; a quick, not a fixed, wait.
        wait_until(
            lambda: any(line["message"] == "all 2 workers serving" for line in _log_lines(log)),
            30,
            "the supervisor did not log its workers' start",
        )
        lines = _log_lines(log)
        assert api.worker_pids() == first
    started = [str(line["message"]) for line in lines if "serving" in str(line["message"])]
    assert (
        sorted(
            int(message.split("[", 1)[1].split("]")[0])
            for message in started
            if message.startswith("worker")
        )
        == first
    ), lines
    assert "all 2 workers serving" in started
    # Each worker took longer than uvicorn's 5 s check, and was neither killed nor replaced.
    assert not [line for line in lines if "ended" in str(line["message"])], lines


@pytest.mark.postgres
def test_workers_die_with_their_supervisor_even_by_sigkill(pg_url: str, tmp_path: Path) -> None:
    with ServedApi(pg_url, 2, tmp_path / "serve.log") as api:
        wait_until(lambda: api.scheduling_pid() is not None, 30, "no scheduling process")
        # The scheduling process the workers hand placements to dies with them.
        workers = [*api.worker_pids(), api.scheduling_pid()]
        try:
            os.kill(api.process.pid, signal.SIGKILL)
            api.process.wait(timeout=30)
            wait_until(lambda: all(_gone(pid) for pid in workers), 30, "the workers did not end")
            wait_until(lambda: _refused(api.url), 30, "the port still answers")
        finally:
            for pid in workers:
                if not _gone(pid):
                    os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize(
    "workers", [1, pytest.param(2, marks=pytest.mark.postgres)], ids=["one", "workers"]
)
def test_sighup_reloads_the_token_and_policy_files_and_keeps_serving(
    workers: int, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    db = request.getfixturevalue("pg_url") if workers > 1 else f"sqlite:///{tmp_path / 'lm.db'}"
    tokens = tmp_path / "tokens.toml"
    tokens.write_text('[tokens]\n"first-admin" = "admin"\n')
    policies = tmp_path / "policies.toml"
    policies.write_text(POLICY.format(name="first"))
    env = {**os.environ, "LOADMASTER_POLICIES_FILE": str(policies)}
    log = tmp_path / "serve.log"
    with ServedApi(
        db, workers, log, token="first-admin", options=["--tokens", str(tokens)], env=env
    ) as api:
        pids = api.worker_pids()

        def answer(token: str) -> int:
            headers = {**CLIENT_HEADERS, "Authorization": f"Bearer {token}"}
            # A new connection each time, so either worker may answer.
            return httpx.get(f"{api.url}/resource_classes/VCPU", headers=headers).status_code

        def policy_names(token: str) -> set[str]:
            headers = {**CLIENT_HEADERS, "Authorization": f"Bearer {token}"}
            listed = httpx.get(f"{api.url}/policies", headers=headers).json()["policies"]
            return {p["name"] for p in listed}

        def scheduled_with(policy: str, token: str) -> int:
            headers = {**CLIENT_HEADERS, "Authorization": f"Bearer {token}"}
            body = {"requests": [{"vms": [str(uuid.uuid4())]}], "policy": policy}
            # 400: a policy the scheduler does not know; 404: it knows it, not the VM.
            return httpx.post(f"{api.url}/schedule", headers=headers, json=body).status_code

        assert answer("second-admin") == 401
        assert "first" in policy_names("first-admin")
        assert scheduled_with("second", "first-admin") == 400
        tokens.write_text('[tokens]\n"second-admin" = "admin"\n')
        policies.write_text(POLICY.format(name="second"))
        # Placements are decided where the new policy must be known: with several
        # workers, in the scheduling process, which reloads as the workers do.
        os.kill(api.process.pid, signal.SIGHUP)
        wait_until(
            lambda: scheduled_with("second", "second-admin") == 404, 60, "policy not reloaded"
        )

        def reloaded(what: str) -> set[str]:
            return {
                str(line["message"])
                for line in _log_lines(log)
                if str(line["message"]).startswith(f"reload: {what}")
            }

        wait_until(lambda: len(reloaded("1 tokens")) >= workers, 60, "not every worker reloaded")
        wait_until(lambda: len(reloaded("")) >= 2 * workers, 60, "policies not reloaded")
        assert all(answer("second-admin") == 200 for _ in range(8))
        assert all(answer("first-admin") == 401 for _ in range(8))
        for _ in range(8):
            names = policy_names("second-admin")
            assert "second" in names and "first" not in names, names
        # Still the same processes: reloaded in place, not restarted.
        assert api.process.poll() is None
        assert api.worker_pids() == pids

        # Files that do not parse change nothing: the reload is refused, by file.
        tokens.write_text("[tokens\n")
        policies.write_text("[policies.third\n")
        os.kill(api.process.pid, signal.SIGHUP)
        wait_until(
            lambda: (
                {"tokens", "policies"}
                <= {
                    str(line["message"]).split()[1]
                    for line in _log_lines(log)
                    if "refused" in str(line["message"])
                }
            ),
            60,
            "the broken files were not reported",
        )
        assert answer("second-admin") == 200
        assert "second" in policy_names("second-admin")
        assert api.process.poll() is None


POLICY = """
[policies.{name}]
description = "pack, reloaded"
weighers = [{{name = "pack", multiplier = 1.0}}]
"""


@pytest.mark.parametrize(
    ("name", "text"),
    [("t.toml", "[tokens\n"), ("t.yaml", "tokens: [\n"), ("t.json", '{"tokens": ')],
)
def test_a_token_file_that_does_not_parse_is_refused_by_name(
    tmp_path: Path, name: str, text: str
) -> None:
    broken = tmp_path / name
    broken.write_text(text)
    with pytest.raises(ValidationError) as err:
        AuthConfig.from_file(broken)
    assert err.value.field == "tokens" and str(broken) in err.value.detail
    served = run_cli("serve", "--db", f"sqlite:///{tmp_path / 'x.db'}", "--tokens", str(broken))
    assert served.returncode == 2 and str(broken) in served.stderr, served.stderr


def test_a_token_file_without_an_admin_stops_serve_by_name(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text("[tokens]\n")
    served = run_cli(
        "serve",
        "--db",
        f"sqlite:///{tmp_path / 'x.db'}",
        "--port",
        str(free_port()),
        "--tokens",
        str(tokens),
    )
    assert served.returncode == 2, served.stderr
    assert str(tokens) in served.stderr and "no token has role admin" in served.stderr


def test_a_reload_of_a_fifo_or_an_adminless_token_file_keeps_serving_the_old_tokens(
    tmp_path: Path,
) -> None:
    """The reload reads off the event loop: a FIFO in the token file's place held every
    request of the worker; a table without an admin token locked every operator out."""
    tokens = tmp_path / "tokens.toml"
    tokens.write_text('[tokens]\n"first-admin" = "admin"\n')
    log = tmp_path / "serve.log"
    db = f"sqlite:///{tmp_path / 'lm.db'}"
    with ServedApi(db, 1, log, token="first-admin", options=["--tokens", str(tokens)]) as api:

        def refusals() -> list[str]:
            return [
                str(line["message"])
                for line in _log_lines(log)
                if str(line["message"]).startswith("reload: tokens from")
            ]

        with api.client(timeout=10.0) as http:
            tokens.unlink()
            os.mkfifo(tokens)
            os.kill(api.process.pid, signal.SIGHUP)
            wait_until(lambda: len(refusals()) == 1, 60, "the FIFO was not refused")
            assert "not a regular file" in refusals()[0]
            assert http.get("/resource_classes/VCPU").status_code == 200

            tokens.unlink()
            tokens.write_text("[tokens]\n")
            os.kill(api.process.pid, signal.SIGHUP)
            wait_until(lambda: len(refusals()) == 2, 60, "the empty table was not refused")
            assert "no token has role admin" in refusals()[1]
            assert http.get("/resource_classes/VCPU").status_code == 200
        assert api.process.poll() is None


def test_stopping_serve_answers_the_agents_it_holds_at_once(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    with ServedApi(f"sqlite:///{tmp_path / 'lm.db'}", 1, log) as api:
        with api.client() as http:
            assert http.post("/hosts", json={"name": "h0"}).status_code == 201
            # Read once: a commit of this process stamped the host, which a wait would
            # otherwise answer at once.
            assert http.get("/hosts/h0/work").status_code == 200
        answers: list[tuple[int, float]] = []

        def poll() -> None:
            with api.client(timeout=90.0) as http:
                answer = http.get("/hosts/h0/work?after=1000000&wait=60")
                answers.append((answer.status_code, time.monotonic()))

        polls = [threading.Thread(target=poll, daemon=True) for _ in range(4)]
        for thread in polls:
            thread.start()
        wait_until(
            lambda: "loadmaster_agent_polls_waiting 4.0" in api.client().get("/metrics").text,
            60,
            "4 polls held",
        )
        stopping = time.monotonic()
        api.process.send_signal(signal.SIGTERM)
        for thread in polls:
            thread.join(timeout=30)
        api.process.wait(timeout=30)
    assert [status for status, _ in answers] == [200] * 4
    assert max(at for _, at in answers) - stopping < 2.0
    assert "Traceback" not in log.read_text(errors="replace")


def test_each_worker_of_several_serves_with_the_server_that_answers_held_polls() -> None:
    """``serve --workers N`` builds its servers in its workers, not in ``run_server``."""
    config = uvicorn.Config("loadmaster.api.app:app_from_env", factory=True, workers=2)
    assert isinstance(Worker(config, []).server, StoppingServer)
