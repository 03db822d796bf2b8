"""Placement's own gabbi tests against a live ``loadmaster serve``.

The YAML files come from the ``openstack-placement`` package, installed (without its
dependencies: only the files are used) with ``gabbi`` into a throw-away virtual environment
under the clone (``.cache/placement-venv``), never copied into the repository. Only the files
that need Placement's basic ``APIFixture`` run, and those that need one of its data
fixtures (``SharedStorageFixture``, ``GranularFixture``, ...), which build providers
through Placement's Python objects: ``gabbi_fixtures.py`` builds the same data through
loadmaster's HTTP API before the file runs. Each file gets a fresh server on a fresh
SQLite database, as the fixture gives each file a fresh database, and the environment
values the fixture sets. (The policy and CORS fixtures' files are not run.)

Run it alone (``bash scripts/placement-gabbi.sh [FILE ...]``) for the per-file tables and
the failures; ``tests/placement/test_gabbi.py`` and ``test_gabbi_fixtures.py`` hold the
pass counts to a ratchet.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import re
import subprocess
import sys
import tempfile
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import yaml
from gabbi_fixtures import FIXTURES, build
from live_server import start_server, stop_server

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".cache" / "placement-venv"
PINS = ("openstack-placement==16.0.0", "gabbi==4.2.3")
GABBITS = "placement/tests/functional/gabbits"
BASIC_FIXTURE = ["APIFixture"]
# Placement's ``noauth2`` tokens: ``user`` is a non-admin its default policy refuses,
# loadmaster's ``member``.
GABBI_TOKENS = ("admin", "user", "admin:admin")
# gabbi's concise reporter writes one line per test: "... <mark> <name>".
_OUTCOME = re.compile(r"^\.\.\. (✓|✗|E|-|o|!) (\S+)", re.MULTILINE)
_PASSED = {"✓", "o"}  # a test the file itself marks xfail passes by failing


@dataclass
class FileResult:
    name: str
    passed: int
    total: int
    output: str

    @property
    def failed(self) -> int:
        return self.total - self.passed


def ensure_venv() -> Path:
    """The throw-away environment with the pinned packages; installed once, reused after.
    Under a lock: the two gabbi tests run in two test workers, and on a fresh clone one
    cleared the environment while the other was installing into it."""
    stamp = VENV / ("." + "-".join(PINS))
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(VENV.parent / "placement-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not stamp.exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
            pip = [str(VENV / "bin/pip"), "install", "-q", "--disable-pip-version-check"]
            subprocess.run([*pip, PINS[1]], check=True)
            # Placement's own dependencies (oslo, keystone middleware...) are not needed
            # to read its test files.
            subprocess.run([*pip, "--no-deps", PINS[0]], check=True)
            stamp.touch()
    return VENV


def gabbits_dir(venv: Path) -> Path:
    found = sorted(venv.glob(f"lib/python*/site-packages/{GABBITS}"))
    if not found:
        raise RuntimeError(f"no {GABBITS} in {venv}")
    return found[0]


def _fixture_of(path: Path) -> str | None:
    """The one fixture a file names (None: several or none)."""
    fixtures = yaml.safe_load(path.read_text()).get("fixtures")
    return fixtures[0] if isinstance(fixtures, list) and len(fixtures) == 1 else None


def basic_fixture_files(venv: Path) -> list[Path]:
    """The files whose only fixture is ``APIFixture``."""
    return [
        p for p in sorted(gabbits_dir(venv).glob("*.yaml")) if [_fixture_of(p)] == BASIC_FIXTURE
    ]


def data_fixture_files(venv: Path) -> list[Path]:
    """The files whose one fixture is a data fixture ``gabbi_fixtures`` builds."""
    return [p for p in sorted(gabbits_dir(venv).glob("*.yaml")) if _fixture_of(p) in FIXTURES]


def fixture_env() -> dict[str, str]:
    """What Placement's ``APIFixture.start_fixture`` puts into the environment, which the
    files read as ``$ENVIRON['...']``."""
    fresh = [
        "RP_UUID",
        "RP_NAME",
        "RP_UUID1",
        "RP_NAME1",
        "RP_UUID2",
        "RP_NAME2",
        "PROJECT_ID",
        "ADMIN_PROJECT_ID",
        "SERVICE_PROJECT_ID",
        "USER_ID",
        "PROJECT_ID_ALT",
        "USER_ID_ALT",
        "INSTANCE_UUID",
        "MIGRATION_UUID",
        "CONSUMER_UUID",
        "PARENT_PROVIDER_UUID",
        "ALT_PARENT_PROVIDER_UUID",
    ]
    env = {name: str(uuid.uuid4()) for name in fresh}
    env.update(
        CUSTOM_RES_CLASS="CUSTOM_IRON_NFV",
        CUSTOM_RES_CLASS1="CUSTOM_IRON_NFV1",
        CUSTOM_RES_CLASS2="CUSTOM_IRON_NFV2",
    )
    return env


def run_file(venv: Path, path: Path) -> FileResult:
    with tempfile.TemporaryDirectory(prefix="lm-gabbi-") as tmp:
        server, port = start_server(Path(tmp), GABBI_TOKENS, {"user": "member"})
        try:
            env = fixture_env()
            fixture = _fixture_of(path)
            if fixture in FIXTURES:
                env = build(fixture, f"http://127.0.0.1:{port}", GABBI_TOKENS[0], env)
            run = subprocess.run(
                [str(venv / "bin/gabbi-run"), f"127.0.0.1:{port}", "--", str(path)],
                env={**os.environ, **env},
                capture_output=True,
                text=True,
                timeout=300,
            )
        finally:
            stop_server(server)
        output = run.stdout + run.stderr
        marks = [mark for mark, _name in _OUTCOME.findall(output)]
        if not marks and run.returncode != 0:
            output += "\n[server log]\n" + (Path(tmp) / "server.log").read_text()
    return FileResult(path.name, sum(mark in _PASSED for mark in marks), len(marks), output)


def run_all(
    files: list[Path] | None = None, jobs: int = 2, *, data_fixtures: bool = False
) -> list[FileResult]:
    """``files``, or every basic-fixture file (``data_fixtures``: every data-fixture one)."""
    venv = ensure_venv()
    if files is not None:
        chosen = files
    else:
        chosen = (data_fixture_files if data_fixtures else basic_fixture_files)(venv)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(lambda path: run_file(venv, path), chosen))


def table(results: list[FileResult]) -> str:
    width = max(len(r.name) for r in results)
    lines = [f"{'file':<{width}}  passed / total"]
    lines += [f"{r.name:<{width}}  {r.passed:>6} / {r.total}" for r in results]
    passed, total = sum(r.passed for r in results), sum(r.total for r in results)
    lines.append(f"{'all':<{width}}  {passed:>6} / {total}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", help="gabbit names (e.g. traits.yaml); default all")
    parser.add_argument("-v", "--verbose", action="store_true", help="print gabbi's output")
    parser.add_argument("-j", "--jobs", type=int, default=2)
    parser.add_argument(
        "--set",
        choices=("basic", "fixtures", "all"),
        default="all",
        help="the basic-fixture files, the data-fixture ones, or both (default)",
    )
    args = parser.parse_args()
    if args.files:
        where = gabbits_dir(ensure_venv())
        runs = [run_all([where / name for name in args.files], jobs=args.jobs)]
    else:
        sets = {"basic": [False], "fixtures": [True], "all": [False, True]}[args.set]
        runs = [run_all(jobs=args.jobs, data_fixtures=data) for data in sets]
    for results in runs:
        if args.verbose:
            for result in results:
                print(f"===== {result.name}\n{result.output}")
        print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
