#!/usr/bin/env bash
# The main job: install, then run the demo on the embedded SQLite default.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh minimal
echo "demo: starting (loading loadmaster takes a few seconds)" >&2
exec .venv/bin/loadmaster demo "$@"
