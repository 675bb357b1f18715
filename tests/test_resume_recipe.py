"""README's "Resume after a failure" recipe, as written, under torchrun with 2 ranks: a job
killed mid-epoch (SIGKILL on one rank) resumes from its last checkpoint exactly, in 2 ranks
(the same batches in the same order as a job never killed) and in 3 (the rest of the epoch
read once, on equal counts)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import torchrun
from tests.test_readme import _parquet, blocks

KILL_AT = 50  # global step at which rank 1 is killed (epoch 1: 38 steps an epoch)
RECORDS = 1200

DRIVER = """
import json, os, signal, sys
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader
from shardstream import StreamingDataset

os.chdir(sys.argv[1])
dist.init_process_group("gloo")
_rank, _kill = dist.get_rank(), int(os.environ.get("KILL_AT", "0"))
_log = open(f"log{_rank}.jsonl", "a")


def _train(epoch, step, batch):
    _log.write(json.dumps([epoch, step, batch["id"].tolist()]) + "\\n")
    _log.flush()
    if _rank == 1 and step == _kill:
        os.kill(os.getpid(), signal.SIGKILL)

"""


def driver(tmp: Path) -> Path:
    (code,) = blocks("### Resume after a failure")
    for old, new in (
        ("...  # train", "_train(epoch, step + 1, batch)"),
        ("every = 100", "every = 3"),
        ("batch_size=256", "batch_size=16"),
    ):
        assert old in code, old
        code = code.replace(old, new)
    path = tmp / "driver.py"
    path.write_text(DRIVER + code + "\ndist.destroy_process_group()\n")
    return path


def logs(folder: Path, ranks: int) -> list[list[tuple[int, int, list[int]]]]:
    out = []
    for r in range(ranks):
        lines = (folder / f"log{r}.jsonl").read_text().splitlines()
        out.append([tuple(json.loads(line)) for line in lines])
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    tmp = tmp_path_factory.mktemp("recipe")
    script = driver(tmp)
    clean = tmp / "clean"
    (clean / "data/train").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for k in range(4):
        _parquet(clean / f"data/train/part-{k}.parquet", RECORDS // 4, k * RECORDS // 4, rng)
    killed = tmp / "killed"
    shutil.copytree(clean, killed)
    torchrun(script, str(clean), nproc=2)
    with pytest.raises(AssertionError, match="failed"):
        torchrun(script, str(killed), nproc=2, env={"KILL_AT": str(KILL_AT)})
    out: dict[str, object] = {"clean": logs(clean, 2), "killed": logs(killed, 2)}
    latest = (killed / "ckpt/latest").read_text()
    out["saved_step"] = int(latest.removeprefix("ckpt/step"))
    for ranks in (2, 3):
        again = tmp / f"again{ranks}"
        shutil.copytree(killed, again)
        for f in again.glob("log*.jsonl"):
            f.unlink()
        torchrun(script, str(again), nproc=ranks)
        out[f"again{ranks}"] = logs(again, ranks)
    return out


def test_a_killed_job_resumes_exactly_in_the_same_layout(runs: dict) -> None:
    saved = runs["saved_step"]
    assert 0 < saved < KILL_AT
    for rank in range(2):
        before = [e for e in runs["killed"][rank] if e[1] <= saved]
        assert len(before) == saved  # every step up to the checkpoint ran
        assert before + runs["again2"][rank] == runs["clean"][rank], f"rank {rank}"


def test_a_killed_job_resumes_in_3_ranks_reading_the_rest_once(runs: dict) -> None:
    saved = runs["saved_step"]
    epoch = runs["killed"][0][saved - 1][0]  # the epoch of the checkpoint
    rest = [[i for e, _, ids in rank if e == epoch for i in ids] for rank in runs["again3"]]
    assert len({len(r) for r in rest}) == 1  # equal counts on the new ranks
    assert all(e >= epoch for rank in runs["again3"] for e, _, _ in rank)
    before = [i for rank in runs["killed"] for e, s, ids in rank if s <= saved and e == epoch
              for i in ids]  # fmt: skip
    in_epoch = before + [i for r in rest for i in r]
    # no drop_last: every record at least once; only the new ranks' padding (< 3) repeats
    assert set(in_epoch) == set(range(RECORDS))
    assert len(in_epoch) - RECORDS < 3
