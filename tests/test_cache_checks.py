"""What the node cache checks, and when: a block file's pieces (loader.cache.files: checked
the first time a process reads them, again after any write in place), and the shards
against the remote (loader.cache.remote: no row of a rewritten shard handed out)."""

from __future__ import annotations

import os
import time
import types
import zlib
from pathlib import Path
from typing import Any

import pytest

import shardstream.loader.cache.files as files
from shardstream.loader import StaleIndexError, StreamingDataset
from shardstream.loader.cache.files import PIECE, read_block, write_block
from shardstream.loader.cache.remote import listing_pays

from .datagen import record_id, write_dataset

DATA = bytes(range(256)) * 800  # 204,800 bytes: 4 pieces, the last one short


@pytest.fixture
def crcs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The lengths of the bytes the block reader checks (each zlib.crc32 call's)."""
    calls: list[int] = []

    def counted(data: Any, value: int = 0) -> int:
        calls.append(len(data))
        return zlib.crc32(data, value)

    monkeypatch.setattr(files, "zlib", types.SimpleNamespace(crc32=counted))
    return calls


def block(tmp_path: Path, age: float) -> Path:
    """A block file of DATA, last changed `age` seconds ago."""
    path = tmp_path / f"{'0' * 32}-0-{len(DATA)}.blk"
    write_block(path, DATA)
    then = time.time_ns() - int(age * 1e9)
    os.utime(path, ns=(then, then))
    return path


def test_a_piece_is_checked_the_first_time_a_process_reads_it(
    tmp_path: Path, crcs: list[int]
) -> None:
    path = block(tmp_path, age=10)
    crcs.clear()  # (the writer's)
    assert read_block(path, 1000, 70_000) == (DATA[1000:70_000], None)
    assert sum(crcs) == 2 * PIECE  # the two pieces read, whole
    crcs.clear()
    assert read_block(path, 1000, 70_000) == (DATA[1000:70_000], None)
    assert read_block(path, 5, 6) == (DATA[5:6], None)
    assert crcs == []  # checked before, and the file is the same one
    assert read_block(path, 0, None) == (DATA, None)
    assert sum(crcs) == len(DATA) - 2 * PIECE  # only the pieces not read before


def test_a_write_in_place_is_caught_after_the_file_was_checked(
    tmp_path: Path, crcs: list[int]
) -> None:
    path = block(tmp_path, age=10)
    assert read_block(path, 0, None) == (DATA, None)
    with open(path, "r+b") as f:  # one byte flipped where a reader already checked
        f.seek(5000)
        f.write(bytes([DATA[5000] ^ 0xFF]))
    data, problem = read_block(path, 4000, 6000)
    assert data is None and problem is not None and "checksum of bytes [0," in problem
    os.truncate(path, 1000)
    data, problem = read_block(path, 0, 10)
    assert data is None and problem is not None and "bytes, expected" in problem


def test_a_file_changed_a_moment_ago_is_checked_at_every_read(
    tmp_path: Path, crcs: list[int]
) -> None:
    """Its modification time could stay the same through a write in the same tick of the
    filesystem's clock: it is not remembered until AGED seconds old."""
    path = block(tmp_path, age=0)
    for _ in range(3):  # (the first clear: the writer's)
        crcs.clear()
        assert read_block(path, 100, 200) == (DATA[100:200], None)
        assert sum(crcs) == PIECE


@pytest.mark.parametrize(
    ("checked", "shards", "pays"),
    [(2, 2, False), (3, 3, True), (8, 32, True), (244, 1_000_000, False), (6, 200, False)],
)
def test_a_listing_is_chosen_where_it_costs_less(checked: int, shards: int, pays: bool) -> None:
    assert listing_pays(checked, shards) is pays


@pytest.mark.parametrize("shards", [2, 8], ids=["a-request-a-shard", "one-listing"])
def test_no_row_of_a_rewritten_shard_is_handed_out(s3: Any, tmp_path: Path, shards: int) -> None:
    """A cached epoch reads and decodes while the checks run; the rows of the shard whose
    check fails never leave: the reading raises StaleIndexError naming it first."""
    sizes = [120, 90, 150, 60, 110, 80, 100, 70][:shards]
    fs = s3.fs()
    fs.mkdir("rewritten")
    write_dataset(fs, "rewritten/p", "parquet", sizes=sizes, row_group_size=20, payload=300)
    kw: dict[str, Any] = {"storage_options": s3.storage_options, "seed": 5}
    ds = StreamingDataset("s3://rewritten/p", cache_dir=tmp_path / "c", **kw)
    assert sorted(map(record_id, ds)) == list(range(sum(sizes)))  # epoch 0 fills the cache
    plain = StreamingDataset("s3://rewritten/p", **kw)
    plain.set_epoch(1)
    expected = list(plain)
    path = "rewritten/p/part-00001.parquet"
    blob = bytearray(fs.cat(path))
    blob[len(blob) // 2] ^= 0xFF  # same size, another ETag
    fs.pipe(path, bytes(blob))
    ds.set_epoch(1)
    got = []
    with pytest.raises(StaleIndexError, match=r"part-00001\.parquet"):
        for row in ds:
            got.append(row)
    stale = range(sizes[0], sizes[0] + sizes[1])
    assert not [r for r in got if record_id(r) in stale]
    assert [{**r, "__url__": None} for r in got] == [
        {**r, "__url__": None} for r in expected[: len(got)]
    ]
