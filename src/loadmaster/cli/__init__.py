"""The ``loadmaster`` command line (typer + rich). Entry point: ``main``."""

from loadmaster.cli import db, demo, local, remote  # noqa: F401  (each registers its commands)
from loadmaster.cli.app import app


def main() -> None:
    app()


__all__ = ["app", "main"]
