"""The index as columns: one Arrow column a field over all shards.

A row a shard: ``url``, ``bytes``, ``version``, ``records``, then the *layout* columns a
reader needs to find the shard's records (what `Shard.details` holds), each null where the
shard has no such entry:

    deferred                  the manifest or list that gave the count (no layout yet)
    row_group_rows/_offsets/_bytes, column_uncompressed_bytes, column_chunk_offsets/_bytes,
    footer_bytes, schema, ipc
                              Parquet and Arrow IPC row groups (record batches)
    stored_rows, selected     a selected index's rows (loader.selection)
    keys, member_ext/_offset/_size, compressed_ends, compression
                              a tar shard's samples and their members' ranges
    partitions, hive_values, extra
                              JSON: Hive values, anything else a format recorded

List columns are flat arrays with per-shard offsets, so a million shards are a few
arrays, a saved index is this table (loader.index.saved), and a shard's layout becomes
Python objects only when `details_at` is asked for it (a reader opening the shard).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..columns.arrays import flags, numbers, one_array
from ..columns.arrow_numpy import arrow_of, arrow_values
from ..formats.tar.members import Keys, Members
from ..shard import Shard
from .urls import base_of, full_url, with_base

__all__ = [
    "LAYOUT",
    "ShardGroups",
    "ShardList",
    "details_at",
    "flags",
    "layout_columns",
    "numbers",
    "one_array",
    "plain",
    "shard_table",
]

_INTS = pa.list_(pa.int64())
# the layout columns and their types; "members" is kept as three columns of one shape
LAYOUT: dict[str, pa.DataType] = {
    "deferred": pa.dictionary(pa.int32(), pa.string()),  # one manifest for many shards
    "row_group_rows": _INTS,
    "row_group_offsets": _INTS,
    "row_group_bytes": _INTS,
    "column_uncompressed_bytes": pa.list_(_INTS),
    "column_chunk_offsets": pa.list_(_INTS),
    "column_chunk_bytes": pa.list_(_INTS),
    "footer_bytes": pa.int64(),
    "schema": pa.int32(),
    "ipc": pa.string(),  # Arrow IPC: "file" or "stream" (an older index: true); "feather1"
    "ipc_schema": _INTS,
    "ipc_footer": _INTS,
    "ipc_dictionaries": pa.list_(_INTS),
    "keys": pa.list_(pa.string()),
    "member_ext": pa.list_(pa.list_(pa.string())),
    "member_offset": pa.list_(_INTS),
    "member_size": pa.list_(_INTS),
    "compressed_ends": _INTS,
    "compression": pa.string(),
    "partitions": pa.string(),
    "hive_values": pa.string(),
    "extra": pa.string(),
    # a selected index's shards (loader.selection): stored rows of each row group, and the
    # storage rows that are records
    "stored_rows": _INTS,
    "selected": _INTS,
}
_JSON = ("partitions", "hive_values")
_MEMBERS = ("member_ext", "member_offset", "member_size")
CORE = pa.schema(
    [("url", pa.string()), ("bytes", pa.int64()), ("version", pa.string()), ("records", pa.int64())]
)


def plain(details: dict[str, Any]) -> dict[str, Any]:
    """Details with array-backed member tables and keys as the lists they stand for
    (for JSON)."""
    return {k: list(v) if isinstance(v, Keys | Members) else v for k, v in details.items()}


def _column_values(details: Sequence[dict[str, Any] | None], name: str) -> list[Any]:
    if name == "keys":
        return [None if d is None or name not in d else list(d[name]) for d in details]
    if name in _MEMBERS:
        k = _MEMBERS.index(name)
        return [
            None
            if d is None or "members" not in d
            else [[m[k] for m in rec] for rec in d["members"]]
            for d in details
        ]
    if name in _JSON:
        return [None if d is None or name not in d else json.dumps(d[name]) for d in details]
    if name == "extra":
        out = []
        for d in details:
            rest = {} if d is None else {k: v for k, v in d.items() if not _known(k)}
            out.append(json.dumps(rest) if rest else None)
        return out
    return [None if d is None else d.get(name) for d in details]


def _known(key: str) -> bool:
    return key in LAYOUT or key == "members"


def layout_columns(details: Sequence[dict[str, Any] | None]) -> dict[str, pa.Array]:
    """The layout columns of shards' details dicts (None: a shard with none), only those
    some shard has."""
    present = {("member_ext" if k == "members" else k) for d in details if d for k in d}
    if any(not _known(k) for d in details if d for k in d):
        present.add("extra")
    tar = _tar_columns(details) if "member_ext" in present else None
    out = {}
    for name, kind in LAYOUT.items():
        if tar is not None and name in tar:
            out[name] = tar[name]
        elif name in present or (name in _MEMBERS and "member_ext" in present):
            out[name] = arrow_values(_column_values(details, name), kind)
    return out


def _tar_columns(details: Sequence[dict[str, Any] | None]) -> dict[str, pa.Array] | None:
    """The ``keys`` and member columns from shards' `Keys` and `Members` tables (a scan's
    arrays) without a Python object a member; None where a shard holds them as lists (a
    JSON index's, names that are not UTF-8): `_column_values` makes those."""
    has = [d is not None and "members" in d for d in details]
    tables = [d["members"] for d, h in zip(details, has) if h and d is not None]
    keys: list[Any] = [d.get("keys") for d, h in zip(details, has) if h and d is not None]
    if not all(isinstance(m, Members) for m in tables) or not all(
        isinstance(k, Keys) for k in keys
    ):
        return None
    records = np.array([len(m) for m in tables], dtype=np.int64)
    counts = np.array([len(m.offset) for m in tables], dtype=np.int64)
    if int(counts.sum()) >= 1 << 31:  # past a list array's int32 offsets
        return None
    mask = pa.array(np.logical_not(has))
    per_shard = np.zeros(len(details), dtype=np.int64)
    per_shard[np.flatnonzero(has)] = records
    outer = pa.array(np.concatenate(([0], np.cumsum(per_shard))), pa.int32())
    starts = np.concatenate(([0], np.cumsum(counts)))
    inner = pa.array(
        np.concatenate([m.first[:-1] + s for m, s in zip(tables, starts.tolist())] + [starts[-1:]]),
        pa.int32(),
    )

    def nested(values: pa.Array, name: str) -> pa.Array:
        rows = pa.ListArray.from_arrays(inner, values, type=LAYOUT[name].value_type)
        return pa.ListArray.from_arrays(outer, rows, type=LAYOUT[name], mask=mask)

    strings = pa.concat_arrays([k.values for k in keys]) if keys else pa.array([], pa.string())

    def flat(values: list[Any]) -> pa.Array:
        return pa.array(np.concatenate(values) if values else np.zeros(0), pa.int64())

    return {  # a shard has a key a record: the keys share the member lists' outer offsets
        "keys": pa.ListArray.from_arrays(outer, strings, type=LAYOUT["keys"], mask=mask),
        "member_ext": nested(
            pa.concat_arrays([m.ext for m in tables]) if tables else pa.array([], pa.string()),
            "member_ext",
        ),
        "member_offset": nested(flat([m.offset for m in tables]), "member_offset"),
        "member_size": nested(flat([m.size for m in tables]), "member_size"),
    }


def shard_table(
    urls: pa.Array,
    sizes: Any,
    versions: pa.Array,
    records: Any,
    layout: dict[str, pa.Array],
    base: str = "",
) -> pa.Table:
    """The index table: the core columns, then the layout columns given; relative URLs
    relative to `base` (loader.index.urls)."""
    columns: dict[str, Any] = {
        "url": urls,
        "bytes": arrow_of(np.asarray(sizes, dtype=np.int64)),
        "version": versions,
        "records": arrow_of(np.asarray(records, dtype=np.int64)),
    }
    columns.update({k: layout[k] for k in LAYOUT if k in layout})
    table = pa.table(columns)
    if not all(c.num_chunks <= 1 for c in table.columns):
        table = table.combine_chunks()
    return with_base(table, base) if base else table


def details_at(columns: dict[str, pa.Array], i: int) -> dict[str, Any]:
    """Shard i's details dict, as the formats read it, from the layout columns."""
    out: dict[str, Any] = {}
    for name, col in columns.items():
        value = col[i]
        if not value.is_valid or name in _MEMBERS[1:]:
            continue
        if name == "member_ext":  # views of the columns: no object a member
            out["members"] = Members.of_columns(*(columns[m][i] for m in _MEMBERS))
        elif name == "keys":
            out["keys"] = Keys(value.values)
        elif name == "selected":  # numpy: a shard may select millions of rows
            out[name] = value.values.to_numpy(zero_copy_only=False)
        elif name in _JSON:
            out[name] = json.loads(value.as_py())
        elif name == "extra":
            out.update(json.loads(value.as_py()))
        else:
            out[name] = value.as_py()
    return out


class ShardList(Sequence[Shard]):
    """The shards of an index table as `Shard` objects, made when one is asked for (the
    last VIEWS kept): `index.shards[i]`. Iterating makes one a shard: fine for a few
    thousand, not the way to look at a million (use the index's arrays)."""

    VIEWS = 1024

    def __init__(self, table: pa.Table, format: str) -> None:
        self.format = format
        self._base = base_of(table)
        self._urls = one_array(table.column("url"))
        self._bytes = numbers(table.column("bytes"))
        self._versions = one_array(table.column("version"))
        self._records = numbers(table.column("records"))
        self._layout = {n: one_array(table.column(n)) for n in table.column_names if n in LAYOUT}
        self._views: OrderedDict[int, Shard] = OrderedDict()
        self._lock = threading.Lock()  # reader threads ask for views at once

    def __len__(self) -> int:
        return len(self._records)

    @overload
    def __getitem__(self, i: int) -> Shard: ...

    @overload
    def __getitem__(self, i: slice) -> list[Shard]: ...

    def __getitem__(self, i: int | slice) -> Shard | list[Shard]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        n = len(self)
        k = int(i) + n if int(i) < 0 else int(i)
        if not 0 <= k < n:
            raise IndexError(f"shard {i} of an index of {n} shards")
        with self._lock:
            view = self._views.get(k)
        if view is None:
            view = Shard(
                self.url(k),
                self.format,
                int(self._records[k]),
                int(self._bytes[k]),
                self._versions[k].as_py(),
                details_at(self._layout, k),
            )
            with self._lock:
                self._views[k] = view
                while len(self._views) > self.VIEWS:
                    self._views.popitem(last=False)
        return view

    def __iter__(self) -> Iterator[Shard]:
        for k in range(len(self)):
            yield self[k]

    def extensions(self) -> tuple[set[str], str | None]:
        """Tar: the member extensions of every indexed shard (one pass over the member
        column, no Shard made) and the URL of the first such shard (None: no shard is
        indexed, a manifest's counts only)."""
        col = self._layout.get("member_ext")
        if col is None:
            return set(), None
        has = np.flatnonzero(flags(pc.is_valid(col)) & (self._records > 0))
        if not has.size:
            return set(), None
        found = pc.unique(col.flatten().flatten()).to_pylist()
        return set(found), self.url(int(has[0]))

    def url(self, k: int) -> str:
        """Shard k's full URL (no `Shard` made)."""
        return full_url(self._base, str(self._urls[k].as_py()))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_views", "_lock")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._views, self._lock = OrderedDict(), threading.Lock()

    def __repr__(self) -> str:
        return f"ShardList({len(self)} {self.format} shards)"


class ShardGroups(Sequence[list[int]]):
    """Per shard, the records of each of its read groups (what the sampler's plans cut
    pieces by), computed by `groups_of` when a plan first asks for a shard: a rank of a
    million-shard job touches its own few hundred, never all."""

    KEPT = 1 << 16  # shards whose groups are kept (epochs reshuffle: a rank meets them all)

    def __init__(self, shards: ShardList, groups_of: Callable[[Shard], list[int]]) -> None:
        self.shards, self.groups_of = shards, groups_of
        self._memo: OrderedDict[int, list[int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self.shards)

    def __getitem__(self, s: int) -> list[int]:  # type: ignore[override]
        got = self._memo.get(s)
        if got is None:
            got = self._memo[s] = self.groups_of(self.shards[s])
            while len(self._memo) > self.KEPT:
                self._memo.popitem(last=False)
        return got

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_memo": OrderedDict()}
