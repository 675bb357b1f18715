"""Under torchrun: phase "first" reads some batches on every rank and saves the state;
phase "second" (any world size) loads it and reads the rest. Rank 0 writes the ids."""

import json
import sys

import torch.distributed as dist
from torch.utils.data import DataLoader

from shardstream.loader import StreamingDataset

dist.init_process_group(backend="gloo")
phase, source, out = sys.argv[1], sys.argv[2], sys.argv[3]
ds = StreamingDataset(source, seed=4, batch_size=5, drop_last=True)
if phase == "second":
    with open(out + ".state") as f:
        ds.load_state_dict(json.load(f))
ds.set_epoch(2)
ids: list[int] = []
done = 0
for batch in DataLoader(ds, batch_size=None, num_workers=2):
    if phase == "first" and done == 3:
        break
    ids += batch["id"].tolist()
    done += 1
everyone: list = [None] * dist.get_world_size()
dist.all_gather_object(everyone, ids)
if dist.get_rank() == 0:
    if phase == "first":
        with open(out + ".state", "w") as f:
            json.dump(ds.consumed_state(done, num_workers=2), f)
    with open(out + "." + phase, "w") as f:
        json.dump(everyone, f)
dist.destroy_process_group()
