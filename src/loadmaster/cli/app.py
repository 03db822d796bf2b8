"""The ``loadmaster`` command: root options, the options every remote command shares and
the command groups."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup

from loadmaster.cli.client import EXIT_CODES_HELP, ApiClient
from loadmaster.settings import default, env_name

app = typer.Typer(
    name="loadmaster",
    help="Decides where virtual machines run and keeps every host inside its promises.\n\n"
    + EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


# The private key of a --tls-cert (the server's, or an agent's client certificate).
TlsKeyOpt = Annotated[
    Path | None,
    typer.Option(
        envvar=env_name("tls_key"), help="its private key (default: in --tls-cert's file)"
    ),
]


@dataclass
class Chosen:
    """What the options of the running command chose. One command runs per invocation."""

    url: str | None = None  # None: not given, the url setting
    token: str | None = None
    ca: Path | None = None
    debug: bool = False


chosen = Chosen()


@app.callback()
def root(
    url: Annotated[
        str | None,
        typer.Option(
            "--url",
            envvar=env_name("url"),
            help=f"API address for remote commands (default: {default('url')})",
            show_default=False,
        ),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option("--token", envvar=env_name("token"), help="bearer token", show_default=False),
    ] = None,
    ca: Annotated[
        Path | None,
        typer.Option(
            "--ca",
            envvar=env_name("ca"),
            help="CA file (PEM) an https:// API's certificate must chain to (default: the "
            "system's trust store)",
            show_default=False,
        ),
    ] = None,
    debug: Annotated[
        bool, typer.Option("--debug", help="show the traceback of an unexpected error")
    ] = False,
) -> None:
    """Remote commands (host, flavor, vm, group, class, trait, usage, schedule, capacity,
    policies, audit --url) use --url, --token and --ca (or LOADMASTER_URL, LOADMASTER_TOKEN,
    LOADMASTER_CA), before or after the subcommand; the others run locally."""
    chosen.url, chosen.token, chosen.ca, chosen.debug = url, token, ca, debug


def _remote_options(
    url: Annotated[
        str | None,
        typer.Option(help="API address (also before the subcommand, or LOADMASTER_URL)"),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(help="bearer token (also before the subcommand, or LOADMASTER_TOKEN)"),
    ] = None,
    ca: Annotated[
        Path | None,
        typer.Option(
            help="CA file of an https:// API (also before the subcommand, or LOADMASTER_CA)"
        ),
    ] = None,
    debug: Annotated[
        bool, typer.Option("--debug", help="show the traceback of an unexpected error")
    ] = False,
) -> None:
    """Never run: typer turns its signature into the options every remote command adds."""


@cache
def _remote_params() -> tuple[Any, ...]:
    # Built once and shared: a parameter keeps no state between invocations.
    shared = typer.Typer(add_completion=False)
    shared.command()(_remote_options)
    params = typer.main.get_command(shared).params
    for param in params:
        param.expose_value = False
        param.callback = _setter(param.name)
    return tuple(params)


def _setter(name: str | None) -> Any:
    def callback(ctx: Any, param: Any, value: Any) -> Any:
        # Given after the subcommand it wins over the root option and the environment;
        # left out, it leaves them alone.
        if value:
            setattr(chosen, str(name), value)
        return value

    return callback


class RemoteCommand(TyperCommand):
    """A command that talks to the API: takes --url, --token, --ca and --debug after its
    name."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params.extend(_remote_params())


class RemoteGroup(TyperGroup):
    """A group whose every command talks to the API (see RemoteCommand)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for command in self.commands.values():
            command.params.extend(_remote_params())


def remote_group(name: str, help_text: str) -> typer.Typer:
    """``loadmaster <name> ...``: a group of commands that talk to the API."""
    group = typer.Typer(help=help_text, no_args_is_help=True, cls=RemoteGroup)
    app.add_typer(group, name=name)
    return group


def api() -> ApiClient:
    """The client configured by the options of the running command: one per process (one
    command runs per invocation), so a command's calls share its connection."""
    return _client(chosen.url or default("url"), chosen.token, chosen.ca)


@cache
def _client(url: str, token: str | None, ca: Path | None) -> ApiClient:
    return ApiClient(url, token, ca)
