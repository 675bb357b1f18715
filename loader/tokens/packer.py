"""Documents to blocks: a run's documents laid end to end with separators, cut every
`length` tokens, with each token's place in its document and its document's number.

numpy does the work a part (256 documents, loader.tokens.rows) at a time: one
scatter of the values between the separators, one cut into rows; what is left
over (less than a block) waits for the next part. Nothing is kept across runs or epochs:
a run starts at a block boundary, located in the index's token counts (sampler.packing).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch.utils.data import get_worker_info

from shardstream.sampler.packing import PackRun

from ..errors import ShardError, StaleIndexError
from ..formats.parquet.fetch import packed
from .pack import Pack
from .rows import TokenRows

__all__ = ["DOCUMENTS", "POSITIONS", "STREAM", "Blocks", "items", "lay_out", "pack_run"]

POSITIONS = "position_ids"
STREAM = "__stream__"  # a mixture's stream index, as record batches carry it
DOCUMENTS = "document_ids"
I64 = npt.NDArray[np.int64]
# (k, length) each: tokens, place in the document, the document's number in the run
Blocks = tuple[I64, I64, I64]


def lay_out(
    docs: TokenRows, pack: Pack, head: tuple[I64, I64, I64] | None = None
) -> tuple[I64, I64, I64]:
    """(tokens, positions, document) of every place of `docs` laid end to end: `bos`,
    the tokens, `eos` for each non-empty document, after the places of `head` (what an
    earlier part left over: written into the same fresh arrays, not joined after).
    `document` numbers the non-empty documents from the one after head's last (from 0
    without a head). ShardError for a null token inside a document."""
    if docs.null_tokens:
        raise ShardError(f"Pack column {pack.column!r} holds {docs.null_tokens} null token(s)")
    lengths, vals = docs.lengths, docs.values
    places = pack.places(lengths)
    h = 0 if head is None else head[0].size
    n = h + int(places.sum())
    tokens, positions, document = (np.empty(n, dtype=np.int64) for _ in range(3))
    first = 0
    if head is not None:
        tokens[:h], positions[:h], document[:h] = head
        first = int(head[2][-1]) + 1 if h else 0
    ends = np.cumsum(places)
    starts = ends - places
    body = tokens[h:]
    if pack.separators == 0:
        body[:] = vals
    else:
        full = lengths > 0
        separators = []
        if pack.bos is not None:
            separators.append(starts[full])
            body[starts[full]] = pack.bos
        if pack.eos is not None:
            separators.append(ends[full] - 1)
            body[ends[full] - 1] = pack.eos
        is_value = np.ones(body.size, dtype=bool)
        for at in separators:
            is_value[at] = False
        body[is_value] = vals
    np.subtract(np.arange(n - h, dtype=np.int64), np.repeat(starts, places), out=positions[h:])
    # documents numbered on from `first`, the empty ones (no places) left out
    document[h:] = np.repeat(np.cumsum(places > 0) - 1 + first, places)
    return tokens, positions, document


def pack_run(parts: Iterable[TokenRows], pack: Pack, run: PackRun, where: str) -> Iterator[Blocks]:
    """The blocks of `run` from its documents (`parts`: the reader's parts, in order),
    a few blocks at a time.

    The run must come out exactly as the index's token counts say: `run.blocks` blocks
    and `run.rest` places after them; anything else is a StaleIndexError naming `where`
    (the counts were made from other bytes than these)."""
    length = pack.length
    carry: tuple[I64, I64, I64] | None = None  # places after the last block made
    count = 0  # places held
    skip = run.skip
    made = 0
    for part in parts:
        try:
            tokens, positions, document = lay_out(part, pack, carry)
        except ShardError as e:
            raise ShardError(f"{where}: {e}") from e
        if skip:  # the run's first places belong to the blocks before (no carry yet)
            k = min(skip, tokens.size)
            tokens, positions, document = tokens[k:], positions[k:], document[k:]
            skip -= k
        count = tokens.size
        k = min(count // length, run.blocks - made)
        cut = max(k, 0) * length
        if k > 0:
            yield (
                tokens[:cut].reshape(k, length),
                positions[:cut].reshape(k, length),
                document[:cut].reshape(k, length),
            )
            made += k
        carry = (tokens[cut:], positions[cut:], document[cut:])
        count -= cut
    if made != run.blocks or count != run.rest or skip:
        raise StaleIndexError(
            f"{where}: the documents read make {made} blocks and {count} tokens more, the "
            f"index's token counts {run.blocks} blocks and {run.rest} more: the counts were "
            "made from other data; rebuild the index (and its token counts)"
        )


def _block_dict(column: str, arrays: Sequence[npt.NDArray[Any]], own: bool) -> dict[str, Any]:
    """One block or a batch of them, from (tokens, positions, document[, stream]):
    document numbers count from 0 in each block; a mixture's stream index comes as
    ``__stream__``. `own`: the tensors share one fresh storage (in a DataLoader worker,
    which sends each storage through its own shared-memory segment), else they are views
    of the packed arrays."""
    tokens, positions, document = arrays[:3]
    named = {column: tokens, POSITIONS: positions, DOCUMENTS: document - document[..., :1]}
    if len(arrays) > 3:
        named[STREAM] = np.asarray(arrays[3])
    if own:
        return packed(named)
    return {k: torch.from_numpy(a) for k, a in named.items()}


def _rows(arrays: Sequence[npt.NDArray[Any]], lo: int, hi: int) -> list[npt.NDArray[Any]]:
    return [a[lo:hi] for a in arrays]


def items(
    chunks: Iterable[Sequence[npt.NDArray[Any]]], column: str, batch_size: int | None
) -> Iterator[list[dict[str, Any]]]:
    """The blocks as items, a list of them per chunk: one block a dict of 1-D tensors,
    or (with `batch_size`) batches of that many blocks as 2-D tensors, the last one
    short when the blocks run out. A chunk is `Blocks`, or Blocks and a fourth array of
    each block's stream index (a mixture). Outside DataLoader workers an item's tensors
    are views of the arrays its part was packed into (an item kept pins that part's 256
    documents); inside one, each item has a storage of its own."""
    own = get_worker_info() is not None
    if batch_size is None:
        for chunk in chunks:
            yield [
                _block_dict(column, [a[i] for a in chunk], own) for i in range(chunk[0].shape[0])
            ]
        return
    held: list[npt.NDArray[Any]] | None = None  # fewer than batch_size blocks, waiting
    for chunk in chunks:
        out = []
        if held is not None:
            need = batch_size - held[0].shape[0]
            held = [np.concatenate((h, f)) for h, f in zip(held, _rows(chunk, 0, need))]
            chunk = _rows(chunk, need, chunk[0].shape[0])
            if held[0].shape[0] < batch_size:
                continue
            out.append(_block_dict(column, held, own))
            held = None
        rows = chunk[0].shape[0]
        whole = rows - rows % batch_size
        out += [
            _block_dict(column, _rows(chunk, lo, lo + batch_size), own)
            for lo in range(0, whole, batch_size)
        ]
        if whole < rows:
            held = _rows(chunk, whole, rows)
        if out:
            yield out
    if held is not None:
        yield [_block_dict(column, held, own)]
