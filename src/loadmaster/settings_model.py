"""The settings as a typed pydantic-settings model: each field's default and description
come from ``settings.OPTIONS``, its type and bounds are here; ``load_settings`` reads
them from the environment."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import pydantic
from pydantic import Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from loadmaster.errors import LoadmasterError, ValidationError
from loadmaster.heartbeat import flush_every, min_silent_after
from loadmaster.resources.aliases import parse_aliases
from loadmaster.settings import OPTIONS, PREFIX, env_name


def _field(name: str, **bounds: Any) -> Any:
    option = OPTIONS[name]
    return Field(default=option.default, description=option.description, **bounds)


class Settings(BaseSettings):
    """loadmaster's options; see ``loadmaster.settings``."""

    model_config = SettingsConfigDict(
        env_prefix=PREFIX, extra="ignore", frozen=True, validate_default=True
    )

    db: str = _field("db")
    url: str = _field("url")
    token: SecretStr | None = _field("token")
    tokens: SecretStr = _field("tokens")
    tokens_file: Path | None = _field("tokens_file")
    no_auth: bool = _field("no_auth")
    tls_cert: Path | None = _field("tls_cert")
    tls_key: Path | None = _field("tls_key")
    tls_client_ca: Path | None = _field("tls_client_ca")
    ca: Path | None = _field("ca")
    max_body: int = _field("max_body", ge=1)
    # Before agent_silent_after: its check reads this one.
    agent_heard_every: float = _field("agent_heard_every", ge=0.1)
    agent_silent_after: float = _field("agent_silent_after", ge=1.0)
    fence_command: str = _field("fence_command")
    fence_timeout: float = _field("fence_timeout", gt=0.0)
    pending_warn_after: float = _field("pending_warn_after", ge=0.0)
    scheduler_policy: str = _field("scheduler_policy")
    policies_file: Path | None = _field("policies_file")
    unknown_specs: Literal["refuse", "warn"] = _field("unknown_specs")
    pci_aliases: str = _field("pci_aliases")
    randomize_allocation_candidates: bool = _field("randomize_allocation_candidates")
    scheduling_dir: Path | None = _field("scheduling_dir")
    fast_statements: bool = _field("fast_statements")

    @field_validator("pci_aliases")
    @classmethod
    def _aliases_parse(cls, value: str) -> str:
        try:
            parse_aliases(value)
        except LoadmasterError as exc:
            raise ValueError(exc.detail) from None
        return value

    @field_validator("agent_silent_after")
    @classmethod
    def _longer_than_liveness_guarantees(cls, value: float, info: ValidationInfo) -> float:
        heard_every = info.data.get("agent_heard_every")
        if heard_every is None:
            return value  # agent_heard_every was refused: that error is the one to fix
        least = min_silent_after(heard_every)
        if value < least:
            raise ValueError(
                f"{value:g} s is below the {least:g} s a live agent is guaranteed to be "
                f"heard within, twice over (agent_heard_every {heard_every:g} s plus a "
                f"{flush_every(heard_every):g} s flush): healthy hosts would be taken for dead "
                f"and fenced; set it to at least {least:g}, or agent_heard_every lower"
            )
        return value


def load_settings() -> Settings:
    """The settings of this process, read from the environment now; a bad value is an
    error naming its variable."""
    try:
        return Settings()
    except pydantic.ValidationError as exc:
        error = exc.errors()[0]
        option = str(error["loc"][0]) if error["loc"] else ""
        name = env_name(option) if option in OPTIONS else PREFIX
        said = error["msg"].removeprefix("Value error, ")
        raise ValidationError(f"{name}: {said}", field=option or None) from exc
