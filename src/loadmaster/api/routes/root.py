"""Placement's version document at ``/``: clients (openstacksdk, osc-placement) read it to
learn which microversions the server speaks before anything else."""

from __future__ import annotations

from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any

from fastapi import APIRouter, Response

from loadmaster.api import microversion

router = APIRouter(tags=["placement"])
CACHE_HEADERS_SINCE = (1, 15)


@router.get("/")
def versions(response: Response) -> dict[str, Any]:
    """The one version there is, with its microversion range. The ``self`` link is
    relative (empty) as Placement's: the server never needs to know its public address."""
    if microversion.current().matches(*CACHE_HEADERS_SINCE):
        # The document is built afresh on every request, so it was last modified now.
        response.headers["cache-control"] = "no-cache"
        response.headers["last-modified"] = format_datetime(datetime.now(UTC), usegmt=True)
    return {
        "versions": [
            {
                "id": f"v{microversion.MIN}",
                "max_version": str(microversion.MAX),
                "min_version": str(microversion.MIN),
                "status": "CURRENT",
                "links": [{"rel": "self", "href": ""}],
            }
        ]
    }
