"""scripts.bench.index's output: a table for each section's rows."""

from __future__ import annotations

from typing import Any


def report(doc: dict[str, Any]) -> None:
    for r in doc.get("distributed", []):
        fetched = "/".join(f"{x:.1f}" for x in r["fetched_mb"])
        cpu = "/".join(f"{x:.2f}" for x in r["client_cpu_s"])
        print(
            f"{r['format']:<8} {r['where']:<6} R={r['ranks']}  {r['shards']:>5} shards  "
            f"{r['seconds']:6.2f}s  x{r['speedup']:.2f}  {r['per_shard_ms']:.2f} ms/shard  "
            f"fetched MB per rank {fetched} (shards {r['shard_mb']:.0f} MB); CPU s per rank "
            f"{cpu}, server {r['server_cpu_s']:.2f}"
        )
    for r in doc.get("latency", []):
        print(
            f"latency: {r['shards']} shards, pool {r['pool']}: {r['round_trips']:.1f} round trips "
            f"(ideal {r['ideal_round_trips']}), {r['requests']} requests"
        )
    for r in doc.get("tar", []):
        print(
            f"tar {r['shards']:<44} {r['where']:<6} {r['how']:<10} {r['seconds']:6.2f}s "
            f"{r['fetched_mb']:9.2f} MB of {r['shard_mb']:.0f} MB"
        )
    for r in doc.get("crossover", []):
        if r["kind"] == "costs":
            print(
                f"read costs {r['where']:<22} small read {r['request_ms']:.2f} ms, sequential "
                f"{r['mb_per_s']:.0f} MB/s: ranged reads win past ~{r['crossover_kb']:.0f} KiB"
            )
        else:
            print(
                f"end to end {r['where']}, {r['member_kb']:>5} KiB members: sequential "
                f"{r['sequential']:.4f}s, ranged {r['ranged']:.4f}s"
            )
    for r in doc.get("startup", []):
        index = f"index {r['index_s']:.3f}s, " if "index_s" in r else ""
        print(f"startup {r['how']:<24} {index}first record {r['first_s']:.3f}s")
    est = doc.get("estimate")
    if est:
        print(
            f"estimate: {est['per_shard_s'] * 1000:.2f} ms/shard scanned, "
            f"{est['list_page_s']:.3f} s per LIST page, "
            f"{est['bytes_per_shard']:.0f} B/shard gathered, "
            f"{est['unpickle_us'] + est['assemble_us']:.1f} us/shard to unpickle and assemble"
        )
        for r, e in est["at"].items():
            print(
                f"  1,000,000 shards, R={r}: {e['total_s']:.0f}s (listing {e['listing_s']:.0f}, "
                f"scan {e['scan_s']:.1f}, gather+assemble {e['gather_assemble_s']:.1f}; "
                f"{e['gathered_mb_per_rank']:.0f} MB gathered per rank)"
            )
