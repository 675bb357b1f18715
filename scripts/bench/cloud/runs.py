"""scripts.bench.cloud's rows: what each runs (the child's spec), the fresh process or
torchrun job it runs in, and the figures the parent makes of the child's clock readings
and the proxy's timeline (requests before the first record, how many stood in line)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scripts.bench.cloud import BATCH, BUCKET, COLUMNS, CONCURRENCY, PER_SHARD, RANKS, SHARDS
from scripts.bench.cloud.child import PREFIX

WS1, R4 = "ws=1", f"rank 0 of {RANKS}"
TR = f"torchrun {RANKS} ranks"
PQ, TAR = f"s3://{BUCKET}/pq/", f"s3://{BUCKET}/tar/"  # the prefixes, without saved indexes
PQ_INDEX, TAR_INDEX = f"s3://{BUCKET}/pq.index.arrow", f"s3://{BUCKET}/tar.index.arrow"
CHILD = ["-m", "scripts.bench.cloud.child"]
TIMEOUT_S = 600  # one run's limit (a full pass)


@dataclass
class Context:
    """What the specs are made of: the proxies' URLs (the first for every run, one a rank
    under torchrun), the shards' keys and the ranges the raw ranged reader fetches."""

    endpoints: list[str]
    parquet: list[str]  # names of the Parquet shards, in order
    ranges: list[dict[str, Any]]  # per shard: its size and [start, end) ranges
    tars: list[str]  # names of the tar shards, in order

    @property
    def endpoint(self) -> str:
        return self.endpoints[0]


@dataclass(frozen=True)
class Row:
    """One line of the table: its key (for --only), its label, the row its records/s are
    compared with (None: it is a limit or peer itself) and the columns it runs in."""

    key: str
    label: str
    base: str | None
    spec: Callable[[Context, int], dict[str, Any]]
    columns: tuple[str, ...] = (WS1, R4)
    note: str = ""


def _ours(ctx: Context, ranks: int) -> dict[str, Any]:
    return {"kind": "ours", "endpoint": ctx.endpoint, "num_replicas": ranks, "rank": 0}


def _batches(ctx: Context, ranks: int) -> dict[str, Any]:
    return {**_ours(ctx, ranks), "batch_size": BATCH, "columns": COLUMNS}


def _raw_loop(ctx: Context, ranks: int) -> dict[str, Any]:
    keys = [f"{BUCKET}/pq/{name}" for name in ctx.parquet[::ranks]]
    return {"kind": "raw_loop", "endpoint": ctx.endpoint, "keys": keys, **_read()}


def _raw_ranges(ctx: Context, ranks: int) -> dict[str, Any]:
    files = [
        {"key": f"{BUCKET}/pq/{name}", **r}
        for name, r in zip(ctx.parquet[::ranks], ctx.ranges[::ranks])
    ]
    return {
        "kind": "raw_ranges",
        "endpoint": ctx.endpoint,
        "files": files,
        "concurrency": CONCURRENCY,
        **_read(),
    }


def _read() -> dict[str, Any]:
    return {"batch_size": BATCH, "columns": COLUMNS}


def _mixture(ctx: Context, ranks: int) -> dict[str, Any]:
    streams = [
        [f"s3://{BUCKET}/pq.index.arrow", 0.7, "a"],
        [f"s3://{BUCKET}/pq2.index.arrow", 0.3, "b"],
    ]
    return {**_batches(ctx, ranks), "streams": streams, "epoch_size": SHARDS * PER_SHARD}


def _tar(source: str) -> Callable[[Context, int], dict[str, Any]]:
    def spec(ctx: Context, ranks: int) -> dict[str, Any]:
        return {**_ours(ctx, ranks), "source": source}

    return spec


def _webdataset(ctx: Context, ranks: int) -> dict[str, Any]:
    urls = [f"{ctx.endpoint}/{BUCKET}/tar/{name}" for name in ctx.tars[::ranks]]
    return {"kind": "wds", "urls": urls}


def _ddp(source: str, batches: bool) -> Callable[[Context, int], dict[str, Any]]:
    """Ours under torchrun: each rank's dataset from `source` (a prefix or a saved index),
    batches or records, the group giving num_replicas and rank."""

    def spec(ctx: Context, ranks: int) -> dict[str, Any]:
        out = _batches(ctx, ranks) if batches else _ours(ctx, ranks)
        out.update(kind="ddp", endpoints=ctx.endpoints[:ranks], source=source)
        del out["num_replicas"], out["rank"], out["endpoint"]
        return out

    return spec


def _ddp_raw(ctx: Context, ranks: int) -> dict[str, Any]:
    """The raw loop in every rank of the torchrun job at once, each over its shards."""
    each = [
        {"kind": "raw_loop", "keys": [f"{BUCKET}/pq/{n}" for n in ctx.parquet[r::ranks]]}
        for r in range(ranks)
    ]
    return {**_read(), "kind": "ddp", "endpoints": ctx.endpoints[:ranks], "each": each}


def _ddp_wds(ctx: Context, ranks: int) -> dict[str, Any]:
    """webdataset in every rank of the torchrun job at once, each over its tars."""
    each = [
        {
            "kind": "wds",
            "urls": [f"{ctx.endpoints[r]}/{BUCKET}/tar/{n}" for n in ctx.tars[r::ranks]],
        }
        for r in range(ranks)
    ]
    return {"kind": "ddp", "endpoints": ctx.endpoints[:ranks], "each": each}


ROWS = [
    Row("raw", "raw pyarrow loop (limit)", None, _raw_loop),
    Row("ranges", f"raw reader, {CONCURRENCY} ranged GETs in flight", "raw", _raw_ranges),
    Row(
        "pq",
        "batches, no saved index",
        "raw",
        lambda c, r: {**_batches(c, r), "source": PQ},
    ),
    Row(
        "pq-index",
        "batches, saved index",
        "raw",
        lambda c, r: {**_batches(c, r), "source": PQ_INDEX},
    ),
    Row("mix", "mixture 0.7/0.3, saved indexes", "pq-index", _mixture, note="x ours"),
    Row("tar", "tar records, no saved index", "wds", _tar(TAR)),
    Row("tar-index", "tar records, saved index", "wds", _tar(TAR_INDEX)),
    Row("wds", "webdataset over S3 (http, curl)", None, _webdataset),
    Row("ddp-raw", f"raw pyarrow loop, {TR} at once", "raw", _ddp_raw, (R4,)),
    Row("ddp", f"batches, no saved index, {TR} (gloo)", "ddp-raw", _ddp(PQ, True), (R4,)),
    Row("ddp-index", f"batches, saved index, {TR}", "ddp-raw", _ddp(PQ_INDEX, True), (R4,)),
    Row("ddp-wds", f"webdataset, {TR} at once", "wds", _ddp_wds, (R4,)),
    Row("ddp-tar", f"tar records, no saved index, {TR}", "ddp-wds", _ddp(TAR, False), (R4,)),
]
BY_KEY = {row.key: row for row in ROWS}


def child_env() -> dict[str, str]:
    """The children's environment: the parent's, its PYTHONPATH made absolute (so each
    child imports shardstream from what the parent's PYTHONPATH puts first), fake AWS
    credentials for moto."""
    paths = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE"):
        env.pop(name, None)
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def _result(lines: str) -> dict[str, Any]:
    found = [x for x in lines.splitlines() if x.startswith(PREFIX)]
    if not found:
        raise RuntimeError("the child printed no result")
    out: dict[str, Any] = json.loads(found[-1][len(PREFIX) :])
    return out


def spawn(spec: dict[str, Any]) -> dict[str, Any]:
    """Run a spec in a fresh process (under torchrun, RANKS of them, for "ddp"): rank 0's
    result, or {"error": ...}."""
    try:
        if spec["kind"] == "ddp":
            from tests.conftest import torchrun

            extra = {k: v for k, v in child_env().items() if k.startswith(("AWS_", "PYTHON"))}
            outs = torchrun(
                "-m", *CHILD[1:], json.dumps(spec), nproc=RANKS, timeout=TIMEOUT_S, env=extra
            )
            return _result(outs[0])
        cmd = [sys.executable, *CHILD, json.dumps(spec)]
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=child_env(), timeout=TIMEOUT_S
        )
        if proc.returncode:
            tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
            return {"error": f"exit {proc.returncode}: {tail[-300:]}"}
        return _result(proc.stdout)
    except Exception as e:  # a row that fails is reported, the others still run
        return {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[-1:]}"}


def figures(result: dict[str, Any], proxy: Any) -> dict[str, Any]:
    """A run's figures: records/s over the pass, seconds to the first record, CPU per
    record, and the requests that reached the server (the run's first proxy) between the
    clock's start and the first record, and how many of those stood in line. Under
    torchrun, records/s and the first record are the job's (a rank's records over the
    slowest rank's pass; the last rank's first record), the requests rank 0's."""
    t0, first, end = result["t0"], result["first"], result["end"]
    arrived = [a for _, _, _, a, _ in list(proxy.timeline)]
    count = result["count"]
    slowest = result.get("slowest") or {"first_s": first - t0, "seconds": end - t0}
    seconds = slowest["seconds"]
    return {
        "records": count,
        "records_per_s": count / seconds if seconds > 0 else 0.0,
        "seconds": seconds,
        "first_s": slowest["first_s"],
        "cpu_us_per_record": result["cpu_s"] / count * 1e6 if count else None,
        "requests_before_first": sum(t0 <= a <= first for a in arrived),
        "in_line_before_first": proxy.in_line(t0, first),
        "requests_in_pass": sum(t0 <= a <= end for a in arrived),
    }


@dataclass
class Cell:
    """One row's figures in one column: the median over the rounds, and each round."""

    row: str
    column: str
    rounds: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    @property
    def median(self) -> dict[str, Any]:
        if not self.rounds:
            return {}
        keys = [k for k, v in self.rounds[0].items() if isinstance(v, int | float)]
        out: dict[str, Any] = {}
        for k in keys:
            values = [r[k] for r in self.rounds if isinstance(r.get(k), int | float)]
            out[k] = statistics.median(values) if values else None
        return out


def measure(row: Row, column: str, ctx: Context, rounds: int, proxy: Any) -> Cell:
    """Run a row's spec in one column `rounds` times."""
    cell = Cell(row.key, column)
    ranks = 1 if column == WS1 else RANKS
    for _ in range(rounds):
        result = spawn(row.spec(ctx, ranks))
        if "error" in result:
            cell.error = result["error"]
            return cell
        cell.rounds.append({**figures(result, proxy), "stats": result.get("stats")})
    return cell
