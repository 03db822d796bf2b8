"""docs/operators-guide.md, run as written: every console block, in order, in one working
directory, against the server the guide itself starts (issue 15: the guide cannot drift
from the behaviour). The guide's install step is what scripts/test.sh runs before this."""

from __future__ import annotations

import sys
from pathlib import Path

from cli_helpers import ROOT, free_port
from guide_runner import GuideRun, parse

GUIDE = ROOT / "docs" / "operators-guide.md"


def test_the_guide_parses_into_commands_with_their_output() -> None:
    steps = parse(GUIDE.read_text())
    commands = [s for s in steps if s.command]
    assert len(commands) >= 40
    assert any(s.write_path == "tokens.toml" for s in steps)
    assert sum(bool(s.expected) for s in commands) >= 25


def test_every_command_of_the_operators_guide(tmp_path: Path) -> None:
    run = GuideRun(tmp_path, Path(sys.executable).parent, free_port())
    try:
        for step in parse(GUIDE.read_text()):
            run.run(step)
    finally:
        run.close()
