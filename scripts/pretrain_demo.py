"""A small pretraining job on shardstream: torchrun, DDP, packed blocks of a token mixture.

    python scripts/pretrain_demo.py        # two sources mixed in 2 phases, 2 ranks x 2 epochs
    torchrun --nproc_per_node=4 scripts/pretrain_demo.py --data s3://bucket/tokens/
    python scripts/pretrain_demo.py --stop-after-steps 30   # "crash" mid-epoch ...
    python scripts/pretrain_demo.py --resume                # ... and continue from the checkpoint

Without torchrun around it, the script generates its embedded default (two Parquet
sources of tokenized documents of 10 to 120 tokens, "prose" and "code", with
distinguishable token distributions, unless --data names one source) and relaunches itself
under torchrun with --nproc ranks (gloo on the CPU, NCCL when CUDA is present). Each rank
trains a bigram model under DistributedDataParallel on blocks of 129 tokens packed from
the mixture (`Pack("input_ids", 129, eos=0)`) in two phases (`schedule=`: prose:code 5:1
for three quarters of the epoch, then an annealing quarter at 1:1; 3:1 over the epoch),
calls set_epoch every epoch, and every --checkpoint-every steps saves the model, the
optimizer and the loader's state. Per epoch it prints tokens/s, each stream's tokens, the
tokens dropped, rank 0's blocks of each stream in each phase, and checks across ranks and
resumes that no token was trained twice.

The generated token ids carry a tag: id = token + VOCAB * n, n unique to each token of the
data (0 for the eos), and the model sees id % VOCAB. The tags let the job check that every
token was trained exactly once an epoch. The sources are sized so that an epoch is one
pass of each (2,016 blocks, 1,512 of prose and 504 of code: whole for 1, 2, 3, 4, 6 or 12
ranks), so exactly once holds per epoch, not only per pass.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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

from shardstream import write_shards
from shardstream.loader import Pack, Stream, StreamingDataset
from shardstream.loader.index.collectives import all_gather_object

VOCAB = 512
BLOCK = 129  # tokens a block: 128 inputs and their next tokens
EOS = 0  # the separator after each document (no tag)
WORK = Path(tempfile.gettempdir()) / "shardstream-demo"
# the embedded mixture: name -> (shards, blocks, first token, first tag); a source of
# `blocks` blocks holds exactly BLOCK * blocks tokens, eos included
SOURCES = {"prose": (16, 1512, 1, 1), "code": (6, 504, VOCAB // 2, 10_000_000)}
# its schedule, in blocks of the epoch over all ranks: mostly prose, then an annealing
# quarter of as much code as prose; the phases add up to each source's blocks, so every
# token is still trained once an epoch
SCHEDULE = [(1512, {"prose": 5, "code": 1}), (504, {"prose": 1, "code": 1})]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument(
        "--data", help="one source of Parquet shards with an input_ids column (default: a mixture)"
    )
    p.add_argument("--nproc", type=int, default=2, help="ranks when launching torchrun")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=8, help="blocks a batch")
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


def make_source(root: Path, shards: int, blocks: int, low: int, first_tag: int) -> str:
    """Documents of 10 to 120 tokens drawn from a fixed random bigram chain over tokens
    [low, low + VOCAB // 2) (each source its own tokens and chain), each token tagged
    (id = token + VOCAB * tag, tags unique from `first_tag`), as an `input_ids` column;
    the documents and their eos hold exactly BLOCK * blocks tokens, over `shards` shards."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(low)
    half = VOCAB // 2 - 1
    nxt = low + rng.integers(0, half, size=(VOCAB, 4))  # each token has 4 likely successors
    lengths: list[int] = []
    left = BLOCK * blocks
    while left > 0:  # each document takes its tokens and an eos
        n = int(rng.integers(10, 121))
        n = left - 1 if left - (n + 1) < 12 else n
        lengths.append(n)
        left -= n + 1
    tokens = np.empty(sum(lengths), dtype=np.int64)
    at = 0
    for n in lengths:
        doc = tokens[at : at + n]
        doc[0] = low + rng.integers(0, half)
        for t in range(1, n):
            doc[t] = nxt[doc[t - 1], rng.integers(0, 4)]
        at += n
    tokens += VOCAB * (first_tag + np.arange(tokens.size, dtype=np.int64))
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)
    table = pa.table({"input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(tokens))})
    if root.exists() and not (root / "_progress.json").exists():
        shutil.rmtree(root)  # shards of another kind: this run's are written afresh
    # written as users write theirs: shardstream's writer, about `shards` shards of row
    # groups of 100 documents, each document's token count kept in the index (a rerun with
    # the same data finds its shards whole and writes nothing)
    encoded = pa.BufferOutputStream()
    pq.write_table(table, encoded)
    write_shards(
        table,
        str(root),
        shard_bytes=max(1, encoded.tell() // shards),
        row_group_rows=100,
        tokens_column="input_ids",
    )
    return str(root)


def make_mixture(root: Path) -> str:
    """The embedded default: the SOURCES, each in its own folder under `root`."""
    for name, (shards, blocks, low, first_tag) in SOURCES.items():
        make_source(root / name, shards, blocks, low, first_tag)
    return str(root)


def launch(args: argparse.Namespace) -> int:
    """Not under torchrun: prepare the data, then run this script under torchrun."""
    # generated beside the checkpoint: runs with their own checkpoint never share shards
    data = args.data or make_mixture(Path(args.checkpoint).parent / "data")
    what = (
        "data"
        if args.data
        else "mixture "
        + " + ".join(f"{n} ({data}/{n})" for n in SOURCES)
        + ", phases "
        + ", ".join(f"{e} blocks at {w}" for e, w in SCHEDULE)
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


def gather_tags(tags: np.ndarray) -> np.ndarray:
    """Every rank's token tags, on every rank. Gathered as torch's all_gather_object does,
    but returning once gloo's thread let go of the tensors: the job's last collective, and
    the DDP model keeps the group's threads alive into the interpreter's exit, where a
    thread still letting go of a tensor (taking the GIL) aborts the process."""
    out = all_gather_object(tags)
    return np.concatenate(out) if out else tags


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
            "pack": Pack("input_ids", BLOCK, eos=EOS),
            "batch_size": args.batch_size,
            "seed": args.seed,
            "cache_dir": args.cache_dir,
        }
        if args.mixture:
            streams = [Stream(f"{args.mixture}/{name}", name=name) for name in SOURCES]
            self.ds = StreamingDataset(streams, schedule=SCHEDULE, **common)
        else:
            self.ds = StreamingDataset(args.data, storage_options=options, **common)
        self.model = DistributedDataParallel(Bigram().to(self.device))
        self.optim = torch.optim.AdamW(self.model.parameters(), lr=3e-3)
        self.loader = DataLoader(
            self.ds, batch_size=None, num_workers=args.workers, pin_memory=cuda
        )
        self.epoch, self.done, self.step = 0, 0, 0  # epoch, its batches done, total steps
        # tags of the tokens all ranks trained this epoch, up to the checkpoint
        self.seen = np.zeros(0, dtype=np.int64)

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
        """Next-token loss on the block's tokens (ids less their tags); a model would mask
        attention across documents with batch["document_ids"]."""
        tokens = (batch["input_ids"] % VOCAB).to(self.device)
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
            mine: list[np.ndarray] = []  # this rank's token tags since the last checkpoint
            ran = 0
            # the phases' ends in this rank's blocks (the plan's, from stats), and this
            # rank's blocks of each stream in each phase
            planned = self.ds.stats()["phases"] if self.args.mixture else []
            ends = np.cumsum([p["positions"] for p in planned], dtype=np.int64)
            phase_blocks = np.zeros((len(ends), 2), dtype=np.int64)
            t0, loss = time.perf_counter(), float("nan")
            self.ds.reset_stats()  # this epoch's: the loop's time waiting for data, below
            for batch in self.ds.timed(self.loader):
                loss = self.train_step(batch)
                blocks = batch["input_ids"].numpy()
                at = self.done * blocks.shape[0] + np.arange(blocks.shape[0])
                if self.args.mixture:
                    code = (blocks.max(axis=1) // VOCAB >= SOURCES["code"][3]).astype(np.int64)
                    np.add.at(phase_blocks, (np.searchsorted(ends, at, side="right"), code), 1)
                ids = blocks.ravel()
                mine.append(ids[ids != EOS] // VOCAB)
                ran += ids.size
                self.done, self.step = self.done + 1, self.step + 1
                if self.args.step_delay:
                    time.sleep(self.args.step_delay)
                if (every and self.step % every == 0) or (stop and self.step >= stop):
                    self.seen = np.concatenate([self.seen, gather_tags(_joined(mine))])
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
            trained = np.concatenate([self.seen, gather_tags(_joined(mine))])  # across resumes
            self.seen, self.done = np.zeros(0, dtype=np.int64), 0
            self.ds.set_epoch(epoch + 1)
            self.save()
            if self.rank == 0:
                stats = self.ds.stats()
                report(
                    epoch,
                    self.world * ran,
                    elapsed,
                    loss,
                    trained,
                    stats,
                    self.world,
                    tagged=bool(self.args.mixture),
                )
                if self.args.cache_dir:
                    print(cache_line(epoch, stats), flush=True)
                if self.args.mixture:
                    phases = "; ".join(
                        f"phase {p + 1}: {n[0]} prose, {n[1]} code"
                        for p, n in enumerate(phase_blocks.tolist())
                    )
                    print(f"epoch {epoch}: rank 0's blocks {phases}", flush=True)


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def report(
    epoch: int,
    tokens: int,
    elapsed: float,
    loss: float,
    trained: np.ndarray,
    stats: dict[str, Any],
    world: int,
    tagged: bool,
) -> None:
    """Print the epoch's tokens/s, each stream's tokens and the tokens dropped; with the
    generated (tagged) data, check that every token of the data was trained exactly once
    (across ranks and resumes)."""
    pack = stats["pack"]
    figures = pack if "tokens" in pack else None  # one source, or per stream
    if figures is None:
        dropped = sum(p["tokens_dropped"] for p in pack.values())
        streams = (
            " ("
            + ", ".join(f"{n} {world * p['blocks_per_rank'] * BLOCK:,}" for n, p in pack.items())
            + ")"
        )
    else:
        dropped, streams = figures["tokens_dropped"], ""
    if tagged:
        every = sum(p["tokens"] - p["documents"] for p in pack.values())  # less their eos
        once = np.unique(trained).size == trained.size
        ok = once and trained.size == every
        verdict = f"every one of the {every:,} tokens trained once"
        wrong = f"NOT exactly once: {trained.size:,} trained, {np.unique(trained).size:,} distinct"
    else:
        ok, verdict, wrong = True, f"{trained.size:,} tokens trained", ""
    stall = stats["stall_fraction"]
    waited = "n/a" if stall is None else f"{stall:.0%}"
    print(
        f"epoch {epoch}: {tokens:,} tokens{streams} in {elapsed:.2f}s on {world} ranks "
        f"({tokens / elapsed:,.0f} tokens/s; rank 0 waited for data {waited} of the time), "
        f"loss {loss:.3f}; {dropped:,} tokens dropped; {verdict if ok else wrong}",
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
