"""Under torchrun (gloo): loader.collectives against torch's own object collectives, for
objects of a different size on every rank (one of them a Failure), and the tensors each
collective sends let go by the group's thread when it returns. Prints one JSON line:

    ours / torch: what all_gather_object and broadcast_object returned
    same_object:  whether broadcast_object gave the source rank its own object
    tensor:       the tensor broadcast from the last rank
    held:         for every collective, the reference counts of its tensors above
                  what they were before it (all 0: the group's thread let go)"""

import json

import torch
import torch.distributed as dist

from shardstream.loader.index import collectives
from shardstream.loader.index.distributed import Failure

collectives.RELEASE_S = 60.0  # a loaded machine waits; never a timing result
held: list[list[int]] = []
run = collectives._run


def checked(collective, tensors):  # type: ignore[no-untyped-def]
    before = collectives._refs(tensors)
    run(collective, tensors)
    held.append([now - then for now, then in zip(collectives._refs(tensors), before)])


collectives._run = checked
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mine: object = {"rank": rank, "data": "x" * (1000 * rank), "ids": list(range(rank * 7))}
if rank == 1:
    mine = Failure("ShardError", "part-1 is cut", "on rank 1")
source = world - 1
ours = [collectives.all_gather_object(mine), collectives.broadcast_object(mine, src=source)]
gathered: list[object] = [None] * world
dist.all_gather_object(gathered, mine)
box = [mine]
dist.broadcast_object_list(box, src=source)
same = collectives.broadcast_object(mine, src=source) is mine
tensor = (
    torch.arange(5, dtype=torch.int64) * 10 if rank == source else torch.zeros(5, dtype=torch.int64)
)
collectives.broadcast(tensor, src=source)
dist.destroy_process_group()
line = {
    "rank": rank,
    "ours": repr(ours),
    "torch": repr([gathered, box[0]]),
    "same_object": same,
    "tensor": tensor.tolist(),
    "held": held,
}
print(json.dumps(line), flush=True)
