"""The tar index's fast header walk finds what Python's tarfile finds, or leaves it to
tarfile; a damaged header is named, never skipped."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import fsspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.loader import ShardError
from shardstream.loader.formats.tar.scan import (
    _NeedsTarfile,
    _tarfile_members,
    _walk_headers,
    scan_tar,
)


def _tar(fmt: int, members: list[tuple[str, bytes | None, bytes]]) -> bytes:
    """members: (name, payload or None for a directory, type flag)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for name, data, kind in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind == tarfile.SYMTYPE:
                info.linkname = "elsewhere"
            info.size = len(data) if data is not None else 0
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


PLAIN = [
    ("a/s1.cls", b"1", tarfile.REGTYPE),
    ("a/s1.jpg", b"x" * 512, tarfile.REGTYPE),  # exactly one block
    ("a/s1.json", b"", tarfile.REGTYPE),  # empty member
    ("dir", None, tarfile.DIRTYPE),
    ("a/link", None, tarfile.SYMTYPE),
    ("__meta__.json", b"{}", tarfile.REGTYPE),
    ("a/s2.cls", b"2" * 1000, tarfile.REGTYPE),
    ("p/" * 60 + "s3.cls", b"3", tarfile.REGTYPE),  # > 100 chars: ustar prefix field
]


@pytest.mark.parametrize(
    ("fmt", "members"),
    [
        (tarfile.USTAR_FORMAT, PLAIN),
        (tarfile.GNU_FORMAT, PLAIN[:-1]),  # GNU writes a long name as its own header
        (tarfile.PAX_FORMAT, PLAIN[:-1]),  # pax too: short ASCII names only here
    ],
)
def test_walk_matches_tarfile(fmt: int, members: list) -> None:
    data = _tar(fmt, members)
    f = io.BytesIO(data)
    assert _walk_headers(f, "x.tar")[:2] == _tarfile_members(f, "x.tar", None)[:2]
    found, _, _ = _walk_headers(f, "x.tar")
    assert [m[0] for m in found][-1] == members[-1][0]
    assert len(found) == len(members) - 2  # the directory and the link: no data


@pytest.mark.parametrize(
    ("fmt", "name"),
    [
        (tarfile.GNU_FORMAT, "n" * 150 + ".cls"),  # a GNU long-name header first
        (tarfile.PAX_FORMAT, "n" * 150 + ".cls"),  # a pax header with the path
        (tarfile.PAX_FORMAT, "é/s.cls"),  # non-ASCII: a pax header
    ],
)
def test_other_headers_are_left_to_tarfile(fmt: int, name: str) -> None:
    data = _tar(fmt, [(name, b"1", tarfile.REGTYPE)])
    with pytest.raises(_NeedsTarfile):
        _walk_headers(io.BytesIO(data), "x.tar")
    got = scan_tar(io.BytesIO(data), "x.tar", len(data))
    assert got["details"]["keys"] == [name.rsplit(".", 1)[0]]
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        (info,) = tf.getmembers()
    assert got["details"]["members"] == [[["cls", info.offset_data, 1]]]


def test_a_damaged_header_is_named() -> None:
    data = bytearray(_tar(tarfile.USTAR_FORMAT, PLAIN[:2]))
    second = 1024  # header of the second member (first: header + one data block)
    data[second + 10] ^= 0x55  # a byte of its name
    with pytest.raises(ShardError, match=r"x.tar: .*bad header checksum at byte 1024"):
        scan_tar(io.BytesIO(bytes(data)), "x.tar", len(data))


def test_many_members_across_read_buffers() -> None:
    members = [
        (f"k{i:05d}.{e}", bytes(i % 700), tarfile.REGTYPE) for i in range(3000) for e in "ab"
    ]
    data = _tar(tarfile.USTAR_FORMAT, members)  # ~3.5 MB: several 1 MiB buffers
    f = io.BytesIO(data)
    assert _walk_headers(f, "x.tar")[:2] == _tarfile_members(f, "x.tar", None)[:2]
    assert scan_tar(f, "x.tar", len(data))["num_records"] == 3000


def test_keys_and_extensions_split_as_webdataset_splits_them() -> None:
    from webdataset.tariterators import base_plus_ext

    from shardstream.loader.formats.tar.groups import KEY_EXT

    for name in ["a/b.c.d", "x.jpg", "dir.v2/x.tar.gz", "noext", "a/.hidden", "a/b.", "./s.cls"]:
        split = KEY_EXT.match(name)
        assert (split.groups() if split else (None, None)) == base_plus_ext(name)


def test_a_header_with_a_signed_checksum_is_accepted_as_tarfile_accepts_it() -> None:
    data = bytearray(_tar(tarfile.USTAR_FORMAT, [("é.cls", b"1", tarfile.REGTYPE)]))
    _, signed = tarfile.calc_chksums(bytes(data[:512]))  # old writers summed signed bytes
    data[148:156] = b"%06o\0 " % signed
    f = io.BytesIO(bytes(data))
    assert _walk_headers(f, "x.tar")[:2] == _tarfile_members(f, "x.tar", None)[:2]
    assert _walk_headers(f, "x.tar")[0] == [("é.cls", 512, 1, 0)]


# ---- ranged header reads: one small read per header, bodies skipped ----------------------


def _index_of(data: bytes, crossover: int | None) -> dict:
    return scan_tar(io.BytesIO(data), "x.tar", len(data), crossover=crossover)


def _tarfile_index(data: bytes) -> list[tuple[str, int, int]]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        return [(m.name, m.offset_data, m.size) for m in tf if m.isreg()]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["jpg", "cls", "json", "seg.png"]),
            st.integers(0, 40_000),
            st.booleans(),  # a new sample starts here
        ),
        max_size=40,
    ),
    st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT]),
)
def test_ranged_sequential_and_tarfile_give_the_same_index(members: list, fmt: int) -> None:
    names, key, used = [], 0, set()
    for ext, size, new in members:
        if new or (key, ext) in used:
            key += 1
        used.add((key, ext))
        names.append((f"s{key:04d}.{ext}", bytes([key % 251]) * size, tarfile.REGTYPE))
    data = _tar(fmt, names)
    sequential = _index_of(data, None)
    for crossover in (0, 1, 4096, 1 << 30):  # ranged from the start, soon, late, never
        assert _index_of(data, crossover) == sequential
    flat = [(f"{k}.{e}", o, n) for k, ms in zip(*sequential["details"].values()) for e, o, n in ms]
    assert flat == [(n.lower(), o, s) for n, o, s in _tarfile_index(data)]


def test_ranged_reads_skip_the_bodies(tmp_path: Path) -> None:
    from shardstream.loader.storage.ranges import RangeFile
    from shardstream.loader.storage.retry import RetryPolicy, bytes_fetched

    big = [(f"s{i}.bin", bytes(300_000), tarfile.REGTYPE) for i in range(12)]
    data = _tar(tarfile.USTAR_FORMAT, big)
    path = tmp_path / "big.tar"
    path.write_bytes(data)
    fs = fsspec.filesystem("file")
    got = {}
    for crossover in (None, 0, 100_000):
        before = bytes_fetched()
        raw = RangeFile(fs, str(path), len(data), RetryPolicy(), None)
        got[crossover] = (
            scan_tar(raw, str(path), len(data), crossover=crossover),
            bytes_fetched() - before,
        )
    assert got[None][0] == got[0][0] == got[100_000][0]
    assert got[None][1] >= len(data)  # every byte
    assert got[0][1] <= 13 * 8192  # a peek at each header and the end
    # chosen from the first 1 MiB: members 300 KB apart are past a 100 KB crossover
    assert got[100_000][1] <= (1 << 20) + 13 * 8192


def test_choose_ranged() -> None:
    from shardstream.loader.formats.tar.scan import choose_ranged

    assert choose_ranged(1 << 20, 3, 256 << 10)  # ~350 KB apart
    assert not choose_ranged(1 << 20, 100, 256 << 10)  # ~10 KB apart
    assert choose_ranged(1 << 20, 0, 256 << 10)  # the first member alone is larger
    assert not choose_ranged(1 << 20, 1, None)
