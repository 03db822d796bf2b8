#!/usr/bin/env bash
# The whole test suite: installs what it needs, starts a real PostgreSQL on 127.0.0.1,
# runs lint, type checks and pytest on SQLite and PostgreSQL.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh full

pgdir=$(mktemp -d /tmp/loadmaster-pg.XXXXXX)
# A port the OS hands out (bind to port 0), not a random guess that may collide on a busy
# machine; if another process grabs it before PostgreSQL binds it, try again.
free_port() { .venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
for attempt in 1 2 3; do
  if LOADMASTER_TEST_PG_URL=$(bash scripts/postgres.sh start "$pgdir" "$(free_port)"); then break; fi
  bash scripts/postgres.sh stop "$pgdir"; mkdir -p "$pgdir"
  [ "$attempt" = 3 ] && exit 1
done
export LOADMASTER_TEST_PG_URL
trap 'bash scripts/postgres.sh stop "$pgdir"' EXIT

.venv/bin/ruff check src tests bench
.venv/bin/ruff format --check src tests bench
.venv/bin/mypy
# loadgroup: tests marked with one xdist_group (the real-QEMU ones share two libvirtd) run
# in one worker; the others spread as before.
.venv/bin/python -m pytest -n 2 --dist loadgroup -q -p no:cacheprovider "$@"
# The storage and scheduler tests again with the fast statement layer off
# (LOADMASTER_FAST_STATEMENTS=0: every statement through SQLAlchemy's own execution), so
# that both ways of running a statement answer the same; only for the whole suite, not
# when a developer names tests. Left out: the files that open no database (pure rules and
# the scheduler's core over hand-made snapshots), and those the setting cannot change
# (settings, the API client, the import walk; test_driver compares both ways itself).
if [ "$#" = 0 ]; then
  LOADMASTER_FAST_STATEMENTS=0 .venv/bin/python -m pytest -n 2 --dist loadgroup -q -p no:cacheprovider \
    tests/foundation tests/scheduler \
    --ignore=tests/foundation/test_normalising.py --ignore=tests/foundation/test_rules.py \
    --ignore=tests/foundation/test_runtime.py --ignore=tests/foundation/test_settings.py \
    --ignore=tests/foundation/test_apiclient.py --ignore=tests/foundation/test_import_circles.py \
    --ignore=tests/foundation/test_driver.py \
    --ignore=tests/scheduler/test_core.py --ignore=tests/scheduler/test_incremental.py \
    --ignore=tests/scheduler/test_read_paths.py --ignore=tests/scheduler/test_requests.py
fi
