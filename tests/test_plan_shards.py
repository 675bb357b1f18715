"""shardstream.plan (the shardstream-plan command): its outputs against the library."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import fsspec
import pytest

from shardstream.loader import ShardIndex
from shardstream.plan.cli import main
from shardstream.sampler import ShardSampler

from .datagen import SIZES, write_dataset

REPO = Path(__file__).resolve().parents[1]


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main([*argv, "--json"]) == 0
    out = capsys.readouterr().out
    return json.loads(out)  # stdout holds the JSON and nothing else


@pytest.fixture
def dataset(tmp_path: Path) -> str:
    write_dataset(fsspec.filesystem("file"), str(tmp_path / "d"), "parquet", row_group_size=5)
    return str(tmp_path / "d")


@pytest.mark.parametrize(("world", "workers", "drop_last"), [(3, 1, False), (4, 2, True)])
def test_json_matches_the_sampler(
    capsys: pytest.CaptureFixture[str], dataset: str, world: int, workers: int, drop_last: bool
) -> None:
    """Per rank and per worker: the records, shards and bytes of the sampler's own plans, the
    records' share of the stored bytes, the padding (or the records dropped)."""
    args = [dataset, "--world-size", str(world), "--workers", str(workers), "--seed", "5"]
    args += ["--epoch", "2"] + (["--drop-last"] if drop_last else [])
    doc = run_json(capsys, *args)
    index = ShardIndex.build(dataset)
    assert (doc["num_shards"], doc["num_records"], doc["world_size"]) == (6, sum(SIZES), world)
    whole = [index.bytes_for(k, 0, n) for k, n in enumerate(SIZES)]
    per_worker = iter(doc["per_worker"])
    for rank, row in enumerate(doc["per_rank"]):
        s = ShardSampler(SIZES, world, rank, seed=5, drop_last=drop_last)
        s.set_epoch(2)
        plans = [s.plan(w, workers) for w in range(workers)]
        fetched = [
            sum(
                index.bytes_for(int(x), int(a), int(b))
                for x, a, b in zip(p.shards, p.starts, p.stops)
            )
            for p in plans
        ]
        shares = [
            round(
                sum(whole[x] * (b - a) / SIZES[x] for x, a, b in zip(p.shards, p.starts, p.stops))
            )
            for p in plans
        ]
        shards = {int(x) for p in plans for x in p.shards}
        assert row == {
            "rank": rank,
            "records": len(s),
            "shards": len(shards),
            "bytes": sum(fetched),
            "share_bytes": sum(shares),
        }
        for w, plan in enumerate(plans):
            assert next(per_worker) == {
                "rank": rank,
                "worker": w,
                "records": len(plan),
                "bytes": fetched[w],
                "share_bytes": shares[w],
                "amplification": fetched[w] / shares[w],
            }
    # 125 records over 3 ranks: 42 each, 1 padded; over 4 with drop_last: 31 each, 1 dropped
    assert (doc["padded_records"], doc["dropped_records"]) == ((0, 1) if drop_last else (1, 0))
    worst = max(doc["per_worker"], key=lambda w: w["amplification"])
    assert doc["worst_worker"] == {k: worst[k] for k in ("rank", "worker", "amplification")}
    assert doc["balance"] == 1.0


def test_table_and_saved_index(
    capsys: pytest.CaptureFixture[str], dataset: str, tmp_path: Path
) -> None:
    saved = tmp_path / "out.index.json"
    assert main([dataset, "--world-size", "2", "--save-index", str(saved)]) == 0
    out = capsys.readouterr().out
    assert "6 shards, 125 records over 2 ranks" in out
    assert "balance (max/min records): 1.000" in out
    assert ShardIndex.load(str(saved)).shards == ShardIndex.build(dataset).shards
    # the saved index is a SOURCE of its own, and plans the same
    again = run_json(capsys, str(saved), "--world-size", "2")
    assert again["per_rank"] == run_json(capsys, dataset, "--world-size", "2")["per_rank"]


def test_simulation(capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(
        capsys, "--simulate-shards", "100000", "--records-per-shard", "1000", "--world-size", "512"
    )
    assert doc["num_records"] == 10**8
    assert [r["records"] for r in doc["per_rank"]] == [10**8 // 512 + 1] * 512
    assert all(r["bytes"] is None for r in doc["per_rank"])
    assert max(r["shards"] for r in doc["per_rank"]) <= 100000 // 512 + 2
    assert 7.0 < doc["mixing"] <= 8.0


def test_simulation_defaults_to_1000_records_a_shard(capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(capsys, "--simulate-shards", "1000", "--world-size", "4")
    assert doc["num_records"] == 10**6


def test_one_ranks_plan(capsys: pytest.CaptureFixture[str], dataset: str) -> None:
    args = [dataset, "--world-size", "3", "--rank", "1", "--workers", "2", "--seed", "5"]
    doc = run_json(capsys, *args)
    index = ShardIndex.build(dataset)
    s = ShardSampler(SIZES, 3, 1, seed=5)
    assert doc["records"] == len(s) and [w["worker"] for w in doc["workers"]] == [0, 1]
    for w in doc["workers"]:
        plan = s.plan(w["worker"], 2)
        assert w["records"] == len(plan)
        assert w["pieces"] == [
            {
                "shard": int(x),
                "url": index.shards[int(x)].url,
                "start": int(a),
                "stop": int(b),
                "bytes": index.bytes_for(int(x), int(a), int(b)),
            }
            for x, a, b in zip(plan.shards, plan.starts, plan.stops)
        ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"rank 1 of 3 over 6 shards (seed 5, epoch 0): {len(s)} records")


def test_plot(capsys: pytest.CaptureFixture[str], dataset: str, tmp_path: Path) -> None:
    png = tmp_path / "plan.png"
    assert main([dataset, "--world-size", "3", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["/no/such/dir", "--world-size", "2"], "error: /no/such/dir: no such file"),
        (["--world-size", "2"], "give either SOURCE, --simulate-shards or --stream"),
        (["x", "--world-size", "2", "--rank", "2"], "--rank must be in [0, 2)"),
        (["x", "--world-size", "0"], "--world-size must be >= 1, got 0"),
        (["x", "--world-size", "2", "--storage-options", "{"], "not valid JSON"),
    ],
)
def test_errors_are_one_line_without_traceback(argv: list[str], message: str) -> None:
    cmd = [sys.executable, "-m", "shardstream.plan", *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_console_command_over_s3_with_aws_endpoint_url(s3: Any) -> None:
    fs = s3.fs()
    fs.mkdir("plans")
    write_dataset(fs, "plans/d", "tar")
    exe = shutil.which("shardstream-plan", path=str(Path(sys.executable).parent))
    assert exe is not None, "pip install -e . installs the shardstream-plan command"
    env = {**os.environ, "AWS_ENDPOINT_URL": s3.endpoint_url}
    cmd = [exe, "s3://plans/d", "--world-size", "4", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    doc = json.loads(proc.stdout)
    assert doc["num_records"] == sum(SIZES)
    assert [r["records"] for r in doc["per_rank"]] == [32] * 4
    assert all(r["bytes"] > 0 for r in doc["per_rank"])


def test_mixture_json_matches_the_sampler(
    capsys: pytest.CaptureFixture[str], dataset: str, tmp_path: Path
) -> None:
    write_dataset(fsspec.filesystem("file"), str(tmp_path / "t"), "tar", sizes=[9, 4])
    args = ["--stream", f"pq={dataset}:3", "--stream", f"tar={tmp_path / 't'}:1"]
    doc = run_json(capsys, *args, "--epoch-size", "100", "--world-size", "2", "--workers", "2")
    from shardstream.sampler import MixtureSampler

    m = MixtureSampler([SIZES, [9, 4]], [3.0, 1.0], 100, 2, 0, names=["pq", "tar"])
    assert [s["records_per_rank"] for s in doc["streams"]] == list(m.counts) == [38, 12]
    assert [s["pass_records_per_rank"] for s in doc["streams"]] == [63, 7]
    pq_stream, tar_stream = doc["streams"]
    assert pq_stream["passes_per_epoch"] == pytest.approx(38 / 63)
    assert pq_stream["pass_ends_epoch"] == 1  # 63 records of the pass at 38 an epoch
    assert tar_stream["pass_ends"][:3] == [0, 1, 1]  # 7-record passes at 12 an epoch
    assert [r["records"] for r in doc["per_rank"]] == [50, 50]
    assert all(sum(r["bytes_per_stream"]) == r["bytes"] > 0 for r in doc["per_rank"])
    assert [r["records_per_stream"] for r in doc["per_rank"]] == [[38, 12]] * 2


def test_mixture_table_simulation_and_plot(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    png = tmp_path / "mix.png"
    argv = ["--stream", "web=simulate:3000x1000:0.7", "--stream", "code=simulate:40x50:0.3"]
    assert main([*argv, "--world-size", "8", "--epoch-size", "80000", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "2 streams, 80,000 records an epoch over 8 ranks" in out
    assert "code" in out and "7,000" in out  # 0.3 of the 10,000 per rank
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_mixture_phases_per_rank_and_stream(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--stream", "web=simulate:100x1000", "--stream", "code=simulate:20x1000"]
    phases = ["--phase", "90000:web=0.8,code=0.2", "--phase", "10000:code=1"]
    doc = run_json(capsys, *argv, *phases, "--world-size", "8", "--workers", "2")
    from shardstream.sampler import MixtureSampler

    schedule = [(90000, {"web": 0.8, "code": 0.2}), (10000, {"code": 1})]
    m = MixtureSampler([[1000] * 100, [1000] * 20], None, None, 8, 0, names=["web", "code"],
                       schedule=schedule)  # fmt: skip
    assert doc["phases"] == [
        {"items": 90000, "per_rank": 11250, "records_per_stream": [9000, 2250]},
        {"items": 10000, "per_rank": 1250, "records_per_stream": [0, 1250]},
    ]
    assert [list(c) for c in m.phases.counts] == [[9000, 2250], [0, 1250]]
    assert [s["records_per_rank"] for s in doc["streams"]] == [9000, 3500]
    assert main([*argv, *phases, "--world-size", "8"]) == 0
    out = capsys.readouterr().out
    assert "   2         10,000     1,250            0        1,250" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--stream", "web", "--world-size", "2"], "expected NAME=SOURCE[:WEIGHT]"),
        (["--stream", "w=x:-1", "--world-size", "2"], "weight must be > 0"),
        (["x", "--stream", "w=x", "--world-size", "2"], "give no SOURCE or --simulate-shards"),
        (["x", "--epoch-size", "5", "--world-size", "2"], "--epoch-size and --phase apply to"),
        (["x", "--phase", "5:a=1", "--world-size", "2"], "--epoch-size and --phase apply to"),
        (["--stream", "w=simulate:2x3:1", "--phase", "6:w=1"], "no :WEIGHT on --stream w"),
        (["--stream", "w=simulate:2x3", "--phase", "6"], "expected ITEMS:NAME=WEIGHT"),
        (["--stream", "w=simulate:ax3", "--world-size", "2"], "not simulate:SHARDSxRECORDS"),
    ],
)
def test_mixture_argument_errors(argv: list[str], message: str) -> None:
    cmd = [sys.executable, "-m", "shardstream.plan", *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_a_simulated_plan_never_imports_torch() -> None:
    """Planning is numpy only: a simulated plan of 1,000,000 shards over 4,096 ranks runs
    without importing torch (whose import is most of a second or more)."""
    code = (
        "import sys; from shardstream.plan.cli import main; "
        "rc = main(['--simulate-shards', '1000000', '--world-size', '4096', '--rank', '7', "
        "'--json']); assert rc == 0; print('torch' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    doc, imported = proc.stdout.strip().splitlines()
    assert json.loads(doc)["records"] == 10**9 // 4096 + 1
    assert imported == "False"


def test_pack_figures_match_the_dataset(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """--pack-column/--pack-length over a real index: the blocks every rank makes and the
    tokens dropped are what the packing dataset says; --save-index keeps the token counts,
    so the saved index packs without reading a token."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from shardstream.loader import Pack, StreamingDataset

    (tmp_path / "d").mkdir()
    for s in range(3):
        rows = [list(range(7 * i % 50 + 1)) for i in range(40 + s)]
        pq.write_table(
            pa.table({"ids": pa.array(rows, pa.list_(pa.int32()))}), tmp_path / "d" / f"{s}.parquet"
        )
    saved = tmp_path / "t.index.arrow"
    args = [str(tmp_path / "d"), "--pack-column", "ids", "--pack-length", "64", "--eos", "0"]
    doc = run_json(capsys, *args, "--world-size", "3", "--save-index", str(saved))
    ds = StreamingDataset(tmp_path / "d", pack=Pack("ids", 64, eos=0), num_replicas=3, rank=2)
    figures = ds.stats()["pack"]
    assert doc["blocks_per_rank"] == len(ds) == figures["blocks_per_rank"] > 0
    assert doc["tokens"] == figures["tokens"] and doc["tokens_dropped"] == figures["tokens_dropped"]
    assert doc["tokens_per_rank"] == 64 * len(ds) and doc["block_spread"] == 0
    assert "tokens:ids" in ShardIndex.load(saved).table.column_names


def test_pack_simulation_at_scale_never_imports_torch() -> None:
    """1,000,000 shards x 4,096 ranks, simulated: closed-form figures, no torch import."""
    code = (
        "import sys; from shardstream.plan.cli import main; "
        "rc = main(['--simulate-shards', '1000000', '--records-per-shard', '100', "
        "'--tokens-per-document', '500', '--pack-length', '2049', '--eos', '2', "
        "'--world-size', '4096', '--json']); assert rc == 0; print('torch' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    out, imported = proc.stdout.strip().splitlines()
    doc = json.loads(out)
    tokens = 10**8 * 501
    assert doc["tokens"] == tokens
    assert doc["blocks_per_rank"] == (tokens // 2049) // 4096
    assert doc["tokens_dropped"] == tokens - 4096 * doc["blocks_per_rank"] * 2049
    assert imported == "False"


def test_mixture_pack_phases_per_rank_and_stream(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """--stream with --pack-length: the blocks and tokens each rank takes of each stream in
    each phase, what a packing mixture dataset of that schedule plans."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from shardstream.loader import Pack, Stream, StreamingDataset

    for name, docs in (("web", 300), ("code", 100)):
        (tmp_path / name).mkdir()
        rows = [list(range(1, 16)) for _ in range(docs)]  # 15 tokens + eos: 16 a document
        pq.write_table(pa.table({"ids": rows}), tmp_path / name / "p.parquet")
    streams = ["--stream", f"web={tmp_path / 'web'}", "--stream", f"code={tmp_path / 'code'}"]
    phases = ["--phase", "200:web=3,code=1", "--phase", "50:code=1"]
    pack = ["--pack-column", "ids", "--pack-length", "32", "--eos", "0", "--world-size", "2"]
    doc = run_json(capsys, *streams, *phases, *pack)
    ds = StreamingDataset(
        [Stream(str(tmp_path / n), name=n) for n in ("web", "code")],
        pack=Pack("ids", 32, eos=0),
        schedule=[(200, {"web": 3, "code": 1}), (50, {"code": 1})],
        num_replicas=2,
        rank=1,
    )
    assert doc["streams"] == ds.stats()["pack"]
    assert doc["streams"]["web"]["blocks_per_rank"] == 300 * 16 // 32 // 2
    assert doc["phases"] == [
        {"blocks_per_rank": 100, "tokens_per_rank": 3200, "per_stream": {"web": 75, "code": 25}},
        {"blocks_per_rank": 25, "tokens_per_rank": 800, "per_stream": {"web": 0, "code": 25}},
    ]
    assert len(ds) == 125
    assert main([*streams, *phases, *pack]) == 0
    assert "           2           25              800            0           25" in (
        capsys.readouterr().out
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--stream", "w=simulate:2x3", "--pack-length", "8"], "reads the streams"),
        (["--stream", "w=x", "--pack-length", "8"], "--pack-column, no simulate:"),
        (["--simulate-shards", "5", "--pack-length", "8"], "needs --tokens-per-document"),
        (["d", "--pack-length", "8"], "needs --pack-column"),
        (["d", "--pack-column", "x"], "need --pack-length"),
    ],
)
def test_pack_argument_errors(argv: list[str], message: str) -> None:
    cmd = [sys.executable, "-m", "shardstream.plan", *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


# --- sizes with units, simulated bytes, --help, flags that would do nothing -----------------


def _simulated_bytes(rank: int, world: int, workers: int, group: int) -> tuple[int, int]:
    """(bytes fetched, the records' share) of a rank of 8 simulated shards of 1,000 rows,
    200 MB each, in groups of `group` rows: the groups each piece overlaps, whole."""
    s = ShardSampler([1000] * 8, world, rank)
    fetched = share = 0
    for w in range(workers):
        plan = s.plan(w, workers)
        for a, b in zip(plan.starts.tolist(), plan.stops.tolist()):
            groups = range(a // group, -(-b // group))
            rows = sum(min(1000, (g + 1) * group) - g * group for g in groups)
            fetched += rows * 200_000
            share += (b - a) * 200_000
    return fetched, share


def test_simulated_shards_have_bytes_with_units(capsys: pytest.CaptureFixture[str]) -> None:
    """--shard-bytes 200MB (as --cache-limit takes units) and --rows-per-group: bytes per
    rank and amplification from a uniform layout, the same as --shard-bytes 200000000."""
    argv = ["--simulate-shards", "8", "--world-size", "4", "--workers", "3"]
    doc = run_json(capsys, *argv, "--shard-bytes", "200MB", "--rows-per-group", "300")
    assert doc == run_json(capsys, *argv, "--shard-bytes", "200000000", "--rows-per-group", "300")
    for r in doc["per_rank"]:
        assert (r["bytes"], r["share_bytes"]) == _simulated_bytes(r["rank"], 4, 3, 300)
    assert doc["bytes_stored"] == 8 * 200_000_000
    assert doc["read_amplification"] == sum(r["bytes"] for r in doc["per_rank"]) / 1.6e9 > 1.1
    assert doc["advice"]["rows_per_group"] == 1 + (2000 // 3) // 20  # 16 MB would be 80,000
    one_group = run_json(capsys, *argv, "--shard-bytes", "200MB")  # as pandas writes
    assert one_group["single_group_shards"] == 8
    assert one_group["read_amplification"] > doc["read_amplification"]
    assert main([*argv, "--shard-bytes", "200MB"]) == 0
    out = capsys.readouterr().out
    assert "fetched/share" in out and "read amplification: the readers fetch" in out
    assert f"{_simulated_bytes(0, 4, 3, 1000)[0]:,}" in out


def test_a_simulation_without_bytes_says_how_to_get_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--simulate-shards", "8", "--world-size", "4"]) == 0
    out = capsys.readouterr().out
    assert "give --shard-bytes" in out and "read amplification" not in out


def test_help_says_what_each_flag_does() -> None:
    cmd = [sys.executable, "-m", "shardstream.plan", "--help"]
    out = " ".join(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.split())
    assert "write the index (JSON) here" not in out  # it writes what the suffix says
    assert "an Arrow IPC file for PATH ending in .index.arrow, JSON for .json" in out
    assert "e.g. 200MB" in out and "e.g. 50GB (not given: no bound)" in out
    assert "--rows-per-group N rows of each simulated row group" in out
    assert "several (what a shell glob expands to) are planned as one dataset" in out
    for flag in ("--seed SEED", "--epoch EPOCH", "--drop-last"):
        assert flag in out and f"{flag} --" not in out  # each has a help text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--simulate-shards", "5", "--shard-bytes", "lots"], "--shard-bytes must be bytes > 0"),
        (["--simulate-shards", "5", "--save-index", "i.json"], "need one dataset's SOURCE"),
        (["d", "--rows-per-group", "5"], "--rows-per-group describes --simulate-shards"),
        (["--simulate-shards", "5", "--rows-per-group", "0"], "--rows-per-group must be >= 1"),
        (["--simulate-shards", "5", "--rank", "0", "--plot", "p.png"], "--plot draws every"),
    ],
)
def test_flags_that_would_do_nothing_are_refused(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit):
        main([*argv, "--world-size", "2"])
    assert message in capsys.readouterr().err


def test_amplification_reads_as_sentences(capsys: pytest.CaptureFixture[str], dataset: str) -> None:
    """Row groups too large for 32 readers, none of them a whole shard: whole sentences (no
    "...once: and every rank..."), wrapped at 100 columns, with the worst worker's factor."""
    assert main([dataset, "--world-size", "8", "--workers", "4"]) == 0
    out = capsys.readouterr().out
    text = " ".join(out.split())
    assert "once: and" not in text and "shards are one row group" not in text
    assert "read amplification: the readers fetch" in text and "the worst worker (rank" in text
    assert "too small for 8 ranks x 4 workers" in text
    assert all(len(line) <= 100 for line in out.splitlines() if "shardstream-write" not in line)
