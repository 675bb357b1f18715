"""Under torchrun: ShardSampler takes rank and world size from the process group."""

import json
import sys

import torch
import torch.distributed as dist

from shardstream.sampler import ShardSampler

dist.init_process_group(backend="gloo")
sizes = [7, 0, 13, 5, 9, 1, 30]
drop_last = sys.argv[1] == "drop_last"
sampler = ShardSampler(sizes, seed=5, drop_last=drop_last)  # no num_replicas / rank
assert (sampler.num_replicas, sampler.rank) == (dist.get_world_size(), dist.get_rank())
mine = torch.tensor(list(sampler), dtype=torch.int64)
gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
dist.all_gather(gathered, mine)
if dist.get_rank() == 0:
    print("IDS", json.dumps([g.tolist() for g in gathered]))
dist.destroy_process_group()
