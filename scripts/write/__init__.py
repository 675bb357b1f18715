"""Writing shards laid out for the job that reads them: ``shardstream.write_shards`` and
the ``shardstream-write`` command (write.cli). The room, one way: writer -> sources,
spill, layout, progress, shard (see write.writer's docstring)."""

from .writer import WriteSummary, write_shards

__all__ = ["WriteSummary", "write_shards"]
