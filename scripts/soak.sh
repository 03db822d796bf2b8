#!/usr/bin/env bash
# The soak under faults (bench/soak.py): installs what it needs, then runs on 127.0.0.1 only.
# Usage: bash scripts/soak.sh [--duration 180] [--clients 6] [--workers 4] [--out soak-out]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh full
exec .venv/bin/python bench/soak.py "$@"
