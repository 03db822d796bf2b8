"""The one way CLI commands talk to the API, and the exit codes they end with."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from enum import IntEnum
from functools import cache
from typing import TYPE_CHECKING, Any, NoReturn

import typer

if TYPE_CHECKING:
    from rich.console import Console

from loadmaster.microversions import CLIENT_HEADERS
from loadmaster.settings import DEFAULTS


@cache
def err_console() -> Console:
    # rich loads only when a command prints through it: scripts calling quick commands
    # should not pay for it.
    from rich.console import Console

    return Console(stderr=True, highlight=False)


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


@dataclass
class ApiClient:
    url: str = DEFAULTS.url
    token: str | None = None
    timeout: float = 60.0

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, body=body)

    def put(self, path: str, body: Any = None) -> Any:
        return self.request("PUT", path, body=body)

    def delete(self, path: str, **params: Any) -> Any:
        return self.request(
            "DELETE", path, params={k: v for k, v in params.items() if v is not None}
        )

    def request(
        self, method: str, path: str, *, body: Any = None, params: dict[str, Any] | None = None
    ) -> Any:
        """The decoded JSON answer (None for 204). Any failure prints the server's
        ``{code, detail}`` and exits with the code that status means."""
        # The standard library, not httpx: importing httpx (and the rich, click and pygments
        # its own command line pulls in) would double the start-up of every quick command.
        from urllib.error import HTTPError, URLError
        from urllib.parse import quote, urlencode
        from urllib.request import Request, urlopen

        query = {k: str(v).lower() if isinstance(v, bool) else v for k, v in (params or {}).items()}
        target = self.url.rstrip("/") + quote(path, safe="/")
        if query:
            target += "?" + urlencode(query, doseq=True)
        headers = {"Accept": "application/json", **CLIENT_HEADERS}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        request = Request(target, data=payload, headers=headers, method=method)
        try:
            with urlopen(request, timeout=self.timeout) as response:
                status, text = response.status, response.read()
        except HTTPError as exc:
            status, text = exc.code, exc.read()
        except (URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            fail(f"cannot reach the loadmaster API at {self.url}: {reason}", Exit.UNREACHABLE)
        if status == 204:
            return None
        try:
            data = json.loads(text)
        except ValueError:  # not JSON, or not even UTF-8
            data = None
        if 200 <= status < 300:
            return data
        if isinstance(data, dict) and "code" in data:
            where = f" ({data['field']})" if data.get("field") else ""
            message = f"{data.get('detail', '')}{where} [{data['code']}]"
            explanation = data.get("explanation")
            if isinstance(explanation, dict):
                message += "\n" + format_explanation(explanation)
        else:
            message = f"HTTP {status}: {text[:200].decode(errors='replace')}"
        fail(message, exit_code_for(status))


def format_explanation(explanation: dict[str, Any]) -> str:
    lines = [str(explanation.get("message", ""))]
    for f in explanation.get("filters", []):
        reasons = ", ".join(f"{n} {r}" for r, n in f.get("reasons", {}).items())
        lines.append(f"  {f.get('filter')}: removed {f.get('removed')} ({reasons})")
    return "\n".join(lines)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
