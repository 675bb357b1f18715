"""A row of a batch is one record, in every mode (DESIGN.md, "How a record travels").

Hypothesis draws the whole matrix: one source or a mixture of 1-4 streams; Parquet,
Arrow IPC or tar (webdataset's TarWriter), tar fields decoded or raw; record or batch mode,
batches as torch, numpy, Arrow or pandas; a filter and a split selecting the records; 0, 1
or 2 DataLoader workers; shuffle on or off; ranks; a resume mid-epoch. Every column of the data
carries the row's id (tests/rowdata.py), and every yielded row is compared, column by
column, with the record pyarrow.dataset or webdataset reads for that id: a row whose
columns came from two records, or whose `__stream__` is another stream's, fails.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from shardstream.loader import Stream, StreamingDataset
from tests import rowdata
from tests.helpers import take

SIZES = [[37, 0, 52, 11], [23, 40], [64], [9, 17, 5]]  # records of each stream's shards
COLUMNS = list(rowdata.SCHEMA.names)


class Data(dict[str, Any]):
    def __repr__(self) -> str:  # hypothesis prints the arguments of a failing case
        return "<rowdata>"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("rows")
    out = Data(parquet=[], arrow=[], tar=[])
    for s, sizes in enumerate(SIZES):
        rowdata.write_parquet(root / f"pq{s}", s, sizes, row_group_size=8)
        rowdata.write_arrow(root / f"arrow{s}", s, sizes, batch_rows=8)
        rowdata.write_tar(root / f"tar{s}", s, sizes)
        out["parquet"].append(root / f"pq{s}")
        out["arrow"].append(root / f"arrow{s}")
        out["tar"].append(root / f"tar{s}")
    SOURCE.update(parquet=out["parquet"][0], arrow=out["arrow"][0], tar=out["tar"][0])
    out["expected"] = {}
    for s in range(len(SIZES)):
        for fmt, folder in (("parquet", "pq"), ("arrow", "arrow")):
            out["expected"][(fmt, False)] = {
                **out["expected"].get((fmt, False), {}),
                **rowdata.columns_expected(root / f"{folder}{s}", fmt),
            }
        for decode in (False, True):
            out["expected"][("tar", decode)] = {
                **out["expected"].get(("tar", decode), {}),
                **rowdata.tar_expected(root / f"tar{s}", decode),
            }
    return out


@st.composite
def cases(draw: st.DrawFn) -> dict[str, Any]:
    fmt = draw(st.sampled_from(["parquet", "arrow", "tar"]))
    streams = draw(st.integers(0, 4))  # 0: one source, not a mixture
    replicas = draw(st.integers(1, 2))
    case = {
        "fmt": fmt,
        "streams": streams,
        "batch_size": draw(st.one_of(st.none(), st.integers(1, 13))),
        "workers": draw(st.integers(0, 2)),
        "shuffle": draw(st.booleans()),
        "seed": draw(st.integers(0, 3)),
        "num_replicas": replicas,
        "rank": draw(st.integers(0, replicas - 1)),
        "decode": fmt == "tar" and draw(st.booleans()),
        "resume": draw(st.floats(0, 1)),
        "columns": None,
        "batch_format": "torch",
        "above": None,  # filter: ids above this
        "split": None,
    }
    if case["batch_size"] is not None and not streams:
        case["batch_format"] = draw(st.sampled_from(["torch", "numpy", "arrow", "pandas"]))
    if fmt != "tar" and not streams:
        case["above"] = draw(st.one_of(st.none(), st.integers(0, 70)))
        case["split"] = draw(st.sampled_from([None, (0.0, 0.7), (0.7, 1.0)]))
    if fmt != "tar" and draw(st.booleans()):
        rest = draw(st.lists(st.sampled_from(COLUMNS[1:]), min_size=1, unique=True))
        case["columns"] = ["id", *rest]
    if streams:
        case["weights"] = draw(st.lists(st.floats(0.1, 1), min_size=streams, max_size=streams))
        case["epoch_size"] = draw(st.integers(2 * replicas, 160))
    return case


def make(data: dict[str, Any], case: dict[str, Any]) -> StreamingDataset:
    dirs = data[case["fmt"]]
    kwargs: dict[str, Any] = {
        "batch_size": case["batch_size"],
        "shuffle": case["shuffle"],
        "seed": case["seed"],
        "num_replicas": case["num_replicas"],
        "rank": case["rank"],
        "columns": case["columns"],
    }
    if case["batch_format"] != "torch":
        kwargs["batch_format"] = case["batch_format"]
    if case["above"] is not None:
        kwargs["filter"] = pc.field("id") > case["above"]
    if case["split"] is not None:
        kwargs["split"] = case["split"]
    if case["fmt"] != "tar" and case["batch_size"] is not None and case["batch_format"] == "torch":
        read = case["columns"] or COLUMNS
        if "ragged" in read:
            kwargs["pad"] = {"ragged": rowdata.PAD}
        if "maybe" in read:
            kwargs["fill_nulls"] = {"maybe": rowdata.FILL}
    elif case["fmt"] == "tar":
        kwargs["decode"] = case["decode"]
    if not case["streams"]:
        return StreamingDataset(str(dirs[0]), **kwargs)
    streams = [Stream(str(dirs[s]), weight=w, name=f"s{s}") for s, w in enumerate(case["weights"])]
    return StreamingDataset(streams, epoch_size=case["epoch_size"], **kwargs)


def keep(batch: Any) -> Any:
    """A DataLoader's collate_fn that hands batches on as the dataset made them (torch's
    default turns numeric numpy arrays into tensors and refuses datetime64 ones)."""
    return batch


def read(ds: StreamingDataset, workers: int) -> list[Any]:
    if workers == 0:
        return list(ds)
    if getattr(ds, "batch_format", "torch") != "torch":  # numpy, Arrow, pandas: as they are
        return list(DataLoader(ds, batch_size=None, num_workers=workers, collate_fn=keep))
    return list(DataLoader(ds, batch_size=None, num_workers=workers))


def check_rows(data: dict[str, Any], case: dict[str, Any], items: list[Any]) -> list[dict]:
    """Every row of the items is the record its id names, whole; returns the rows."""
    batch = case["batch_size"] is not None
    expected = data["expected"][(case["fmt"], case["decode"])]
    if case["batch_format"] != "torch":  # as pyarrow gives the rows of such a batch
        items = [as_arrow(item, case["batch_format"]) for item in items]
        batch = False  # (a record a row, as Arrow's to_pylist gives them)
        items = [row for item in items for row in item.to_pylist()]
    rows = [row for item in items for row in rowdata.rows_of(item, batch)]
    for row in rows:
        rid = rowdata.row_id(row)
        want = dict(expected[rid])
        if case["streams"]:
            stream = rid // rowdata.STRIDE
            assert row.pop("__stream__") == (stream if batch else f"s{stream}"), row
        if case["fmt"] != "tar":
            if case["columns"] is not None:
                want = {c: want[c] for c in case["columns"]}
            if batch:
                want = rowdata.batch_view(want)
            if case["above"] is not None:
                assert rid > case["above"], f"row {rid} does not pass the filter"
        else:
            url = row.pop("__url__")
            assert os.path.basename(url) == os.path.basename(want.pop("__url__")), (url, rid)
        assert rowdata.same(row, want), f"row {row} is not record {want}"
    return rows


def as_arrow(item: Any, batch_format: str) -> pa.RecordBatch:
    """A numpy, pandas or Arrow batch as the RecordBatch pyarrow makes of it."""
    if batch_format == "arrow":
        assert isinstance(item, pa.RecordBatch), type(item)
        return item
    known = rowdata.SCHEMA.names  # (tar samples' fields: as pyarrow infers them)
    if batch_format == "pandas":
        columns = {c: item[c] for c in item.columns}
    else:
        assert all(isinstance(v, np.ndarray) for v in item.values()), item
        columns = dict(item)
    arrays = [
        pa.array(v, rowdata.SCHEMA.field(c).type if c in known else None, from_pandas=True)
        for c, v in columns.items()
    ]
    return pa.RecordBatch.from_arrays(arrays, names=list(columns))


def selected(case: dict[str, Any]) -> int:
    """Records the case's filter and split select of the one source."""
    if case["split"] is not None:
        probe = StreamingDataset(
            str(SOURCE[case["fmt"]]), seed=case["seed"], split=case["split"], **filter_of(case)
        )
        return probe.sampler.num_records
    return sum(1 for i in range(sum(SIZES[0])) if case["above"] is None or i > case["above"])


def filter_of(case: dict[str, Any]) -> dict[str, Any]:
    return {} if case["above"] is None else {"filter": pc.field("id") > case["above"]}


SOURCE: dict[str, Any] = {}


def expected_count(data: dict[str, Any], case: dict[str, Any]) -> int:
    """Records one rank yields in an epoch."""
    replicas = case["num_replicas"]
    if case["streams"]:
        return int(case["epoch_size"]) // replicas
    return -(-selected(case) // replicas)


@settings(
    max_examples=int(os.environ.get("ROWS_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(case=cases())
def test_a_row_is_one_record(data: dict[str, Any], case: dict[str, Any]) -> None:
    ds = make(data, case)
    items = read(ds, case["workers"])
    rows = check_rows(data, case, items)
    assert len(rows) == expected_count(data, case)
    assert len(items) == len(ds)
    if not case["streams"] and case["num_replicas"] == 1:
        ids = sorted(rowdata.row_id(r) for r in rows)
        if case["split"] is None:  # each record once: all of them, or those passing
            above = -1 if case["above"] is None else case["above"]
            assert ids == [i for i in range(sum(SIZES[0])) if i > above]
        else:
            assert len(set(ids)) == len(ids)

    # resume mid-epoch: the rest of the epoch, whole records, in the same order
    k = round(case["resume"] * len(items))
    first = make(data, case)
    if case["workers"] == 0:
        head = take(first, k)
        state = first.state_dict()
    else:
        head, state = items[:k], first.consumed_state(k, case["workers"])
    second = make(data, case)
    second.load_state_dict(state)
    resumed = check_rows(data, case, head) + check_rows(data, case, read(second, case["workers"]))
    assert len(resumed) == len(rows)
    assert all(rowdata.same(a, b) for a, b in zip(resumed, rows))


def test_mixture_batches_pair_columns_of_one_record(data: dict[str, Any]) -> None:
    """The case found by hand: two Parquet streams in batch mode, numbers and strings."""
    streams = [Stream(str(data["parquet"][s]), weight=w) for s, w in ((0, 0.8), (1, 0.2))]
    ds = StreamingDataset(streams, epoch_size=100, batch_size=16, columns=["id", "id_str"])
    rows = [r for b in ds for r in rowdata.rows_of(b, True)]
    assert len(rows) == 100
    mixed = [r for r in rows if r["id_str"] != f"r{r['id']}"]
    assert not mixed, f"{len(mixed)} of {len(rows)} rows mix two records, e.g. {mixed[:2]}"
