"""The index: which shards a source has, how many records each, and where they lie.

Built once per job, in one pass down: `build.discover` lists the source (`listing`, a
`manifest`, a `saved` index, a `hf` dataset), `build.scan` reads what each shard's format
needs (Parquet footers, tar headers or sidecars: loader.formats), `assemble` makes the
columnar `table`; `distributed` shares that work over the ranks of a process group;
`shard_index.ShardIndex` is what the dataset and the sampler use.

``from shardstream.loader.index import ShardIndex`` works as it did when this was one module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardstream.sampler.lazy import lazy_names

if TYPE_CHECKING:
    from .shard_index import ShardIndex

__all__ = ["ShardIndex"]

__getattr__, __dir__ = lazy_names(__name__, {"ShardIndex": ".shard_index"}, globals())
