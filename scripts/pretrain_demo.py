"""A small pretraining job on shardstream: torchrun, DDP, Parquet shards, resumable.

    python scripts/pretrain_demo.py               # make a small dataset, run 2 ranks x 2 epochs
    torchrun --nproc_per_node=4 scripts/pretrain_demo.py --data s3://bucket/tokens/
    python scripts/pretrain_demo.py --stop-after-steps 30   # "crash" mid-epoch ...
    python scripts/pretrain_demo.py --resume                # ... and continue from the checkpoint

Without torchrun around it, the script generates its embedded default dataset (16 Parquet
shards of token sequences, unless --data is given) and relaunches itself under torchrun with
--nproc ranks (gloo on the CPU, NCCL when CUDA is present). Each rank trains a bigram model
on its share of the records under DistributedDataParallel, calls set_epoch every epoch, and
saves the loader's state with the model checkpoint. Per epoch it prints the throughput and
checks, across ranks and resumes, that every record was seen exactly once.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from loader import StreamingDataset

VOCAB = 512
SEQ = 33  # tokens per record: 32 inputs and their next tokens
WORK = Path(tempfile.gettempdir()) / "shardstream-demo"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--data", help="Parquet shards with columns id, tokens (default: generated)")
    p.add_argument("--nproc", type=int, default=2, help="ranks when launching torchrun")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=1, help="DataLoader workers per rank")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", default=str(WORK / "checkpoint.pt"))
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    p.add_argument("--stop-after-steps", type=int, help="stop (as if failed) after N steps")
    p.add_argument("--storage-options", help="fsspec/s3fs options as JSON, for s3:// data")
    return p.parse_args()


def make_dataset(root: Path, shards: int = 16, per_shard: int = 1000) -> str:
    """The embedded default: token sequences drawn from a fixed random bigram chain."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    nxt = rng.integers(0, VOCAB, size=(VOCAB, 4))  # each token has 4 likely successors
    for k in range(shards):
        tokens = np.empty((per_shard, SEQ), dtype=np.int32)
        tokens[:, 0] = rng.integers(0, VOCAB, per_shard)
        for t in range(1, SEQ):
            tokens[:, t] = nxt[tokens[:, t - 1], rng.integers(0, 4, per_shard)]
        table = pa.table(
            {
                "id": np.arange(k * per_shard, (k + 1) * per_shard, dtype=np.int64),
                "tokens": pa.FixedSizeListArray.from_arrays(tokens.ravel(), SEQ).cast(
                    pa.list_(pa.int32())
                ),
            }
        )
        pq.write_table(table, root / f"part-{k:05d}.parquet", row_group_size=250)
    return str(root)


def launch(args: argparse.Namespace) -> int:
    """Not under torchrun: prepare the data, then run this script under torchrun."""
    # generated beside the checkpoint: runs with their own checkpoint never share shards
    data = args.data or make_dataset(Path(args.checkpoint).parent / "data")
    print(f"data: {data}; launching {args.nproc} ranks with torchrun", flush=True)
    argv = [a for a in sys.argv[1:]]
    if not args.data:
        argv += ["--data", data]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={args.nproc}",
        __file__,
        *argv,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    return subprocess.call(cmd, env=env)


class Bigram(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 64)
        self.out = nn.Linear(64, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(self.embed(tokens))


def gather_ids(ids: list[int]) -> list[int]:
    """Every rank's ids, on every rank."""
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, ids)
    return [i for part in out for i in part]


class Job:
    """One rank's training: model, optimizer, dataset, and what a checkpoint holds."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        cuda = torch.cuda.is_available()
        dist.init_process_group(backend="nccl" if cuda else "gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.device = torch.device(f"cuda:{os.environ['LOCAL_RANK']}" if cuda else "cpu")
        torch.manual_seed(args.seed)
        options = json.loads(args.storage_options) if args.storage_options else None
        self.ds = StreamingDataset(
            args.data,
            columns=["id", "tokens"],
            batch_size=args.batch_size,
            seed=args.seed,
            storage_options=options,
        )
        self.model = DistributedDataParallel(Bigram().to(self.device))
        self.optim = torch.optim.AdamW(self.model.parameters(), lr=3e-3)
        self.loader = DataLoader(
            self.ds, batch_size=None, num_workers=args.workers, pin_memory=cuda
        )
        self.epoch, self.done, self.step = 0, 0, 0  # epoch, its batches done, total steps
        self.seen: list[int] = []  # ids all ranks saw this epoch before a resume

    def save(self, seen: list[int]) -> None:
        if self.rank == 0:
            Path(self.args.checkpoint).parent.mkdir(parents=True, exist_ok=True)
            loader = self.ds.consumed_state(self.done, self.args.workers)
            state = {
                "model": self.model.module.state_dict(),
                "optim": self.optim.state_dict(),
                "loader": loader,  # {"epoch", "position": batches consumed, "num_workers"}
                "seen": seen,
                "step": self.step,
            }
            torch.save(state, self.args.checkpoint)
        dist.barrier()

    def resume(self) -> None:
        ckpt = torch.load(self.args.checkpoint, map_location=self.device, weights_only=False)
        self.model.module.load_state_dict(ckpt["model"])
        self.optim.load_state_dict(ckpt["optim"])
        self.ds.load_state_dict(ckpt["loader"])
        self.epoch, self.done = ckpt["loader"]["epoch"], ckpt["loader"]["position"]
        self.seen, self.step = ckpt["seen"], ckpt["step"]
        if self.rank == 0:
            print(f"resumed at epoch {self.epoch}, batch {self.done}", flush=True)

    def train_step(self, batch: dict[str, Any]) -> float:
        tokens = batch["tokens"].to(self.device).long()
        logits = self.model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        self.optim.zero_grad()
        loss.backward()
        self.optim.step()
        return float(loss.item())

    def run(self) -> None:
        stop = self.args.stop_after_steps
        for epoch in range(self.epoch, self.args.epochs):
            self.ds.set_epoch(epoch)
            self.epoch = epoch
            mine: list[int] = []
            t0, loss = time.perf_counter(), float("nan")
            self.ds.reset_stats()  # this epoch's: the loop's time waiting for data, below
            for batch in self.ds.timed(self.loader):
                loss = self.train_step(batch)
                mine += batch["id"].tolist()
                self.done, self.step = self.done + 1, self.step + 1
                if stop and self.step >= stop:
                    self.save(self.seen + gather_ids(mine))
                    if self.rank == 0:
                        print(
                            f"stopping after {self.step} steps (epoch {epoch}, batch "
                            f"{self.done}); checkpoint: {self.args.checkpoint}",
                            flush=True,
                        )
                    return
            elapsed = time.perf_counter() - t0
            ran = gather_ids(mine)  # this run's records, all ranks
            everything = self.seen + ran  # the epoch's, across a resume
            self.seen, self.done = [], 0
            self.ds.set_epoch(epoch + 1)
            self.save([])
            if self.rank == 0:
                expected = self.world * len(self.ds.sampler)  # padding included
                stall = self.ds.stats()["stall_fraction"]
                report(epoch, len(ran), elapsed, loss, everything, expected, self.world, stall)


def report(
    epoch: int,
    records: int,
    elapsed: float,
    loss: float,
    ids: list[int],
    expected: int,
    world: int,
    stall: float | None = None,
) -> None:
    """Print the epoch's throughput and check that every record was seen exactly once
    (records repeated only as padding, when the records do not split evenly over ranks)."""
    counts = np.bincount(np.asarray(ids, dtype=np.int64))
    n = int(np.count_nonzero(counts))
    padding = expected - n
    ok = len(ids) == expected and int((counts - 1).clip(min=0).sum()) == padding
    verdict = f"every one of the {n:,} records seen exactly once" + (
        f" (+{padding} padding repeats, as DistributedSampler pads)" if padding else ""
    )
    if not ok:
        verdict = f"NOT exactly once: {len(ids):,} seen, {expected:,} expected"
    print(
        f"epoch {epoch}: {records:,} records in {elapsed:.2f}s on {world} ranks "
        f"({records / elapsed:,.0f} records/s; rank 0 waited for data "
        f"{'n/a' if stall is None else f'{stall:.0%}'} of the time), loss {loss:.3f}; {verdict}",
        flush=True,
    )
    if not ok:
        raise SystemExit(1)


def main() -> int:
    args = parse_args()
    if "LOCAL_RANK" not in os.environ:
        return launch(args)
    job = Job(args)
    if args.resume:
        job.resume()
    job.run()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
