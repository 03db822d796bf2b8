"""Bearer tokens with four roles: ``admin`` may write, ``reader`` may only read,
``agent:<host>`` is a host agent's, bound to its host: it reads, registers and reports
for its own host, and says ``up``/``launch-failed``/``migration-failed``/``migrate`` for
VMs on that host only (the routes check the VM; see ``agent_host``), and ``member`` is
an identity with no operator rights (OpenStack's project member): it is known, so not
401, but every route answers 403, as Placement's default policy answers non-admins.

Tokens come from a file (TOML, YAML or JSON, chosen by extension)::

    [tokens]                       # TOML; YAML and JSON use the same structure
    "s3cr3t-admin" = "admin"
    "s3cr3t-reader" = "reader"
    "s3cr3t-host-1" = "agent:host-1"
    "s3cr3t-tenant" = "member"

or from ``LOADMASTER_TOKENS="tok1:admin,tok2:reader"``. An entry may hold a token's
SHA-256 instead of the token, ``"sha256:<64 hex digits>" = "reader"``, so that the file
does not give the token away; the token sent is hashed and compared. A token comes as
``Authorization: Bearer <token>`` or, as OpenStack's clients send it, ``X-Auth-Token:
<token>``; both map through the same table, so the same roles apply. Checking is a
middleware, so a request without a valid token is refused before its body is read.

Over HTTPS with a client CA (``serve --tls-client-ca``), a request that sends no token but
came with a verified client certificate naming host H has role ``agent:H`` (``api.tls``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from starlette.types import ASGIApp, Receive, Scope, Send

from loadmaster.api.errors import Forbidden, Unauthenticated, error_response
from loadmaster.api.tls import CLIENT_HOST
from loadmaster.errors import ValidationError
from loadmaster.settings import env_name, read_operator_file

ROLES = ("admin", "reader", "member", "agent:<host>")
PLAIN_ROLES = frozenset(ROLES[:3])
AGENT_PREFIX = "agent:"
HASHED_PREFIX = "sha256:"
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
# The writes an agent may make, each naming its own host or a VM of it.
_AGENT_HOST_WRITES = (re.compile(r"^/hosts/(?P<host>[^/]+)/(agent|report)$"),)
_AGENT_VM_WRITES = re.compile(r"^/vms/[^/]+/(up|launch-failed|migration-failed|migrate)$")
TOKENS_ENV = env_name("tokens")
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# Liveness probes, the API description and Placement's version document (clients read it
# to negotiate before they authenticate) need no token.
OPEN_PATHS = frozenset({"/", "/healthz", "/openapi.json", "/docs", "/docs/oauth2-redirect"})


@dataclass(frozen=True)
class AuthConfig:
    """``token -> role``. ``repr`` hides the tokens so a logged config leaks nothing."""

    tokens: Mapping[str, str] = field(repr=False)

    def __post_init__(self) -> None:
        for role in self.tokens.values():
            if role not in PLAIN_ROLES and not (
                role.startswith(AGENT_PREFIX) and len(role) > len(AGENT_PREFIX)
            ):
                raise ValidationError(
                    f"role {role!r} is not one of {', '.join(ROLES)}", field="tokens"
                )
        if any(not token for token in self.tokens):
            raise ValidationError("a token must not be empty", field="tokens")
        for i, token in enumerate(self.tokens):
            if token.startswith(HASHED_PREFIX) and not _SHA256_HEX.fullmatch(
                token[len(HASHED_PREFIX) :]
            ):
                # The entry itself is not echoed: it may be a token mistyped.
                raise ValidationError(
                    f"token entry {i} starts with {HASHED_PREFIX} but is not followed by a "
                    "SHA-256 in 64 lower-case hexadecimal digits",
                    field="tokens",
                )

    def role_of(self, presented: str) -> str | None:
        """The role of ``presented``, comparing against every token (or, for a hashed
        entry, its SHA-256) in constant time so the time taken tells nothing about how
        much of a token matched."""
        found = None
        given = presented.encode()
        hashed = (HASHED_PREFIX + hashlib.sha256(given).hexdigest()).encode()
        for token, role in self.tokens.items():
            expected = hashed if token.startswith(HASHED_PREFIX) else given
            if hmac.compare_digest(token.encode(), expected):
                found = role
        return found

    @classmethod
    def from_inline(cls, text: str) -> AuthConfig:
        """From ``token:role,token:role`` (the ``tokens`` setting)."""
        tokens: dict[str, str] = {}
        for i, item in enumerate(p.strip() for p in text.split(",")):
            if not item:
                continue
            bound = item.find(":" + AGENT_PREFIX)
            if bound > 0:  # an agent's role holds a colon itself: token:agent:<host>
                token, sep, role = item[:bound], ":", item[bound + 1 :]
            else:
                token, sep, role = item.rpartition(":")
            if not sep:
                raise ValidationError(
                    f"{TOKENS_ENV} entry {i} has no role: write token:admin or token:reader",
                    field=TOKENS_ENV,
                )
            tokens[token] = role
        return cls(tokens)

    @classmethod
    def from_file(cls, path: str | Path) -> AuthConfig:
        path = Path(path)
        text = read_operator_file(path, "tokens")
        data: object
        try:
            if path.suffix == ".toml":
                data = tomllib.loads(text)
            elif path.suffix in (".yaml", ".yml"):
                data = yaml.safe_load(text)
            elif path.suffix == ".json":
                data = json.loads(text)
            else:
                raise ValidationError(
                    f"{path}: token files end in .toml, .yaml, .yml or .json", field="tokens"
                )
        except (ValueError, yaml.YAMLError) as exc:  # TOML's and JSON's errors are ValueErrors
            raise ValidationError(f"{path}: {exc}", field="tokens") from exc
        tokens = data.get("tokens") if isinstance(data, Mapping) else None
        if not isinstance(tokens, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in tokens.items()
        ):
            raise ValidationError(
                f"{path}: expected a 'tokens' table of token = role", field="tokens"
            )
        if "admin" not in tokens.values():
            # Accepted, it would refuse every operator until the file is fixed by hand.
            raise ValidationError(
                f"{path}: no token has role admin, so no operator could use the API; "
                'add one (e.g. "<secret>" = "admin")',
                field="tokens",
            )
        return cls(dict(tokens))


class TokenTable:
    """The tokens a running server checks. A reload (SIGHUP, ``api.reload``) replaces
    ``config`` whole, so each request sees the old tokens or the new ones, never a mix."""

    def __init__(self, config: AuthConfig) -> None:
        self.config = config


class AuthMiddleware:
    """Refuses requests without a known bearer token (401) and writes by readers (403)."""

    def __init__(self, app: ASGIApp, tokens: TokenTable) -> None:
        self.app = app
        self.tokens = tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        role = request_role(scope, self.tokens)
        if role is None:
            presented = presented_token(scope)
            # Both are 401, but an operator fixes them differently: configure a token, or
            # correct the one configured. The token itself is never echoed.
            detail = (
                "no token sent: send Authorization: Bearer <token> or X-Auth-Token: <token>"
                if presented is None
                else "the token sent is not one this server knows: check it for a typo "
                "and that the server's tokens include it"
            )
            response = error_response(
                Unauthenticated(detail), headers={"WWW-Authenticate": "Bearer"}
            )
        elif role.startswith(AGENT_PREFIX):
            host = role[len(AGENT_PREFIX) :]
            if scope["method"] in READ_METHODS or _agent_may_write(scope["path"], host):
                scope.setdefault("state", {})["agent_host"] = host
                await self.app(scope, receive, send)
                return
            response = error_response(
                Forbidden(f"the agent of host {host} may only write for its own host and VMs")
            )
        elif role == "member":
            response = error_response(
                Forbidden("role member may not use this API; it needs admin or reader")
            )
        elif role != "admin" and scope["method"] not in READ_METHODS:
            response = error_response(Forbidden(f"role {role} may only read; writing needs admin"))
        else:
            scope.setdefault("state", {})["role"] = role
            await self.app(scope, receive, send)
            return
        await response(scope, receive, send)


def request_role(scope: Scope, tokens: TokenTable) -> str | None:
    """The role of the request: its token's if it sends one, else ``agent:<host>`` for a
    verified client certificate naming the host; None when neither is known."""
    presented = presented_token(scope)
    if presented is not None:
        return tokens.config.role_of(presented)
    host = scope.get("state", {}).get(CLIENT_HOST)
    return None if host is None else AGENT_PREFIX + host


def presented_token(scope: Scope) -> str | None:
    """The bearer or X-Auth-Token token of the request, None when it sends neither."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
        elif name == b"x-auth-token" and value.strip():
            return value.decode("latin-1").strip()
    return None


def _agent_may_write(path: str, host: str) -> bool:
    for pattern in _AGENT_HOST_WRITES:
        match = pattern.match(path)
        if match:
            return match.group("host") == host
    return _AGENT_VM_WRITES.match(path) is not None


def resolve_auth(
    *, no_auth: bool, tokens_file: str | Path | None, inline: str = ""
) -> AuthConfig | None:
    """What a server runs with: nothing (``--no-auth``), a token file, else the ``inline``
    tokens; with none of them it must not start, since "no token, no access"."""
    if no_auth:
        return None
    if tokens_file:
        return AuthConfig.from_file(tokens_file)
    config = AuthConfig.from_inline(inline)
    if not config.tokens:
        raise ValidationError(
            f"no tokens configured: pass --tokens FILE, set {TOKENS_ENV}=token:admin,... "
            "or use --no-auth for local use",
            field="tokens",
        )
    return config
