#!/usr/bin/env bash
# The whole test suite, as CI runs it: set up .venv, lint, type-check, test.
# Extra arguments go to pytest (e.g. bash scripts/test.sh -k sampler).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
.venv/bin/ruff check .
.venv/bin/ruff format --check .
bash scripts/typecheck.sh
.venv/bin/python -m pytest "$@"
