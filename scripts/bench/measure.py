"""scripts.bench's measurement of one run, in a process of its own (`python -m scripts.bench
--one`, run in the repository's root): its time, items, time to first item, CPU, peak RSS
and bytes fetched; and the row that summarizes a run's rounds."""

from __future__ import annotations

import contextlib
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from scripts.bench import REPO
from scripts.bench.ours import RESTART, STATS
from scripts.bench.runs import RUNS

# the entry point that measures one run in its own process (--one), run in REPO
BENCH = ["-m", "scripts.bench"]


def _preload() -> None:
    """Import what the runs use before the clock starts: import time is not read time."""
    import importlib

    for module in (
        "torch",
        "torch.utils.data",
        "shardstream.loader",
        "s3fs",
        "webdataset",
        "datasets",
    ):
        with contextlib.suppress(ImportError):
            importlib.import_module(module)


def measure_one(
    name: str, data: Path, endpoint: str | None, opts: dict[str, Any]
) -> dict[str, Any]:
    """Run one measurement in this process: time, items, time to first item, peak RSS and
    the process's size after imports (the baseline the growth is counted from)."""
    _preload()
    from shardstream.loader.storage.retry import (
        bytes_fetched,  # this process's reads (not its workers')
    )

    fetched0 = 0
    base = _peak_rss_kb()
    cpu0 = _cpu_seconds()
    t0 = time.perf_counter()
    first, count = None, 0
    for n in RUNS[name][2](data, endpoint, opts):
        if n == RESTART:  # what came before was a warm-up: measure from here
            t0, cpu0, first, count = time.perf_counter(), _cpu_seconds(), None, 0
            fetched0 = bytes_fetched()
            continue
        if first is None:
            first = time.perf_counter() - t0
        count += n
    seconds = time.perf_counter() - t0
    cpu = _cpu_seconds() - cpu0
    own = _peak_rss_kb()
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # DataLoader workers

    return {
        "seconds": seconds,
        "cpu_s": cpu,
        "count": count,
        "first_s": first or 0.0,
        "peak_rss_mb": max(own, kids) / 1024,
        "base_rss_mb": base / 1024,
        "fetched": bytes_fetched() - fetched0,
        "stats": dict(STATS),
    }


def _cpu_seconds() -> float:
    """CPU seconds (user + system) of this process, all its threads, and of its children
    that have ended (DataLoader workers, joined when the loader finishes)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _peak_rss_kb() -> int:
    """This process's peak RSS in KiB: /proc's VmHWM, which is this program's own (getrusage's
    ru_maxrss also keeps the RSS of the bench process this one was forked from before its
    exec, which grows as the bench runs)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def run_isolated(
    name: str, data: Path, endpoint: str | None, opts: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    cmd = [sys.executable, *BENCH, "--one", name, "--data", str(data)]
    if endpoint:
        cmd += ["--endpoint", endpoint]
    if opts:
        cmd += ["--opts", json.dumps(opts)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        tqdm.write(f"  {name}: skipped ({tail})", file=sys.stderr)
        return None
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def summarize(
    name: str, results: list[dict[str, Any]], nbytes: dict[str, int], records: int
) -> dict[str, Any]:
    best = sorted(results, key=lambda r: r["seconds"])[len(results) // 2]
    kind = "tar" if "tar" in name or "webdataset" in name else "parquet"
    is_bytes = name == "raw s3fs read"
    # bytes our loader fetched in the measuring process (index included) against the
    # run's share of the shard bytes; runs with DataLoader workers fetch in the workers
    count = records if name.startswith("raw ranged GETs") else best["count"]
    # the shard bytes of the records the run yielded (all of them; 1/4 for rank 0 of 4; a
    # mixture's records come from the same shards, at the same bytes a record)
    share = nbytes[kind] * (count / records if name.startswith("ours") else 1)
    stats = best.get("stats") or {}
    fetched = 0
    if name.startswith("ours"):  # this process's reads (index included), and its workers'
        workers = stats.get("bytes_fetched", 0) if " w0" not in name else 0
        fetched = best.get("fetched", 0) + workers
    return {
        "run": name,
        "group": RUNS[name][1],
        "fetched_mb": fetched / 1e6 if fetched and kind == "parquet" else None,
        "fetched_x_share": fetched / share if fetched and kind == "parquet" else None,
        "records_per_s": None if is_bytes else count / best["seconds"],
        # CPU per record: the median over rounds (steadier than wall time on a shared machine)
        "cpu_us_per_record": None
        if is_bytes or not count
        else statistics.median(r.get("cpu_s", 0.0) / max(1, r["count"]) for r in results) * 1e6,
        "mb_per_s": share / best["seconds"] / 1e6,
        "seconds": best["seconds"],
        "first_item_s": statistics.median(r["first_s"] for r in results),
        "first_share": statistics.median(r["first_s"] / r["seconds"] for r in results),
        "peak_rss_mb": max(r["peak_rss_mb"] for r in results),
        "rss_growth_mb": max(r["peak_rss_mb"] - r.get("base_rss_mb", 0) for r in results),
        "held_mb": stats.get("peak_held_bytes", 0) / 2**20 or None,
        "stall_fraction": stats.get("stall_fraction"),
        "limit": RUNS[name][0] or None,
    }
