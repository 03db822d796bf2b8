#!/usr/bin/env bash
# Placement's gabbi files (the ones needing only its basic fixture) against a live
# `loadmaster serve`, one fresh server and database per file; prints passed/total per file.
# The files come from openstack-placement installed into .cache/placement-venv (throw-away).
#   bash scripts/placement-gabbi.sh                 # all files, the table
#   bash scripts/placement-gabbi.sh -v traits.yaml  # one file, with gabbi's failures
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python tests/placement/gabbi_suite.py "$@"
