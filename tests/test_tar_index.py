"""Tar indexes beside the shards: DALI .idx sidecars and wids shard lists are read instead of
the shards, give the index a scan gives, and are refused loudly when stale."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import fsspec
import pytest

from shardstream.loader import ShardIndex, StaleIndexError, StreamingDataset
from shardstream.loader.errors import StaleSidecarError
from shardstream.loader.formats.tar.idx import idx_text, parse_idx, write_sidecars
from tests.s3proxy import counting_proxy

from .datagen import SIZES, record_id, tar_bytes, write_dataset

LOCAL = fsspec.filesystem("file")


def wds2idx(data: bytes) -> str:
    """A DALI v1.2 index as DALI's tools/wds2idx.py writes it (its tarfile fallback): every
    regular member, data offset and size, grouped by the name up to its first dot."""
    lines: list[list[str]] = []
    last = None
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        for m in tf:
            if m.type != tarfile.REGTYPE:
                continue
            dot = m.name.find(".", m.name.rfind("/") + 1)
            base, ext = m.name[:dot], m.name[dot + 1 :]
            if base != last:
                lines.append([])
                last = base
            lines[-1].append(f"{ext} {m.offset_data} {m.size} {m.name}")
    return f"v1.2 {len(lines)}\n" + "".join(" ".join(line) + "\n" for line in lines)


@pytest.fixture
def tars(tmp_path: Path) -> Path:
    write_dataset(LOCAL, str(tmp_path / "t"), "tar")
    return tmp_path / "t"


def test_dali_sidecars_give_the_scanned_index(tars: Path) -> None:
    scanned = ShardIndex.build(str(tars))
    for p in sorted(tars.glob("*.tar")):
        (tars / (p.stem + ".idx")).write_text(wds2idx(p.read_bytes()))  # wds2idx's name
    from_sidecars = ShardIndex.build(str(tars))
    assert from_sidecars.shards == scanned.shards
    assert sorted(record_id(r) for r in StreamingDataset(from_sidecars)) == list(range(125))


def test_our_sidecars_are_dali_v1_2_and_read_back(tars: Path) -> None:
    index = ShardIndex.build(str(tars))
    assert write_sidecars(index.shards) == 5  # the empty shard gets none: DALI refuses those
    first = tars / "part-00000.tar.idx"
    assert first.read_text() == wds2idx((tars / "part-00000.tar").read_bytes())
    assert not (tars / "part-00001.tar.idx").exists()
    assert ShardIndex.build(str(tars)).shards == index.shards
    assert idx_text(index.shards[1]) is None


def test_sidecars_are_read_instead_of_the_shards_over_s3(s3: Any) -> None:
    fs = s3.fs()
    fs.mkdir("side")
    sizes = [400, 300]
    write_dataset(fs, "side/t", "tar", sizes=sizes)
    index = ShardIndex.build("s3://side/t", s3.storage_options)
    write_sidecars(index.shards, s3.storage_options)
    with counting_proxy(s3.endpoint_url) as proxy:
        opts = {"client_kwargs": {"endpoint_url": proxy.url}}
        again = ShardIndex.build("s3://side/t", opts)
    assert again.shards == index.shards
    shard_bytes = sum(n for _, path, n in proxy.requests if path.endswith(".tar"))
    assert shard_bytes == 2 * (512 + 512 + 1024)  # the checks: two headers and the end
    total = sum(s.bytes for s in index.shards)
    assert proxy.bytes_served < total / 5


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("append", r"holds more after the last member"),
        ("truncate", r"members end at byte \d+, the shard has \d+ bytes"),
        ("rewrite", r"the shard holds sample000023.cls where the sidecar has sample000000.cls"),
        ("resize", r"member sample000000.cls: 1 bytes in the shard, 7 in the sidecar"),
    ],
)
def test_a_stale_sidecar_is_refused_naming_both_files(
    tars: Path, change: str, message: str
) -> None:
    index = ShardIndex.build(str(tars))
    write_sidecars(index.shards)
    shard = tars / "part-00000.tar"
    if change == "append":  # more samples: the old sidecar misses them
        shard.write_bytes(tar_bytes(0, 30))
    elif change == "truncate":
        shard.write_bytes(tar_bytes(0, 10))
    elif change == "rewrite":  # same size, other members
        shard.write_bytes(tar_bytes(23, 23))
    else:  # the first member longer
        data = bytearray(tar_bytes(0, 23))
        (tars / "part-00000.tar.idx").write_text(
            (tars / "part-00000.tar.idx").read_text().replace("cls 512 1 ", "cls 512 7 ", 1)
        )
        shard.write_bytes(bytes(data))
    with pytest.raises(
        StaleSidecarError,
        match=r"part-00000.tar.idx: does not describe .*"
        r"part-00000.tar \(.*" + message + r".*rewrite it .*or remove it",
    ):
        ShardIndex.build(str(tars))
    with pytest.raises(StaleIndexError):  # a StaleIndexError like any other
        ShardIndex.build(str(tars))
    assert ShardIndex.build(str(tars), sidecars=False).shards[0].num_records > 0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("junk\n", r"not a DALI webdataset index \(first line 'junk'"),
        ("v1.2 3\ncls 512 1 a.cls\n", r"says 3 records but holds 1"),
        ("v1.2 1\ncls 512 a.cls\n", r"line 2 is malformed"),
        ("v1.2 1\ncls x 1 a.cls\n", r"line 2 is malformed"),
    ],
)
def test_a_malformed_sidecar_is_named(text: str, message: str) -> None:
    with pytest.raises(StaleSidecarError, match=r"s.idx: " + message):
        parse_idx(text, "s.idx")


def test_a_v1_1_sidecar_has_no_names_so_the_shard_is_scanned(tars: Path) -> None:
    (tars / "part-00000.idx").write_text("v1.1 1\ncls 512 1\n")
    assert parse_idx("v1.1 1\ncls 512 1\n", "x") is None
    assert ShardIndex.build(str(tars)).shards == ShardIndex.build(str(tars), sidecars=False).shards


def _wids(root: Path, sizes: dict[str, tuple[int, int]]) -> None:
    doc = {
        "__kind__": "wids-shard-index-v1",
        "wids_version": 1,
        "name": "t",
        "shardlist": [
            {"url": url, "nsamples": n, "filesize": size} for url, (n, size) in sizes.items()
        ],
    }
    (root / "shardindex.json").write_text(json.dumps(doc))


def test_wids_counts_plan_without_reading_and_readers_index_on_open(tars: Path) -> None:
    shards = sorted(tars.glob("*.tar"))
    _wids(tars, {p.name: (n, p.stat().st_size) for p, n in zip(shards, SIZES)})
    index = ShardIndex.build(str(tars))
    assert index.shard_sizes.tolist() == SIZES
    assert all(s.details == {"deferred": str(tars / "shardindex.json")} for s in index.shards)
    assert index.bytes_for(0, 0, 23) == shards[0].stat().st_size  # estimated: whole shard
    # 5 ranks of 25 records: each reads pieces of shards it indexes when it opens them
    ids = [record_id(r) for k in range(5) for r in StreamingDataset(index, num_replicas=5, rank=k)]
    assert sorted(ids) == list(range(125))


def test_a_stale_wids_list_is_refused(tars: Path) -> None:
    shards = sorted(tars.glob("*.tar"))
    sizes = {p.name: (n, p.stat().st_size) for p, n in zip(shards, SIZES)}
    _wids(tars, {**sizes, "part-00002.tar": (41, 999)})
    with pytest.raises(
        StaleSidecarError,
        match=r"shardindex.json: lists .*part-00002.tar with "
        r"filesize 999 .* the shard has \d+ bytes; the list is stale",
    ):
        ShardIndex.build(str(tars))
    _wids(tars, {**sizes, "part-00002.tar": (40, sizes["part-00002.tar"][1])})  # a count off
    index = ShardIndex.build(str(tars))
    with pytest.raises(
        StaleSidecarError,
        match=r"shardindex.json: gives 40 records for "
        r".*part-00002.tar, the shard holds 41; it is stale",
    ):
        list(StreamingDataset(index, shuffle=False))


def test_a_wids_list_is_not_a_saved_index(tars: Path) -> None:
    _wids(tars, {"part-00000.tar": (23, 1)})
    with pytest.raises(ValueError, match=r"a wids shard list, not a shardstream index"):
        ShardIndex.resolve(str(tars / "shardindex.json"))
