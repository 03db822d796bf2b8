#!/usr/bin/env bash
# The whole test suite: installs what it needs, starts a real PostgreSQL on 127.0.0.1,
# runs lint, type checks and pytest on SQLite and PostgreSQL.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh full

pgdir=$(mktemp -d /tmp/loadmaster-pg.XXXXXX)
port=$(( 20000 + RANDOM % 20000 ))
LOADMASTER_TEST_PG_URL=$(bash scripts/postgres.sh start "$pgdir" "$port")
export LOADMASTER_TEST_PG_URL
trap 'bash scripts/postgres.sh stop "$pgdir"' EXIT

.venv/bin/ruff check src tests bench
.venv/bin/ruff format --check src tests bench
.venv/bin/mypy
# loadgroup: tests marked with one xdist_group (the real-QEMU ones share two libvirtd) run
# in one worker; the others spread as before.
.venv/bin/python -m pytest -n 2 --dist loadgroup -q -p no:cacheprovider "$@"
