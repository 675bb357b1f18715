"""The node cache: remote shard bytes kept on a node's local disk across epochs.

- `node`: `NodeCache`, aligned blocks of a shard read through it, shared by a node's ranks.
- `files`: its block files, their checks (size, trailer, CRC-32s) and fetch claims.
- `next_use`: when the node reads each shard next, the future it evicts by.
- `locality`: the dataset options (`cache_dir`, `cache_limit`, `locality="node"`).

Stands on `loader.storage`; storage reaches it only through `loader.storage.through`.
"""

from __future__ import annotations

__all__: list[str] = []  # import names from the modules above
