"""sampler.DistributedSampler is a drop-in for torch's: same indices, same len()."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys

import numpy as np
import pytest
import torch.utils.data.distributed as tud

from shardstream.sampler import DistributedSampler

from .conftest import REPO, torchrun

SEED_EXAMPLES = REPO / "scripts" / "seed_examples.py"


class Sized(list):  # a map-style "dataset": only len() matters to the sampler
    pass


@pytest.fixture(autouse=True)
def _no_torchrun_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)


GRID = list(
    itertools.product(
        [0, 1, 2, 5, 23, 64, 100, 101],  # len(dataset)
        [1, 2, 3, 7, 8],  # num_replicas
        [True, False],  # shuffle
        [0, 42],  # seed
        [True, False],  # drop_last
    )
)


@pytest.mark.parametrize(("n", "world", "shuffle", "seed", "drop_last"), GRID)
def test_same_indices_and_len_as_torch(
    n: int, world: int, shuffle: bool, seed: int, drop_last: bool
) -> None:
    data = Sized(range(n))
    for rank in range(world):
        ours = DistributedSampler(data, world, rank, shuffle, seed, drop_last)
        theirs = tud.DistributedSampler(data, world, rank, shuffle, seed, drop_last)
        for epoch in (0, 1, 5):
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            assert list(ours) == list(theirs), (rank, epoch)
            assert len(ours) == len(theirs)


def test_defaults_without_process_group() -> None:
    # torch's would raise here: no process group is initialized
    s = DistributedSampler(Sized(range(10)), shuffle=False)
    assert (s.num_replicas, s.rank) == (1, 0)
    assert list(s) == list(range(10))


def test_defaults_from_torchrun_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "2")
    s = DistributedSampler(Sized(range(10)), shuffle=False)
    assert list(s) == list(tud.DistributedSampler(Sized(range(10)), 3, 2, shuffle=False))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_replicas": 2, "rank": 2}, r"Invalid rank 2, rank should be in the interval \[0, 1"),
        ({"num_replicas": 0, "rank": 0}, r"num_replicas must be >= 1, got 0"),
        ({"num_replicas": 2, "rank": -1}, r"Invalid rank -1"),
    ],
)
def test_bad_values_raise_value_error(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DistributedSampler(Sized(range(10)), **kwargs)


def test_numpy_integers_as_torch_takes_them() -> None:
    data = Sized(range(23))
    for rank in range(3):
        args = (np.int64(3), np.int32(rank))
        ours = DistributedSampler(data, *args, seed=np.int64(42), drop_last=True)
        # torch takes numpy num_replicas / rank; a numpy seed fails in its __iter__
        # (Generator.manual_seed wants an int), so its reference gets an int seed
        theirs = tud.DistributedSampler(data, *args, seed=42, drop_last=True)
        ours.set_epoch(1)
        theirs.set_epoch(1)
        assert list(ours) == list(theirs)
        assert (type(ours.num_replicas), type(ours.rank), type(ours.seed)) == (int, int, int)
    with pytest.raises(ValueError, match=r"seed must be an int, got 1\.5 \(float\)"):
        DistributedSampler(data, 3, 0, seed=1.5)
    with pytest.raises(ValueError, match=r"num_replicas must be an int, got True"):
        DistributedSampler(data, True, 0)


def _run_example_3(impl: str) -> str:
    cmd = [sys.executable, str(SEED_EXAMPLES), "--example", "3", "--impl", impl]
    return subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=REPO).stdout


def test_seed_example_3_drop_last() -> None:
    ours, theirs = _run_example_3("shardstream"), _run_example_3("torch")
    assert ours == theirs
    # 23 records over 2 ranks with drop_last: 11 each, batches of 4, 4, 3
    rank0, rank1 = ours.split("Rank 1 samples:")
    assert len(re.findall(r"\d+", rank0.replace("Rank 0", ""))) == 11
    assert len(re.findall(r"\d+", rank1)) == 11


@pytest.mark.parametrize("example", [1, 2])
def test_seed_examples_under_torchrun(example: int) -> None:
    args = ("--example", str(example))
    ours = torchrun(SEED_EXAMPLES, *args, "--impl", "shardstream", nproc=2)
    theirs = torchrun(SEED_EXAMPLES, *args, "--impl", "torch", nproc=2)
    assert ours == theirs  # each rank prints the same batches as with torch's sampler
    expected = {1: 1, 2: 2 * 5}[example]  # per rank: 1 batch | 2 epochs x 5 batches
    for rank, out in enumerate(ours):
        batches = [line for line in out.splitlines() if "batch: tensor(" in line]
        assert len(batches) == expected
        assert all(f"Rank {rank}," in line for line in batches)
