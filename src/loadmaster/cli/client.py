"""The one way CLI commands talk to the API, and the exit codes they end with."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, NoReturn

import httpx
import typer
from rich.console import Console
from rich.markup import escape

from loadmaster.microversions import CLIENT_HEADERS

DEFAULT_URL = "http://127.0.0.1:8080"
err_console = Console(stderr=True, highlight=False)


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
    err_console.print(f"[bold red]error:[/] {escape(message)}")
    raise typer.Exit(int(code))


def exit_code_for(status: int) -> Exit:
    if status == 404:
        return Exit.NOT_FOUND
    if status == 409:
        return Exit.CONFLICT
    return Exit.SERVER_ERROR


@dataclass
class ApiClient:
    url: str = DEFAULT_URL
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
        headers = dict(CLIENT_HEADERS)
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            response = httpx.request(
                method,
                self.url.rstrip("/") + path,
                json=body,
                params=params,
                headers=headers,
                timeout=self.timeout,
            )
        except httpx.TransportError as exc:
            fail(f"cannot reach the loadmaster API at {self.url}: {exc}", Exit.UNREACHABLE)
        if response.status_code == 204:
            return None
        try:
            data = response.json()
        except json.JSONDecodeError:
            data = None
        if response.is_success:
            return data
        if isinstance(data, dict) and "code" in data:
            where = f" ({data['field']})" if data.get("field") else ""
            message = f"{data.get('detail', '')}{where} [{data['code']}]"
            explanation = data.get("explanation")
            if isinstance(explanation, dict):
                message += "\n" + format_explanation(explanation)
        else:
            message = f"HTTP {response.status_code}: {response.text[:200]}"
        fail(message, exit_code_for(response.status_code))


def format_explanation(explanation: dict[str, Any]) -> str:
    lines = [str(explanation.get("message", ""))]
    for f in explanation.get("filters", []):
        reasons = ", ".join(f"{n} {r}" for r, n in f.get("reasons", {}).items())
        lines.append(f"  {f.get('filter')}: removed {f.get('removed')} ({reasons})")
    return "\n".join(lines)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
