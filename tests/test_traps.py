"""A newcomer's first hour: `import shardstream`, and each silent trap of the usual mistakes
raising or warning with the fix (each test failed before its fix: the trap returned
something plausible and wrong)."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from shardstream import loader, sampler
from shardstream.loader import Batch, StreamingDataset
from tests.datagen import SIZES, record_id, write_dataset


@pytest.fixture
def parquet(tmp_path: Path) -> str:
    import fsspec

    write_dataset(fsspec.filesystem("file"), str(tmp_path / "pq"), "parquet")
    return str(tmp_path / "pq")


@pytest.fixture
def tars(tmp_path: Path) -> str:
    import fsspec

    write_dataset(fsspec.filesystem("file"), str(tmp_path / "tar"), "tar")
    return str(tmp_path / "tar")


# --- import shardstream -------------------------------------------------------------------


def test_import_shardstream_exposes_the_public_api() -> None:
    import shardstream

    assert shardstream.StreamingDataset is loader.StreamingDataset
    assert shardstream.Stream is loader.Stream
    assert shardstream.ShardIndex is loader.ShardIndex
    assert shardstream.ShardError is loader.ShardError
    assert shardstream.StaleIndexError is loader.StaleIndexError
    assert shardstream.DistributedSampler is sampler.DistributedSampler
    assert shardstream.ShardSampler is sampler.ShardSampler
    assert shardstream.MixtureSampler is sampler.MixtureSampler
    assert set(shardstream.__all__) <= set(dir(shardstream))
    assert shardstream.__version__ != "0+unknown"  # installed: the README's setup ran


@pytest.mark.parametrize("name", ["loader", "sampler", "scripts"])
def test_a_users_module_named_like_our_parts_is_left_alone(tmp_path: Path, name: str) -> None:
    # one top-level name is installed (shardstream): a user's loader.py is theirs alone
    (tmp_path / f"{name}.py").write_text("raise RuntimeError('imported the user module')\n")
    r = subprocess.run(
        [sys.executable, "-c", "import shardstream; print(shardstream.StreamingDataset)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "shardstream.loader.dataset.StreamingDataset" in r.stdout


# --- DataLoader batching our batches ------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("kwargs", [{}, {"batch_size": 4}])
def test_dataloader_batching_batches_is_refused_with_the_fix(
    parquet: str, workers: int, kwargs: dict[str, int]
) -> None:
    ds = StreamingDataset(parquet, batch_size=16, columns=["id"])
    with pytest.raises(TypeError, match=r"batch_size=None") as e:
        next(iter(DataLoader(ds, num_workers=workers, **kwargs)))
    assert "each of 16 records" in str(e.value)


def test_dataloader_without_its_own_batching_passes_our_batches(parquet: str) -> None:
    ds = StreamingDataset(parquet, batch_size=16, columns=["id", "value"])
    got = list(DataLoader(ds, batch_size=None, num_workers=2, pin_memory=False))
    assert all(isinstance(b, dict) and b["id"].shape[0] <= 16 for b in got)
    assert sorted(i for b in got for i in b["id"].tolist()) == list(range(sum(SIZES)))
    assert type(next(iter(ds))) is Batch


def test_records_are_still_batched_by_the_dataloader(parquet: str) -> None:
    ds = StreamingDataset(parquet, columns=["id"])
    batch = next(iter(DataLoader(ds, batch_size=8)))
    assert batch["id"].shape == (8,)


# --- tar columns --------------------------------------------------------------------------


def test_a_tar_extension_no_sample_has_is_refused(tars: str) -> None:
    with pytest.raises(ValueError, match=r"\['cxs'\].*did you mean 'cls'"):
        StreamingDataset(tars, columns="cxs")
    with pytest.raises(ValueError, match=r"'txt;cls'.*columns=\['cls', 'txt'\]"):
        StreamingDataset(tars, columns="txt;cls")


def test_tar_columns_that_exist_select_them(tars: str) -> None:
    got = list(StreamingDataset(tars, columns=["cls", "__key__"], shuffle=False))
    assert len(got) == sum(SIZES)
    assert all(set(r) == {"__key__", "__url__", "cls"} for r in got)


# --- state_dict in the main process while workers read ------------------------------------


def test_state_dict_in_the_main_process_after_workers_read_is_refused(parquet: str) -> None:
    ds = StreamingDataset(parquet, batch_size=8, columns=["id"])
    it = iter(DataLoader(ds, batch_size=None, num_workers=2))
    for _ in range(3):
        next(it)
    with pytest.raises(RuntimeError, match=r"StatefulDataLoader.*consumed_state"):
        ds.state_dict()
    del it
    ds.set_epoch(1)  # a new epoch nobody read yet: position 0 is right
    assert ds.state_dict()["epoch"] == 1 and ds.state_dict()["position"] == 0


def test_stateful_dataloader_with_workers_still_saves_and_resumes(parquet: str) -> None:
    ds = StreamingDataset(parquet, batch_size=8, columns=["id"], seed=3)
    dl = StatefulDataLoader(ds, batch_size=None, num_workers=2)
    it = iter(dl)
    seen = [next(it) for _ in range(5)]
    state = dl.state_dict()
    del it
    again = StreamingDataset(parquet, batch_size=8, columns=["id"], seed=3)
    dl2 = StatefulDataLoader(again, batch_size=None, num_workers=2)
    dl2.load_state_dict(state)
    rest = list(dl2)
    ids = [i for b in [*seen, *rest] for i in b["id"].tolist()]
    assert sorted(ids) == list(range(sum(SIZES)))


# --- another pass without set_epoch -------------------------------------------------------


def _passes(ds: StreamingDataset, n: int, set_epoch: bool) -> list[list[int]]:
    out = []
    for epoch in range(n):
        if set_epoch:
            ds.set_epoch(epoch)
        out.append([record_id(r) for r in ds])
    return out


def test_a_second_pass_without_set_epoch_warns_once(parquet: str) -> None:
    ds = StreamingDataset(parquet, columns=["id"])
    with pytest.warns(UserWarning, match=r"without set_epoch\(\).*ds.set_epoch\(epoch\)") as w:
        passes = _passes(ds, 3, set_epoch=False)
    assert passes[0] == passes[1] == passes[2]  # what the warning is about
    assert sum("set_epoch" in str(x.message) for x in w) == 1


@pytest.mark.parametrize(("shuffle", "set_epoch"), [(True, True), (False, False)])
def test_no_warning_when_epochs_are_set_or_order_is_fixed(
    parquet: str, shuffle: bool, set_epoch: bool
) -> None:
    ds = StreamingDataset(parquet, columns=["id"], shuffle=shuffle)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        passes = _passes(ds, 3, set_epoch=set_epoch)
    assert (passes[0] != passes[1]) == shuffle


def test_a_peek_before_the_epoch_is_not_a_pass(parquet: str) -> None:
    ds = StreamingDataset(parquet, columns=["id"])
    next(iter(ds))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(list(ds)) == sum(SIZES)


def test_the_warning_comes_from_dataloader_workers_too(parquet: str) -> None:
    # a script of its own: pytest records the warnings of forked workers, never shows them
    code = (
        "from torch.utils.data import DataLoader\n"
        "from shardstream import StreamingDataset\n"
        f"ds = StreamingDataset({parquet!r}, batch_size=8, columns=['id'])\n"
        "dl = DataLoader(ds, batch_size=None, num_workers=2)\n"
        "first, second = list(dl), list(dl)\n"
        "assert [b['id'].tolist() for b in first] == [b['id'].tolist() for b in second]\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("without set_epoch()") == 1


# --- S3 without credentials ---------------------------------------------------------------


def test_s3_without_credentials_is_a_permission_error_naming_the_url(
    s3_endpoint: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS")}
    env.update(HOME=str(tmp_path), AWS_EC2_METADATA_DISABLED="true", AWS_DEFAULT_REGION="x")
    code = (
        "from shardstream import StreamingDataset\n"
        f"StreamingDataset('s3://bucket/data/', storage_options={{'endpoint_url': "
        f"'{s3_endpoint}'}})\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("PermissionError: s3://bucket/data/: no S3 credentials found")
    assert "AWS_ACCESS_KEY_ID" in last and "'anon': True" in last
    assert len(r.stderr.splitlines()) < 40  # not botocore's 88-line traceback


# --- the planner --------------------------------------------------------------------------


def test_plan_defaults_to_one_rank_and_explains_single_row_group_shards(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import pandas as pd

    from shardstream.plan.cli import main

    pd.DataFrame({"x": range(1000)}).to_parquet(tmp_path / "one.parquet")  # one row group
    assert main([str(tmp_path / "one.parquet"), "--workers", "2"]) == 0
    out = capsys.readouterr().out
    assert "over 1 ranks x 2 workers" in out
    assert "2.00x the bytes" in out and "1 shards are one row group" in out
    assert "row_group_size=" in out
