"""``SIGHUP`` (what ``systemctl reload`` sends): a serving process reads its tokens again
and keeps serving.

Only the tokens are reloaded: the token file is re-read (``LOADMASTER_TOKENS`` is the
process's environment, fixed at its start, so it reads the same). Every other setting is
read once at start (the database, the body limit, the scheduler's policies, ...), so a
change to one needs a restart. A token file that cannot be read or parsed is logged and
the previous tokens stay: a typo must not lock every agent out.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Callable

from loadmaster.api.auth import TOKENS_ENV, TokenTable, resolve_auth
from loadmaster.errors import LoadmasterError
from loadmaster.settings_model import Settings

log = logging.getLogger("loadmaster.api.reload")


def reload_tokens(tokens: TokenTable | None, settings: Settings) -> bool:
    """Replace the tokens in ``tokens`` with those ``settings`` name now; False (and the
    old tokens kept) if they cannot be read. ``None``: a server without authentication,
    which stays so."""
    if tokens is None:
        log.info("reload: serving without tokens (--no-auth), nothing to reload")
        return True
    source = str(settings.tokens_file) if settings.tokens_file else TOKENS_ENV
    try:
        fresh = resolve_auth(
            no_auth=False,
            tokens_file=settings.tokens_file,
            inline=settings.tokens.get_secret_value(),
        )
    except LoadmasterError as exc:
        log.error("reload: tokens from %s refused, the previous ones stay: %s", source, exc.detail)
        return False
    except OSError as exc:
        log.error("reload: cannot read %s, the previous tokens stay: %s", source, exc)
        return False
    assert fresh is not None  # no_auth=False
    tokens.config = fresh
    log.info("reload: %d tokens from %s (process %d)", len(fresh.tokens), source, os.getpid())
    return True


def on_sighup(reload: Callable[[], object]) -> Callable[[], None]:
    """Run ``reload`` on the event loop at each SIGHUP, if this thread owns the process's
    signals (``loadmaster serve``, one of its workers); a server run in a thread (tests,
    the demo) leaves them to its process. Returns what undoes it."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGHUP, reload)

    def undo() -> None:
        loop.remove_signal_handler(signal.SIGHUP)
        # Until the process ends, a SIGHUP must not end it either.
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    return undo
