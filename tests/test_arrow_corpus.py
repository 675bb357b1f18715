"""The Apache arrow-testing corpus (tests/arrow_corpus.py): every file, locally and over S3
(moto), in record and batch mode, read exactly as pyarrow reads the same bytes or refused
by a ShardError naming the file. Each case runs in a child process with a time limit, so a
crash or a hang fails that case alone, by name."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.arrow_corpus import corpus_files, make_cases, run_cases, s3_copy, unpack

BACKENDS = ("local", "s3")
MODES = ("record", "batch")

# Files pyarrow reads that record mode refuses, and why (the refusal must say so). Batch
# mode may also refuse what its contract cannot hold (nulls in an integer tensor, ...),
# by name.
REFUSED = {
    # pyarrow has no Python array class for month intervals: to_pylist cannot either
    "generated_interval": "month_interval",
    # several columns of one name: a record holds one value a name
    "generated_duplicate_fieldnames": "columns are named",
    "generated_union": "columns are named",  # (the older writers named both columns alike)
    # values Python's datetime / timedelta cannot hold (pyarrow's to_pylist fails alike)
    "generated_datetime": "out of range",
    "generated_duration": "too large",
    # fuzzed footers: a footer filling the whole file (no leading magic), pages that
    # decode to fewer rows than the footer says
    "4740205688193024": "footer length",
    "5665099979423744": "footer length",
    "5697144926502912": "decode to 0 rows",
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, Any]]]:
    """Every case's outcome, by id (`backend-mode-name`)."""
    files = unpack(tmp_path_factory.mktemp("arrow-testing"))
    with s3_copy(files) as (prefix, opts, keys):
        cases = make_cases(files, {"local": ("", {}), "s3": (prefix, opts)})
        yield run_cases(cases, {**os.environ, **keys})


def _reason(name: str) -> str | None:
    return next((why for key, why in REFUSED.items() if key in name), None)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", corpus_files())
def test_arrow_testing_file(
    name: str, backend: str, mode: str, outcomes: dict[str, dict[str, Any]]
) -> None:
    r = outcomes[f"{backend}-{mode}-{name}"]
    assert r["outcome"] in ("read", "refused"), f"{r['outcome']}: {r.get('error')}"
    if r["outcome"] == "refused" and r["pyarrow"] == "reads":
        why = _reason(name)
        if mode == "record" or why is not None:
            assert why is not None, f"pyarrow reads it, we refused it: {r['error']}"
            assert why in r["error"], r["error"]


def test_the_corpus_reads_where_pyarrow_does(outcomes: dict[str, dict[str, Any]]) -> None:
    """Most of the IPC files pyarrow reads, we read too, in both modes (the rest are the
    refusals above); none that pyarrow refuses."""
    ipc = {k: r for k, r in outcomes.items() if "-ipc/" in k}
    readable = [k for k, r in ipc.items() if r["pyarrow"] == "reads" and "-record-" in k]
    read = [k for k in readable if ipc[k]["outcome"] == "read"]
    assert len(readable) > 250 and len(read) > 0.8 * len(readable), (len(read), len(readable))
    wrongly_read = [
        k for k, r in outcomes.items() if r["pyarrow"] != "reads" and r["outcome"] == "read"
    ]
    assert not wrongly_read
