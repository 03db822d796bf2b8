"""A fresh clone's first commands: ``scripts/demo.sh`` says what it is doing before each
slow step of its install, and the README's tour says how to get the ``openstack`` client
it uses, pinned as the tests pin it. The install runs with stand-ins for pip and the
system's tools: what is checked is what the scripts say, and when."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _stub(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/usr/bin/env bash\n{body}\n")
    path.chmod(0o755)


def test_the_demo_says_what_it_installs_before_it_does(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    (clone / "scripts").mkdir(parents=True)
    for script in ("setup.sh", "demo.sh"):
        shutil.copy(ROOT / "scripts" / script, clone / "scripts" / script)
    (clone / "pyproject.toml").write_text("")
    tools = tmp_path / "tools"
    # The system has what the minimal install needs; python3 makes a venv of stand-ins
    # that say when they run.
    _stub(tools / "pkg-config", "exit 0")
    venv = clone / ".venv" / "bin"
    _stub(
        tools / "python3",
        f'mkdir -p "{venv}"\n'
        f'printf \'#!/usr/bin/env bash\\necho "RAN pip $*"\\n\' > "{venv}/pip"\n'
        f"printf '#!/usr/bin/env bash\\nexit 0\\n' > \"{venv}/python\"\n"
        f'printf \'#!/usr/bin/env bash\\necho "RAN loadmaster $*"\\n\' > "{venv}/loadmaster"\n'
        f'chmod +x "{venv}"/*',
    )
    env = {**os.environ, "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}"}
    # stdout and stderr interleaved, as a terminal shows them.
    ran = subprocess.run(
        ["bash", "scripts/demo.sh", "--hosts", "3"],
        cwd=clone,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stdout
    merged = ran.stdout.splitlines()

    def first(pattern: str) -> int:
        return next(i for i, line in enumerate(merged) if re.search(pattern, line))

    assert first(r"^setup: creating the virtual environment") < first(r"^RAN pip"), merged
    assert first(r"^setup: installing loadmaster .* with pip") < first(r"^RAN pip"), merged
    assert first(r"^demo: starting") < first(r"^RAN loadmaster demo --hosts 3"), merged


def test_the_readme_says_how_to_get_the_openstack_client_of_its_tour() -> None:
    readme = (ROOT / "README.md").read_text()
    tour = readme.split("More of the tour:", 1)[1].split("```", 2)[1]
    lines = tour.splitlines()
    used = next(i for i, line in enumerate(lines) if line.startswith("openstack "))
    assert any('pip install -e ".[openstack]"' in line for line in lines[:used]), tour
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    names = {re.split(r"[=<>]", pin)[0] for pin in extras["openstack"]}
    assert {"python-openstackclient", "osc-placement"} <= names
    assert all("==" in pin for pin in extras["openstack"]), extras["openstack"]
