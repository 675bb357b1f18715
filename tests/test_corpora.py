"""The world's test corpora (Apache parquet-testing, webdataset's test shards), read
locally, over S3 (moto), over HTTP from a server honouring Range and from one ignoring
it, in record mode and batch mode: each file reads exactly as pyarrow / webdataset read
it, or is refused by a ShardError naming it (where pyarrow also fails, where the batch
contract refuses its columns, or where the server ignores Range). Never different
values, never a crash of the interpreter."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardstream.loader import ShardError, ShardIndex, StreamingDataset
from shardstream.loader.formats.parquet.meta import FOOTERS
from shardstream.loader.storage.ranged_get import RangeIgnoredError
from tests.conftest import moto_server
from tests.corpora import (
    batch_columns,
    batch_same,
    corpus_names,
    same,
    unpack,
    webdataset_samples,
)
from tests.httpd import http_server

BACKENDS = ["local", "s3", "http", "http-no-range"]
NAMES = corpus_names()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return unpack(tmp_path_factory.mktemp("corpora"))


@pytest.fixture(scope="module")
def servers(corpus: dict[str, Path]) -> Iterator[dict[str, str]]:
    root = next(iter(corpus.values())).parents[1]
    with http_server(root, ranges=True) as ranged, http_server(root, ranges=False) as plain:
        yield {"http": ranged, "http-no-range": plain}


@pytest.fixture(scope="module")
def corpus_s3(corpus: dict[str, Path]) -> Iterator[dict[str, Any]]:
    """A moto S3 server of this module's own holding every corpus file in bucket
    "corpora" (uploaded once: the shared server is reset by other tests); yields the
    storage_options that reach it."""
    import s3fs

    keys = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update(keys)
    try:
        with moto_server() as endpoint:
            opts: dict[str, Any] = {"client_kwargs": {"endpoint_url": endpoint}}
            fs = s3fs.S3FileSystem(**opts, skip_instance_cache=True)
            fs.mkdir("corpora")
            fs.pipe({f"corpora/{name}": path.read_bytes() for name, path in corpus.items()})
            yield opts
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _where(
    name: str, path: Path, backend: str, servers: dict[str, str], request: pytest.FixtureRequest
) -> tuple[str, dict[str, Any]]:
    """(URL, storage_options) of the corpus file on the backend."""
    if backend == "local":
        return str(path), {}
    if backend == "s3":
        return f"s3://corpora/{name}", request.getfixturevalue("corpus_s3")
    return f"{servers[backend]}/{name}", {}


HEAVY = {"parquet/large_string_map.brotli.parquet"}


@functools.cache
def _reference(path: Path) -> tuple[pa.Table | None, list[dict[str, Any]] | None]:
    """pyarrow's table and Python rows of the file (None, None where it refuses it)."""
    try:
        table = pq.read_table(path)
        return table, table.to_pylist()  # pyarrow's Python values: what records hold
    except Exception:
        return None, None


def _read(url: str, opts: dict[str, Any], batch: int | None) -> list[Any]:
    """The file read whole. Remote, as a job reading an index built before: the footers
    the build parsed are forgotten, so each is fetched with the first column chunks, from
    their places in the index (ParquetFormat.fetch_many)."""
    source: Any = url
    if url.startswith(("s3://", "http")):
        source = ShardIndex.build(url, opts)
        FOOTERS.clear()
    ds = StreamingDataset(source, shuffle=False, storage_options=opts, batch_size=batch)
    return list(ds)


def _refused(error: BaseException, url: str, backend: str) -> None:
    """A refusal must be a ShardError naming the file (a server ignoring Range: saying so)."""
    assert isinstance(error, ShardError), f"{type(error).__name__}: {error}"
    assert url in str(error), str(error)
    if backend == "http-no-range" and isinstance(error, RangeIgnoredError):
        assert "ignores Range" in str(error) or "sent bytes" in str(error)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", [n for n in NAMES if not n.startswith("wds/")])
def test_parquet_corpus(
    name: str,
    backend: str,
    corpus: dict[str, Path],
    servers: dict[str, str],
    request: pytest.FixtureRequest,
) -> None:
    path = corpus[name]
    table, rows = _reference(path)
    url, opts = _where(name, path, backend, servers, request)
    outcomes = []
    # a file whose strings decode to > 2 GB (pyarrow refuses it after ~10 s of work, in a
    # column it reads the same way in both modes) is read in record mode only
    modes = (None,) if name in HEAVY else (None, 7)
    for batch in modes:
        try:
            got = _read(url, opts, batch)
        except Exception as e:
            _refused(e, url, backend)
            outcomes.append("refused")
            if backend != "http-no-range" and table is not None and batch is None:
                pytest.fail(f"pyarrow reads {name}, we refused it in record mode: {e}")
            continue
        assert table is not None, f"pyarrow refuses {name}, we read {len(got)} items"
        if batch is None:
            assert same(got, rows)
        else:
            columns = batch_columns(got)
            want = {c: table.column(c).to_pylist() for c in table.column_names}
            assert sorted(columns) == sorted(want) or table.num_rows == 0
            for c, values in columns.items():
                assert batch_same(values, want[c]), c
        outcomes.append("read")
    if backend == "local" and table is not None:
        assert outcomes[0] == "read"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", [n for n in NAMES if n.startswith("wds/")])
def test_webdataset_corpus(
    name: str,
    backend: str,
    corpus: dict[str, Path],
    servers: dict[str, str],
    request: pytest.FixtureRequest,
) -> None:
    path = corpus[name]
    want = [
        {k: v for k, v in s.items() if not k.startswith("__") or k == "__key__"}
        for s in webdataset_samples(path)
    ]
    url, opts = _where(name, path, backend, servers, request)
    try:
        got = _read(url, opts, None)
    except Exception as e:
        assert backend == "http-no-range", f"{type(e).__name__}: {e}"
        _refused(e, url, backend)
        assert isinstance(e, RangeIgnoredError)
        return
    assert [r["__url__"] for r in got] == [url] * len(got)
    assert [{k: v for k, v in r.items() if k != "__url__"} for r in got] == want
    batches = _read(url, opts, 3)
    assert [k for b in batches for k in b["__key__"]] == [s["__key__"] for s in want]
