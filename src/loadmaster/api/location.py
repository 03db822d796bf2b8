"""``Location`` headers as Placement sends them."""

from __future__ import annotations

from fastapi import Request


def absolute(request: Request, path: str) -> str:
    """The full URL of ``path`` as the client addressed this server."""
    return str(request.base_url).rstrip("/") + path
