"""Under torchrun: StreamingDataset takes rank and world size from the process group,
rank 0 builds the index and broadcasts it, and the ranks all_gather what they read."""

import json
import sys

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from shardstream.loader import StreamingDataset

from tests.datagen import record_id

dist.init_process_group(backend="gloo")
source, workers = sys.argv[1], int(sys.argv[2])
ds = StreamingDataset(source, seed=11, drop_last=True)  # no num_replicas / rank given
assert (ds.sampler.num_replicas, ds.sampler.rank) == (dist.get_world_size(), dist.get_rank())
ids = torch.tensor([record_id(r) for r in DataLoader(ds, batch_size=None, num_workers=workers)])
assert len(ids) == len(ds)
gathered = [torch.empty_like(ids) for _ in range(dist.get_world_size())]
dist.all_gather(gathered, ids)
if dist.get_rank() == 0:
    print("IDS", json.dumps([g.tolist() for g in gathered]))
dist.destroy_process_group()
