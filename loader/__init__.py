"""Storage, shard index, format readers and the streaming IterableDataset."""

__all__: list[str] = []
