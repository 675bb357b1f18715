"""DALI ``.idx`` sidecars kept beside tar shards: read instead of scanning a shard, checked
against it, and written for the next job.

DALI's index (format v1.2, written by DALI's ``tools/wds2idx.py``, read by its
``fn.readers.webdataset``), one text file per shard::

    v1.2 <records>
    <ext> <data offset> <size> <member name> [<ext> <offset> <size> <name> ...]   a record

Offsets are those of the members' data (each header is the 512 bytes before), multiples
of 512. v1.1 files lack the member names, which webdataset's keys come from: their shards
are scanned instead. A sidecar lies beside its shard as ``<shard>.idx`` or, as wds2idx
names it by default, the shard's name up to its first dot plus ``.idx``.

A sidecar that does not fit its shard raises StaleSidecarError naming both: members that
overlap, run past the shard, or disagree with the headers read at its first and last
member, or a shard that holds another member after them. Three small range reads per
shard check that, concurrently. (wids shard lists: loader.formats.tar.wids.)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ...errors import StaleSidecarError
from ...shard import Shard
from ...storage.filesystems import FileEntry, filesystem, redact
from ...storage.retry import RetryPolicy, read_ranges
from .groups import Found, group_members

__all__ = [
    "IDX_VERSION",
    "find_idx",
    "idx_candidates",
    "idx_text",
    "index_from_sidecars",
    "parse_idx",
    "write_sidecars",
]

log = logging.getLogger(__name__)

IDX_VERSION = "v1.2"
_BLOCK = 512
_END = 2 * _BLOCK  # the end-of-archive blocks
_REGULAR = (b"0", b"\0", b"7")
_NO_DATA = (b"1", b"2", b"3", b"4", b"5", b"6")  # links, devices, directories, fifos

IdxMember = tuple[str, int, int]  # member name, data offset, size


def _pad(n: int) -> int:
    return -(-n // _BLOCK) * _BLOCK


def idx_candidates(url: str) -> tuple[str, str]:
    """Where a plain tar shard's DALI sidecar may lie: ``<shard>.idx``, or wds2idx's
    default name (the shard's name up to its first dot, plus ``.idx``)."""
    dot = url.find(".", url.rfind("/") + 2)
    return url + ".idx", (url[:dot] if dot > 0 else url) + ".idx"


def find_idx(
    entries: Sequence[FileEntry], companions: Sequence[FileEntry]
) -> list[FileEntry | None]:
    """Each shard's DALI sidecar among the listed companion files (None: none, or a
    compressed shard, whose offsets an ``.idx`` cannot give). A default-named sidecar two
    shards could claim (``a.x.tar`` and ``a.y.tar`` both map to ``a.idx``) is used by
    neither."""
    by_url = {c.url: c for c in companions if c.url.lower().endswith(".idx")}
    wanted = [idx_candidates(e.url) if e.url.lower().endswith(".tar") else None for e in entries]
    claims: dict[str, int] = {}
    for names in wanted:
        if names is not None:
            claims[names[1]] = claims.get(names[1], 0) + 1
    out: list[FileEntry | None] = []
    for names in wanted:
        if names is None:
            out.append(None)
        elif names[0] in by_url:
            out.append(by_url[names[0]])
        elif names[1] in by_url and claims[names[1]] == 1:
            out.append(by_url[names[1]])
        else:
            out.append(None)
    return out


def parse_idx(text: str, where: str) -> list[IdxMember] | None:
    """The members (name, data offset, size) a DALI index lists, in order; None for a
    v1.1 index (no member names). StaleSidecarError naming `where` and the line when the
    file is not a DALI index or is cut short."""
    lines = text.splitlines()
    head = lines[0].split() if lines else []
    if len(head) != 2 or not head[0].startswith("v") or not head[1].isdigit():
        first = lines[0][:60] if lines else ""
        raise StaleSidecarError(
            f"{redact(where)}: not a DALI webdataset index (first line {first!r}, expected "
            f"'{IDX_VERSION} <records>'); rewrite it (shardstream-plan --write-sidecars) or "
            "remove it"
        )
    if head[0] != IDX_VERSION:
        return None
    body = [line for line in lines[1:] if line.strip()]
    if len(body) != int(head[1]):
        raise StaleSidecarError(
            f"{redact(where)}: says {head[1]} records but holds {len(body)}; the file was "
            "cut short or edited: rewrite it (shardstream-plan --write-sidecars) or remove it"
        )
    members: list[IdxMember] = []
    for number, line in enumerate(body, start=2):
        parts = line.split()
        try:
            if len(parts) % 4:
                raise ValueError("not groups of <ext> <offset> <size> <name>")
            for i in range(0, len(parts), 4):
                members.append((parts[i + 3], int(parts[i + 1]), int(parts[i + 2])))
        except ValueError as e:
            raise StaleSidecarError(
                f"{redact(where)}: line {number} is malformed ({e}): rewrite the sidecar "
                "or remove it"
            ) from None
    return members


def _stale(idx: str, shard: str, what: str) -> StaleSidecarError:
    return StaleSidecarError(
        f"{redact(idx)}: does not describe {redact(shard)} ({what}); the shard changed after "
        "the sidecar was written: rewrite it (shardstream-plan --write-sidecars) or remove it"
    )


def _check_layout(members: Sequence[IdxMember], size: int, idx: str, shard: str) -> int:
    """Where the archive's end should be, from the sidecar alone: members in order,
    aligned, apart, and ending with room for the end-of-archive blocks in `size` bytes."""
    end = 0
    for name, offset, length in members:
        if offset % _BLOCK or length < 0 or offset < end + _BLOCK:
            raise _stale(idx, shard, f"member {name} at byte {offset} overlaps or is misaligned")
        end = offset + _pad(length)
    if end + _END > size:
        raise _stale(idx, shard, f"its members end at byte {end}, the shard has {size} bytes")
    return end


def _number(field: bytes) -> int | None:
    """A tar number field: octal, or base-256 (a leading 0x80 byte)."""
    if field[:1] == b"\x80":
        return int.from_bytes(field[1:], "big")
    try:
        return int(field.split(b"\0", 1)[0].strip() or b"0", 8)
    except ValueError:
        return None


def _header(block: bytes) -> tuple[bytes, str, int | None] | None:
    """(type flag, name, size) of a valid tar header block; None if it is not one."""
    if len(block) != _BLOCK:
        return None
    stored = _number(block[148:156])
    unsigned = sum(block) - sum(block[148:156]) + 8 * 32
    signed = unsigned - 256 * (sum(b > 127 for b in block) - sum(b > 127 for b in block[148:156]))
    if stored not in (unsigned, signed):
        return None
    name = block[:100].split(b"\0", 1)[0]
    prefix = block[345:500].split(b"\0", 1)[0]
    if prefix:
        name = prefix + b"/" + name
    return block[156:157], name.decode("utf-8", "surrogateescape"), _number(block[124:136])


def _member_matches(block: bytes, name: str, length: int) -> str | None:
    """Why the header before a member's data is not the sidecar's (None if it is). Names
    that need a pax or GNU long-name header are held elsewhere: only the size is checked."""
    got = _header(block)
    if got is None:
        return "no valid tar header before its data"
    kind, found, size = got
    if kind not in _REGULAR:
        return f"the header there is of type {kind!r}, not a file"
    long = len(name.encode()) > 100 or not name.isascii()
    if found != name and not long:
        return f"the shard holds {found} where the sidecar has {name}"
    if size != length:
        return f"member {name}: {size} bytes in the shard, {length} in the sidecar"
    return None


def _end_matches(blocks: bytes) -> str | None:
    """Why what follows the sidecar's last member is not the archive's end (None if it is,
    or if it is a header of an entry without data)."""
    if blocks == bytes(_END):
        return None
    got = _header(blocks[:_BLOCK])
    if got is not None and got[0] in _NO_DATA:
        return None
    return "the shard holds more after the last member the sidecar lists"


def index_from_sidecars(
    fs: Any, entries: Sequence[FileEntry], sidecars: Sequence[FileEntry], retry: RetryPolicy
) -> list[dict[str, Any] | None]:
    """Each shard's index from its DALI sidecar (what `TarFormat.scan` would give), checked
    against the shard; None where the sidecar is v1.1 (the shard is to be scanned).

    Reads each sidecar whole, then the first and last members' headers and the two blocks
    after the last member, of all the shards at once (each read of the listed version)."""
    texts = read_ranges(
        fs,
        [s.url for s in sidecars],
        [0] * len(sidecars),
        [s.size for s in sidecars],
        retry,
        [(s.size, s.version) for s in sidecars],
    )
    parsed = [
        parse_idx(t.decode("utf-8", "surrogateescape"), s.url) for t, s in zip(texts, sidecars)
    ]
    urls: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    indexed: list[tuple[int, str | None]] = []
    for entry, side, members in zip(entries, sidecars, parsed):
        if members is None:
            log.info(
                "%s: a v1.1 DALI index (no member names): scanning the shard", redact(side.url)
            )
            continue
        end = _check_layout(members, entry.size, side.url, entry.url)
        at = [m[1] - _BLOCK for m in (members[:1] + members[-1:])] if members else []
        urls += [entry.url] * (len(at) + 1)
        starts += [*at, end]
        ends += [a + _BLOCK for a in at] + [end + _END]
        indexed += [(entry.size, entry.version)] * (len(at) + 1)
    blocks = iter(read_ranges(fs, urls, starts, ends, retry, indexed))
    out: list[dict[str, Any] | None] = []
    for entry, side, members in zip(entries, sidecars, parsed):
        if members is None:
            out.append(None)
            continue
        for name, _, length in (members[:1] + members[-1:]) if members else []:
            why = _member_matches(next(blocks), name, length)
            if why:
                raise _stale(side.url, entry.url, why)
        why = _end_matches(next(blocks))
        if why:
            raise _stale(side.url, entry.url, why)
        keys, grouped, _ = group_members(
            Found.of_members([(n, o, s, 0) for n, o, s in members]), entry.url, entry.size
        )
        out.append({"num_records": len(keys), "details": {"keys": keys, "members": grouped}})
    return out


def idx_text(shard: Shard) -> str | None:
    """The DALI v1.2 index of an indexed plain tar shard (member names as webdataset sees
    them: key, dot, lower-cased extension); None for a compressed, deferred or empty
    shard (DALI refuses an index of no records)."""
    d = shard.details
    if shard.format != "tar" or "compressed_ends" in d or "members" not in d or not d["keys"]:
        return None
    lines = [f"{IDX_VERSION} {len(d['keys'])}"]
    for key, members in zip(d["keys"], d["members"]):
        lines.append(" ".join(f"{ext} {off} {size} {key}.{ext}" for ext, off, size in members))
    return "\n".join(lines) + "\n"


def write_sidecars(shards: Sequence[Shard], storage_options: dict[str, Any] | None = None) -> int:
    """Write ``<shard>.idx`` beside each plain tar shard that has records (what
    `idx_text` gives), in one concurrent batch of writes; returns how many were written.
    DALI reads them as ``index_paths``; our next index build reads them instead of the
    shards."""
    texts = {s.url + ".idx": idx_text(s) for s in shards}
    todo = {u: t.encode() for u, t in texts.items() if t is not None}
    if not todo:
        return 0
    fs, _ = filesystem(next(iter(todo)), storage_options)
    fs.pipe({fs._strip_protocol(u): data for u, data in todo.items()})
    log.info("wrote %d DALI .idx sidecars", len(todo))
    return len(todo)
