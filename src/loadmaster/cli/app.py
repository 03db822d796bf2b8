"""The ``loadmaster`` command: root options and the command groups."""

from __future__ import annotations

from typing import Annotated

import typer

from loadmaster.cli.client import DEFAULT_URL, EXIT_CODES_HELP, ApiClient

app = typer.Typer(
    name="loadmaster",
    help="Decides where virtual machines run and keeps every host inside its promises.\n\n"
    + EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@app.callback()
def root(
    url: Annotated[
        str, typer.Option("--url", envvar="LOADMASTER_URL", help="API address for remote commands")
    ] = DEFAULT_URL,
    token: Annotated[
        str | None,
        typer.Option("--token", envvar="LOADMASTER_TOKEN", help="bearer token", show_default=False),
    ] = None,
) -> None:
    """Remote commands (host, flavor, vm, group, usage, schedule, capacity) use --url and
    --token (or LOADMASTER_URL / LOADMASTER_TOKEN); the others run locally."""
    _client[0] = ApiClient(url, token)


# One command runs per invocation; the root callback sets its client before it runs.
_client: list[ApiClient] = [ApiClient()]


def api() -> ApiClient:
    """The client configured by the root options of the running command."""
    return _client[0]
