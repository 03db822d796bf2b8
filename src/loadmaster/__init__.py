"""loadmaster: decides where virtual machines run and keeps every host inside its promises."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loadmaster.errors import LoadmasterError

if TYPE_CHECKING:
    from loadmaster.service import Loadmaster, open_loadmaster

    open = open_loadmaster


def __getattr__(name: str) -> Any:
    # The service pulls in SQLAlchemy, numpy and the scheduler (~0.7 s); the CLI's remote
    # commands import this package and need none of it, so it loads on first use.
    if name in ("Loadmaster", "open"):
        from loadmaster import service

        return service.Loadmaster if name == "Loadmaster" else service.open_loadmaster
    raise AttributeError(f"module 'loadmaster' has no attribute {name!r}")


__all__ = ["Loadmaster", "LoadmasterError", "open"]
