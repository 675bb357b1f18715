"""The read options of a dataset, checked (ValueError or TypeError naming the value) before
any storage is touched, and `transform=` applied where the items are made."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from shardstream.sampler.checks import as_int

from .cursor import rows_of
from .read.plan_reader import DEFAULT_MEMORY_BUDGET

__all__ = [
    "budget_args",
    "check_batch_options",
    "check_decode",
    "check_positive",
    "check_transform",
    "column_list",
    "transformed",
]

Transform = Callable[[Any], Any]


def check_positive(name: str, value: object) -> int | None:
    if value is None:
        return None
    return as_int(name, value, 1, what="a positive int or None")


def column_list(columns: object) -> list[str] | None:
    """The asked columns as a list: None for all, one str as one column (not its letters),
    or an iterable of str; TypeError naming any other value."""
    if columns is None:
        return None
    if isinstance(columns, str):
        return [columns]
    if isinstance(columns, bytes | bytearray) or not isinstance(columns, Iterable):
        raise TypeError(
            f"columns must be a column name or a list of names, got {columns!r} "
            f"({type(columns).__name__})"
        )
    names = list(columns)
    bad = [c for c in names if not isinstance(c, str)]
    if bad:
        raise TypeError(
            f"columns must be names (str), got {bad[0]!r} ({type(bad[0]).__name__}) in {names!r}"
        )
    twice = sorted({c for c in names if names.count(c) > 1})
    if twice:
        raise ValueError(f"columns names {twice} more than once: {names!r}; name each column once")
    return names


def check_batch_options(
    batch_size: int | None, fill_nulls: object, pad: object, batch_format: str = "torch"
) -> None:
    """`fill_nulls` and `pad` shape batches' tensors: without `batch_size` (records, which
    carry None and lists as they are) or in batches of another `batch_format` than torch
    (which carry them as Arrow does) they would do nothing, so they are refused."""
    given = [name for name, value in (("fill_nulls", fill_nulls), ("pad", pad)) if value]
    if given and batch_format != "torch":
        raise ValueError(
            f"{' and '.join(given)} shape the tensors of torch batches; "
            f"batch_format={batch_format!r} batches carry nulls and ragged lists as Arrow "
            "does: leave them out"
        )
    if batch_size is None and given:
        raise ValueError(
            f"{' and '.join(given)} shape the tensors of batches (batch_size=B); records "
            "carry nulls as None and lists as they are. Pass batch_size, or leave them out"
        )


def check_decode(decode: object, allow_pickle: bool, formats: Sequence[str | None]) -> None:
    """`decode` and `allow_pickle` decode tar members (webdataset's decoders): ValueError
    when one is given and no source is tar (they would do nothing to Parquet or Arrow
    columns, of image bytes or any other)."""
    if "tar" in formats:
        return
    kinds = sorted({f or "parquet" for f in formats})
    if allow_pickle:
        raise ValueError(
            f"allow_pickle=True lets tar shards' pickled members unpickle; these shards are "
            f"{', '.join(kinds)}, which hold no pickles: leave it out"
        )
    if decode is False or decode is None:
        return
    raise ValueError(
        f"decode={decode!r} decodes tar shards' members (webdataset's decoders: images by "
        f"extension, .json, .npy, ...); these shards are {', '.join(kinds)}, whose columns "
        "come as stored (image bytes as bytes, a datasets Image as a dict of bytes and path). "
        "Decode in transform= instead, e.g. PIL.Image.open(io.BytesIO(record['image']))"
    )


def budget_args(memory_budget: object, prefetch: object) -> tuple[int, int | None]:
    """(memory budget in bytes, the deprecated prefetch or None), checked."""
    if prefetch is not None:
        prefetch = as_int("prefetch", prefetch, 0, what="an int >= 0 (blocks read ahead)")
        warnings.warn(
            "StreamingDataset(prefetch=...) is deprecated and will be removed in the next "
            "release: pass memory_budget (bytes of decoded data held plus read ahead)",
            DeprecationWarning,
            stacklevel=3,
        )
    if memory_budget is None:
        return DEFAULT_MEMORY_BUDGET, prefetch if isinstance(prefetch, int) else None
    memory_budget = as_int("memory_budget", memory_budget, 0, what="an int >= 0 (bytes)")
    if prefetch is not None:
        raise ValueError("pass memory_budget or the deprecated prefetch, not both")
    return memory_budget, None


def check_transform(transform: object) -> Transform | None:
    """`transform` as given: None or a callable (TypeError naming anything else)."""
    if transform is not None and not callable(transform):
        raise TypeError(
            f"transform must be a function of a record (or of a batch, with batch_size), "
            f"got {transform!r} ({type(transform).__name__})"
        )
    return transform


def _checked(transform: Transform, items: Iterable[Any], batches: bool) -> Iterator[Any]:
    for item in items:
        out = transform(item)
        if out is None:
            raise TypeError(
                "transform= returned None: it must return the new record (or batch); each "
                "item yields one (the record counts of every rank stay equal)"
            )
        if batches:
            rows, got = rows_of(item), rows_of(out)
            if got is not None and got != rows:
                raise ValueError(
                    f"transform= turned a batch of {rows} rows into one of {got}: a transform "
                    "keeps each batch's rows (len(dataset), resume positions and the equal "
                    "batch counts of every rank count rows in, one out for one in). Drop or "
                    "add rows after the DataLoader, in the training step"
                )
        yield out


def transformed(
    deliveries: Iterator[Any], transform: Transform | None, batches: bool = False
) -> Iterator[Any]:
    """Each delivery (a list of records, a list of one batch, or a generator of records)
    with `transform` applied to each item, keeping its shape (a list stays a list, so the
    dataset's position stays exact); the deliveries as they are without a transform. With
    `batches`, a transform that changes a batch's row count is a ValueError."""
    if transform is None:
        return deliveries
    return (
        list(_checked(transform, items, batches))
        if isinstance(items, list)
        else _checked(transform, items, batches)
        for items in deliveries
    )
