"""Records in memory (an iterable of dicts, a pyarrow Table, a pandas DataFrame) spilled
to Arrow IPC files under ``DEST/_input/``, so the writer's processes each read their own
share (an iterable cannot be split among processes) and memory holds one batch at a time.
``_input/_done`` marks a finished spill: a resumed write reads it again, not the iterable
(which may not be replayable)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from typing import Any

import pyarrow as pa

from shardstream.loader.storage.filesystems import filesystem, is_local

__all__ = ["SPILL_DIR", "SPILL_ROWS", "finished_spill", "spill"]

log = logging.getLogger(__name__)

SPILL_DIR = "_input"
SPILL_ROWS = 8192  # rows a record batch: the spill's read group
_FILE_ROWS = 4_000_000  # rows a spill file


def _batches(source: Any) -> Iterator[pa.Table]:
    """`source` as tables of up to SPILL_ROWS rows, of the first's schema."""
    if type(source).__name__ == "DataFrame":
        source = pa.Table.from_pandas(source, preserve_index=False)
    if isinstance(source, pa.RecordBatch):
        source = pa.Table.from_batches([source])
    if isinstance(source, pa.Table):
        for batch in source.to_batches(SPILL_ROWS):
            yield pa.Table.from_batches([batch])
        return
    schema: pa.Schema | None = None
    rows: list[dict[str, Any]] = []
    done = 0

    def table() -> pa.Table:
        try:
            return pa.Table.from_pylist(rows, schema=schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as e:
            raise ValueError(
                f"records {done}-{done + len(rows) - 1} of the iterable do not fit the types "
                f"of its first {SPILL_ROWS} records ({schema}): {e}. Give dicts of one "
                "schema, or a pyarrow.Table with the schema you want"
            ) from e

    for row in source:
        if not isinstance(row, dict):
            raise ValueError(
                f"record {done + len(rows)} of the iterable is a {type(row).__name__}, not a "
                "dict (column -> value)"
            )
        rows.append(row)
        if len(rows) == SPILL_ROWS:
            out = table()
            schema = out.schema
            yield out
            done += len(rows)
            rows = []
    if rows or schema is None:
        yield table()


def finished_spill(dest: str, storage_options: dict[str, Any] | None) -> list[str] | None:
    """The spill files of a finished spill under `dest`, or None."""
    fs, path = filesystem(f"{dest}/{SPILL_DIR}/_done", storage_options)
    try:
        with fs.open(path, "r") as f:
            names = json.load(f)["files"]
    except FileNotFoundError:
        return None
    return [f"{dest}/{SPILL_DIR}/{n}" for n in names]


def spill(source: Iterable[Any], dest: str, storage_options: dict[str, Any] | None) -> list[str]:
    """Write `source` to Arrow IPC files under DEST/_input/ (their URLs, in order)."""
    names: list[str] = []
    fs, _ = filesystem(dest, storage_options)
    with ExitStack() as files:
        writer: pa.ipc.RecordBatchFileWriter | None = None
        rows = 0
        for table in _batches(source):
            if writer is None or rows >= _FILE_ROWS:
                files.close()  # the file before (its footer, then the file)
                names.append(f"part-{len(names):05d}.arrow")
                _, path = filesystem(f"{dest}/{SPILL_DIR}/{names[-1]}", storage_options)
                if is_local(fs):
                    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
                sink = files.enter_context(fs.open(path, "wb"))
                writer = files.enter_context(pa.ipc.new_file(sink, table.schema))
                rows = 0
            writer.write_table(table, max_chunksize=SPILL_ROWS)
            rows += table.num_rows
    _, done = filesystem(f"{dest}/{SPILL_DIR}/_done", storage_options)
    with fs.open(done, "w") as f:
        json.dump({"files": names}, f)
    log.info("spilled the records to %d Arrow file(s) under %s/%s", len(names), dest, SPILL_DIR)
    return [f"{dest}/{SPILL_DIR}/{n}" for n in names]
