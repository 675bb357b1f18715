"""docs/stores.md's "Trying it locally" examples run as written against the emulators the
tests start (their ports and bucket names swapped for the fixtures'), and give the record
a local read of the same files gives first."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from .test_readme import PRELUDE, blocks, run, workdir  # noqa: F401 (workdir: a fixture)

STORES_DOC = Path(__file__).resolve().parents[1] / "docs" / "stores.md"
_names = itertools.count()


@pytest.mark.parametrize(
    ("section", "port", "bucket", "fixture"),
    [
        ("## Google Cloud Storage", "9023", "my-bucket", "gcs_endpoint"),
        ("## Azure Blob Storage", "10000", "my-container", "azurite_endpoint"),
    ],
)
def test_the_local_emulator_examples_run(
    workdir: Path,  # noqa: F811
    request: pytest.FixtureRequest,
    section: str,
    port: str,
    bucket: str,
    fixture: str,
) -> None:
    endpoint = request.getfixturevalue(fixture)
    text = STORES_DOC.read_text()
    start = text.index(section)
    local = text.index("### Trying it locally", start)
    (command,) = blocks("### Trying it locally", "bash", _from(local))
    assert f"--port {port}" in command or f"--blobPort {port}" in command
    (code,) = blocks("### Trying it locally", "python", _from(local))
    assert f"http://127.0.0.1:{port}" in code
    fresh = f"{bucket}-{next(_names)}"  # the session's emulator is shared by tests
    code = code.replace(f"http://127.0.0.1:{port}", endpoint).replace(bucket, fresh)
    scope = run(PRELUDE + code)
    from shardstream import StreamingDataset

    expected = next(iter(StreamingDataset("data/train/")))  # the same files, read locally
    first = scope["first"]
    assert isinstance(first, dict)
    plain = {k: v for k, v in first.items() if not k.startswith("__")}  # __url__ differs
    assert plain == {k: v for k, v in expected.items() if not k.startswith("__")}


def _from(offset: int) -> Path:
    """docs/stores.md from `offset` on, as a file `blocks` can read (its first "Trying it
    locally" is then the one of the section asked for)."""
    import tempfile

    out = Path(tempfile.mkdtemp()) / "stores.md"
    out.write_text(STORES_DOC.read_text()[offset:])
    return out
