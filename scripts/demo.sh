#!/usr/bin/env bash
# The main job on its embedded default: set up .venv, then run the demo pretraining job
# (a generated Parquet dataset, 2 ranks under torchrun, 2 epochs). Extra arguments go to
# scripts/pretrain_demo.py (e.g. --stop-after-steps 30, then --resume).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python scripts/pretrain_demo.py "$@"
