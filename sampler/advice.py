"""A Parquet layout for a job: the shard count and rows per row group that let its readers
split the data without re-reading it. Pure arithmetic (numpy only, no I/O).

How the sampler cuts the data (sampler.epoch): the epoch's records laid end to end are cut
into R contiguous rank spans of L records (L = ceil(N / R), or N // R with drop_last; the
padding wraps to the line's start), and each span into W contiguous worker parts, the
smallest of q = L // W records. A reader fetches every row group its part overlaps, whole.
Shards begin and end on row-group bounds, so only the two ends of a part can cut a group:
a part of q records in groups of g rows fetches at most q + 2 (g - 1) rows, so

    worst reader's amplification  <=  1 + 2 (g - 1) / q

(with locality="node" a node's span was cut from epoch 0's line once and its pieces are
reordered every epoch, so a part may also hold the two pieces cut there: 4 (g - 1)); and,
a cut falling anywhere in a group, a boundary between two parts re-reads g - 1 rows on
average: the whole job fetches about 1 + (R W - 1)(g - 1) / (R L) times its records.
`advise` takes the largest g that keeps the worst reader within `target` (1.1x), then the
sizes storage likes where the data allows: row groups of at most 16 MB (1-16 MB is what
Parquet readers like; where the parts are too small for 1 MB groups, amplification wins)
and shards of 64 MB-1 GB (256 MB, their geometric middle, unless a current shard count
already falls in the range). Row groups under 64 KB cost more in footer metadata and
requests than they save: a job whose parts need smaller ones is too small for that many
readers, and `readers_fed` says how many it can feed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from .epoch import rank_length

__all__ = [
    "GROUP_BYTES",
    "MIN_GROUP_BYTES",
    "SHARD_BYTES",
    "SHARD_TARGET",
    "TARGET",
    "Advice",
    "advise",
    "fetched_rows",
    "max_rows_per_group",
    "mean_amplification",
    "reader_records",
    "records_needed",
    "worst_amplification",
]

I64Array = npt.NDArray[np.int64]

TARGET = 1.1  # the amplification every reader stays within
MIN_GROUP_BYTES = 64_000  # a row group below this is not worth its metadata and request
GROUP_BYTES = (1_000_000, 16_000_000)  # the row-group sizes Parquet readers do best with
SHARD_BYTES = (64_000_000, 1_000_000_000)  # the shard sizes object stores do best with
SHARD_TARGET = 256_000_000  # the geometric middle of SHARD_BYTES


@dataclass(frozen=True)
class Advice:
    """A layout for `readers` = world_size x workers readers of `num_records` records.

    `fits`: row groups of at least MIN_GROUP_BYTES keep every reader within the target;
    when False the data is too small for that many readers (`readers_fed` is how many it
    can feed), and the layout given still keeps the target, with smaller row groups.
    `groups_below_range` / `shards_below_range`: the row groups (shards) are under 1 MB
    (64 MB) because the readers' parts (the data) are too small for more.
    `current_fits`: whether the current rows per group keep the target (None: not given).
    """

    num_records: int
    bytes_per_row: float
    world_size: int
    workers: int
    readers: int
    records_per_reader: int  # the smallest reader's part
    max_rows_per_group: int  # the most rows per group that keep every reader in target
    rows_per_group: int
    num_shards: int
    rows_per_shard: int
    worst_amplification: float  # bound on any reader's factor (inf: readers with nothing)
    mean_amplification: float  # about the whole job's factor
    fits: bool
    readers_fed: int
    groups_below_range: bool
    shards_below_range: bool
    current_fits: bool | None

    @property
    def group_bytes(self) -> float:
        return self.rows_per_group * self.bytes_per_row

    @property
    def shard_bytes(self) -> float:
        return self.rows_per_shard * self.bytes_per_row


def _slack(target: float) -> Fraction:
    """target - 1 as an exact fraction (1.1 -> 1/10), so integer bounds do not round."""
    slack = Fraction(target).limit_denominator(10**6) - 1
    if slack <= 0:
        raise ValueError(f"target must be > 1 (an amplification factor), got {target}")
    return slack


def reader_records(num_records: int, world_size: int, workers: int, drop_last: bool) -> int:
    """Records of the smallest worker part: L // W, L the records a rank (padding included)."""
    return rank_length(num_records, world_size, drop_last) // workers


def worst_amplification(rows_per_group: int, part: int, cuts: int = 2) -> float:
    """The most a reader of `part` records fetches over its records, in groups of
    `rows_per_group` rows, when `cuts` places in its part may fall inside a group (its two
    ends; four with locality="node", whose node spans were cut once at epoch 0):
    (part + cuts (g - 1)) / part (inf for an empty part)."""
    if part <= 0:
        return math.inf
    return 1 + cuts * (rows_per_group - 1) / part


def mean_amplification(
    rows_per_group: int, num_records: int, world_size: int, workers: int, drop_last: bool
) -> float:
    """About what the whole job fetches over the records it reads: each of the R W - 1
    boundaries between parts (and the end of the padding, or of what drop_last keeps,
    where the line does not end on a rank's span) re-reads g - 1 rows on average, over
    the R L records read."""
    read = world_size * rank_length(num_records, world_size, drop_last)
    if read <= 0:
        return math.inf
    cuts = world_size * workers - 1 + int(read != num_records)
    return 1 + cuts * (rows_per_group - 1) / read


def max_rows_per_group(part: int, target: float = TARGET, cuts: int = 2) -> int:
    """The most rows per group keeping a reader of `part` records within `target`:
    1 + floor((target - 1) part / cuts) (one-row groups are never re-read)."""
    slack = _slack(target)
    return 1 + (slack.numerator * max(part, 0)) // (cuts * slack.denominator)


def records_needed(rows_per_group: int, target: float = TARGET, cuts: int = 2) -> int:
    """The fewest records a reader's part needs for groups of `rows_per_group` rows to keep
    it within `target`: ceil(cuts (g - 1) / (target - 1)), at least 1."""
    slack = _slack(target)
    need = -(-cuts * (rows_per_group - 1) * slack.denominator // slack.numerator)
    return max(1, need)


def fetched_rows(
    starts: I64Array, stops: I64Array, group_rows: int, shard_rows: int | I64Array
) -> I64Array:
    """(P,) rows a reader fetches for pieces [starts, stops) of shards of `shard_rows` rows
    (one number, or one a piece) in groups of `group_rows` (the last group of a shard may
    be short): every group a piece overlaps, whole."""
    starts, stops = np.asarray(starts, np.int64), np.asarray(stops, np.int64)
    # (P,) first row of the first group and one past the last row of the last group
    first = starts // group_rows * group_rows
    last = np.minimum(-(-stops // group_rows) * group_rows, shard_rows)
    return np.where(stops > starts, last - first, 0).astype(np.int64)


def _shards(num_records: int, stored: float, current_shards: int | None) -> tuple[int, int]:
    """(shards, rows a shard): the current count where its shards are 64 MB-1 GB, else
    shards of about 256 MB (at most 1 GB). A shard's last row group may be short: shards
    begin and end on row-group bounds whatever their rows, so no count re-reads more."""
    lo, hi = SHARD_BYTES
    if current_shards and lo <= stored / current_shards <= hi:
        count = current_shards
    else:
        count = max(1, round(stored / SHARD_TARGET), math.ceil(stored / hi))
    count = min(count, max(1, num_records))
    rows = -(-num_records // count)
    return -(-num_records // max(rows, 1)), rows


def _bytes_per_row(
    num_records: int, world_size: int, workers: int, stored: float | None, per_row: float | None
) -> float:
    """The bytes a row, from either; ValueError for sizes out of range."""
    if world_size < 1 or workers < 1 or num_records < 0:
        raise ValueError(
            f"advise needs world_size >= 1, workers >= 1, num_records >= 0; got "
            f"{world_size}, {workers}, {num_records}"
        )
    if per_row is None:
        if stored is None or num_records <= 0:
            raise ValueError("advise needs stored_bytes (with records) or bytes_per_row")
        per_row = stored / num_records
    if not per_row > 0:
        raise ValueError(f"bytes_per_row must be > 0, got {per_row}")
    return float(per_row)


def _groups(
    num_records: int, readers: int, part: int, floor_rows: int, target: float, cuts: int
) -> tuple[int, int, bool, int]:
    """(cuts a part, the most rows a group, whether groups of floor_rows rows or more keep
    the target, the readers such groups can feed)."""
    fed = max(1, num_records // records_needed(floor_rows, target, cuts)) if num_records else 0
    if readers == 1:  # one reader reads everything: nothing is cut
        return 0, max(1, num_records), num_records >= 1, max(fed, 1) if num_records else 0
    largest = max_rows_per_group(part, target, cuts)
    fits = part >= 1 and largest >= floor_rows
    # (a rank's parts are a little smaller than N / readers: say it as it is)
    return cuts, largest, fits, max(fed, readers) if fits else min(fed, readers - 1)


def advise(
    num_records: int,
    world_size: int,
    workers: int = 1,
    *,
    stored_bytes: float | None = None,
    bytes_per_row: float | None = None,
    drop_last: bool = False,
    current_shards: int | None = None,
    current_rows_per_group: int | None = None,
    locality: bool = False,
    target: float = TARGET,
) -> Advice:
    """The layout for `world_size` ranks x `workers` DataLoader workers reading
    `num_records` records of `stored_bytes` bytes (or `bytes_per_row` a row): the largest
    row groups (at most 16 MB) that keep every reader within `target`, in shards of about
    256 MB (see the module's docstring for the arithmetic). `locality`: the job reads with
    locality="node" (four cuts a part, not two). ValueError for sizes < 1 or no bytes."""
    per_row = _bytes_per_row(num_records, world_size, workers, stored_bytes, bytes_per_row)
    readers = world_size * workers
    part = reader_records(num_records, world_size, workers, drop_last)
    floor_rows = math.ceil(MIN_GROUP_BYTES / per_row)  # rows of the smallest group
    cuts, largest, fits, fed = _groups(
        num_records, readers, part, floor_rows, target, 4 if locality else 2
    )
    shards, shard_rows = _shards(num_records, num_records * per_row, current_shards)
    # the largest group in target, at most 16 MB and at most a shard
    rows = max(1, min(largest, int(GROUP_BYTES[1] // per_row), shard_rows))
    return Advice(
        num_records=num_records,
        bytes_per_row=per_row,
        world_size=world_size,
        workers=workers,
        readers=readers,
        records_per_reader=part,
        max_rows_per_group=largest,
        rows_per_group=rows,
        num_shards=shards,
        rows_per_shard=shard_rows,
        worst_amplification=worst_amplification(rows, part, cuts),
        mean_amplification=mean_amplification(rows, num_records, world_size, workers, drop_last),
        fits=fits,
        readers_fed=fed,
        groups_below_range=rows * per_row < GROUP_BYTES[0],
        shards_below_range=shard_rows * per_row < SHARD_BYTES[0],
        current_fits=None if current_rows_per_group is None else current_rows_per_group <= largest,
    )
