"""scripts.bench.cloud: shardstream over S3 against the raw loops it must match, in one
table (records/s, x the raw pyarrow loop over the same S3 files)::

    python -m scripts.bench.cloud [--latency-ms 30 --mbps 100] [--rounds N] [--only a,b]
                                  [--json]

The data (32 Parquet shards x 4,096 records: ``id`` int64, ``tokens`` list<int32> of 128,
``text`` of 200-800 characters, row groups of 1,024; a second copy of them; the same
records as 32 WebDataset tar shards) is written once per invocation in a temporary folder
and uploaded, unshaped, to a moto S3 server on 127.0.0.1 (bucket ``bench``), with the
saved indexes the rows read (built unshaped, not timed).

Every measured run is a fresh process (``python -m scripts.bench.cloud.child``) whose S3
traffic goes through tests/s3proxy.py's counting proxy (shaped as --latency-ms and --mbps
say); the child reports its clock's start and its first record in ``time.monotonic()``
and the parent counts, from the proxy's timeline, the requests that reached the server
before the first record and how many of them stood in line.

The modules: data (shards, uploads, column-chunk ranges), child (the measured runs, in the
child process), runs (the rows, spawning the children, the proxy's counts), table (the
markdown table). Only the public API of shardstream is used (StreamingDataset, Stream,
ShardIndex), so that the same script measures an older checkout: the children import
shardstream from whatever the parent's PYTHONPATH puts first.
"""

from __future__ import annotations

BUCKET = "bench"
SHARDS = 32
PER_SHARD = 4_096
ROW_GROUP = 1_024
TOKENS = 128
TEXT_CHARS = (200, 800)
BATCH = 256
COLUMNS = ["id", "tokens"]
CONCURRENCY = 16  # the raw ranged reader's requests in flight (our read_threads' default)
RANKS = 4  # the "rank 0 of 4" column
