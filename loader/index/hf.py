"""Hugging Face `datasets` objects as a source: a ``datasets.Dataset`` is read from the
Arrow files it is memory-mapped from (``ds.cache_files``: what ``load_dataset``,
``load_from_disk`` and ``.map`` write), with the Arrow IPC reader. No `datasets` import:
the objects are recognized by their module and class names.

What a Dataset holds only in memory is not in its files, so it is refused by name rather
than read wrong: an in-memory Dataset, an indices mapping (``select``, ``filter``,
``shuffle``, ``train_test_split``), columns renamed or removed after loading, rows added
in memory. The fix in each case is to write the Dataset out (``flatten_indices()``,
``save_to_disk``, ``to_parquet``).
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["check_hf_rows", "hf_files"]

log = logging.getLogger(__name__)

_SAVE = "write it out (ds.save_to_disk(path) or ds.to_parquet(path)) and give that path"


def _is_hf(source: object, *names: str) -> bool:
    t = type(source)
    return t.__module__.split(".")[0] == "datasets" and t.__name__ in names


def hf_files(source: object) -> list[str] | None:
    """The Arrow files a ``datasets.Dataset`` reads from, in row order; None when
    `source` is not a `datasets` object; ValueError naming what cannot be read from the
    files and how to write them."""
    if _is_hf(source, "DatasetDict", "IterableDatasetDict"):
        splits = list(source.keys())  # type: ignore[attr-defined]
        raise ValueError(
            f"a datasets.DatasetDict (splits {splits}): pass one split, e.g. ds[{splits[0]!r}]"
        )
    if _is_hf(source, "IterableDataset"):
        raise ValueError(
            "a streaming datasets.IterableDataset (load_dataset(..., streaming=True)) has no "
            "local files: load it without streaming=True, or give the URLs of its data files "
            "(Parquet) as the source"
        )
    if not _is_hf(source, "Dataset"):
        return None
    ds: Any = source
    if getattr(ds, "_indices", None) is not None:
        raise ValueError(
            "this datasets.Dataset selects rows through an indices mapping (select, filter, "
            "shuffle or train_test_split made it): its files hold all rows. Call "
            "ds = ds.flatten_indices() first (it writes the selected rows), or " + _SAVE
        )
    files = [f["filename"] for f in ds.cache_files]
    if not files:
        raise ValueError(f"an in-memory datasets.Dataset has no files to stream: {_SAVE}")
    if ds.format.get("type") is not None or ds.format.get("format_kwargs"):
        log.warning(
            "datasets.Dataset: its set_format/with_transform (%s) is not applied: shardstream "
            "reads the columns from its files (use StreamingDataset(transform=...))",
            ds.format.get("type"),
        )
    return files


def check_hf_rows(source: Any, columns: list[str], num_records: int) -> None:
    """ValueError when the Dataset's rows or columns are not those of its files (rows
    added, or columns renamed or removed, in memory after loading); columns merely in
    another order are read in the files' order."""
    if num_records != len(source) or set(columns) != set(source.column_names):
        raise ValueError(
            f"this datasets.Dataset has {len(source)} rows and columns "
            f"{list(source.column_names)}, but its files hold {num_records} rows and columns "
            f"{columns}: the difference lives in memory only; " + _SAVE
        )
