"""The index built by all ranks (torchrun, gloo) and by worker processes: the same index
everywhere, each share scanned once, and a failure on any rank raised on every rank."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import fsspec
import pytest

from shardstream.loader import ShardError, ShardIndex
from shardstream.loader.index.build import discover, shares
from shardstream.loader.index.distributed import build_parallel

from .conftest import REPO, torchrun
from .datagen import write_dataset

LOCAL = fsspec.filesystem("file")


def digest(index: ShardIndex) -> str:
    return hashlib.sha256(json.dumps(index.to_json(), sort_keys=True).encode()).hexdigest()


def test_ranks_build_one_index_and_share_failures(tmp_path: Path) -> None:
    sizes = [30, 0, 12, 25, 7, 19, 40]
    parquet = write_dataset(LOCAL, str(tmp_path / "p"), "parquet", sizes=sizes)
    write_dataset(LOCAL, str(tmp_path / "t"), "tar", sizes=sizes)
    write_dataset(LOCAL, str(tmp_path / "bad"), "tar", sizes=sizes)
    bad = tmp_path / "bad" / "part-00004.tar"
    bad.write_bytes(bad.read_bytes()[:1500])  # cut inside a member
    owner = next(
        r for r, part in enumerate(shares(discover(str(tmp_path / "bad")), 3)) if 4 in part
    )
    ShardIndex.build(str(tmp_path / "t")).save(str(tmp_path / "t.index.json"))
    sources = [str(tmp_path / "p"), str(tmp_path / "t"), str(tmp_path / "bad")]
    sources += [str(tmp_path / "missing"), parquet[::-1], str(tmp_path / "t.index.json")]
    # a manifest with counts (its rows broadcast as arrays) and a saved Arrow index
    listed = ShardIndex.build(str(tmp_path / "p"))
    (tmp_path / "p.manifest").write_text(
        "".join(f"{s.url} {s.bytes} {s.num_records}\n" for s in listed.shards)
    )
    listed.save(str(tmp_path / "p.index.arrow"))
    sources += [str(tmp_path / "p.manifest"), str(tmp_path / "p.index.arrow")]
    out = torchrun(
        REPO / "tests" / "dist" / "build_index.py",
        "null",
        *[json.dumps(s) for s in sources],
        nproc=3,
    )
    results = [
        [json.loads(line.split(" ", 1)[1]) for line in o.splitlines() if line.startswith("RESULT")]
        for o in out
    ]
    assert [len(r) for r in results] == [len(sources)] * 3  # no rank stopped or hung
    for k, source in enumerate(sources):
        got = [r[k] for r in results]
        if k in (2, 3):  # every rank raises the failing rank's error, naming the shard
            assert len({(g["error"], g["message"]) for g in got}) == 1
            continue
        want = ShardIndex.resolve(source)
        assert [g["digest"] for g in got] == [digest(want)] * 3
    assert results[0][2]["error"] == "ShardError"
    assert "part-00004.tar: truncated tar" in results[0][2]["message"]
    assert f"(indexing on rank {owner})" in results[0][2]["message"]
    assert results[0][3]["error"] == "FileNotFoundError"
    assert "missing: no such file" in results[0][3]["message"]
    # each rank read its own share of the tar shards, every byte once over all ranks
    listing = discover(str(tmp_path / "t"))
    want = [sum(listing.entries[i].size for i in part) for part in shares(listing, 3)]
    assert [r[1]["fetched"] for r in results] == want
    assert all(want)


def test_worker_processes_build_the_same_index(tmp_path: Path, monkeypatch: Any) -> None:
    from shardstream.loader.index import build

    monkeypatch.setattr(build, "SCAN_BATCH", 2)
    import shardstream.loader.index.distributed as di

    monkeypatch.setattr(di, "SCAN_BATCH", 2)
    write_dataset(LOCAL, str(tmp_path / "p"), "parquet")
    seen: list[tuple[int, int]] = []
    got = build_parallel(str(tmp_path / "p"), workers=2, progress=lambda d, n: seen.append((d, n)))
    assert digest(got) == digest(ShardIndex.build(str(tmp_path / "p")))
    assert seen[-1] == (6, 6) and len(seen) == 3
    bad = tmp_path / "p" / "part-00003.parquet"
    bad.write_bytes(b"garbage, not parquet")
    with pytest.raises(ShardError, match=r"part-00003.parquet: not a Parquet file"):
        build_parallel(str(tmp_path / "p"), workers=2)


@pytest.mark.parametrize("parts", [1, 2, 3, 8])
def test_shares_are_disjoint_contiguous_and_of_about_equal_cost(parts: int) -> None:
    from shardstream.loader.index.build import REQUEST_BYTES, Hint, Listing
    from shardstream.loader.storage.filesystems import FileEntry

    sizes = [(i * 7919) % 5_000_000 for i in range(200)]
    entries = [FileEntry(f"s{i}.tar", n, None) for i, n in enumerate(sizes)]
    hints = [Hint(10, "m", defer=True) if i % 5 == 0 else None for i in range(200)]
    listing = Listing("tar", entries, hints)
    got = shares(listing, parts)
    assert [i for part in got for i in part] == list(range(200))  # disjoint, complete, in order
    cost = [0 if h else 1 + n / REQUEST_BYTES for n, h in zip(sizes, hints)]
    per = [sum(cost[i] for i in part) for part in got]
    assert max(per) - min(per) <= 2 * max(cost)


@pytest.mark.parametrize("parts", [1, 3, 8])
def test_shares_along_an_order_are_its_runs_of_about_equal_cost(parts: int) -> None:
    """Cut along a given order (the epoch's shard order): each part is a run of that
    order, every shard in exactly one, costs as even as along the listing."""
    import numpy as np

    from shardstream.loader.index.build import Listing
    from shardstream.loader.storage.filesystems import FileEntry

    entries = [FileEntry(f"s{i}.parquet", 1000 + i, None) for i in range(50)]
    listing = Listing("parquet", entries, [None] * 50)
    order = np.random.default_rng(parts).permutation(50)
    got = shares(listing, parts, order)
    runs = [sorted(order[at : at + len(p)].tolist()) for at, p in zip(_starts(got), got)]
    assert runs == [p.tolist() for p in got]  # each part is a run of `order`, ascending
    assert sorted(i for p in got for i in p.tolist()) == list(range(50))
    assert max(len(p) for p in got) - min(len(p) for p in got) <= 1


def _starts(parts: list[Any]) -> list[int]:
    out, at = [], 0
    for p in parts:
        out.append(at)
        at += len(p)
    return out


def test_a_ranks_own_span_is_the_shards_its_bytes_share_of_the_line_covers() -> None:
    import numpy as np

    from shardstream.loader.index.distributed import _own_span

    sizes = np.array([10, 10, 10, 10, 40, 10, 10], dtype=np.int64)  # 100 bytes
    line = np.array([6, 5, 4, 3, 2, 1, 0], dtype=np.int64)
    # bytes along the line: 6 [0,10) 5 [10,20) 4 [20,60) 3 [60,70) 2 [70,80) 1, 0
    assert _own_span(sizes, line, 0, 2).tolist() == [6, 5, 4, 3]  # [0, 50), one more after
    assert _own_span(sizes, line, 1, 2).tolist() == [5, 4, 3, 2, 1, 0]  # [50, 100), one before
    assert _own_span(sizes, line, 3, 4).tolist() == [3, 2, 1, 0]  # [75, 100)
    assert _own_span(sizes, line[:0], 0, 2).tolist() == []


def test_one_rank_reads_a_given_index_while_the_others_wait(tmp_path: Path) -> None:
    """A dataset given its ShardIndex under a process group asks no other rank for
    anything: rank 0 alone reads every record while the others wait at a barrier."""
    import pyarrow.dataset as pds

    write_dataset(LOCAL, str(tmp_path / "p"), "parquet")
    out = torchrun(
        REPO / "tests" / "dist" / "index_given_one_rank.py", str(tmp_path / "p"), timeout=120
    )
    rows = [json.loads(x.split(" ", 1)[1]) for x in out[0].splitlines() if x.startswith("ROWS")]
    assert rows == [pds.dataset(str(tmp_path / "p")).to_table().to_pylist()]
