"""Under torchrun: each rank builds a StreamingDataset over an S3 prefix that has no saved
index (argv: the prefix, the endpoint), takes its first batch, and prints the round trips
its stats counted before it."""

import json
import sys

import torch.distributed as dist

from shardstream.loader import StreamingDataset

dist.init_process_group(backend="gloo")
source, endpoint = sys.argv[1], sys.argv[2]
opts = {"client_kwargs": {"endpoint_url": endpoint}}
ds = StreamingDataset(source, storage_options=opts, batch_size=16, seed=3)
next(iter(ds))
st = ds.stats()
trips = {"in_line": st["first_in_line"], "requests": st["first_requests"]}
print("TRIPS", json.dumps(trips), flush=True)
dist.barrier()
dist.destroy_process_group()
