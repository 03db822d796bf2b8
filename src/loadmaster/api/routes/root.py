"""Placement's version document at ``/``: clients (openstacksdk, osc-placement) read it to
learn which microversions the server speaks before anything else."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from loadmaster.api import microversion
from loadmaster.api.responses import VersionsOut

router = APIRouter(tags=["placement"])


@router.get("/", response_model=VersionsOut)
def versions() -> dict[str, Any]:
    """The one version there is, with its microversion range. The ``self`` link is
    relative (empty) as Placement's: the server never needs to know its public address."""
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
