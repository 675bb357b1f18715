#!/usr/bin/env bash
# mypy (strict) over the package as it is installed: shardstream, shardstream.loader,
# shardstream.sampler and shardstream.write, laid out in links under .cache/typecheck/ (the repository's folders
# are mapped to those names by pyproject's package-dir; mypy reads packages from folders).
set -euo pipefail
cd "$(dirname "$0")/.."
view=.cache/typecheck/shardstream
rm -rf .cache/typecheck
mkdir -p "$view"
ln -s ../../../loader/shardstream/__init__.py "$view/__init__.py"
ln -s ../../../loader/shardstream/py.typed "$view/py.typed"
ln -s ../../../loader "$view/loader"
ln -s ../../../sampler "$view/sampler"
ln -s ../../../scripts/write "$view/write"
exec .venv/bin/mypy "$@"
