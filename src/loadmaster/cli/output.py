"""What the commands print: JSON for scripts, tables for people (rich loads only when a
table is printed), and the parsing of KEY=VALUE options."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from functools import cache
from typing import TYPE_CHECKING, Annotated, Any

import typer

from loadmaster.cli.client import Exit, err_console, fail, print_json

if TYPE_CHECKING:
    from rich.console import Console

JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON (for scripts)")]
VmArg = Annotated[str, typer.Argument(help="the VM's uuid or (unique) name")]
HostArg = Annotated[str, typer.Argument(help="the host's name or uuid")]
GroupArg = Annotated[str, typer.Argument(help="the server group's name or uuid")]


@cache
def console() -> Console:
    from rich.console import Console

    # Names from the server are not markup, nor emoji codes (a MAC's ":ab:" is not 🆎).
    # Soft wrap: a line is never broken by rich (at
    # 80 columns when not a terminal, cutting "44 VMs moved" in two for a script or a
    # log); a terminal wraps what is wider than itself.
    return Console(highlight=False, markup=False, soft_wrap=True, emoji=False)


def show(data: Any, as_json: bool, title: str, columns: Iterable[str], rows: Iterable[Any]) -> None:
    """JSON as the server sent it, or a table for people. A table wider than the terminal
    is printed wide rather than cut: a class or VM name must be read whole."""
    if as_json:
        print_json(data)
        return
    from rich.measure import Measurement
    from rich.table import Table

    table = Table()
    for column in columns:
        table.add_column(column, no_wrap=True)
    for row in rows:
        table.add_row(*(cell(v) for v in row))
    from rich.console import Console

    out = Console(highlight=False, markup=False, emoji=False)
    out.width = max(
        out.width, Measurement.get(out, out.options.update_width(10_000), table).maximum
    )
    # The title on a line of its own: as the table's title it would wrap at its width.
    out.print(title, soft_wrap=True)
    out.print(table)


def say(text: str) -> None:
    console().print(text, soft_wrap=True)


def warn(warnings: Iterable[str]) -> None:
    """Warnings go to stderr, so a script reading a table or JSON is not disturbed."""
    for warning in warnings:
        err_console().print(f"warning: {warning}", markup=False, soft_wrap=True)


def cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value) or "-"
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items()) or "-"
    return str(value)


def pairs(items: list[str], what: str) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(f"{what} {item!r}: write KEY=VALUE", Exit.USAGE)
        pairs[key] = value
    return pairs


# Placement's resource class names: standard (VCPU) and custom (CUSTOM_GPU) alike.
_CLASS_NAME = re.compile(r"[A-Z0-9_]+")


def resource_amounts(items: list[str], what: str) -> dict[str, int]:
    """``CLASS=AMOUNT`` options as a flavor's resources. Anything malformed is a usage
    error naming the value and what is wrong, before the server is asked; whether the
    class exists is the server's to say."""
    amounts = {}
    for item in items:
        name, sep, amount = item.partition("=")
        if not sep or not name:
            fail(f"{what} {item!r}: write CLASS=AMOUNT", Exit.USAGE)
        if not _CLASS_NAME.fullmatch(name):
            fail(
                f"{what} {item!r}: a resource class is upper case letters, digits and _",
                Exit.USAGE,
            )
        if not amount.isascii() or not amount.isdigit():
            fail(f"{what} {item!r}: the amount must be a whole number of 0 or more", Exit.USAGE)
        amounts[name] = int(amount)
    return amounts


def number(text: str, what: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            fail(f"{what}: {text!r} is not a number", Exit.USAGE)


# An inventory's fields besides its total: whole numbers, but for the ratio.
INVENTORY_WHOLE = ("reserved", "min_unit", "max_unit", "step_size")


def parse_inventory(item: str, option: str = "--inventory") -> tuple[str, dict[str, int | float]]:
    """``VCPU=32`` or ``VCPU=32,allocation_ratio=4,reserved=2``. Anything malformed (the
    form, the class name, a field no inventory has, a value of the wrong kind) is a usage
    error naming the value, before the server is asked, as ``resource_amounts`` does;
    how the values agree (reserved within total, ...) is the server's to say."""
    name, sep, rest = item.partition("=")
    what = f"{option} {item!r}"
    if not sep or not name or not rest:
        fail(f"{what}: write CLASS=TOTAL[,field=value...]", Exit.USAGE)
    if not _CLASS_NAME.fullmatch(name):
        fail(f"{what}: a resource class is upper case letters, digits and _", Exit.USAGE)
    total, *options = rest.split(",")
    inventory: dict[str, int | float] = {"total": _whole(total, f"{what}: total")}
    for given in options:
        key, sep, value = given.partition("=")
        if not sep or not key:
            fail(f"{what}: write field=value after the total, not {given!r}", Exit.USAGE)
        if key in INVENTORY_WHOLE:
            inventory[key] = _whole(value, f"{what}: {key}")
        elif key == "allocation_ratio":
            ratio = number(value, f"{what}: {key}")
            if not ratio > 0:
                fail(f"{what}: allocation_ratio must be more than 0", Exit.USAGE)
            inventory[key] = ratio
        else:
            known = ", ".join(("allocation_ratio", *INVENTORY_WHOLE))
            fail(f"{what}: {key!r} is not an inventory field ({known})", Exit.USAGE)
    return name, inventory


def _whole(text: str, what: str) -> int:
    if not text.isascii() or not text.isdigit():
        fail(f"{what}: {text!r} is not a whole number of 0 or more", Exit.USAGE)
    return int(text)


VM_COLUMNS = ("name", "state", "host", "flavor", "group", "tags", "uuid")


def vm_row(v: Mapping[str, Any]) -> tuple[Any, ...]:
    """A VM's line in a table of VMs (``VM_COLUMNS``)."""
    host = v["host"] if not v.get("target_host") else f"{v['host']} -> {v['target_host']}"
    return (v["name"], v["state"], host, v["flavor"], v["group"], v["tags"], v["uuid"])
