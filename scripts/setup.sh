#!/usr/bin/env bash
# Make .venv (Python 3.11) with torch and shardstream (editable) installed.
#   bash scripts/setup.sh         the library
#   bash scripts/setup.sh test    the library and the test tools
# TORCH_SPEC overrides the torch requirement (default torch==2.13.0, the CPU build this
# project is developed and tested on).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
extra=${1:-}
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check "${TORCH_SPEC:-torch==2.13.0}"
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".${extra:+[$extra]}"
if [ "$extra" = test ]; then
  # Azurite, the Azure Blob emulator the tests start (an npm package; node is on the
  # machines): installed here, pinned, never downloaded at test time
  azurite_version=3.35.0
  if ! grep -qs "\"version\": \"$azurite_version\"" .cache/azurite/node_modules/azurite/package.json; then
    mkdir -p .cache/azurite
    npm install --silent --no-audit --no-fund --prefix .cache/azurite "azurite@$azurite_version" >/dev/null
  fi
fi
# the modules compiled once here: where PYTHONDONTWRITEBYTECODE is set (as on our machines)
# an editable install would otherwise compile every module in every fresh process (and
# DataLoader worker): ~0.2 s a start, measured
.venv/bin/python -m compileall -q loader sampler scripts/plan >/dev/null
