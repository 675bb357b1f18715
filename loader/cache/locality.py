"""The multi-epoch options of a dataset: the node cache (``cache_dir``, ``cache_limit``) and
``locality="node"``, checked before any storage is touched, and the cache each reading
gets (with the node's future, loader.cache.next_use)."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

from shardstream.sampler.checks import as_int
from shardstream.sampler.topology import env_int

from ..storage.filesystems import UrlOrPath
from .next_use import NextUse
from .node import NodeCache, parse_size

__all__ = ["NodeOptions"]


@dataclass(frozen=True)
class NodeOptions:
    """`cache_dir` (None: no cache), `cache_limit` (bytes, None: no bound), `policy` of
    eviction ("next-use"; "lru" for comparison), and `local_world_size`: the ranks a node
    holds, when ``locality="node"`` (None: the global reshuffle) or a cache needs to know
    the node."""

    cache_dir: str | None
    cache_limit: int | None
    locality: str | None
    local_world_size: int
    policy: str = "next-use"

    @classmethod
    def check(
        cls,
        cache_dir: UrlOrPath | None,
        cache_limit: object,
        locality: object,
        local_world_size: object,
        world_size: int,
        policy: str = "next-use",
    ) -> NodeOptions:
        """The options, validated (ValueError naming the value). `local_world_size`
        defaults to torchrun's LOCAL_WORLD_SIZE, else 1 rank a node for one process (a job
        of several ranks without it is an error with ``locality="node"``)."""
        if locality not in (None, "node"):
            raise ValueError(f"locality must be None or 'node', got {locality!r}")
        folder = None
        if cache_dir is not None:
            folder = os.fspath(cache_dir)
            if "://" in folder:
                raise ValueError(
                    f"cache_dir must be a local folder (the node's disk), got {folder!r}"
                )
        limit = parse_size(cache_limit)
        if limit is not None and folder is None:
            raise ValueError("cache_limit needs cache_dir (the folder it bounds)")
        if local_world_size is None:
            local_world_size = env_int("LOCAL_WORLD_SIZE")
        if local_world_size is None:
            if locality == "node" and world_size > 1:
                raise ValueError(
                    "locality='node' needs local_world_size (ranks per node): pass it, or "
                    "run under torchrun, which sets LOCAL_WORLD_SIZE"
                )
            local_world_size = 1 if world_size > 1 else world_size
        local = as_int("local_world_size", local_world_size, 1)
        if world_size % local:
            raise ValueError(
                f"local_world_size={local} must divide the world size {world_size}: every "
                "node runs the same number of ranks"
            )
        return cls(folder, limit, locality, local, policy)

    def for_stream(self, cache_dir: UrlOrPath | None, cache_limit: object) -> NodeOptions:
        """A mixture stream's options: its own cache folder and bound where it gives them."""
        folder = self.cache_dir if cache_dir is None else os.fspath(cache_dir)
        limit = parse_size(cache_limit) if cache_limit is not None else self.cache_limit
        if cache_dir is not None and "://" in folder:  # type: ignore[operator]
            raise ValueError(f"cache_dir must be a local folder (the node's disk), got {folder!r}")
        if limit is not None and folder is None:
            raise ValueError("cache_limit needs cache_dir (the folder it bounds)")
        return replace(self, cache_dir=folder, cache_limit=limit)

    @property
    def node_size(self) -> int | None:
        """Ranks per node for planning (None: the global reshuffle)."""
        return self.local_world_size if self.locality == "node" else None

    def cache(self, sampler: Any, names: Any, worker: int, num_workers: int) -> NodeCache | None:
        """The cache of one reading (None without cache_dir): its future is the plans of
        the node's ranks, this epoch and the next (`sampler`: the dataset's ShardSampler;
        `names(shard)`: (url, version)). A mixture's stream (`sampler` None) evicts the
        least recently read block instead: its future is not planned (yet)."""
        if self.cache_dir is None:
            return None
        sharers = self.local_world_size * max(1, num_workers)  # processes on the folder
        if sampler is None:  # a mixture's stream: its passes' future is not computed
            return NodeCache(self.cache_dir, self.cache_limit, None, "lru", sharers)
        future = None
        if self.cache_limit is not None and self.policy == "next-use":
            node = sampler.rank // self.local_world_size
            ranks = range(node * self.local_world_size, (node + 1) * self.local_world_size)
            future = NextUse.of_node(
                sampler.sizes,
                names,
                seed=sampler.seed,
                epoch=sampler.epoch,
                shuffle=sampler.shuffle,
                drop_last=sampler.drop_last,
                num_replicas=sampler.num_replicas,
                rank=sampler.rank,
                node_ranks=list(ranks),
                worker=worker,
                num_workers=max(1, num_workers),
                window=sampler.window,
                local_world_size=self.node_size,
            )
        return NodeCache(self.cache_dir, self.cache_limit, future, self.policy, sharers)

    def held_bytes(self) -> int:
        """Bytes the cache folder holds in blocks (0 without a cache)."""
        if self.cache_dir is None or not os.path.isdir(self.cache_dir):
            return 0
        return NodeCache(self.cache_dir).held_bytes()

    def state(self) -> dict[str, Any]:
        """What a resume state records of the layout: the ranks of a node, with locality."""
        return {} if self.node_size is None else {"local_world_size": self.node_size}
