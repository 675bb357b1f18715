"""Under torchrun: each rank builds a StreamingDataset over S3 prefixes that have no saved
index (argv: the endpoint, then one prefix, or several: a mixture of them as streams),
takes its first batch, and prints the round trips its stats counted before it."""

import json
import sys

import torch.distributed as dist

from shardstream.loader import Stream, StreamingDataset

dist.init_process_group(backend="gloo")
endpoint, sources = sys.argv[1], sys.argv[2:]
opts = {"client_kwargs": {"endpoint_url": endpoint}}
if len(sources) == 1:
    ds = StreamingDataset(sources[0], storage_options=opts, batch_size=16, seed=3)
else:
    streams = [Stream(s, weight=1.0) for s in sources]
    ds = StreamingDataset(streams, storage_options=opts, batch_size=16, seed=3)
next(iter(ds))
st = ds.stats()
trips = {"in_line": st["first_in_line"], "requests": st["first_requests"]}
print("TRIPS", json.dumps(trips), flush=True)
dist.barrier()
dist.destroy_process_group()
