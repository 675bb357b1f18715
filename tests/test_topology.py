"""Rank and world size: explicit values, torchrun's variables, defaults, clear errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch.distributed as dist

from shardstream.sampler import DistributedSampler, ShardSampler, Topology

from .conftest import free_port


@pytest.fixture(autouse=True)
def _no_torchrun_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)


def test_defaults_without_process_group_or_env() -> None:
    assert Topology.resolve() == Topology(rank=0, world_size=1)


def test_env_from_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    assert Topology.resolve() == Topology(rank=3, world_size=4)
    assert Topology.resolve(num_replicas=8) == Topology(rank=3, world_size=8)
    # rank 0 given explicitly is not "missing" (the `rank or detect()` bug)
    assert Topology.resolve(rank=0) == Topology(rank=0, world_size=4)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_replicas": 0, "rank": 0}, "num_replicas must be >= 1, got 0"),
        ({"num_replicas": 2, "rank": 2}, r"Invalid rank 2.*\[0, 1\]"),
        ({"num_replicas": 2, "rank": -1}, r"Invalid rank -1"),
        ({"num_replicas": 2.0, "rank": 0}, r"num_replicas must be an int, got 2.0"),
        ({"num_replicas": 2, "rank": True}, r"rank must be an int, got True"),
        ({"num_replicas": np.float64(2.0), "rank": 0}, r"num_replicas must be an int, got .*2\.0"),
        ({"num_replicas": 2, "rank": np.bool_(True)}, r"rank must be an int, got .*True"),
        ({"num_replicas": "2", "rank": 0}, r"num_replicas must be an int, got '2' \(str\)"),
    ],
)
def test_invalid_values_are_quoted(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Topology.resolve(**kwargs)


def test_garbage_env_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "four")
    with pytest.raises(ValueError, match="WORLD_SIZE='four'"):
        Topology.resolve()
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "5")
    with pytest.raises(ValueError, match=r"Invalid rank 5"):
        Topology.resolve()


@pytest.mark.parametrize("kind", [np.int64, np.int32, np.uint8])
def test_numpy_integers_are_taken_as_ints(kind: type) -> None:
    topo = Topology.resolve(num_replicas=kind(2), rank=kind(1))
    assert topo == Topology(rank=1, world_size=2)
    assert type(topo.rank) is int and type(topo.world_size) is int
    direct = Topology(rank=kind(0), world_size=kind(3))  # type: ignore[arg-type]
    assert (type(direct.rank), type(direct.world_size)) == (int, int)


def test_world_size_without_rank_outside_torchrun_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # every process would silently be rank 0 and read rank 0's records
    with pytest.raises(ValueError, match=r"num_replicas=2 was given without rank.*pass rank"):
        Topology.resolve(num_replicas=2)
    with pytest.raises(ValueError, match=r"num_replicas=4 was given without rank"):
        ShardSampler([10, 10], num_replicas=np.int64(4))
    with pytest.raises(ValueError, match=r"num_replicas=2 was given without rank"):
        DistributedSampler(list(range(10)), num_replicas=2)  # type: ignore[arg-type]
    # one rank has only one possible rank; both None is rank 0 of 1
    assert Topology.resolve(num_replicas=1) == Topology(rank=0, world_size=1)
    assert Topology.resolve() == Topology(rank=0, world_size=1)
    # torchrun's RANK is a rank: taken (an explicit num_replicas still wins)
    monkeypatch.setenv("RANK", "1")
    assert Topology.resolve(num_replicas=2) == Topology(rank=1, world_size=2)
    # WORLD_SIZE without RANK: the same silent rank 0, refused
    monkeypatch.delenv("RANK")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ValueError, match=r"WORLD_SIZE=4 is set but RANK is not"):
        Topology.resolve()
    assert Topology.resolve(rank=3) == Topology(rank=3, world_size=4)


def test_world_size_without_rank_takes_the_process_groups_rank() -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    try:
        assert Topology.resolve(num_replicas=3) == Topology(rank=0, world_size=3)
        assert Topology.resolve() == Topology(rank=0, world_size=1)
    finally:
        dist.destroy_process_group()
