"""One settings object: every option read from LOADMASTER_<NAME>, documented, and bad
values refused naming their variable; operators' scheduling policies from a TOML file."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.scheduler.conftest import add_hosts, small_flavor

import loadmaster
from loadmaster.errors import ValidationError
from loadmaster.scheduler import RequestSpec
from loadmaster.scheduler.core.policies import load_policy_file
from loadmaster.service import Loadmaster
from loadmaster.settings import OPTIONS, env_name
from loadmaster.settings_model import Settings, load_settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in os.environ:
        if name.startswith("LOADMASTER_"):
            monkeypatch.delenv(name)


@pytest.fixture
def slm(tmp_path: Path) -> Iterator[Loadmaster]:
    with loadmaster.open(f"sqlite:///{tmp_path / 'settings.db'}") as service:
        yield service


def test_each_option_comes_from_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    untouched = load_settings()
    for name, option in OPTIONS.items():
        value = getattr(untouched, name)
        if hasattr(value, "get_secret_value"):
            value = value.get_secret_value()
        assert value == option.default, name
    monkeypatch.setenv("LOADMASTER_DB", "sqlite:///elsewhere.db")
    monkeypatch.setenv("LOADMASTER_MAX_BODY", "2048")
    monkeypatch.setenv("LOADMASTER_NO_AUTH", "1")
    monkeypatch.setenv("LOADMASTER_TOKEN", "s3cret")
    chosen = load_settings()
    assert (chosen.db, chosen.max_body, chosen.no_auth) == ("sqlite:///elsewhere.db", 2048, True)
    assert chosen.token is not None and chosen.token.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(chosen)


@pytest.mark.parametrize(
    ("variable", "value", "words"),
    [
        ("LOADMASTER_MAX_BODY", "lots", "valid integer"),
        ("LOADMASTER_MAX_BODY", "0", "greater than or equal to 1"),
        ("LOADMASTER_UNKNOWN_SPECS", "ignore", "'refuse' or 'warn'"),
        ("LOADMASTER_AGENT_SILENT_AFTER", "0.5", "greater than or equal to 1"),
    ],
)
def test_a_bad_value_is_refused_naming_its_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, words: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError) as err:
        load_settings()
    assert err.value.detail.startswith(f"{variable}: ") and words in err.value.detail
    assert env_name(str(err.value.field)) == variable


def test_every_option_is_described_and_documented() -> None:
    doc = (ROOT / "docs/configuration.md").read_text()
    documented = set(re.findall(r"`(LOADMASTER_[A-Z_]+)`", doc))
    assert set(Settings.model_fields) == set(OPTIONS)
    for name, option in OPTIONS.items():
        assert option.description, f"{name} has no description"
        assert Settings.model_fields[name].default == option.default
        assert env_name(name) in documented, f"{name} is not in docs/configuration.md"
    assert documented == {env_name(name) for name in OPTIONS}


POLICIES = """
[policies.first-host]
description = "the host named first, with only the filters that matter here"
weighers = [{name = "vm_count", multiplier = 1.0}]
filters = ["host_state", "resources"]

[policies.no-state]
weighers = [{name = "pack"}]
disabled_filters = ["host_state"]
sample = 10
"""


def test_policies_from_the_operators_file_choose_filters_and_weighers(
    slm: Loadmaster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_hosts(slm, 2, vcpu=8)
    small_flavor(slm)
    slm.hosts.set_state("h0", "maintenance")
    path = tmp_path / "policies.toml"
    path.write_text(POLICIES)
    monkeypatch.setenv("LOADMASTER_POLICIES_FILE", str(path))
    monkeypatch.setenv("LOADMASTER_SCHEDULER_POLICY", "no-state")
    lm = Loadmaster(slm.store)
    assert lm.scheduler.default_policy == "no-state"
    spec = RequestSpec(flavor="small", exclude_hosts=["h1"])
    # "first-host" runs no hosts filter: exclude_hosts is not its business.
    assert (
        lm.scheduler.schedule([spec], dry_run=True, policy="first-host").placements[0].host == "h1"
    )
    # "no-state" switched host_state off: a host in maintenance is chosen.
    assert lm.scheduler.schedule([spec], dry_run=True).placements[0].host == "h0"
    explained = lm.scheduler.explain(RequestSpec(flavor="small"), policy="first-host")
    assert [f.filter for f in explained.filters] == ["host_state"]


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        (
            "[policies.p]\nweighers = [{multiplier = 2}]",
            "weighers[0]",
            "must be a table with a name",
        ),
        ("[policies.p]\nsample = 0", "sample", "positive integer"),
        ("[policies.p]\nfilterz = []", "policies.p.filterz", "not a policy setting"),
        ("[policy.p]", "policy", "not a section"),
        ("[policies.p]\nfilters = 'resources'", "filters", "must be a list"),
    ],
)
def test_a_bad_policy_file_is_refused_naming_the_setting(
    tmp_path: Path, text: str, field: str, words: str
) -> None:
    path = tmp_path / "policies.toml"
    path.write_text(text)
    with pytest.raises(ValidationError) as err:
        load_policy_file(path)
    assert str(err.value.field).endswith(field) and words in err.value.detail
    assert str(path) in err.value.detail


def test_a_policy_running_an_unregistered_filter_is_refused(
    slm: Loadmaster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_hosts(slm, 1)
    small_flavor(slm)
    path = tmp_path / "policies.toml"
    path.write_text("[policies.odd]\nfilters = ['resources', 'nonesuch']\n")
    monkeypatch.setenv("LOADMASTER_POLICIES_FILE", str(path))
    with pytest.raises(ValidationError, match="runs filter 'nonesuch', which is not registered"):
        Loadmaster(slm.store).scheduler.schedule(
            [RequestSpec(flavor="small")], dry_run=True, policy="odd"
        )


def test_the_settings_command_shows_values_without_secrets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from typer.testing import CliRunner

    from loadmaster.cli import app

    monkeypatch.setenv("LOADMASTER_TOKEN", "s3cret")
    monkeypatch.setenv("LOADMASTER_MAX_BODY", "4096")
    result = CliRunner().invoke(app, ["settings", "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["variable"]: row for row in json.loads(result.output)}
    assert set(rows) == {env_name(name) for name in OPTIONS}
    assert rows["LOADMASTER_MAX_BODY"]["value"] == "4096"
    assert rows["LOADMASTER_TOKEN"]["value"] == "(set)" and "s3cret" not in result.output
    monkeypatch.setenv("LOADMASTER_MAX_BODY", "lots")
    refused = CliRunner().invoke(app, ["settings"])
    assert refused.exit_code != 0 and "LOADMASTER_MAX_BODY" in refused.output
