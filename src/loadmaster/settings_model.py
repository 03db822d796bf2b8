"""The settings as a typed pydantic-settings model: each field's default and description
come from ``settings.OPTIONS``, its type and bounds are here."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from loadmaster.settings import OPTIONS, PREFIX


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
    agent_silent_after: float = _field("agent_silent_after", ge=1.0)
    fence_command: str = _field("fence_command")
    fence_timeout: float = _field("fence_timeout", gt=0.0)
    pending_warn_after: float = _field("pending_warn_after", ge=0.0)
    scheduler_policy: str = _field("scheduler_policy")
    policies_file: Path | None = _field("policies_file")
    unknown_specs: Literal["refuse", "warn"] = _field("unknown_specs")
    randomize_allocation_candidates: bool = _field("randomize_allocation_candidates")
    scheduling_dir: Path | None = _field("scheduling_dir")
