"""Where tokens come from, and that they never show up where they should not."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from loadmaster.api import AuthConfig, create_app
from loadmaster.api.auth import resolve_auth
from loadmaster.api.tls import peer_host
from loadmaster.errors import ValidationError
from loadmaster.microversions import CLIENT_HEADERS
from loadmaster.scheduler.core.policies import load_policy_file
from loadmaster.settings import MAX_FILE_BYTES
from loadmaster.settings_model import load_settings

SECRET = "s3cr3t-admin-token"


@pytest.mark.parametrize(
    ("suffix", "text"),
    [
        (".toml", f'[tokens]\n"{SECRET}" = "admin"\n"r-token" = "reader"\n'),
        (".yaml", f"tokens:\n  {SECRET}: admin\n  r-token: reader\n"),
        (".json", json.dumps({"tokens": {SECRET: "admin", "r-token": "reader"}})),
    ],
)
def test_token_files(tmp_path: Path, suffix: str, text: str) -> None:
    path = tmp_path / f"tokens{suffix}"
    path.write_text(text)
    config = AuthConfig.from_file(path)
    assert config.role_of(SECRET) == "admin" and config.role_of("r-token") == "reader"
    assert config.role_of(SECRET[:-1]) is None and config.role_of("") is None
    assert SECRET not in repr(config)


@pytest.mark.parametrize(
    ("suffix", "text"),
    [
        (".toml", "[tokens]\n"),
        (".toml", '[tokens]\n"r-token" = "reader"\n'),
        (".yaml", "tokens: {}\n"),
        (".json", json.dumps({"tokens": {"a-token": "agent:h0"}})),
    ],
)
def test_a_token_file_without_an_admin_is_refused_by_name(
    tmp_path: Path, suffix: str, text: str
) -> None:
    """Accepted, it would lock every operator out until someone fixed the file by hand."""
    path = tmp_path / f"tokens{suffix}"
    path.write_text(text)
    with pytest.raises(ValidationError) as refused:
        AuthConfig.from_file(path)
    assert refused.value.field == "tokens"
    assert str(path) in refused.value.detail and "no token has role admin" in refused.value.detail


def _read_within(seconds: float, read: Callable[[], object]) -> BaseException | None:
    """What ``read()`` raised (None: it returned), failing if it takes over ``seconds``."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            read()
        except BaseException as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    reader = threading.Thread(target=run, daemon=True)
    reader.start()
    reader.join(seconds)
    assert outcome, f"still reading after {seconds} s"
    return outcome[0]


def test_only_a_regular_file_of_bounded_size_is_read_as_tokens_or_policies(
    tmp_path: Path,
) -> None:
    """A FIFO blocked its reader until something wrote to it; a link to /dev/zero was read
    until memory ran out."""
    fifo = tmp_path / "tokens.toml"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.toml"
    with huge.open("wb") as out:
        out.truncate(MAX_FILE_BYTES + 1)
    endless = tmp_path / "endless.toml"
    endless.symlink_to("/dev/zero")
    for path, reason in ((fifo, "not a regular file"), (huge, "larger than"), (endless, "not")):
        for read, field in (
            (lambda p=path: AuthConfig.from_file(p), "tokens"),
            (lambda p=path: load_policy_file(p), "policies_file"),
        ):
            refused = _read_within(10.0, read)
            assert isinstance(refused, ValidationError), refused
            assert refused.field == field and str(path) in refused.detail
            assert reason in refused.detail, refused.detail


def test_tokens_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOADMASTER_TOKENS", f"{SECRET}:admin, r:tok:reader")
    inline = load_settings().tokens.get_secret_value()
    config = resolve_auth(no_auth=False, tokens_file=None, inline=inline)
    assert config is not None
    assert config.role_of(SECRET) == "admin" and config.role_of("r:tok") == "reader"


def test_hashed_tokens_inline_and_malformed_hashes(monkeypatch: pytest.MonkeyPatch) -> None:
    digest = hashlib.sha256(SECRET.encode()).hexdigest()
    monkeypatch.setenv("LOADMASTER_TOKENS", f"sha256:{digest}:agent:host-1, plain:reader")
    config = resolve_auth(
        no_auth=False, tokens_file=None, inline=load_settings().tokens.get_secret_value()
    )
    assert config is not None
    assert config.role_of(SECRET) == "agent:host-1" and config.role_of("plain") == "reader"
    assert config.role_of(f"sha256:{digest}") is None
    for entry in (f"sha256:{digest[:-1]}", f"sha256:{digest.upper()}", "sha256:"):
        with pytest.raises(ValidationError) as err:
            AuthConfig({"fine": "admin", entry: "admin"})
        assert err.value.field == "tokens" and "token entry 1" in err.value.detail
        assert entry == "sha256:" or entry not in err.value.detail


def test_the_host_a_client_certificate_names() -> None:
    cn = ((("countryName", "FR"),), (("commonName", "host-1"),))
    assert peer_host({"subject": cn, "subjectAltName": (("DNS", "other"),)}) == "host-1"
    assert peer_host({"subject": (), "subjectAltName": (("DNS", "host-2"),)}) == "host-2"
    two = (("DNS", "host-2"), ("DNS", "host-3"), ("IP Address", "10.0.0.1"))
    assert peer_host({"subject": (), "subjectAltName": two}) is None
    # Not verified (empty) or not sent.
    assert peer_host({}) is None and peer_host(None) is None


def test_misconfiguration_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValidationError, match="no tokens configured"):
        resolve_auth(no_auth=False, tokens_file=None)
    assert resolve_auth(no_auth=True, tokens_file=None) is None
    with pytest.raises(ValidationError, match="role"):
        AuthConfig.from_inline("tok:root")
    with pytest.raises(ValidationError, match="no role"):
        AuthConfig.from_inline("just-a-token")
    bad = tmp_path / "tokens.ini"
    bad.write_text("x")
    with pytest.raises(ValidationError, match=r"\.toml"):
        AuthConfig.from_file(bad)


def test_tokens_are_not_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    app = create_app(f"sqlite:///{tmp_path / 'auth.db'}", AuthConfig({SECRET: "admin"}))
    with caplog.at_level(logging.DEBUG), TestClient(app) as client:
        assert client.get("/flavors", headers={"Authorization": f"Bearer {SECRET}"}).is_success
        assert (
            client.get("/flavors", headers={"Authorization": "Bearer wrong-token"}).status_code
            == 401
        )
    assert caplog.records and all(
        SECRET not in r.getMessage() and "wrong-token" not in r.getMessage() for r in caplog.records
    )
    assert all(SECRET not in str(getattr(r, "fields", "")) for r in caplog.records)


def test_no_auth_app_serves_without_tokens(tmp_path: Path) -> None:
    app = create_app(f"sqlite:///{tmp_path / 'open.db'}", None)
    with TestClient(app) as client:
        assert client.put("/traits/CUSTOM_OPEN", headers=CLIENT_HEADERS).status_code == 201
        assert "securitySchemes" not in client.get("/openapi.json").json().get("components", {})


def test_missing_and_wrong_tokens_are_told_apart(tmp_path: Path) -> None:
    """Both 401, each saying what to fix; the token sent is never echoed."""
    app = create_app(f"sqlite:///{tmp_path / 'auth.db'}", AuthConfig({SECRET: "admin"}))
    with TestClient(app) as client:
        missing = client.get("/flavors")
        basic = client.get("/flavors", headers={"Authorization": "Basic YWRtaW46YWRtaW4="})
        wrong = client.get("/flavors", headers={"Authorization": "Bearer wrong-token-42"})
        wrong_x = client.get("/flavors", headers={"X-Auth-Token": "wrong-token-42"})
    for response in (missing, basic, wrong, wrong_x):
        assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
        assert response.json()["code"] == "loadmaster.unauthenticated"
    assert missing.json()["detail"].startswith("no token sent: send Authorization: Bearer")
    assert basic.json()["detail"] == missing.json()["detail"]
    assert wrong.json()["detail"].startswith("the token sent is not one this server knows")
    assert wrong_x.json()["detail"] == wrong.json()["detail"]
    assert "wrong-token-42" not in wrong.text + wrong_x.text
