"""A dataset built BEFORE init_process_group, iterated after it (loader.ranks): run by
tests/test_process_group.py, under torch.multiprocessing.spawn (no torchrun variables:
`spawn PORT`) or under torchrun (`torchrun`). Each rank pickles what it read (records, or
batches cut into rows), its len() before and after the group, to OUT/rank<r>.pkl."""

import pickle
import sys

import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader

from shardstream.loader import StreamingDataset
from tests.rowdata import FILL, PAD, rows_of

BATCH_OPTIONS = {"fill_nulls": {"maybe": FILL}, "pad": {"ragged": PAD}}


def job(rank: int, world: int, port: int, args: list[str]) -> None:
    source, out, workers, context, batch_size = args[:5]
    batch = int(batch_size) or None
    ds = StreamingDataset(source, seed=5, batch_size=batch, **(BATCH_OPTIONS if batch else {}))
    before = len(ds)  # under the provisional topology (rank 0 of 1 without torchrun)
    if port:
        dist.init_process_group("gloo", f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    else:
        dist.init_process_group("gloo")
    loader = DataLoader(
        ds,
        batch_size=None,
        num_workers=int(workers),
        multiprocessing_context=context if int(workers) else None,
    )
    items = list(loader)
    rows = [row for item in items for row in rows_of(item, batch is not None)]
    result = {
        "rank": dist.get_rank(),
        "replicas": ds.sampler.num_replicas,
        "before": before,
        "len": len(ds),
        "items": len(items),
        "rows": rows,
    }
    with open(f"{out}/rank{dist.get_rank()}.pkl", "wb") as f:
        pickle.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    mode, rest = sys.argv[1], sys.argv[2:]
    if mode == "spawn":
        mp.spawn(job, args=(2, int(rest[0]), rest[1:]), nprocs=2)
    else:
        job(0, 0, 0, rest)
