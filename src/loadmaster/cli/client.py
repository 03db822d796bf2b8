"""The one way CLI commands talk to the API, and the exit codes they end with."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from enum import IntEnum
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer

if TYPE_CHECKING:
    from rich.console import Console

from loadmaster.apiclient import ApiClient as HttpClient
from loadmaster.apiclient import ApiError, ApiUnreachable, ClientTls, TlsSetupError
from loadmaster.settings import default


@cache
def err_console() -> Console:
    # rich loads only when a command prints through it: scripts calling quick commands
    # should not pay for it.
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)  # as output.console()


class Exit(IntEnum):
    OK = 0
    SERVER_ERROR = 1  # the server refused or failed (auth, validation, 5xx)
    USAGE = 2  # the command line itself is wrong (click's own code for usage errors)
    NOT_FOUND = 3
    CONFLICT = 4  # conflict, stale generation or no valid host
    UNREACHABLE = 5


EXIT_CODES_HELP = (
    "Exit codes: 0 ok; 1 error (from the server: auth, invalid input, 5xx; or a failing "
    "policy, agent or audit); 2 usage error; "
    "3 not found; 4 conflict or no valid host; 5 cannot connect to the API."
)


def fail(message: str, code: Exit) -> NoReturn:
    sys.stderr.write(f"error: {message}\n")
    raise typer.Exit(int(code))


def exit_code_for(status: int) -> Exit:
    if status == 404:
        return Exit.NOT_FOUND
    if status == 409:
        return Exit.CONFLICT
    return Exit.SERVER_ERROR


class ApiClient(HttpClient):
    """The CLI's calls to the API (``loadmaster.apiclient``: one kept-open connection,
    ``Retry-After`` honoured). Any failure prints the server's ``{code, detail}`` and exits
    with the code that status means."""

    def __init__(
        self, url: str = default("url"), token: str | None = None, ca: Path | None = None
    ) -> None:
        try:
            super().__init__(url, token, tls=ClientTls(ca=ca))
        except TlsSetupError as exc:
            fail(str(exc), Exit.USAGE)
        except ValueError as exc:
            fail(f"--url: {exc}", Exit.USAGE)

    def request(self, method: str, path: str, **options: Any) -> Any:
        try:
            return super().request(method, path, **options)
        except ApiUnreachable as exc:
            fail(str(exc), Exit.UNREACHABLE)
        except ApiError as exc:
            if exc.code:
                # Said once: a detail that opens with its field is not followed by it again.
                named = exc.field and not exc.detail.startswith(exc.field)
                where = f" ({exc.field})" if named else ""
                message = f"{exc.detail}{where} [{exc.code}]"
                explanation = exc.body.get("explanation")
                # The one host named (``--host``) is refused with each reason already.
                if isinstance(explanation, dict) and exc.field != "host":
                    message += "\n" + format_explanation(explanation, told=[exc.detail])
            else:
                message = f"HTTP {exc.status}: {exc.detail}"
            fail(message, exit_code_for(exc.status))


def format_explanation(explanation: dict[str, Any], *, told: Sequence[str] = ()) -> str:
    """Its message, then what each filter removed and why. What the lines ``told`` just
    printed already say of the message is not said again."""
    message = str(explanation.get("message", ""))
    for line in told:
        if message in line:
            message = ""
        elif line and message.startswith(line):
            message = message.removeprefix(line).lstrip("; ")
    lines = [message] if message else []
    for f in explanation.get("filters", []):
        reasons = ", ".join(f"{n} {r}" for r, n in f.get("reasons", {}).items())
        lines.append(f"  {f.get('filter')}: removed {f.get('removed')} ({reasons})")
    return "\n".join(lines)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
