"""Mixture phases read from files: whole records, phases delivered in order through
DataLoader workers, resume in the same layout and elastic resume, refusals."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

from shardstream.loader import Stream, StreamingDataset
from shardstream.sampler.resume import phased_streams, resume_point

from .helpers import take
from .test_mixture_dataset import ids_of, root, stream_of

assert root  # the module's fixture: streams a (100 records), b (30) and c (7)

SCHEDULE = [(60, {"a": 1, "b": 1}), (30, {"c": 1})]  # 90 items: c only in the last third


def phased(root: Path, **kw: Any) -> StreamingDataset:
    names = ["a", "b", "c"]
    kw.setdefault("schedule", SCHEDULE)
    return StreamingDataset([Stream(str(root / n), name=n) for n in names], **kw)


def records(items: list[Any]) -> list[dict[str, Any]]:
    """Items (records, or batches) as records."""
    if items and isinstance(items[0], dict) and hasattr(items[0]["id"], "tolist"):
        return [
            {"id": i, "tok": t, "src": s, "__stream__": k}
            for b in items
            for i, t, s, k in zip(
                b["id"].tolist(), b["tok"].tolist(), b["src"], b["__stream__"].tolist()
            )
        ]
    return items


def check_records(got: list[dict[str, Any]]) -> None:
    """Every record whole: each column as the source row of its id holds it."""
    names = ["a", "b", "c"]
    for r in got:
        i = int(r["id"])
        assert list(r["tok"]) == [i, i + 1] and r["src"] == stream_of(i)
        assert r["__stream__"] in (stream_of(i), names.index(stream_of(i)))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("batch_size", [None, 3])
def test_phases_are_delivered_in_order(root: Path, workers: int, batch_size: int | None) -> None:
    for rank in range(2):
        ds = phased(root, num_replicas=2, rank=rank, batch_size=batch_size)
        for epoch in range(2):
            ds.set_epoch(epoch)
            got = records(list(DataLoader(ds, batch_size=None, num_workers=workers)))
            check_records(got)
            assert len(ds) * (batch_size or 1) == len(got) == 45
            streams = [stream_of(r["id"]) for r in got]
            # a rank's first 60 // 2 records are phase 1 (a and b by their weights), the
            # last 15 phase 2 (c only)
            assert Counter(streams[:30]) == Counter({"a": 15, "b": 15})
            assert set(streams[30:]) == {"c"}


def test_phase_2_continues_each_stream_where_phase_1_left_it(root: Path) -> None:
    # a in both phases: its records never repeat within its first pass (100 records)
    ds = phased(root, num_replicas=1, rank=0, schedule=[(40, {"a": 1}), (40, {"a": 1, "b": 1})])
    got = records(list(ds))
    check_records(got)
    a = [r["id"] for r in got if stream_of(r["id"]) == "a"]
    assert len(a) == 60 and len(set(a)) == 60


@pytest.mark.parametrize("consumed", [2, 9, 10, 11, 14])
def test_resume_with_workers_across_the_phase_boundary(root: Path, consumed: int) -> None:
    def make() -> StreamingDataset:
        ds = phased(root, num_replicas=2, rank=1, batch_size=3)
        ds.set_epoch(1)
        return ds

    full = ids_of(list(DataLoader(make(), batch_size=None, num_workers=2)))
    ds = make()
    head = take(DataLoader(ds, batch_size=None, num_workers=2), consumed)
    state = json.loads(json.dumps(ds.consumed_state(consumed, 2)))
    again = make()
    again.load_state_dict(state)
    rest = list(DataLoader(again, batch_size=None, num_workers=2))
    assert ids_of(head) + ids_of(rest) == full
    check_records(records(rest))


def test_a_state_saved_before_phase_cut_resumes_in_its_own_layout(root: Path) -> None:
    """States saved before "phase_cut" cut each phase among the workers on its own; loaded
    now, such a state resumes as one of another layout (elastic): the rest is exactly what
    that layout's loader had not delivered, though today's layout differs."""
    schedule = [(10, {"a": 1}), (10, {"b": 1}), (10, {"a": 1})]

    def make() -> StreamingDataset:
        ds = phased(root, num_replicas=1, rank=0, batch_size=3, schedule=schedule)
        ds.set_epoch(1)
        return ds

    by_position = ids_of(list(make()))  # no workers: the rank's positions in order

    def rest_after(consumed: int, cumulative: bool) -> Counter[int]:
        mine = phased_streams((10, 20, 30), 1, 2, 3, cumulative)[0]
        queues = [[x for *_, a, b in segs for x in range(a, b)] for segs in mine]
        skips, _ = resume_point([-(-len(q) // 3) for q in queues], consumed)
        head = [x for q, k in zip(queues, skips) for x in q[: 3 * k]]
        return Counter(by_position) - Counter(by_position[x] for x in head)

    consumed = 5  # 15 records: worker 0 took 9 of them, [0, 6) and [10, 13) as saved
    assert rest_after(consumed, False) != rest_after(consumed, True)
    for legacy in (True, False):
        ds = make()
        head = take(DataLoader(ds, batch_size=None, num_workers=2), consumed)
        assert Counter(ids_of(head)) == Counter(by_position) - rest_after(consumed, True)
        state = json.loads(json.dumps(ds.consumed_state(consumed, 2)))
        assert state.pop("phase_cut") == 2
        if not legacy:
            state["phase_cut"] = 2
        again = make()
        again.load_state_dict(state)
        rest = list(DataLoader(again, batch_size=None, num_workers=2))
        check_records(records(rest))
        assert Counter(ids_of(rest)) == rest_after(consumed, not legacy)


@pytest.mark.parametrize(("old", "new"), [((3, 0), (2, 2)), ((2, 2), (3, 1))])
def test_elastic_resume_cuts_the_rest_phase_by_phase(
    root: Path, old: tuple[int, int], new: tuple[int, int]
) -> None:
    (R, W), (R2, W2) = old, new
    kw = {"drop_last": True, "batch_size": 2}
    consumed = 4  # batches every old rank delivered: 8 of its 20 phase-1 positions
    head: list[int] = []
    state: dict[str, Any] = {}
    for rank in range(R):
        ds = phased(root, num_replicas=R, rank=rank, **kw)
        head += ids_of(take(DataLoader(ds, batch_size=None, num_workers=W), consumed))
        state = ds.consumed_state(consumed, W)
    rest: list[int] = []
    for rank in range(R2):
        ds = phased(root, num_replicas=R2, rank=rank, **kw)
        ds.load_state_dict(state)
        got = records(list(DataLoader(ds, batch_size=None, num_workers=W2)))
        check_records(got)
        streams = [stream_of(r["id"]) for r in got]
        # the rest of phase 1 (a and b) first, then phase 2 (c): each worker reads its
        # part of each phase, so the loader's turns mix them at most at one batch a worker
        first_c = streams.index("c")
        late = [s for s in streams[first_c:] if s != "c"]
        assert len(late) <= 2 * max(1, W2)
        rest += [r["id"] for r in got]
    whole = Counter(
        i for r in range(R) for i in ids_of(list(phased(root, num_replicas=R, rank=r, **kw)))
    )
    epoch = Counter(head + rest)
    assert not epoch - whole  # nothing the epoch does not hold
    assert sum((whole - epoch).values()) < 2 * R2  # only the last records of each phase's cut
    a = [i for i in head + rest if stream_of(i) == "a"]
    assert len(a) == len(set(a))  # a's first pass: no record twice


def test_refusals_name_the_schedule(root: Path) -> None:
    with pytest.raises(ValueError, match=r"schedule=.* is for mixtures"):
        StreamingDataset(str(root / "a"), schedule=SCHEDULE)
    with pytest.raises(ValueError, match=r"Stream\(weight=...\) of \['a'\] conflicts"):
        StreamingDataset(
            [Stream(str(root / "a"), name="a", weight=2.0), Stream(str(root / "c"), name="c")],
            schedule=[(10, {"a": 1})],
        )
    with pytest.raises(ValueError, match=r"schedule\[1\] weighs streams \['web'\]"):
        phased(root, schedule=[(10, {"a": 1}), (10, {"web": 1})])
    with pytest.raises(ValueError, match="hold 90 items, and epoch_size=100"):
        phased(root, epoch_size=100)


@pytest.mark.parametrize("workers", [0, 2])
def test_new_weights_apply_from_the_next_item(root: Path, workers: int) -> None:
    def mix(weights: dict[str, float] | None = None, **kw: Any) -> StreamingDataset:
        weights = weights or {"a": 5, "b": 3, "c": 2}
        streams = [Stream(str(root / n), weight=w, name=n) for n, w in weights.items()]
        return StreamingDataset(streams, num_replicas=1, rank=0, epoch_size=40, **kw)

    def loader(ds: StreamingDataset) -> DataLoader:
        return DataLoader(ds, batch_size=None, num_workers=workers)

    ds = mix()
    head = take(loader(ds), 10)
    state = json.loads(json.dumps(ds.consumed_state(10, workers)))
    heavier = mix({"a": 1, "b": 1, "c": 8})
    heavier.load_state_dict(state)
    assert len(heavier) == 30  # the epoch's rest, by the new weights from item 11 on
    rest = list(loader(heavier))
    check_records(rest)
    assert Counter(stream_of(r["id"]) for r in rest) == Counter({"a": 3, "b": 3, "c": 24})
    # a state saved in the resumed epoch resumes it exactly
    again = mix({"a": 1, "b": 1, "c": 8})
    again.load_state_dict(state)
    part = take(loader(again), 7)
    later = mix({"a": 1, "b": 1, "c": 8})
    later.load_state_dict(json.loads(json.dumps(again.consumed_state(7, workers))))
    assert ids_of(part) + ids_of(list(loader(later))) == ids_of(rest)
    heavier.set_epoch(1)
    nxt = list(loader(heavier))
    assert Counter(stream_of(r["id"]) for r in nxt) == Counter({"a": 4, "b": 4, "c": 32})
    # no record twice within a pass: a (100 records) is in its first pass; c (7) is read
    # in whole passes, each record as often as any other, give or take the pass under way
    read = ids_of(head) + [r["id"] for r in rest + nxt]
    a = [i for i in read if stream_of(i) == "a"]
    assert len(a) == len(set(a))
    c = Counter(i for i in read if stream_of(i) == "c")
    assert len(c) == 7 and max(c.values()) - min(c.values()) <= 1


def test_a_worker_state_keeps_its_weights_to_the_epoch_end(root: Path) -> None:
    # one DataLoader worker's own state (as StatefulDataLoader restores per worker) knows
    # nothing of the other workers' progress: its epoch ends with the saved schedule
    full = ids_of(list(phased(root, num_replicas=1, rank=0)))
    ds = phased(root, num_replicas=1, rank=0)
    it = iter(ds)
    for _ in range(5):
        next(it)
    state = {**ds.state_dict(), "rank": 0, "worker": 0}
    other = phased(root, num_replicas=1, rank=0, schedule=[(90, {"a": 1, "b": 1, "c": 1})])
    other.load_state_dict(state)
    assert ids_of(list(other)) == full[5:]
    other.set_epoch(1)
    assert Counter(stream_of(i) for i in ids_of(list(other))) == Counter(a=30, b=30, c=30)


def test_stats_give_each_phase_of_the_plan(root: Path) -> None:
    ds = phased(root, num_replicas=2, rank=1)
    assert ds.stats()["phases"] == [
        {"positions": 30, "per_stream": {"a": 15, "b": 15, "c": 0}},
        {"positions": 15, "per_stream": {"a": 0, "b": 0, "c": 15}},
    ]
    fixed = StreamingDataset([Stream(str(root / n), name=n) for n in "ab"], epoch_size=20)
    assert "phases" not in fixed.stats()


def test_an_elastic_state_under_new_weights_ends_its_epoch_with_the_saved_ones(
    root: Path,
) -> None:
    kw: dict[str, Any] = {"drop_last": True}
    head: list[int] = []
    state: dict[str, Any] = {}
    for rank in range(3):
        ds = phased(root, num_replicas=3, rank=rank, **kw)
        head += ids_of(take(ds, 12))
        state = ds.state_dict()
    new = [(90, {"a": 1, "b": 1, "c": 1})]
    rest: list[int] = []
    for rank in range(2):
        ds = phased(root, num_replicas=2, rank=rank, schedule=new, **kw)
        ds.load_state_dict(state)
        rest += ids_of(list(ds))
        ds.set_epoch(1)
        got = Counter(stream_of(i) for i in ids_of(list(ds)))
        assert got == Counter(a=15, b=15, c=15)  # the new weights from the next epoch
    # the rest of epoch 0: the saved phases (c only in the last third), exactly once
    epoch = Counter(stream_of(i) for i in head + rest)
    assert epoch == Counter(a=30, b=30, c=30)
    a = [i for i in head + rest if stream_of(i) == "a"]
    assert len(a) == len(set(a))


def test_new_weights_at_a_checkpoint_over_token_blocks(tmp_path: Path) -> None:
    """With pack, items are blocks: a state under one schedule resumes under another from
    its next batch, each stream's blocks of the pass still once."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from shardstream.loader import Pack

    for name, base in (("web", 1), ("code", 100_000)):
        (tmp_path / name).mkdir()
        docs = [[base + 10 * d + t for t in range(9)] for d in range(120)]  # 10 tokens a doc
        pq.write_table(pa.table({"ids": docs}), tmp_path / name / "p.parquet", row_group_size=30)

    def blocks(schedule: list) -> StreamingDataset:
        streams = [Stream(str(tmp_path / n), name=n) for n in ("web", "code")]
        return StreamingDataset(
            streams, pack=Pack("ids", length=20, eos=0), batch_size=2, schedule=schedule
        )

    ds = blocks([(60, {"web": 1, "code": 1})])
    head = take(ds, 5)
    state = json.loads(json.dumps(ds.state_dict()))
    later = blocks([(40, {"web": 1, "code": 1}), (20, {"code": 1})])
    later.load_state_dict(state)
    rest = list(later)
    assert len(later) == len(rest) == 30 - 5
    tokens = [t for b in head + rest for t in b["ids"].flatten().tolist() if t]
    code = [t for b in rest[-10:] for t in b["ids"].flatten().tolist() if t]
    assert code and all(t >= 100_000 for t in code)  # the last 20 blocks: code only
    web = [t for t in tokens if t < 100_000]
    assert len(web) == len(set(web))  # web's first pass (60 blocks): no token twice
