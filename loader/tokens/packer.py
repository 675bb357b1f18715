"""Documents to blocks: a run's documents laid end to end with separators, cut every
`length` tokens, with each token's place in its document and its document's number.

numpy does the work a part (~1,024 documents) at a time: one flatten of the Arrow list
column, one scatter of the values between the separators, one cut into rows; what is left
over (less than a block) waits for the next part. Nothing is kept across runs or epochs:
a run starts at a block boundary, located in the index's token counts (sampler.packing).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import torch

from sampler.packing import PackRun

from ..errors import ShardError, StaleIndexError
from .pack import Pack

__all__ = ["DOCUMENTS", "POSITIONS", "Blocks", "items", "lay_out", "pack_run"]

POSITIONS = "position_ids"
DOCUMENTS = "document_ids"
I64 = npt.NDArray[np.int64]
# (k, length) each: tokens, place in the document, the document's number in the run
Blocks = tuple[I64, I64, I64]


def lay_out(docs: pa.Array | pa.ChunkedArray, pack: Pack) -> tuple[I64, I64, I64]:
    """(tokens, positions, document) of every place of `docs` laid end to end: `bos`,
    the tokens, `eos` for each non-empty document; `document` numbers the documents of
    `docs` from 0. ShardError for a null token inside a document."""
    if isinstance(docs, pa.ChunkedArray):
        docs = docs.combine_chunks() if docs.num_chunks != 1 else docs.chunk(0)
    lengths = np.asarray(pc.fill_null(pc.list_value_length(docs), 0).to_numpy(), np.int64)
    values = docs.flatten()
    if values.null_count:
        raise ShardError(f"Pack column {pack.column!r} holds {values.null_count} null token(s)")
    vals = np.asarray(values.to_numpy(zero_copy_only=False))
    places = pack.places(lengths)
    ends = np.cumsum(places)
    starts = ends - places
    if pack.separators == 0:
        tokens = vals.astype(np.int64)
    else:
        tokens = np.empty(int(ends[-1]) if ends.size else 0, dtype=np.int64)
        full = lengths > 0
        first = int(pack.bos is not None)
        if pack.bos is not None:
            tokens[starts[full]] = pack.bos
        if pack.eos is not None:
            tokens[ends[full] - 1] = pack.eos
        # each value's place: its index plus what comes before it that is not a value
        shift = np.repeat(starts + first - (np.cumsum(lengths) - lengths), lengths)
        tokens[np.arange(vals.size) + shift] = vals
    which = np.repeat(np.arange(lengths.size, dtype=np.int64), places)  # each place's row
    positions = np.arange(tokens.size, dtype=np.int64) - starts[which]
    # documents numbered from 0, the empty ones (no places) left out
    document = (np.cumsum(places > 0) - 1)[which]
    return tokens, positions, document


def pack_run(
    parts: Iterable[dict[str, Any]], pack: Pack, run: PackRun, where: str
) -> Iterator[Blocks]:
    """The blocks of `run` from its documents (`parts`: the reader's parts, in order,
    each with the pack column as an Arrow list array), a few blocks at a time.

    The run must come out exactly as the index's token counts say: `run.blocks` blocks
    and `run.rest` places after them; anything else is a StaleIndexError naming `where`
    (the counts were made from other bytes than these)."""
    length = pack.length
    held: list[tuple[I64, I64, I64]] = []
    count = 0  # places held
    skip = run.skip
    made = 0
    documents = 0
    for part in parts:
        docs = part[pack.column]
        try:
            tokens, positions, document = lay_out(docs, pack)
        except ShardError as e:
            raise ShardError(f"{where}: {e}") from e
        document += documents
        documents = int(document[-1]) + 1 if document.size else documents
        if skip:
            k = min(skip, tokens.size)
            tokens, positions, document = tokens[k:], positions[k:], document[k:]
            skip -= k
        if not tokens.size:
            continue
        held.append((tokens, positions, document))
        count += tokens.size
        k = min(count // length, run.blocks - made)
        if k <= 0:
            continue
        joined = [
            np.concatenate([h[i] for h in held]) if len(held) > 1 else held[0][i] for i in range(3)
        ]
        cut = k * length
        yield tuple(a[:cut].reshape(k, length) for a in joined)  # type: ignore[misc]
        made += k
        held = [(joined[0][cut:], joined[1][cut:], joined[2][cut:])]
        count -= cut
    if made != run.blocks or count != run.rest or skip:
        raise StaleIndexError(
            f"{where}: the documents read make {made} blocks and {count} tokens more, the "
            f"index's token counts {run.blocks} blocks and {run.rest} more: the counts were "
            "made from other data; rebuild the index (and its token counts)"
        )


def _block_dict(column: str, tokens: I64, positions: I64, document: I64) -> dict[str, Any]:
    """One block or a batch of them: document numbers count from 0 in each block."""
    first = document[..., :1]
    return {
        column: torch.from_numpy(tokens),
        POSITIONS: torch.from_numpy(positions),
        DOCUMENTS: torch.from_numpy(document - first),
    }


def items(
    chunks: Iterable[Blocks], column: str, batch_size: int | None
) -> Iterator[list[dict[str, Any]]]:
    """The blocks as items, a list of them per chunk: one block a dict of 1-D tensors,
    or (with `batch_size`) batches of that many blocks as 2-D tensors, the last one
    short when the blocks run out."""
    if batch_size is None:
        for tokens, positions, document in chunks:
            yield [
                _block_dict(column, tokens[i].copy(), positions[i].copy(), document[i].copy())
                for i in range(tokens.shape[0])
            ]
        return
    held: list[Blocks] = []
    rows = 0
    for chunk in chunks:
        held.append(chunk)
        rows += chunk[0].shape[0]
        if rows < batch_size:
            continue
        joined = [np.concatenate([h[i] for h in held]) for i in range(3)]
        whole = rows - rows % batch_size
        # a batch of its own memory (a copy, unless it is the whole chunk): a batch the
        # training loop keeps pins its own blocks, not the chunk's
        own = whole < rows or whole > batch_size
        yield [
            _block_dict(column, *(a[lo : lo + batch_size].copy() if own else a for a in joined))
            for lo in range(0, whole, batch_size)
        ]
        held = [tuple(a[whole:] for a in joined)] if whole < rows else []  # type: ignore[list-item]
        rows -= whole
    if rows:
        joined = [np.concatenate([h[i] for h in held]) for i in range(3)]
        yield [_block_dict(column, *joined)]
