"""`Pack`: what packing documents into fixed-length blocks of tokens asks for."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from shardstream.sampler.checks import as_int

from ..columns.kinds import Kind

__all__ = ["Pack", "check_token_column", "pack_columns", "token_kinds"]


@dataclass(frozen=True)
class Pack:
    """Pack the documents of `column` (a list of integers a row: one tokenized document)
    end to end into blocks of `length` tokens: `bos` before each document and `eos` after
    it when given (token ids), the sequence cut every `length` tokens, a document running
    on into the next block. A document of no tokens (an empty list, or null) adds nothing,
    separators included.

    ``StreamingDataset(source, pack=Pack("input_ids", length=2049, eos=2))`` yields blocks
    (dicts of int64 tensors of `length`: the column, ``position_ids`` counting from 0 at
    each document start, ``document_ids`` numbering the documents of the block from 0), or
    batches of them with `batch_size`."""

    column: str
    length: int
    eos: int | None = None
    bos: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.column, str) or not self.column:
            raise ValueError(f"Pack's column must be a column name (a str), got {self.column!r}")
        object.__setattr__(self, "length", as_int("Pack length", self.length, 1))
        for name in ("eos", "bos"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, as_int(f"Pack {name}", value))

    @property
    def separators(self) -> int:
        """Tokens added to each non-empty document (eos and bos)."""
        return int(self.eos is not None) + int(self.bos is not None)

    def places(self, lengths: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
        """Places each document takes in the packed sequence, from its token count."""
        lengths = np.asarray(lengths, dtype=np.int64)
        return np.where(lengths > 0, lengths + self.separators, 0)


def check_token_column(schema: pa.Schema, pack: Pack) -> None:
    """ValueError unless `schema` has `pack.column` as a list of integers."""
    if pack.column not in schema.names:
        raise ValueError(f"Pack column {pack.column!r} is not in the data: {schema.names}")
    t = schema.field(pack.column).type
    is_list = pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
    if not (is_list and pa.types.is_integer(t.value_type)):
        raise ValueError(
            f"Pack column {pack.column!r} must hold a list of integer token ids a row "
            f"(list<int32>, list<int64>, ...), it holds {t}; tokenize the text into such a "
            "column first (README: 'Pretraining on tokens')"
        )


def pack_columns(
    pack: Pack,
    columns: list[str] | None,
    fill_nulls: Mapping[str, Any] | None,
    pad: Mapping[str, Any] | None,
    locality: str | None,
) -> list[str]:
    """The columns a packing dataset reads (its token column), after refusing the options
    packing has no use for (ValueError or TypeError naming them)."""
    if not isinstance(pack, Pack):
        raise TypeError(f"pack must be a loader.Pack, got {type(pack).__name__}")
    if columns is not None and columns != [pack.column]:
        raise ValueError(
            f"pack= reads only its token column {pack.column!r}; columns={columns} "
            "asks for others (leave columns out)"
        )
    unused = [name for name, v in (("fill_nulls", fill_nulls), ("pad", pad)) if v]
    if unused:
        raise ValueError(
            f"{' and '.join(unused)} do not apply with pack= (blocks are never padded)"
        )
    if locality is not None:
        raise ValueError("pack= reads the epoch's token line, which locality='node' does not keep")
    return [pack.column]


def token_kinds(pack: Pack, schemas: Sequence[pa.Schema | None]) -> list[dict[str, Kind]]:
    """Per source (schema), the kinds a packing format reads with: the token column,
    checked, handed over as Arrow lists (loader.tokens.rows takes it from there)."""
    out = []
    for schema in schemas:
        if schema is None:
            raise ValueError("pack= reads a token column of Parquet or Arrow IPC shards, not tar")
        check_token_column(schema, pack)
        out.append({pack.column: Kind(False)})
    return out
