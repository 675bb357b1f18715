"""Under torchrun: a filtered dataset evaluates its filter with each rank reading a share of
the shards (all-gathered): every rank holds the same passing rows, and the ranks read
disjoint equal shares of the passing records."""

import json
import sys

import pyarrow.compute as pc
import torch.distributed as dist

from shardstream.loader import StreamingDataset

dist.init_process_group(backend="gloo")
source = sys.argv[1]
ds = StreamingDataset(source, filter=pc.field("lang") == "en", seed=2, drop_last=True)
kept = ds.index.table.column('filter:(lang == "en")').to_pylist()
ids = [r["id"] for r in ds]
gathered: list = [None] * dist.get_world_size()
dist.all_gather_object(gathered, {"kept": kept, "ids": ids, "len": len(ds)})
if dist.get_rank() == 0:
    print("RANKS", json.dumps(gathered))
dist.destroy_process_group()
