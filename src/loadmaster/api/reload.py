"""``SIGHUP`` (what ``systemctl reload`` sends): a serving process reads its files again
and keeps serving.

What lives in files is reloaded: the token file, the scheduler's policies file
(``LOADMASTER_POLICIES_FILE``) and the server's TLS certificate and key (``--tls-cert``,
``--tls-key``; the client CA is read at start only). Settings given as environment variables or options are
the process's own, fixed at its start (the database, the body limit, the fence command,
the default policy, ...), so a change to one needs a restart. A file that cannot be read
or parsed (or is not a regular file, or is larger than ``settings.MAX_FILE_BYTES``), or a
token file with no admin token, is logged and what was loaded before stays: a typo must
not lock every agent or operator out or leave the scheduler without its policies.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Callable

from loadmaster.api import tls
from loadmaster.api.auth import TOKENS_ENV, TokenTable, resolve_auth
from loadmaster.errors import LoadmasterError
from loadmaster.scheduler import Scheduler
from loadmaster.scheduler.core.policies import load_policy_file
from loadmaster.settings_model import Settings

log = logging.getLogger("loadmaster.api.reload")


def reload_tokens(tokens: TokenTable | None, settings: Settings) -> bool:
    """Replace the tokens in ``tokens`` with those ``settings`` name now; False (and the
    old tokens kept) if they cannot be read. ``None``: a server without authentication,
    which stays so."""
    if tokens is None:
        log.info("reload: serving without tokens (--no-auth), nothing to reload")
        return True

    def install() -> int:
        fresh = resolve_auth(
            no_auth=False,
            tokens_file=settings.tokens_file,
            inline=settings.tokens.get_secret_value(),
        )
        assert fresh is not None  # no_auth=False
        tokens.config = fresh
        return len(fresh.tokens)

    return _reload("tokens", settings.tokens_file or TOKENS_ENV, install)


def reload_certificate(settings: Settings) -> bool:
    """The server's certificate and key read again from ``settings.tls_cert`` and
    ``tls_key`` (none: serving plain HTTP, nothing to do); False, and the certificate
    presented until now kept, if they cannot be used."""
    cert = settings.tls_cert
    if cert is None:
        return True
    return _reload(
        "certificate and key", cert, lambda: tls.reload_certificate(cert, settings.tls_key)
    )


def reload_policies(scheduler: Scheduler, settings: Settings) -> bool:
    """The operator's policies read again from ``settings.policies_file`` (none set:
    nothing to do); False, and the previous policies kept, if they are refused."""
    path = settings.policies_file
    if path is None:
        return True

    def install() -> int:
        scheduler.use_policies(load_policy_file(path))
        return len(scheduler.policies)

    return _reload("policies", path, install)


def _reload(what: str, source: object, install: Callable[[], int]) -> bool:
    """``install`` (it reads ``what`` from ``source``, puts it in force and says how many)
    with its outcome logged; a refusal or a file that cannot be read leaves what was in
    force before."""
    try:
        count = install()
    except LoadmasterError as exc:
        log.error(
            "reload: %s from %s refused, the previous ones stay: %s", what, source, exc.detail
        )
        return False
    except OSError as exc:
        log.error("reload: cannot read %s, the previous %s stay: %s", source, what, exc)
        return False
    log.info("reload: %d %s from %s (process %d)", count, what, source, os.getpid())
    return True


def on_sighup(reload: Callable[[], object]) -> Callable[[], None]:
    """Run ``reload`` at each SIGHUP, if this thread owns the process's signals
    (``loadmaster serve``, one of its workers); a server run in a thread (tests, the demo)
    leaves them to its process. Returns what undoes it.

    Each reload runs in a thread of its own, one after the other: on the event loop, a
    file that reads slowly (a network mount) or never ends held every request."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    loop = asyncio.get_running_loop()
    one_at_a_time = threading.Lock()

    def in_order() -> None:
        with one_at_a_time:
            reload()

    loop.add_signal_handler(
        signal.SIGHUP, lambda: threading.Thread(target=in_order, name="reload", daemon=True).start()
    )

    def undo() -> None:
        loop.remove_signal_handler(signal.SIGHUP)
        # Until the process ends, a SIGHUP must not end it either.
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    return undo
