"""shardstream-plan --epochs --cache-limit: the node cache simulation (scripts/plan_cache)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardstream.plan.cache import simulate
from shardstream.plan.cli import main
from shardstream.sampler import ShardSampler


def reads(*epochs: list[tuple[int, float]]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Epochs of (shard, bytes) reads in order, as node_reads gives them."""
    out = []
    for e, reads_ in enumerate(epochs):
        s = np.array([r[0] for r in reads_], dtype=np.int64)
        out.append((s, e + np.linspace(0, 0.9, s.size), np.array([r[1] for r in reads_])))
    return out


def test_next_use_keeps_what_comes_back_first_and_lru_degenerates() -> None:
    """Room for 2 of 3 shards, read in the same order twice: next use fetches one shard
    again, LRU (which evicts exactly the one needed next) all three."""
    r = reads([(0, 1.0), (1, 1.0), (2, 1.0)], [(0, 1.0), (1, 1.0), (2, 1.0)])
    assert simulate(r, 2.0, "next-use") == [3.0, 1.0]
    assert simulate(r, 2.0, "lru") == [3.0, 3.0]
    assert simulate(r, None, "next-use") == [3.0, 0.0]


def test_a_shard_read_in_part_is_held_in_part() -> None:
    r = reads([(0, 4.0)], [(0, 6.0)])
    assert simulate(r, 5.0, "next-use") == [4.0, 2.0]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main([*argv, "--json"]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def test_node_reads_are_the_nodes_plans(capsys: pytest.CaptureFixture[str]) -> None:
    """A node's reads are its ranks' plans: with locality its share is the same bytes
    every epoch, and without a limit later epochs fetch nothing."""
    doc = run(
        capsys,
        "--simulate-shards",
        "40",
        "--records-per-shard",
        "100",
        "--shard-bytes",
        "1000",
        "--world-size",
        "4",
        "--local-world-size",
        "2",
        "--epochs",
        "3",
        "--locality",
        "node",
    )
    rows = doc["per_node_epoch"]
    assert doc["nodes"] == 2 and len(rows) == 6
    for node in (0, 1):
        s = ShardSampler([100] * 40, 4, 2 * node, local_world_size=2)
        records = len(s) * 2
        mine = [r for r in rows if r["node"] == node]
        assert [r["share"] for r in mine] == pytest.approx([records * 10.0] * 3)
        assert [r["next_use"] for r in mine] == pytest.approx([records * 10.0, 0, 0])


def test_at_scale_next_use_fetches_the_share_less_the_limit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """1,000,000 shards x 4,096 ranks (the issue's size), locality node: each epoch after
    the first fetches what the node reads less what the cache holds (the optimum), LRU
    nearly all of it."""
    doc = run(
        capsys,
        "--simulate-shards",
        "1000000",
        "--world-size",
        "4096",
        "--local-world-size",
        "8",
        "--epochs",
        "3",
        "--cache-limit",
        "50GB",
        "--locality",
        "node",
        "--sim-nodes",
        "2",
    )
    for r in doc["per_node_epoch"]:
        if r["epoch"] == 0:
            assert r["next_use"] == r["lru"] == pytest.approx(r["share"])
        else:
            assert r["next_use"] == pytest.approx(r["share"] - 50e9, rel=1e-3)
            assert r["lru"] > 0.9 * r["share"]


def test_table_and_plot(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    png = tmp_path / "cache.png"
    argv = [
        "--simulate-shards",
        "500",
        "--world-size",
        "8",
        "--local-world-size",
        "4",
        "--cache-limit",
        "20GB",
        "--plot",
        str(png),
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "next-use" in out and "LRU" in out and "epochs 1+:" in out
    assert png.stat().st_size > 10_000


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--local-world-size", "3"], "--local-world-size 3 must divide --world-size 4"),
        (["--cache-limit", "lots"], "--cache-limit must be bytes"),
        (["--epochs", "2", "--rank", "0"], "no --stream, --rank"),
    ],
)
def test_bad_cache_arguments_are_named(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit):
        main(["--simulate-shards", "10", "--world-size", "4", *argv])
    assert message in capsys.readouterr().err
