"""Under torchrun: each rank builds a StreamingDataset over an S3 source (argv: the
endpoint, then the source), and prints whether its S3 client was there once the
construction returned (before any read), then takes its first batch."""

import json
import sys

import torch.distributed as dist

from shardstream.loader import StreamingDataset
from shardstream.loader.storage.filesystems import filesystem

dist.init_process_group(backend="gloo")
endpoint, source = sys.argv[1], sys.argv[2]
opts = {"client_kwargs": {"endpoint_url": endpoint}}
ds = StreamingDataset(source, storage_options=opts, batch_size=16, seed=3)
imported = "s3fs" in sys.modules  # (before `filesystem` below imports it)
fs, _ = filesystem(source, opts)  # the process's one instance for these options
client = getattr(fs, "_s3", None) is not None  # s3fs's botocore client, once connected
rows = len(next(iter(ds))["id"])
got = {"rank": dist.get_rank(), "imported": imported, "client": client, "rows": rows}
print("CLIENT", json.dumps(got), flush=True)
dist.barrier()
dist.destroy_process_group()
