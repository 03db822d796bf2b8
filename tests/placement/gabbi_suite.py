"""Placement's own gabbi tests against a live ``loadmaster serve``.

The YAML files come from the ``openstack-placement`` package, installed (without its
dependencies: only the files are used) with ``gabbi`` into a throw-away virtual environment
under the clone (``.cache/placement-venv``), never copied into the repository. Only the files
that need nothing but Placement's basic ``APIFixture`` run: the others build providers
through Placement's Python objects, which loadmaster does not have. Each file gets a fresh
server on a fresh SQLite database, as the fixture gives each file a fresh database, and the
environment values the fixture sets.

Run it alone (``bash scripts/placement-gabbi.sh [FILE ...]``) for the per-file table and
the failures; ``tests/placement/test_gabbi.py`` holds the pass count to a ratchet.
"""

from __future__ import annotations

import argparse
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
    """The throw-away environment with the pinned packages; installed once, reused after."""
    stamp = VENV / ("." + "-".join(PINS))
    if not stamp.exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
        pip = [str(VENV / "bin/pip"), "install", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, PINS[1]], check=True)
        # Placement's own dependencies (oslo, keystone middleware...) are not needed to
        # read its test files.
        subprocess.run([*pip, "--no-deps", PINS[0]], check=True)
        stamp.touch()
    return VENV


def gabbits_dir(venv: Path) -> Path:
    found = sorted(venv.glob(f"lib/python*/site-packages/{GABBITS}"))
    if not found:
        raise RuntimeError(f"no {GABBITS} in {venv}")
    return found[0]


def basic_fixture_files(venv: Path) -> list[Path]:
    """The files whose only fixture is ``APIFixture``."""
    files = []
    for path in sorted(gabbits_dir(venv).glob("*.yaml")):
        if yaml.safe_load(path.read_text()).get("fixtures") == BASIC_FIXTURE:
            files.append(path)
    return files


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
            run = subprocess.run(
                [str(venv / "bin/gabbi-run"), f"127.0.0.1:{port}", "--", str(path)],
                env={**os.environ, **fixture_env()},
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


def run_all(files: list[Path] | None = None, jobs: int = 2) -> list[FileResult]:
    venv = ensure_venv()
    chosen = files if files is not None else basic_fixture_files(venv)
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
    args = parser.parse_args()
    files = None
    if args.files:
        where = gabbits_dir(ensure_venv())
        files = [where / name for name in args.files]
    results = run_all(files, jobs=args.jobs)
    if args.verbose:
        for result in results:
            print(f"===== {result.name}\n{result.output}")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
