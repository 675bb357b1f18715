"""A small pretraining job on shardstream: torchrun, DDP, a weighted mixture, resumable.

    python scripts/pretrain_demo.py        # make two sources, mix them 3:1, 2 ranks x 2 epochs
    torchrun --nproc_per_node=4 scripts/pretrain_demo.py --data s3://bucket/tokens/
    python scripts/pretrain_demo.py --stop-after-steps 30   # "crash" mid-epoch ...
    python scripts/pretrain_demo.py --resume                # ... and continue from the checkpoint

Without torchrun around it, the script generates its embedded default (two Parquet
sources of token sequences, "prose" and "code", with distinguishable token
distributions, unless --data names one source) and relaunches itself under torchrun with
--nproc ranks (gloo on the CPU, NCCL when CUDA is present). Each rank trains a bigram model
under DistributedDataParallel on the mixture (prose:code = 3:1, `loader.Stream` weights),
calls set_epoch every epoch, and every --checkpoint-every steps saves the model, the
optimizer and the loader's state. Per epoch it prints the throughput, each stream's
records, and checks across ranks and resumes that every record was trained exactly once
within its stream's pass (the records the plan assigns to the epoch, none lost, none
repeated but by a stream's next pass).
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

from loader import Stream, StreamingDataset
from sampler import MixtureSampler

VOCAB = 512
SEQ = 33  # tokens per record: 32 inputs and their next tokens
WORK = Path(tempfile.gettempdir()) / "shardstream-demo"
# the embedded mixture: name -> (shards, records per shard, first token, weight, first id)
SOURCES = {"prose": (16, 1000, 0, 3.0, 0), "code": (6, 500, VOCAB // 2, 1.0, 1_000_000)}
EPOCH_SIZE = 16_000


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument(
        "--data", help="one source of Parquet shards with columns id, tokens (default: a mixture)"
    )
    p.add_argument("--nproc", type=int, default=2, help="ranks when launching torchrun")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=1, help="DataLoader workers per rank")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", default=str(WORK / "checkpoint.pt"))
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    p.add_argument("--stop-after-steps", type=int, help="stop (as if failed) after N steps")
    p.add_argument("--checkpoint-every", type=int, default=20, help="steps between checkpoints")
    p.add_argument("--step-delay", type=float, default=0.0, help="sleep per step (a slower GPU)")
    p.add_argument("--storage-options", help="fsspec/s3fs options as JSON, for s3:// data")
    p.add_argument(
        "--cache-dir", help="the node cache's folder: remote bytes read once, later epochs from it"
    )
    p.add_argument("--mixture", help=argparse.SUPPRESS)  # the generated sources' folder
    return p.parse_args()


def make_source(root: Path, shards: int, per_shard: int, low: int, first_id: int) -> str:
    """Token sequences drawn from a fixed random bigram chain over tokens
    [low, low + VOCAB // 2): each source has its own tokens and its own chain."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(low)
    half = VOCAB // 2
    nxt = low + rng.integers(0, half, size=(VOCAB, 4))  # each token has 4 likely successors
    for k in range(shards):
        tokens = np.empty((per_shard, SEQ), dtype=np.int32)
        tokens[:, 0] = low + rng.integers(0, half, per_shard)
        for t in range(1, SEQ):
            tokens[:, t] = nxt[tokens[:, t - 1], rng.integers(0, 4, per_shard)]
        ids = np.arange(k * per_shard, (k + 1) * per_shard, dtype=np.int64) + first_id
        table = pa.table(
            {
                "id": ids,
                "tokens": pa.FixedSizeListArray.from_arrays(tokens.ravel(), SEQ).cast(
                    pa.list_(pa.int32())
                ),
            }
        )
        pq.write_table(table, root / f"part-{k:05d}.parquet", row_group_size=250)
    return str(root)


def make_mixture(root: Path) -> str:
    """The embedded default: the SOURCES, each in its own folder under `root`."""
    for name, (shards, per_shard, low, _, first_id) in SOURCES.items():
        make_source(root / name, shards, per_shard, low, first_id)
    return str(root)


def launch(args: argparse.Namespace) -> int:
    """Not under torchrun: prepare the data, then run this script under torchrun."""
    # generated beside the checkpoint: runs with their own checkpoint never share shards
    data = args.data or make_mixture(Path(args.checkpoint).parent / "data")
    what = (
        "data"
        if args.data
        else "mixture "
        + " + ".join(f"{n} ({data}/{n}, weight {w[3]:g})" for n, w in SOURCES.items())
    )
    print(f"{what}; launching {args.nproc} ranks with torchrun", flush=True)
    argv = [a for a in sys.argv[1:]]
    if not args.data:
        argv += ["--mixture", data]
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
        common = {
            "columns": ["id", "tokens"],
            "batch_size": args.batch_size,
            "seed": args.seed,
            "cache_dir": args.cache_dir,
        }
        if args.mixture:
            streams = [
                Stream(f"{args.mixture}/{name}", weight=w[3], name=name)
                for name, w in SOURCES.items()
            ]
            self.ds = StreamingDataset(streams, epoch_size=EPOCH_SIZE, drop_last=True, **common)
        else:
            self.ds = StreamingDataset(args.data, storage_options=options, **common)
        self.model = DistributedDataParallel(Bigram().to(self.device))
        self.optim = torch.optim.AdamW(self.model.parameters(), lr=3e-3)
        self.loader = DataLoader(
            self.ds, batch_size=None, num_workers=args.workers, pin_memory=cuda
        )
        self.epoch, self.done, self.step = 0, 0, 0  # epoch, its batches done, total steps
        self.seen: list[int] = []  # ids all ranks trained this epoch, up to the checkpoint

    def save(self) -> None:
        """Checkpoint (rank 0 writes it whole, then renames: a kill never leaves half)."""
        if self.rank == 0:
            path = Path(self.args.checkpoint)
            path.parent.mkdir(parents=True, exist_ok=True)
            state = {
                "model": self.model.module.state_dict(),
                "optim": self.optim.state_dict(),
                "loader": self.ds.consumed_state(self.done, self.args.workers),
                "seen": self.seen,
                "step": self.step,
            }
            torch.save(state, path.with_suffix(".tmp"))
            os.replace(path.with_suffix(".tmp"), path)
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
        stop, every = self.args.stop_after_steps, self.args.checkpoint_every
        for epoch in range(self.epoch, self.args.epochs):
            self.ds.set_epoch(epoch)
            self.epoch = epoch
            mine: list[int] = []  # this rank's ids since the last checkpoint
            ran = 0
            t0, loss = time.perf_counter(), float("nan")
            self.ds.reset_stats()  # this epoch's: the loop's time waiting for data, below
            for batch in self.ds.timed(self.loader):
                loss = self.train_step(batch)
                mine += batch["id"].tolist()
                ran += len(batch["id"])
                self.done, self.step = self.done + 1, self.step + 1
                if self.args.step_delay:
                    time.sleep(self.args.step_delay)
                if (every and self.step % every == 0) or (stop and self.step >= stop):
                    self.seen += gather_ids(mine)
                    mine = []
                    self.save()
                if stop and self.step >= stop:
                    if self.rank == 0:
                        print(
                            f"stopping after {self.step} steps (epoch {epoch}, batch "
                            f"{self.done}); checkpoint: {self.args.checkpoint}",
                            flush=True,
                        )
                    return
            elapsed = time.perf_counter() - t0
            trained = self.seen + gather_ids(mine)  # the epoch's, across resumes
            records = self.world * ran
            self.seen, self.done = [], 0
            expected = planned_ids(self.ds, self.world, epoch)
            self.ds.set_epoch(epoch + 1)
            self.save()
            if self.rank == 0:
                padded = self.world * len(self.ds.sampler)  # a single source's, padding included
                stats = self.ds.stats()
                report(
                    epoch,
                    records,
                    elapsed,
                    loss,
                    trained,
                    expected,
                    self.world,
                    padded,
                    stats["stall_fraction"],
                )
                if self.args.cache_dir:
                    print(cache_line(epoch, stats), flush=True)


def planned_ids(ds: StreamingDataset, world: int, epoch: int) -> dict[str, list[list[int]]]:
    """Per stream of the mixture, the ids every rank's plan assigns to the epoch, grouped by
    the stream's pass they belong to: the check's reference. A single source (--data, ids
    of the user's own): {} (the check counts repeats against the padding instead)."""
    sampler = ds.sampler
    if not isinstance(sampler, MixtureSampler):
        return {}
    out: dict[str, dict[int, list[int]]] = {n: {} for n in sampler.names}
    for r in range(world):
        m = MixtureSampler(
            sampler.sizes,
            sampler.weights,
            sampler.epoch_size,
            world,
            r,
            sampler.shuffle,
            sampler.seed,
            sampler.drop_last,
            sampler.window,
            sampler.names,
        )
        m.set_epoch(epoch)
        part = m.part(0, len(m))
        for k, pieces in enumerate(part.pieces):
            first = SOURCES[sampler.names[k]][4]
            for piece in pieces:
                group = out[sampler.names[k]].setdefault(piece.pass_index, [])
                for chunk in piece.plan.chunks(piece.start, piece.stop):
                    group += (first + m.offsets[k][chunk.shards] + chunk.rows).tolist()
    return {name: list(groups.values()) for name, groups in out.items()}


def report(
    epoch: int,
    records: int,
    elapsed: float,
    loss: float,
    trained: list[int],
    planned: dict[str, list[list[int]]],
    world: int,
    padded: int,
    stall: float | None = None,
) -> None:
    """Print the epoch's throughput and per-stream records, and check that the records
    trained (all ranks, across resumes) are exactly the planned ones, each once within its
    stream's pass; for a single source, that only padding repeats (`padded`: the epoch's
    records with padding)."""
    if planned:
        every = [i for groups in planned.values() for g in groups for i in g]
        once = all(len(g) == len(set(g)) for groups in planned.values() for g in groups)
        ok = once and sorted(trained) == sorted(every)
        per_stream = {n: sum(len(g) for g in groups) for n, groups in planned.items()}
        streams = " (" + ", ".join(f"{n} {c:,}" for n, c in per_stream.items()) + ")"
        verdict = f"every one of the {len(every):,} records trained once within its stream's pass"
        wrong = f"NOT exactly once: {len(trained):,} trained, {len(every):,} planned"
    else:
        counts = np.bincount(np.asarray(trained, dtype=np.int64))
        n = int(np.count_nonzero(counts))
        padding = padded - n
        ok = len(trained) == padded and int((counts - 1).clip(min=0).sum()) == padding
        streams = ""
        verdict = f"every one of the {n:,} records seen exactly once" + (
            f" (+{padding} padding repeats, as DistributedSampler pads)" if padding else ""
        )
        wrong = f"NOT exactly once: {len(trained):,} seen, {padded:,} expected"
    print(
        f"epoch {epoch}: {len(trained):,} records{streams} in {elapsed:.2f}s on {world} "
        f"ranks ({records / elapsed:,.0f} records/s; rank 0 waited for data "
        f"{'n/a' if stall is None else f'{stall:.0%}'} of the time), loss {loss:.3f}; "
        f"{verdict if ok else wrong}",
        flush=True,
    )
    if not ok:
        raise SystemExit(1)


def cache_line(epoch: int, stats: dict) -> str:
    """What rank 0 read from the node cache this epoch, against what it read in all."""
    hit, fetched = stats["cache_hit_bytes"], stats["bytes_fetched"]
    if hit + fetched == 0:
        return f"epoch {epoch}: node cache: nothing read"
    held = stats["cache_held_bytes"] / 1e6
    return (
        f"epoch {epoch}: node cache served {hit / 1e6:,.1f} MB of rank 0's "
        f"{(hit + fetched) / 1e6:,.1f} MB ({hit / (hit + fetched):.0%}); it holds "
        f"{held:,.1f} MB" + ("" if hit or held else " (local data is read in place, never copied)")
    )


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
