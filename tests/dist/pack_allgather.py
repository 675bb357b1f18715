"""Under torchrun: a packing dataset counts its documents' tokens with each rank reading a
share of the shards (all-gathered), every rank makes the same blocks, and the ranks
all_gather the blocks they made. A shard that no longer matches the index is an error on
every rank (the second mode)."""

import json
import sys

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from shardstream.loader import Pack, ShardError, StreamingDataset

dist.init_process_group(backend="gloo")
source, workers, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
pack = Pack("input_ids", 16, eos=-1)
if mode == "broken":
    try:
        StreamingDataset(source, pack=pack, seed=4)
    except ShardError as e:
        print("ERROR", type(e).__name__, str(e))
    dist.destroy_process_group()
    sys.exit(0)
ds = StreamingDataset(source, pack=pack, seed=4, batch_size=2)
blocks = [b["input_ids"] for b in DataLoader(ds, batch_size=None, num_workers=workers)]
mine = torch.cat(blocks) if blocks else torch.zeros(0, 16, dtype=torch.int64)
assert sum(len(b) for b in blocks) == ds.stats()["pack"]["blocks_per_rank"]
gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
dist.all_gather(gathered, mine)
if dist.get_rank() == 0:
    print("BLOCKS", json.dumps([g.tolist() for g in gathered]))
dist.destroy_process_group()
