"""The HTTP API (FastAPI): ``create_app(lm_or_url, auth)``. Routes call ``Loadmaster``
services only; the domain never imports this package."""

from loadmaster.api.app import create_app
from loadmaster.api.auth import AuthConfig

__all__ = ["AuthConfig", "create_app"]
