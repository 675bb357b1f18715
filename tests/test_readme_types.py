"""README's examples type-check with `mypy --strict`, as a user's code would: the public
signatures (a list of Stream, epoch_size, transforms, resume states) describe what the
examples pass. Third-party packages without type information (torchdata, datasets) are
taken as untyped, as a user's own mypy configuration would take them."""

from __future__ import annotations

import inspect
import pydoc
import re
import subprocess
import sys
from pathlib import Path

import pytest

from shardstream import MixtureDataset, StreamingDataset
from tests.test_readme import PRELUDE

REPO = Path(__file__).resolve().parent.parent

CONFIG = """
[mypy]
strict = True
mypy_path = {paths}
untyped_calls_exclude = torch

# shardstream's own modules as an installed package's: read, their errors not reported
# (they pass the project's own mypy run)
[mypy-loader.*,sampler.*,shardstream.*]
follow_imports = silent

[mypy-torchdata.*,datasets.*,fsspec.*,s3fs.*,pyarrow.*,webdataset.*,pandas.*]
ignore_missing_imports = True
"""


def user_examples() -> list[str]:
    """The Python blocks of README's user part: all of README, now that "How it works"
    lives in docs/how-it-works.md (were it back in README, what follows it is not the
    user's part)."""
    text = (REPO / "README.md").read_text()
    user = text.split("\n# How it works", 1)[0]
    return re.findall(r"```python\n(.*?)```", user, flags=re.S)


def test_readme_examples_pass_mypy_strict(tmp_path: Path) -> None:
    examples = user_examples()
    assert len(examples) >= 8
    # `shardstream` is installed from loader/shardstream (pyproject's package-dir), which
    # mypy cannot follow through the editable install: links lay it out as installed (as
    # scripts/typecheck.sh does)
    view = tmp_path / "paths" / "shardstream"
    view.mkdir(parents=True)
    for name in ("__init__.py", "py.typed"):
        (view / name).symlink_to(REPO / "loader" / "shardstream" / name)
    for name, folder in (("loader", "loader"), ("sampler", "sampler"), ("write", "scripts/write")):
        (view / name).symlink_to(REPO / folder)
    files = []
    for i, code in enumerate(examples):
        # a block that names its file ("# tokenize_docs.py") is a module the next imports
        named = re.match(r"# (\w+\.py)\n", code)
        path = tmp_path / (named.group(1) if named else f"readme_example_{i}.py")
        path.write_text(code if named else PRELUDE + code)
        files.append(str(path))
    config = tmp_path / "mypy.ini"
    config.write_text(CONFIG.format(paths=f"{tmp_path / 'paths'}:{REPO}"))
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(config), "--cache-dir",
         str(tmp_path / "cache"), *files],
        capture_output=True, text=True, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"no issues found in {len(files)} source files" in r.stdout


def test_help_shows_the_parameters_streaming_dataset_takes() -> None:
    params = inspect.signature(StreamingDataset).parameters
    assert list(params)[:3] == ["source", "epoch_size", "columns"]
    assert "Sequence[Stream]" in str(params["source"].annotation)
    assert "StreamingDataset(source: " in pydoc.render_doc(
        StreamingDataset, renderer=pydoc.plaintext
    )
    assert list(inspect.signature(MixtureDataset).parameters)[:2] == ["streams", "epoch_size"]


def test_epoch_size_of_one_source_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"epoch_size=100 is for mixtures \(a list of Stream\)"):
        StreamingDataset(str(tmp_path), epoch_size=100)
