"""Under torchrun: only rank 0 builds a StreamingDataset from a ShardIndex (argv: the
folder) and reads it whole, in storage order; the other ranks wait at a barrier. A dataset
given its index makes no collective, so rank 0 is not left waiting for the others."""

import json
import sys

import torch.distributed as dist

from shardstream.loader import ShardIndex, StreamingDataset

dist.init_process_group(backend="gloo")
if dist.get_rank() == 0:
    index = ShardIndex.build(sys.argv[1])
    ds = StreamingDataset(index, num_replicas=1, rank=0, local_world_size=1, shuffle=False)
    print("ROWS", json.dumps(list(ds)), flush=True)
dist.barrier()
dist.destroy_process_group()
