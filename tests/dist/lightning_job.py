"""Lightning's DDP strategy on the CPU (2 processes, gloo), 3 epochs over a StreamingDataset
built where Lightning users build it: in the LightningDataModule's `__init__` (Lightning's
launcher has set WORLD_SIZE there, not RANK), in `setup()` (the group is up), or before the
Trainer exists (`before`). Run by tests/test_process_group.py as

    lightning_job.py SOURCE OUT WHERE WORKERS PERSISTENT SET_EPOCH

Each rank pickles, per epoch, the rows of its batches to OUT/rank<r>.pkl. With SET_EPOCH=1
the README's callback calls set_epoch; without it the dataset warns (loader.epoch)."""

import os
import pickle
import sys

import lightning as L
import torch
from torch.utils.data import DataLoader

from shardstream.loader import StreamingDataset
from tests.rowdata import FILL, PAD, rows_of

BATCH_OPTIONS = {"fill_nulls": {"maybe": FILL}, "pad": {"ragged": PAD}}

SOURCE, OUT, WHERE = sys.argv[1], sys.argv[2], sys.argv[3]
WORKERS, PERSISTENT, SET_EPOCH = (int(a) for a in sys.argv[4:7])


def make() -> StreamingDataset:
    return StreamingDataset(SOURCE, batch_size=50, seed=7, **BATCH_OPTIONS)


BUILT_BEFORE = make() if WHERE == "before" else None


class Data(L.LightningDataModule):
    def __init__(self) -> None:
        super().__init__()
        self.train = make() if WHERE == "init" else BUILT_BEFORE

    def setup(self, stage: str) -> None:
        if WHERE == "setup":
            self.train = make()

    def train_dataloader(self) -> DataLoader:
        return DataLoader(
            self.train,
            batch_size=None,
            num_workers=WORKERS,
            persistent_workers=bool(PERSISTENT and WORKERS),
        )


class SetEpoch(L.Callback):  # README's recipe
    def __init__(self, data: Data) -> None:
        self.data = data

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.data.train.set_epoch(trainer.current_epoch)


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen: list[list[dict]] = []

    def on_train_epoch_start(self) -> None:
        self.seen.append([])

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        self.seen[-1].extend(rows_of(batch, True))
        return self.layer(batch["id_f"].float()[:, None]).sum() * 0.0

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    data, model = Data(), Model()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[SetEpoch(data)] if SET_EPOCH else [],
    )
    trainer.fit(model, datamodule=data)
    ds = data.train
    result = {
        "rank": trainer.global_rank,
        "replicas": ds.sampler.num_replicas,
        "len": len(ds),
        "epochs": model.seen,
        "env_rank": os.environ.get("RANK"),
    }
    with open(f"{OUT}/rank{trainer.global_rank}.pkl", "wb") as f:
        pickle.dump(result, f)
    # torch's shutdown advice, which Lightning follows for NCCL only: without it the gloo
    # group's threads outlive the interpreter, and one still letting go of a collective's
    # tensor then takes the GIL in a dying interpreter: an abort at exit ("terminate
    # called without an active exception"), once in CI (pytorch/pytorch#179291)
    torch.distributed.destroy_process_group()
