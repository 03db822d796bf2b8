"""The ``loadmaster`` command line (typer + rich). Entry point: ``main``."""

import sys

from loadmaster.cli import agent, db, demo, policy, remote, server  # noqa: F401  (each registers its commands)
from loadmaster.cli.app import app, chosen
from loadmaster.cli.client import Exit


def main() -> None:
    try:
        app()
    except Exception as exc:
        # An operator reads one line and an exit code; --debug is for a bug report.
        if chosen.debug:
            raise
        sys.stderr.write(
            f"error: {type(exc).__name__}: {exc} (run again with --debug for the traceback)\n"
        )
        sys.exit(int(Exit.SERVER_ERROR))


__all__ = ["app", "main"]
