"""Invariant 3: the order is a pure function of the arguments, pinned by golden ids.

The ids in tests/data/golden_shard_sampler.json were produced by this module. If a change
moves them, every job resumed across that change would read different records: bump the
project's major version and regenerate deliberately with
``python -m tests.test_golden --write``. The cases with `groups` pin the group-by-group
order the loader reads since read groups came in (the older cases did not move).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from shardstream.sampler import ShardSampler
from shardstream.sampler.keyed import derive_key, permute

GOLDEN = Path(__file__).parent / "data" / "golden_shard_sampler.json"

CASES = [
    {
        "sizes": [37, 0, 120, 64, 5, 250, 99, 1],
        "world": 3,
        "rank": 1,
        "workers": 1,
        "worker": 0,
        "seed": 0,
        "epoch": 0,
        "shuffle": True,
        "drop_last": False,
        "window": 8,
    },
    {
        "sizes": [37, 0, 120, 64, 5, 250, 99, 1],
        "world": 3,
        "rank": 2,
        "workers": 2,
        "worker": 1,
        "seed": 1234,
        "epoch": 7,
        "shuffle": True,
        "drop_last": True,
        "window": 3,
    },
    {
        "sizes": [1000] * 50,
        "world": 4,
        "rank": 0,
        "workers": 3,
        "worker": 2,
        "seed": 2**40 + 3,
        "epoch": 1,
        "shuffle": True,
        "drop_last": False,
        "window": 8,
    },
    {
        "sizes": [3, 4],
        "world": 5,
        "rank": 4,
        "workers": 1,
        "worker": 0,
        "seed": 9,
        "epoch": 2,
        "shuffle": True,
        "drop_last": False,
        "window": 2,
    },
    {
        "sizes": [10, 20, 30],
        "world": 2,
        "rank": 1,
        "workers": 1,
        "worker": 0,
        "seed": 0,
        "epoch": 0,
        "shuffle": False,
        "drop_last": False,
        "window": 8,
    },
    # read groups (the loader passes Parquet row groups): pieces read group by group
    {
        "sizes": [120, 0, 64, 250, 99],
        "groups": [[40, 40, 40], [], [64], [100, 100, 50], [30, 30, 39]],
        "world": 2,
        "rank": 0,
        "workers": 2,
        "worker": 1,
        "seed": 77,
        "epoch": 3,
        "shuffle": True,
        "drop_last": False,
        "window": 3,
    },
    {
        "sizes": [1000] * 6,
        "groups": [[250] * 4] * 6,
        "world": 1,
        "rank": 0,
        "workers": 1,
        "worker": 0,
        "seed": 0,
        "epoch": 0,
        "shuffle": True,
        "drop_last": True,
        "window": 8,
    },
]


def compute() -> dict:
    out = {"cases": [], "permute": permute(range(40), 1000, derive_key(1, 2)).tolist()}
    for case in CASES:
        sampler = ShardSampler(
            case["sizes"],
            case["world"],
            case["rank"],
            case["shuffle"],
            case["seed"],
            case["drop_last"],
            case["window"],
            case.get("groups"),
        )
        sampler.set_epoch(case["epoch"])
        ids = []
        offsets = sampler.offsets
        for chunk in sampler.plan(case["worker"], case["workers"]).chunks():
            ids += (offsets[chunk.shards] + chunk.rows).tolist()
        out["cases"].append({**case, "ids": ids[:300], "count": len(ids)})
    return out


@pytest.mark.parametrize("k", range(len(CASES)))
def test_golden_ids(k: int) -> None:
    want = json.loads(GOLDEN.read_text())["cases"][k]
    got = compute()["cases"][k]
    assert got == want


def test_golden_permutation() -> None:
    assert compute()["permute"] == json.loads(GOLDEN.read_text())["permute"]


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m tests.test_golden --write")
    GOLDEN.write_text(json.dumps(compute(), indent=None) + "\n")
    print(f"wrote {GOLDEN}")
