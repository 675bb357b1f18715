"""`Stream`: one source of a mixture, as users name it (loader.mixture reads them), and the
checks that a mixture's streams agree (names, formats, column kinds)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .columns.kinds import Kind, kinds_of

# a mixture's phases: (items of the epoch across ranks, weights by stream name), in order
Schedule = Sequence[tuple[int, Mapping[str, float] | Sequence[float]]]

__all__ = [
    "Schedule",
    "Stream",
    "check_formats",
    "check_kinds",
    "check_stream_column",
    "is_mixture",
    "stream_name",
]


@dataclass(frozen=True)
class Stream:
    """One source of a mixture: anything a single dataset takes as `source`, its weight
    (default: its record count, i.e. natural proportions), its name (default: the source
    string; names are unique, and seed the stream's shuffles) and its own storage options
    (default: the dataset's), so two streams may live in two buckets or endpoints.
    `cache_dir` and `cache_limit` (default: the dataset's) give the stream its own node
    cache folder and bound (loader.cache.node). `filter` and `split` select the stream's
    records as StreamingDataset's do for one source (with the dataset's seed)."""

    source: Any
    weight: float | None = None
    name: str | None = None
    storage_options: dict[str, Any] | None = None
    cache_dir: Any = None
    cache_limit: int | str | None = None
    filter: Any = None  # a pyarrow.compute.Expression: the stream's records that pass it
    split: tuple[float, float] | None = None  # a seeded fraction of them (loader.selection)

    def __post_init__(self) -> None:
        from .selection import check_filter, check_split  # (it imports the index: later)

        check_filter(self.filter)
        check_split(self.split)


def is_mixture(source: Any) -> bool:
    """Whether a dataset source is a list of Streams."""
    return (
        isinstance(source, list | tuple)
        and len(source) > 0
        and all(isinstance(s, Stream) for s in source)
    )


def stream_name(stream: Stream, k: int) -> str:
    """The name of the k-th stream: its `name`, else its source's path, else "stream{k}"."""
    if stream.name is not None:
        return stream.name
    if isinstance(stream.source, str | os.PathLike):
        return os.fspath(stream.source)
    return f"stream{k}"


def check_formats(
    names: Sequence[str], formats: Sequence[str | None], batch_size: int | None
) -> None:
    """ValueError if streams of different shapes (tar samples, columns) are to form batches."""
    by_name = dict(zip(names, formats))
    shapes = {"tar" if f == "tar" else "columns" for f in formats}
    if batch_size is not None and len(shapes) > 1:
        raise ValueError(
            f"streams of different formats {by_name} cannot form batches: their records "
            "have different shapes; use record mode (batch_size=None) or one format"
        )


def check_stream_column(names: Sequence[str], schemas: Sequence[Any], column: str) -> None:
    """ValueError naming a stream whose data has a column named `column` (the name a
    mixture gives the stream each row came from)."""
    for name, schema in zip(names, schemas):
        if schema is not None and column in schema.names:
            raise ValueError(
                f"stream {name!r}: its data has a column named {column!r}, the name a "
                "mixture gives the stream each row came from; rename that column, or "
                "leave it out with columns=[...]"
            )


def check_kinds(
    names: Sequence[str],
    schemas: Sequence[Any],
    fill_nulls: Mapping[str, Any] | None,
    pad: Mapping[str, Any],
) -> list[dict[str, Kind] | None]:
    """Per stream, its columns' kinds (batch mode; None for tar streams); ValueError naming
    a column whose kind differs between two streams, or a stream with other columns."""
    if schemas[0] is None:
        return [None] * len(schemas)
    kinds = [kinds_of(s, fill_nulls, pad) if s is not None else {} for s in schemas]
    first = kinds[0]
    for name, other in zip(names[1:], kinds[1:]):
        if list(other) != list(first):
            raise ValueError(
                f"stream {name!r} has columns {list(other)}, stream {names[0]!r} "
                f"{list(first)}: batches need the same columns in every stream "
                "(pass columns=[...])"
            )
        for col, kind in other.items():
            a, b = first[col], kind
            if (a.tensor, a.value, a.shape) != (b.tensor, b.value, b.shape):
                raise ValueError(
                    f"column {col!r} is {_kind_text(a)} in stream {names[0]!r} but "
                    f"{_kind_text(b)} in stream {name!r}; a batch column has one kind"
                )
    return list(kinds)


def _kind_text(kind: Kind) -> str:
    if not kind.tensor:
        return "a list"
    shape = "(n, L)" if kind.shape is None else f"(n, {', '.join(map(str, kind.shape))})"
    return f"a {kind.value} tensor {shape}".replace("(n, )", "(n,)")
