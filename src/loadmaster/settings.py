"""Every option loadmaster reads from its environment, in one place.

Each field is read from ``LOADMASTER_<NAME>`` (``db`` from ``LOADMASTER_DB``); a command
line option, where one exists, wins over the variable. ``loadmaster settings`` prints them
all with their values and what they do, and docs/configuration.md lists them. Nothing else
in loadmaster reads the environment: the server, the CLI and the Python API take their
defaults from ``load_settings()``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pydantic
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from loadmaster.errors import ValidationError

PREFIX = "LOADMASTER_"


class Settings(BaseSettings):
    """loadmaster's options; see the module docstring."""

    model_config = SettingsConfigDict(env_prefix=PREFIX, extra="ignore", frozen=True)

    db: str = Field(
        default="sqlite:///loadmaster.db",
        description="database URL: sqlite:///FILE (the embedded default) or "
        "postgresql+psycopg://USER@HOST:PORT/DB when several processes share one state",
    )
    url: str = Field(
        default="http://127.0.0.1:8080", description="the API address remote CLI commands talk to"
    )
    token: SecretStr | None = Field(
        default=None, description="bearer token the CLI and the host agent present to the API"
    )
    tokens: SecretStr = Field(
        default=SecretStr(""),
        description="the server's tokens inline, token:role,... (roles: admin, reader, "
        "member, agent:<host>); a token file (tokens_file) is the better place",
    )
    tokens_file: Path | None = Field(
        default=None,
        description="the server's token file (.toml/.yaml/.json: [tokens] TOKEN = ROLE)",
    )
    no_auth: bool = Field(default=False, description="serve without tokens (local use only)")
    max_body: int = Field(
        default=1024 * 1024, ge=1, description="largest request body the server accepts, in bytes"
    )
    agent_silent_after: float = Field(
        default=60.0,
        ge=1.0,
        description="seconds without a word from a host's agent before the host and its "
        "VMs are shown as silent (their claims are kept)",
    )
    scheduler_policy: str = Field(
        default="spread", description="the scheduling policy used when a request names none"
    )
    policies_file: Path | None = Field(
        default=None,
        description="TOML file of scheduling policies, [policies.NAME] with weighers, "
        "filters and disabled_filters (see docs/scheduling.md)",
    )
    unknown_specs: Literal["refuse", "warn"] = Field(
        default="refuse",
        description="flavor extra specs loadmaster does not know: refuse the flavor, or "
        "warn and ignore them",
    )

    @classmethod
    def env_name(cls, field: str) -> str:
        if field not in cls.model_fields:
            raise KeyError(field)
        return PREFIX + field.upper()


# Every option's default, for help texts and typer defaults (no environment read).
DEFAULTS = Settings.model_construct()


def load_settings() -> Settings:
    """The settings of this process, read from the environment now; a bad value is an
    error naming its variable."""
    try:
        return Settings()
    except pydantic.ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else ""
        name = Settings.env_name(field) if field in Settings.model_fields else PREFIX
        raise ValidationError(f"{name}: {error['msg']}", field=field or None) from exc
