"""A tar's members grouped into webdataset samples, as arrays.

A header walk (loader.formats.tar.scan) finds the tar's regular members as columns
(`Found`); `group_members` groups them as webdataset's `group_by_keys` does and gives the
index's ``keys`` and ``members`` as a `Keys` and a `Members` table (arrays, not a Python
list a member: scripts.bench's 480,000 members grouped in ~0.2 s instead of ~0.8 s, and the
index table made from them without a Python object a member).

The rules are applied to all members at once with Arrow's kernels (a search for the first
dot; RE2, `KEY_EXT`'s pattern, for names with a slash); anything unusual
(a name that is not UTF-8 or holds a newline, where RE2 and Python's `re` could differ; a
sample split or with a repeated extension; a member past the file's end) is handed to
`_group_one_by_one`, webdataset's rules written member by member, which gives the same
groups or the error naming the member.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from ...columns.arrays import flags, numbers, read_pool
from ...errors import ShardError
from ...storage.filesystems import redact
from .members import Keys, Members

__all__ = ["KEY_EXT", "Found", "group_members"]

I64 = npt.NDArray[np.int64]
_SKIP_META = re.compile(r"__[^/]*__($|/)")  # webdataset's skip_meta default
# webdataset's base_plus_ext (key, then every extension), compiled once
KEY_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
# the same two rules for Arrow (RE2): Python's `$` also matches before a final newline,
# RE2's only at the end, so names holding a newline take the member-by-member path
_SKIP_META_RE2 = r"^__[^/]*__($|/)"
_KEY_EXT_RE2 = r"^(?P<key>(?:.*/|)[^.]+)[.](?P<ext>[^/]*)$"

# Arrow work on the scanning threads (16 at once) allocates from one pool, not a heap
# a thread (see read_pool)
POOL = read_pool()

# name, data offset, data size, compressed bytes read once the member's data is reached
# (0 for an uncompressed tar)
Member = tuple[str, int, int, int]


class Found:
    """A tar's regular members in order, as columns: `names` (Arrow strings; a list of str
    where some name is not UTF-8, as tarfile decodes it with surrogateescape), `offsets`
    (where each member's data begins), `sizes`, and `seen` (compressed bytes read once its
    data is reached; zeros for a plain tar). Iterates as `Member` tuples."""

    def __init__(self, names: pa.Array | list[str], offsets: I64, sizes: I64, seen: I64) -> None:
        self.names, self.offsets, self.sizes, self.seen = names, offsets, sizes, seen

    @classmethod
    def of_members(cls, members: Sequence[Member]) -> Found:
        """From (name, offset, size, seen) tuples (tarfile's walk, a sidecar's lines)."""
        names = [m[0] for m in members]
        try:
            arrow: pa.Array | list[str] = pa.array(names, pa.string())
        except (UnicodeEncodeError, pa.ArrowException):  # surrogate-escaped bytes
            arrow = names
        return cls(arrow, *(np.array([m[k] for m in members], dtype=np.int64) for k in (1, 2, 3)))

    def name_list(self) -> list[str]:
        return self.names if isinstance(self.names, list) else self.names.to_pylist()

    def __len__(self) -> int:
        return len(self.offsets)

    def __iter__(self) -> Iterator[Member]:
        cols = (self.offsets.tolist(), self.sizes.tolist(), self.seen.tolist())
        return iter(zip(self.name_list(), *cols))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Found | list):
            return NotImplemented
        return list(self) == list(other)


def group_members(found: Found, url: str, size: int | None) -> tuple[Any, Any, list[int]]:
    """(keys, members, compressed ends) of the samples the tar's regular members form, by
    webdataset's rules: meta files (``__...__``) and names without an extension skipped,
    the key and lower-cased extension split as `base_plus_ext` splits them, neighbours
    with one key one sample, a repeated extension in a sample refused, and a key whose
    members are not all next to each other refused. Keys and members are a `Keys` and a
    `Members` table (lists where a name is not UTF-8)."""
    names = found.names
    if isinstance(names, list) or flags(pc.match_substring(names, "\n", memory_pool=POOL)).any():
        return _group_one_by_one(found, url, size)
    meta = flags(pc.match_substring_regex(names, _SKIP_META_RE2, memory_pool=POOL))
    cut = _key_lengths(names)  # -1: no extension
    at = np.flatnonzero(~meta & (cut >= 0))
    offsets, sizes = found.offsets[at], found.sizes[at]
    if size is not None and at.size and int((offsets + sizes).max()) > size:
        return _group_one_by_one(found, url, size)  # it names the member
    begin, end = _bounds(names)
    keys = _pieces(names, begin[at], cut[at])
    ext = _lower(_pieces(names, begin[at] + cut[at] + 1, end[at] - begin[at] - cut[at] - 1))
    n = len(keys)
    starts = np.ones(n, dtype=bool)
    if n > 1:
        starts[1:] = flags(pc.not_equal(keys.slice(1), keys.slice(0, n - 1), memory_pool=POOL))
    first = np.flatnonzero(starts)
    run = np.cumsum(starts) - 1
    codes = numbers(pc.dictionary_encode(ext, memory_pool=POOL).indices).astype(np.int64)
    split_key = len(pc.unique(keys, memory_pool=POOL)) != len(first)
    repeated = len(np.unique(run * (int(codes.max(initial=0)) + 1) + codes)) != n
    if split_key or repeated:
        return _group_one_by_one(found, url, size)  # it names the sample
    ends = np.append(first[1:], n)[: len(first)] - 1  # each sample's last member
    members = Members(np.append(first, n).astype(np.int64), ext, offsets, sizes)
    return Keys(keys.take(pa.array(first))), members, found.seen[at][ends].tolist()


def _key_lengths(names: pa.Array) -> I64:
    """Per name, the bytes of its key as `KEY_EXT` splits it (the extension follows
    after a dot), or -1 where it has no extension. Without a slash the key ends at the
    first dot (a leading dot: no key, no match); a name with a slash takes the regex."""
    dot = numbers(pc.find_substring(names, ".", memory_pool=POOL)).astype(np.int64)
    cut = np.where(dot > 0, dot, -1)
    slash = np.flatnonzero(flags(pc.match_substring(names, "/", memory_pool=POOL)))
    if slash.size:
        split = pc.extract_regex(names.take(pa.array(slash)), _KEY_EXT_RE2)
        lengths = numbers(pc.binary_length(split.field("key")), fill=-1)
        cut[slash] = np.where(flags(split.is_valid()), lengths, -1)
    return cut


def _bounds(names: pa.Array) -> tuple[I64, I64]:
    """Where each string of an Arrow string array begins and ends in its data buffer."""
    held = np.frombuffer(names.buffers()[1], dtype=np.int32)
    offsets: I64 = held[names.offset : names.offset + len(names) + 1].astype(np.int64)
    return offsets[:-1], offsets[1:]


def _pieces(names: pa.Array, begin: I64, length: I64) -> pa.Array:
    """Strings of bytes [begin, begin + length) of `names`' data buffer (cut at ASCII
    characters, so still UTF-8)."""
    held = names.buffers()[2]
    data = np.frombuffer(held, dtype=np.uint8) if held is not None else np.zeros(0, np.uint8)
    offsets = np.zeros(len(begin) + 1, dtype=np.int32)
    np.cumsum(length, out=offsets[1:])
    picks = np.arange(int(offsets[-1]), dtype=np.int64) + np.repeat(begin - offsets[:-1], length)
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(data[picks].tobytes())]
    return pa.Array.from_buffers(pa.string(), len(begin), buffers)


def _lower(ext: pa.Array) -> pa.Array:
    """Extensions lower-cased by Python's str.lower (as webdataset's group_by_keys does),
    once a distinct extension."""
    encoded = pc.dictionary_encode(ext, memory_pool=POOL)
    lowered = pa.array([e.lower() for e in encoded.dictionary.to_pylist()], pa.string())
    return pc.take(lowered, encoded.indices, memory_pool=POOL)


def _group_one_by_one(
    found: Found, url: str, size: int | None
) -> tuple[list[str], list[list[list[Any]]], list[int]]:
    """`group_members` a member at a time: the same groups, as lists, or the error naming
    the member that breaks a rule."""
    keys: list[str] = []
    members: list[list[list[Any]]] = []
    ends: list[int] = []
    exts: set[str] = set()  # the current record's extensions
    seen_keys: set[str] = set()
    for name, offset, length, seen in found:
        if name[:2] == "__" and _SKIP_META.match(name):
            continue
        split = KEY_EXT.match(name)
        if split is None:
            continue
        key, ext = split.groups()
        ext = ext.lower()  # as webdataset's group_by_keys (lcase=True)
        if size is not None and offset + length > size:
            raise ShardError(
                f"{redact(url)}: truncated tar: member {name} ends at byte "
                f"{offset + length} of a {size}-byte file"
            )
        if not keys or keys[-1] != key:
            if key in seen_keys:
                raise ShardError(
                    f"{redact(url)}: sample {key!r} is split: its members are not next to "
                    f"each other in the tar ({name} comes after other samples' members); "
                    "webdataset would give two samples with this key. Write each sample's "
                    "files together (sort the names before tarring)"
                )
            seen_keys.add(key)
            keys.append(key)
            members.append([])
            ends.append(seen)
            exts = set()
        elif ext in exts:
            raise ShardError(
                f"{redact(url)}: duplicate file name in tar file: sample {key!r} has two "
                f"members with extension {ext!r} (the second: {name}); webdataset refuses "
                "such shards too"
            )
        exts.add(ext)
        members[-1].append([ext, offset, length])
        ends[-1] = seen
    return keys, members, ends
