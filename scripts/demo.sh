#!/usr/bin/env bash
# The main job on its embedded default: set up .venv, then run the seed document's three
# DistributedSampler examples against shardstream's drop-in (two of them under torchrun).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python scripts/seed_examples.py "$@"
