"""The tar index's fast header walk finds what Python's tarfile finds, or leaves it to
tarfile; a damaged header is named, never skipped."""

from __future__ import annotations

import io
import tarfile

import pytest

from loader import ShardError
from loader.formats.tar import _NeedsTarfile, _tarfile_members, _walk_headers, scan_tar


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

    from loader.formats.tar import _KEY_EXT

    for name in ["a/b.c.d", "x.jpg", "dir.v2/x.tar.gz", "noext", "a/.hidden", "a/b.", "./s.cls"]:
        split = _KEY_EXT.match(name)
        assert (split.groups() if split else (None, None)) == base_plus_ext(name)


def test_a_header_with_a_signed_checksum_is_accepted_as_tarfile_accepts_it() -> None:
    data = bytearray(_tar(tarfile.USTAR_FORMAT, [("é.cls", b"1", tarfile.REGTYPE)]))
    _, signed = tarfile.calc_chksums(bytes(data[:512]))  # old writers summed signed bytes
    data[148:156] = b"%06o\0 " % signed
    f = io.BytesIO(bytes(data))
    assert _walk_headers(f, "x.tar")[:2] == _tarfile_members(f, "x.tar", None)[:2]
    assert _walk_headers(f, "x.tar")[0] == [("é.cls", 512, 1, 0)]
