"""shardstream-plan's indexing: worker processes, progress bars, sidecars."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import fsspec
import pytest

from shardstream.loader import ShardIndex
from shardstream.loader.index import build as index_build
from shardstream.loader.index import distributed as index_distributed
from shardstream.loader.storage import listing
from shardstream.loader.storage.listing import list_files
from shardstream.plan.cli import main

from .datagen import SIZES, write_dataset

REPO = Path(__file__).resolve().parents[1]
LOCAL = fsspec.filesystem("file")


def test_index_workers_plan_what_one_process_plans(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: Any
) -> None:

    monkeypatch.setattr(index_build, "SCAN_BATCH", 2)  # 3 batches for 2 processes
    monkeypatch.setattr(index_distributed, "SCAN_BATCH", 2)
    write_dataset(LOCAL, str(tmp_path / "d"), "parquet")
    args = [str(tmp_path / "d"), "--world-size", "3", "--workers", "4", "--json"]
    assert main(args) == 0
    one = json.loads(capsys.readouterr().out)
    assert main([*args, "--index-workers", "2"]) == 0
    two = json.loads(capsys.readouterr().out)
    assert one["per_rank"] == two["per_rank"] and one["num_records"] == sum(SIZES)


def test_progress_bars_for_listing_and_indexing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    write_dataset(LOCAL, str(tmp_path / "d"), "tar")
    assert main([str(tmp_path / "d"), "--world-size", "2"]) == 0
    err = capsys.readouterr().err
    assert "listing: " in err and "6 files" in err
    assert "indexing shards: 100%" in err and "6/6" in err


def test_write_sidecars_then_index_from_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    write_dataset(LOCAL, str(tmp_path / "d"), "tar")
    assert main([str(tmp_path / "d"), "--world-size", "2", "--write-sidecars"]) == 0
    assert "wrote 5 .idx sidecars" in capsys.readouterr().err  # the empty shard: none
    assert len(list((tmp_path / "d").glob("*.tar.idx"))) == 5
    # a stale sidecar: refused; --no-sidecars --write-sidecars rewrites it
    (tmp_path / "d" / "part-00000.tar.idx").write_text("v1.2 1\ncls 512 9 sample000000.cls\n")
    assert main([str(tmp_path / "d"), "--world-size", "2"]) == 2
    assert "part-00000.tar.idx: does not describe" in capsys.readouterr().err
    args = [str(tmp_path / "d"), "--world-size", "2", "--no-sidecars", "--write-sidecars"]
    assert main(args) == 0
    assert ShardIndex.build(str(tmp_path / "d")).shard_sizes.tolist() == SIZES


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--index-workers", "0"], "--index-workers must be >= 1, got 0"),
        (["--write-sidecars"], "--write-sidecars writes tar index sidecars"),
    ],
)
def test_bad_flags(tmp_path: Path, argv: list[str], message: str) -> None:
    write_dataset(LOCAL, str(tmp_path / "d"), "parquet")
    cmd = [sys.executable, "-m", "shardstream.plan", str(tmp_path / "d")]
    proc = subprocess.run([*cmd, "--world-size", "2", *argv], capture_output=True, text=True)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_s3_listing_reports_progress_page_by_page(s3: Any, monkeypatch: Any) -> None:

    fs = s3.fs()
    fs.mkdir("lst")
    for i in range(7):
        fs.pipe(f"lst/d/{i:02d}.parquet", b"x")
    monkeypatch.setattr(listing, "LIST_REPORT", 3)
    seen: list[int] = []
    found = list_files("s3://lst/d", s3.storage_options, seen.append)
    assert len(found) == 7 and seen == [3, 6, 7]


def test_several_sources_are_one_dataset(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`shardstream-plan data/*.parquet --world-size 2`: the shell's list of files is one
    dataset, planned as the folder is, with options before, between or after them."""
    write_dataset(LOCAL, str(tmp_path / "d"), "parquet")
    files = sorted(str(p) for p in (tmp_path / "d").glob("*.parquet"))
    assert main([str(tmp_path / "d"), "--world-size", "2", "--json"]) == 0
    folder = json.loads(capsys.readouterr().out)
    for argv in ([*files, "--world-size", "2"], [files[0], "--world-size", "2", *files[1:]]):
        assert main([*argv, "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["num_shards"] == len(files) == 6 and doc["per_rank"] == folder["per_rank"]


@pytest.mark.parametrize("name", ["i.index.arrow", "i.json"])
def test_save_index_writes_what_the_suffix_says(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str
) -> None:
    write_dataset(LOCAL, str(tmp_path / "d"), "parquet")
    saved = tmp_path / name
    assert main([str(tmp_path / "d"), "--save-index", str(saved), "--json"]) == 0
    if name.endswith(".arrow"):
        assert saved.read_bytes()[:6] == b"ARROW1"
    else:
        assert json.loads(saved.read_text())["format_version"] == 2
    assert ShardIndex.load(str(saved)).shard_sizes.tolist() == SIZES


def test_save_index_refuses_a_name_no_source_would_load(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """An Arrow file named .parquet would be read as a Parquet shard: refused, unwritten."""
    write_dataset(LOCAL, str(tmp_path / "d"), "parquet")
    saved = tmp_path / "i.parquet"
    assert main([str(tmp_path / "d"), "--save-index", str(saved)]) == 2
    assert "name it *.index.arrow (an Arrow IPC file) or *.json" in capsys.readouterr().err
    assert not saved.exists()
