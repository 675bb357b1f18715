"""Packing documents into blocks of tokens (`pack=Pack(...)`): DESIGN's "Pretraining on
tokens" invariants, on real Parquet shards.

Every token of the test data names its document and place (token = 4096 * document +
place), so a block is checked whole: each token sits at the position its document gives
it, separators where documents end, `document_ids` and `position_ids` agreeing with the
tokens, and no token in two blocks of an epoch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
import torch
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from shardstream.loader import Pack, ShardError, ShardIndex, Stream, StreamingDataset

STRIDE = 4096  # token = STRIDE * document + place in the document
EOS, BOS = -1, -2
SIZES = [23, 0, 41, 9, 30, 17]  # documents a shard (one empty shard)
L = 32


def documents(seed: int = 0) -> list[list[int] | None]:
    """Every document of the data set, in storage order (None: a null row)."""
    rng = np.random.default_rng(seed)
    out: list[list[int] | None] = []
    for d in range(sum(SIZES)):
        n = int(rng.integers(0, 90))
        out.append(None if d % 37 == 5 else [STRIDE * d + j for j in range(n if d % 11 else 0)])
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tokens")
    docs = documents()
    at = 0
    for s, n in enumerate(SIZES):
        rows = docs[at : at + n]
        table = pa.table(
            {
                "input_ids": pa.array(rows, pa.list_(pa.int32())),
                "text": [f"doc {at + i}" for i in range(n)],
            }
        )
        pq.write_table(table, root / f"part-{s:02d}.parquet", row_group_size=7)
        at += n
    return root


def make(data: Path, pack: Pack, **kw: Any) -> StreamingDataset:
    kw.setdefault("seed", 3)
    return StreamingDataset(data, pack=pack, **kw)


def as_rows(items: list[dict[str, torch.Tensor]]) -> list[tuple[tuple[int, ...], ...]]:
    """Each block (items of blocks, or batches of them) as (tokens, positions, documents)."""
    out = []
    for item in items:
        t, p, d = (
            item[k].reshape(-1, item[k].shape[-1])
            for k in ("input_ids", "position_ids", "document_ids")
        )
        for i in range(t.shape[0]):
            out.append((tuple(t[i].tolist()), tuple(p[i].tolist()), tuple(d[i].tolist())))
    return out


def check_block(block: tuple[tuple[int, ...], ...], pack: Pack, docs: Any) -> list[int]:
    """Assert the block is whole documents' places, rightly labelled; its real tokens."""
    tokens, positions, doc_ids = block
    assert len(tokens) == pack.length
    first = int(pack.bos is not None)
    current = None  # the document the run of places belongs to
    real = []
    for i, (t, p, d) in enumerate(zip(tokens, positions, doc_ids)):
        if i == 0:
            assert d == 0
        elif p == 0:  # a new document starts
            assert d == doc_ids[i - 1] + 1
            current = None
        else:
            assert p == positions[i - 1] + 1 and d == doc_ids[i - 1]
        if t >= 0:
            doc, j = divmod(t, STRIDE)
            assert p == j + first, (t, p)
            assert current in (None, doc)
            current = doc
            real.append(t)
        elif t == EOS:
            assert pack.eos == EOS
            if current is not None:
                assert p == len(docs[current]) + first
        else:
            assert t == BOS == pack.bos and p == 0
    return real


def epoch_blocks(data: Path, pack: Pack, replicas: int, epoch: int = 0, **kw: Any) -> list[Any]:
    """[rank] -> the rank's blocks of the epoch (iterated directly)."""
    out = []
    for rank in range(replicas):
        ds = make(data, pack, num_replicas=replicas, rank=rank, **kw)
        ds.set_epoch(epoch)
        out.append(as_rows(list(ds)))
    return out


@pytest.mark.parametrize(
    "pack",
    [Pack("input_ids", L, eos=EOS), Pack("input_ids", 20, EOS, BOS), Pack("input_ids", 7)],
    ids=["eos", "eos+bos", "bare"],
)
@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_equal_counts_every_token_once_and_whole_blocks(
    data: Path, pack: Pack, replicas: int
) -> None:
    docs = documents()
    lengths = np.array([len(d or []) for d in docs])
    places = int(np.where(lengths > 0, lengths + pack.separators, 0).sum())
    for epoch in (0, 1):
        ranks = epoch_blocks(data, pack, replicas, epoch)
        ds = make(data, pack, num_replicas=replicas, rank=0)
        n = (places // pack.length) // replicas
        assert [len(r) for r in ranks] == [n] * replicas == [len(ds)] * replicas
        real = [t for r in ranks for b in r for t in check_block(b, pack, docs)]
        assert len(real) == len(set(real))  # no token twice
        summary = ds.stats()["pack"]
        assert summary["tokens"] == places
        assert summary["tokens_dropped"] == places - replicas * n * pack.length
        assert summary["tokens_dropped"] < pack.length * (replicas + 1)
        assert len(real) >= int(lengths.sum()) - summary["tokens_dropped"]


def test_storage_order_is_the_documents_end_to_end(data: Path) -> None:
    """shuffle=False on one rank: what pyarrow.dataset reads, each document then eos,
    cut every `length` tokens."""
    pack = Pack("input_ids", L, eos=EOS, bos=BOS)
    table = pads.dataset(str(data), format="parquet").to_table(columns=["input_ids"])
    stream: list[int] = []
    for row in table.column("input_ids").to_pylist():
        if row:
            stream += [BOS, *row, EOS]
    want = [tuple(stream[i : i + L]) for i in range(0, len(stream) - L + 1, L)]
    (got,) = epoch_blocks(data, pack, 1, shuffle=False)
    assert [b[0] for b in got] == want


def test_the_token_line_does_not_depend_on_ranks_or_batches(data: Path) -> None:
    """Rank r of R reads blocks [r n, (r + 1) n) of the epoch's line: the ranks' blocks laid
    end to end are the first R n blocks one rank reads; batches hold the same blocks."""
    pack = Pack("input_ids", L, eos=EOS)
    (whole,) = epoch_blocks(data, pack, 1, epoch=2)
    for replicas in (2, 3):
        ranks = epoch_blocks(data, pack, replicas, epoch=2)
        assert [b for r in ranks for b in r] == whole[: replicas * len(ranks[0])]
    batched = make(data, pack, batch_size=5)
    batched.set_epoch(2)
    batches = list(batched)
    assert len(batches) == len(batched) == -(-len(whole) // 5)
    assert all(b["input_ids"].shape == (5, L) for b in batches[:-1])
    assert all(b["input_ids"].dtype == torch.int64 for b in batches)
    assert as_rows(batches) == whole


def test_epochs_reshuffle_and_repeat(data: Path) -> None:
    pack = Pack("input_ids", L, eos=EOS)
    a, b, a2 = (epoch_blocks(data, pack, 1, epoch=e)[0] for e in (0, 1, 0))
    assert a == a2 and a != b


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_dataloader_workers_read_the_ranks_blocks(data: Path, workers: int) -> None:
    pack = Pack("input_ids", L, eos=EOS)
    ds = make(data, pack, num_replicas=2, rank=1, batch_size=3)
    direct = as_rows(list(ds))
    loaded = as_rows(list(DataLoader(ds, batch_size=None, num_workers=workers)))
    assert len(loaded) == len(direct) and sorted(loaded) == sorted(direct)


@pytest.mark.parametrize("stop", [0, 1, 4, 13])
def test_resume_at_any_block_yields_the_rest(data: Path, stop: int) -> None:
    pack = Pack("input_ids", L, eos=EOS, bos=BOS)
    (whole, _) = epoch_blocks(data, pack, 2, epoch=1)
    ds = make(data, pack, num_replicas=2, rank=0)
    ds.set_epoch(1)
    it = iter(ds)
    for _ in range(stop):
        next(it)
    state = ds.state_dict()
    assert set(state) >= {"epoch", "position"} and state["position"] == stop
    again = make(data, pack, num_replicas=2, rank=0)
    again.load_state_dict(state)
    assert len(again) == len(whole)  # len is the epoch's, resumed or not
    assert as_rows(list(again)) == whole[stop:]


def test_stateful_dataloader_with_workers_resumes_exactly(data: Path) -> None:
    pack = Pack("input_ids", L, eos=EOS)
    ds = make(data, pack, batch_size=2)
    whole = sorted(as_rows(list(ds)))
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=2)
    it = iter(loader)
    first = [next(it) for _ in range(3)]
    state = loader.state_dict()
    del it
    resumed = make(data, pack, batch_size=2)
    rest = StatefulDataLoader(resumed, batch_size=None, num_workers=2)
    rest.load_state_dict(state)
    assert sorted(as_rows(first) + as_rows(list(rest))) == whole


@pytest.mark.parametrize(("old", "new"), [(3, 2), (2, 3), (1, 4)])
def test_elastic_resume_reads_each_token_once(data: Path, old: int, new: int) -> None:
    pack = Pack("input_ids", 16, eos=EOS)
    docs = documents()
    taken = []
    for rank in range(old):
        ds = make(data, pack, num_replicas=old, rank=rank, batch_size=2)
        taken += as_rows(list(ds)[:2])
    state = make(data, pack, num_replicas=old, rank=0, batch_size=2).consumed_state(2, 0)
    rest = []
    for rank in range(new):
        ds = make(data, pack, num_replicas=new, rank=rank, batch_size=2)
        ds.load_state_dict(state)
        got = as_rows(list(ds))
        assert len(ds) == -(-len(got) // 2)  # after an elastic resume: this rank's rest
        rest.append(got)
    assert len({len(r) for r in rest}) == 1  # equal counts on the new ranks
    blocks = taken + [b for r in rest for b in r]
    real = [t for b in blocks for t in check_block(b, pack, docs)]
    assert len(real) == len(set(real))
    (whole,) = epoch_blocks(data, pack, 1)
    assert set(blocks) <= set(whole)
    assert (
        len(whole) - len(blocks) < new + old
    )  # the equal cut leaves out fewer than a block a rank


def test_token_counts_are_kept_in_the_saved_index(data: Path, tmp_path: Path) -> None:
    pack = Pack("input_ids", L, eos=EOS)
    ds = make(data, pack)
    assert "tokens:input_ids" in ds.index.table.column_names
    path = tmp_path / "corpus.index.arrow"
    ds.index.save(path)
    loaded = ShardIndex.load(path)
    assert "tokens:input_ids" in loaded.table.column_names
    again = make(path, pack)
    assert len(again) == len(ds)
    assert as_rows(list(again)) == as_rows(list(ds))


def test_files_other_writers_wrote(tmp_path: Path) -> None:
    """polars (large_list<i64>) and pandas (list<i64>) token columns pack as pyarrow's."""
    import pandas as pd
    import polars as pl

    docs = [d or [] for d in documents()[:60]]
    pl.DataFrame({"input_ids": docs[:30]}).write_parquet(tmp_path / "a.parquet")
    pd.DataFrame({"input_ids": docs[30:]}).to_parquet(tmp_path / "b.parquet")
    types = {
        f: str(pq.read_schema(tmp_path / f).field("input_ids").type)
        for f in ("a.parquet", "b.parquet")
    }
    assert types == {"a.parquet": "large_list<element: int64>", "b.parquet": "list<element: int64>"}
    pack = Pack("input_ids", 16, eos=EOS)
    (got,) = epoch_blocks(tmp_path, pack, 1, shuffle=False)
    stream = [t for d in docs if d for t in [*d, EOS]]
    assert [b[0] for b in got] == [
        tuple(stream[i : i + 16]) for i in range(0, len(stream) - 15, 16)
    ]


def test_bad_arguments_are_named(data: Path, tmp_path: Path) -> None:
    pack = Pack("input_ids", L, eos=EOS)
    with pytest.raises(ValueError, match="'text' must hold a list of integer"):
        make(data, Pack("text", L))
    with pytest.raises(ValueError, match=r"columns \['nope'\] are not in the shards"):
        make(data, Pack("nope", L))
    with pytest.raises(ValueError, match="reads only its token column"):
        make(data, pack, columns=["text"])
    with pytest.raises(ValueError, match="do not apply"):
        make(data, pack, pad={"input_ids": 0})
    with pytest.raises(ValueError, match="fewer than one for each of 1000 ranks"):
        StreamingDataset(
            [Stream(data), Stream(data, name="b")], pack=pack, num_replicas=1000, rank=0
        )
    with pytest.raises(ValueError, match="fewer than one for each of 1000 ranks"):
        make(data, Pack("input_ids", 4096), num_replicas=1000, rank=0)
    with pytest.raises(ValueError, match="length"):
        Pack("input_ids", 0)
    with pytest.raises(TypeError, match=r"loader\.Pack"):
        StreamingDataset(data, pack={"column": "input_ids"})  # type: ignore[arg-type]


def test_a_null_token_is_a_shard_error(tmp_path: Path) -> None:
    rows = [[4, None, 6]] + [[1, 2, 3]] * 20
    pq.write_table(
        pa.table({"input_ids": pa.array(rows, pa.list_(pa.int64()))}), tmp_path / "n.parquet"
    )
    ds = StreamingDataset(tmp_path, pack=Pack("input_ids", 4), shuffle=False)
    with pytest.raises(ShardError, match=r"n\.parquet.*1 null token"):
        list(ds)


def second_documents() -> dict[int, list[int]]:
    """Another stream's documents by number, from 100,000 on."""
    rng = np.random.default_rng(7)
    return {
        100_000 + d: [STRIDE * (100_000 + d) + j for j in range(int(rng.integers(1, 70)))]
        for d in range(50)
    }


@pytest.fixture(scope="module")
def second(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another stream: documents numbered from 100,000 (tokens above 4096 * 100,000)."""
    root = tmp_path_factory.mktemp("second")
    docs = list(second_documents().values())
    for s in range(2):
        pq.write_table(
            pa.table({"input_ids": pa.array(docs[25 * s : 25 * s + 25], pa.list_(pa.int64()))}),
            root / f"b-{s}.parquet",
            row_group_size=6,
        )
    return root


def mixture(data: Path, second: Path, weights: tuple[float, float], **kw: Any) -> StreamingDataset:
    streams = [
        Stream(data, weight=weights[0], name="a"),
        Stream(second, weight=weights[1], name="b"),
    ]
    return StreamingDataset(streams, pack=Pack("input_ids", 16, eos=EOS), seed=5, **kw)


def stream_of(block: tuple[tuple[int, ...], ...]) -> int:
    """Which stream a block's tokens come from (0 or 1); never both."""
    real = {t // STRIDE >= 100_000 for t in block[0] if t >= 0}
    assert len(real) == 1, "a block mixes streams"
    return int(real.pop())


@pytest.mark.parametrize("weights", [(0.8, 0.2), (0.5, 0.5), (1.0, 3.0)])
@pytest.mark.parametrize("replicas", [1, 3])
def test_mixture_weights_count_tokens(
    data: Path, second: Path, weights: Any, replicas: int
) -> None:
    """Every rank makes the same blocks an epoch; stream k's share of a rank's tokens is
    its weight's within one block; no block mixes streams; within a pass of a stream no
    token repeats, across ranks and epochs."""
    docs = {**dict(enumerate(documents())), **second_documents()}
    epoch_size = 60 * replicas
    # [rank][stream] -> that rank's blocks of the stream, over the epochs, in order
    seq: list[list[list[Any]]] = [[[], []] for _ in range(replicas)]
    for epoch in range(3):
        counts = []
        for rank in range(replicas):
            ds = mixture(
                data,
                second,
                weights,
                num_replicas=replicas,
                rank=rank,
                batch_size=4,
                epoch_size=epoch_size,
            )
            ds.set_epoch(epoch)
            batches = list(ds)
            assert len(batches) == len(ds) == 15
            blocks = as_rows(batches)
            ids = np.concatenate([b["__stream__"].numpy() for b in batches])
            assert [stream_of(b) for b in blocks] == ids.tolist()
            share = weights[0] / sum(weights)
            assert abs(int((ids == 0).sum()) - share * len(blocks)) <= 1
            for b, k in zip(blocks, ids.tolist()):
                check_block(b, Pack("input_ids", 16, eos=EOS), docs)
                seq[rank][k].append(b)
            counts.append(len(blocks))
        assert len(set(counts)) == 1
    summary = ds.stats()["pack"]
    for k, name in enumerate(("a", "b")):
        n = summary[name]["blocks_per_rank"]  # a rank's blocks of one pass
        passes = min(len(seq[r][k]) for r in range(replicas)) // n
        if weights[1] > weights[0]:
            assert k == 0 or passes >= 1  # the small stream: whole passes, then repeats
        for p in range(passes):  # pass p over all ranks: no token twice
            tokens = [
                t
                for r in range(replicas)
                for b in seq[r][k][p * n : (p + 1) * n]
                for t in b[0]
                if t >= 0
            ]
            assert len(tokens) == len(set(tokens))


def test_mixture_resume_and_elastic_resume(data: Path, second: Path) -> None:
    weights = (0.7, 0.3)
    kw = {"batch_size": 2, "epoch_size": 40}  # no stream's pass ends within the epoch
    whole = as_rows(list(mixture(data, second, weights, num_replicas=2, rank=1, **kw)))
    ds = mixture(data, second, weights, num_replicas=2, rank=1, **kw)
    it = iter(ds)
    first = [next(it) for _ in range(5)]
    state = ds.state_dict()
    again = mixture(data, second, weights, num_replicas=2, rank=1, **kw)
    again.load_state_dict(state)
    assert as_rows(first) + as_rows(list(again)) == whole
    # elastic: 2 ranks took 5 batches each, 3 ranks read the rest of the epoch
    taken = []
    for rank in range(2):
        taken += as_rows(
            list(mixture(data, second, weights, num_replicas=2, rank=rank, batch_size=2))[:5]
        )
    rest = []
    for rank in range(3):
        ds = mixture(data, second, weights, num_replicas=3, rank=rank, **kw)
        ds.load_state_dict(state)
        rest.append(as_rows(list(ds)))
    assert [len(r) for r in rest] == [6, 6, 6]  # the 20 blocks left, cut equally (2 dropped)
    blocks = taken + [b for r in rest for b in r]
    tokens = [t for b in blocks for t in b[0] if t >= 0]
    assert len(tokens) == len(set(tokens))


@pytest.mark.parametrize("workers", [0, 2])
def test_torchrun_ranks_count_a_share_each_and_make_the_epochs_blocks(
    data: Path, workers: int
) -> None:
    """3 real processes (gloo): each counts a third of the shards' tokens (all-gathered);
    together they make the first 3 n blocks of the epoch's line, n each, as one process
    computes them (in the DataLoader's order without workers)."""
    from .conftest import REPO, torchrun

    out = torchrun(
        REPO / "tests" / "dist" / "pack_allgather.py", str(data), str(workers), "ok", nproc=3
    )
    line = next(x for x in out[0].splitlines() if x.startswith("BLOCKS "))
    per_rank = json.loads(line[7:])
    pack = Pack("input_ids", 16, eos=-1)
    (whole,) = epoch_blocks(data, pack, 1, seed=4)
    n = len(whole) // 3
    assert [len(r) for r in per_rank] == [n] * 3
    for r, got in enumerate(per_rank):
        want = [b[0] for b in whole[r * n : (r + 1) * n]]
        got = [tuple(b) for b in got]
        # workers' batches arrive in turn: the same blocks, in the order the loader takes them
        assert got == want if workers == 0 else sorted(got) == sorted(want)


def test_torchrun_a_shard_that_fails_to_count_fails_every_rank(tmp_path: Path) -> None:
    from .conftest import REPO, torchrun

    for s in range(4):
        rows = [[s * 1000 + i] * (i + 1) for i in range(20)]
        pq.write_table(
            pa.table({"input_ids": pa.array(rows, pa.list_(pa.int64()))}), tmp_path / f"{s}.parquet"
        )
    index = ShardIndex.build(str(tmp_path))
    (tmp_path / "3.parquet").write_bytes(b"PAR1 not a parquet file PAR1")
    index.save(tmp_path / "i.index.arrow")
    out = torchrun(
        REPO / "tests" / "dist" / "pack_allgather.py",
        str(tmp_path / "i.index.arrow"),
        "0",
        "broken",
        nproc=2,
    )
    for rank_out in out:
        assert "ERROR StaleIndexError" in rank_out and "3.parquet" in rank_out


def test_s3_and_arrow_ipc_shards_pack_as_local_parquet(data: Path, tmp_path: Path, s3: Any) -> None:
    """The same documents over S3 (moto's server, counts read through checked ranged
    GETs, then saved beside the shards) and as Arrow IPC files pack into the same blocks."""
    pack = Pack("input_ids", L, eos=EOS)
    (local,) = epoch_blocks(data, pack, 1, epoch=1)
    fs = s3.fs()
    fs.mkdir("corpus")
    fs.put(str(data) + "/", "corpus/tokens/", recursive=True)
    remote = make(
        "s3://corpus/tokens/", pack, storage_options=s3.storage_options, num_replicas=1, rank=0
    )
    remote.set_epoch(1)
    assert as_rows(list(remote)) == local
    remote.index.save("s3://corpus/tokens.index.arrow", s3.storage_options)
    again = make("s3://corpus/tokens.index.arrow", pack, storage_options=s3.storage_options)
    assert "tokens:input_ids" in again.index.table.column_names and len(again) == len(local)
    (tmp_path / "ipc").mkdir()
    for f in sorted(data.glob("*.parquet")):
        table = pq.read_table(f)
        with pa.ipc.new_file(tmp_path / "ipc" / f"{f.stem}.arrow", table.schema) as w:
            w.write_table(table, max_chunksize=7)
    (ipc,) = epoch_blocks(tmp_path / "ipc", pack, 1, epoch=1)
    (ipc_whole,) = epoch_blocks(tmp_path / "ipc", pack, 1, epoch=1, shuffle=False)
    (local_whole,) = epoch_blocks(data, pack, 1, epoch=1, shuffle=False)
    assert ipc_whole == local_whole  # storage order: the same documents end to end
    assert sorted(t for b in ipc for t in b[0]) == sorted(t for b in local for t in b[0])
