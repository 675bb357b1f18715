"""Fuzzed Parquet footers of the Apache arrow-testing corpus (tests/data/corpora/SOURCES.md):
pyarrow refuses each file, and so does the loader, with a ShardError naming the file (not a
UnicodeDecodeError, a ValueError about a negative record count, a KeyError or an
ArrowInvalid from deep inside, naming nothing)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from loader import ShardError, StreamingDataset
from tests.corpora import CORPORA

FUZZED = sorted((CORPORA / "arrow-testing" / "fuzzing").iterdir())


def test_the_corpus_is_here() -> None:
    assert len(FUZZED) == 6


@pytest.mark.parametrize("path", FUZZED, ids=[p.name[-16:] for p in FUZZED])
def test_a_fuzzed_footer_is_refused_by_name(path: Path, tmp_path: Path) -> None:
    name = path.name.removesuffix(".fuzz") + ".parquet"  # named as a shard would be
    (tmp_path / name).write_bytes(path.read_bytes())
    with pytest.raises(Exception):  # noqa: B017  the reference: pyarrow refuses it
        pq.read_table(tmp_path / name)
    with pytest.raises(ShardError, match=name):
        list(StreamingDataset(str(tmp_path), shuffle=False))
