"""HTTPS for ``loadmaster serve``: the server's certificate, read again on SIGHUP, and
agents' client certificates (mutual TLS).

uvicorn builds each serving process's ``SSLContext`` through ``server_context`` (its
``ssl_context_factory``), which keeps it here: a reload loads the new certificate chain
into that same context, so the next handshakes present it while connections already open
keep theirs. With ``--workers N`` each worker builds, keeps and reloads its own.

With a client CA the server asks every client for a certificate but requires none (token
users send none); one that does not verify against that CA ends the handshake. A
verified one names its host by its subject's common name, else by its one DNS subject
alternative name. uvicorn shows the ASGI app nothing of the TLS connection, so
``api.server.NoDelayHTTPProtocol`` puts that name in the ``state`` of each of the
connection's requests, under ``CLIENT_HOST``, and authentication takes it as role
``agent:<host>`` (``api.auth.request_role``).
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

from uvicorn.config import Config

from loadmaster.errors import ValidationError

# The key of a verified client certificate's host in a request's ``scope["state"]``.
CLIENT_HOST = "tls_client_host"

# The contexts this process serves with (one, or none when it serves plain HTTP).
_served: list[ssl.SSLContext] = []


def server_context(config: Config, default: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
    """uvicorn's context (certificate, key, client CA as ``config`` says), kept for
    ``reload_certificate``."""
    context = default()
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _served.append(context)
    return context


def reload_certificate(cert: Path, key: Path | None) -> int:
    """Load ``cert`` and ``key`` into every context this process serves with, for the
    handshakes to come; how many. Raises ``OSError`` (``ssl.SSLError`` among them), the
    contexts unchanged, when the files cannot be read or do not match."""
    # Loaded into a live context, a key that does not match the certificate would leave it
    # with the new certificate and no key at all: every handshake would fail.
    ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key)
    for context in _served:
        context.load_cert_chain(cert, key)
    return len(_served)


def check_server_files(cert: Path, key: Path | None, client_ca: Path | None) -> None:
    """That ``serve`` can use these files: a ``ValidationError`` naming the option and the
    reason if not."""
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key)
    except OSError as exc:
        files = f"{cert} and {key}" if key is not None else str(cert)
        raise ValidationError(
            f"--tls-cert/--tls-key: cannot use {files}: {exc}", field="tls_cert"
        ) from exc
    if client_ca is not None:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_verify_locations(client_ca)
        except OSError as exc:
            raise ValidationError(
                f"--tls-client-ca: cannot use {client_ca}: {exc}", field="tls_client_ca"
            ) from exc


def peer_host(certificate: dict[str, Any] | None) -> str | None:
    """The host a verified client certificate (``SSLObject.getpeercert()``) names: its
    subject's common name, else its DNS name if it has exactly one; None for no
    certificate, an unverified one (an empty dict) or one naming no host."""
    if not certificate:
        return None
    for rdn in certificate.get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and value:
                return str(value)
    names = [value for kind, value in certificate.get("subjectAltName", ()) if kind == "DNS"]
    return str(names[0]) if len(names) == 1 else None
