"""Grouping a tar's members into samples with arrays gives what webdataset's rules, applied
member by member, give: the same keys and members, or the same error; and the header
walk reads names and sizes as tarfile reads them, whatever the writer put around them."""

from __future__ import annotations

import io
import re
import tarfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.loader import ShardError
from shardstream.loader.formats.tar.groups import Found, _group_one_by_one, group_members
from shardstream.loader.formats.tar.members import Keys, Members
from shardstream.loader.formats.tar.scan import _tarfile_members, _walk_headers, scan_tar

_PARTS = st.sampled_from(
    ["s1", "s2", "S2", "a/s1", "a.b/s1", "a/.h", ".h", "__meta__", "__x__/y", "é", "b c", ""]
)
_EXTS = st.sampled_from(["jpg", "JPG", "cls", "json", "seg.png", "", "tar.gz", "a/b", None])


def _name(part: str, ext: str | None) -> str:
    return part if ext is None else f"{part}.{ext}"


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(_PARTS, _EXTS, st.integers(0, 3)), max_size=30),
    st.sampled_from([None, 10_000, 600]),
)
def test_arrays_group_as_webdataset_does_member_by_member(members: list, size: int | None) -> None:
    found, at = [], 512
    for part, ext, blocks in members:
        found.append((_name(part, ext), at, blocks * 100, at // 7))
        at += 512 * (blocks + 1)
    table = Found.of_members(found)
    try:
        expected = _group_one_by_one(table, "x.tar", size)
    except ShardError as e:
        with pytest.raises(ShardError, match=re.escape(str(e))):
            group_members(table, "x.tar", size)
        return
    keys, grouped, ends = group_members(table, "x.tar", size)
    assert isinstance(keys, Keys) and isinstance(grouped, Members)  # grouped as arrays
    assert (list(keys), list(grouped), ends) == expected


def test_names_that_are_not_utf8_or_hold_a_newline_group_member_by_member() -> None:
    odd = Found.of_members([("k\udcff.cls", 512, 1, 0), ("k\udcff.jpg", 1536, 1, 0)])
    assert isinstance(odd.names, list)  # surrogate escapes: no Arrow strings
    assert group_members(odd, "x.tar", None)[0] == ["k\udcff"]
    newline = Found.of_members([("a.cls\n", 512, 1, 0), ("a.b\nc.x", 1536, 1, 0)])
    assert group_members(newline, "x.tar", None) == _group_one_by_one(newline, "x.tar", None)


def _header(name: bytes, size_field: bytes, prefix: bytes = b"") -> bytes:
    """A ustar header with these raw name, size and prefix fields, its checksum right."""
    hdr = bytearray(512)
    hdr[: len(name)] = name
    hdr[100:108] = b"0000644\0"
    hdr[124 : 124 + len(size_field)] = size_field
    hdr[156:157] = b"0"
    hdr[257:263] = b"ustar\0"
    hdr[263:265] = b"00"
    hdr[345 : 345 + len(prefix)] = prefix
    hdr[148:156] = b" " * 8
    hdr[148:156] = b"%06o\0 " % sum(hdr)
    return bytes(hdr)


@pytest.mark.parametrize(
    ("name", "size_field", "prefix"),
    [
        (b"k1.cls\0garbage", b"00000000003\0", b""),  # bytes after the name's NUL
        (b"k1.cls", b"         3 \0", b""),  # a size written with spaces
        (b"k1.cls", b"3\0" + b"\0" * 10, b""),  # a short size field
        (b"k1.cls", b"000000000003", b""),  # twelve digits, no NUL
        (b"k1.cls", b"00000000003\0", b"dir/sub"),  # ustar's prefix
        (b"k\xff1.cls", b"00000000003\0", b""),  # not UTF-8
    ],
)
def test_the_walk_reads_header_fields_as_tarfile_does(
    name: bytes, size_field: bytes, prefix: bytes
) -> None:
    body = _header(name, size_field, prefix) + b"abc".ljust(512, b"\0")
    key = name.split(b"\0")[0].rsplit(b".", 1)[0]
    data = body + _header(key + b".txt", b"00000000001\0", prefix) + b"x".ljust(512, b"\0")
    data += bytes(1024)
    f = io.BytesIO(data)
    walked = _walk_headers(f, "x.tar")
    assert walked[:2] == _tarfile_members(f, "x.tar", None)[:2]
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        first = tf.getmembers()[0]
    assert next(iter(walked[0]))[:3] == (first.name, first.offset_data, first.size)
    index = scan_tar(io.BytesIO(data), "x.tar", len(data))
    assert index["num_records"] == 1
    assert index["details"]["members"][0][0][1:] == [512, 3]


def test_index_columns_from_arrays_equal_those_from_lists() -> None:
    from shardstream.loader.index.table import layout_columns, plain

    members = [(f"k{i // 3:04d}.{'abc'[i % 3]}", 512 * (2 * i + 1), i % 7, 0) for i in range(300)]
    scanned = dict(zip(("keys", "members"), group_members(Found.of_members(members), "x", None)))
    empty = dict(zip(("keys", "members"), group_members(Found.of_members([]), "e", None)))
    assert isinstance(scanned["members"], Members) and isinstance(empty["members"], Members)
    shards = [scanned, None, {"deferred": "counts.json"}, empty, dict(scanned)]
    from_arrays = layout_columns(shards)
    from_lists = layout_columns([None if d is None else plain(d) for d in shards])
    assert from_arrays.keys() == from_lists.keys()
    for name, column in from_lists.items():
        assert from_arrays[name].type == column.type, name
        assert from_arrays[name].equals(column), name
