"""The benchmarks, run from the repository's root:

    python -m scripts.bench ...          shardstream against the limits and the peers
                                         (__main__.py; its parts: data, measure, runs,
                                         limits, ours, peers, s3, stores, table)
    python -m scripts.bench.index ...    the index build (index/)
    python -m scripts.bench.scale ...    starting at scale (scale/)
    python -m scripts.bench.cache ...    epochs from S3 with a node cache, 4 ranks (cache/);
                                         scripts.bench.cache.epochs: cached epochs, one process
    python -m scripts.bench.ipc ...      Arrow IPC shards against pyarrow's readers
    python -m scripts.bench.sampler ...  the samplers' planning cost and mixing
    python -m scripts.bench.tokens ...   packing against numpy and torchtitan loops

The processes they start run the same way (``python -m scripts.bench...``, in REPO).
"""

from __future__ import annotations

from pathlib import Path

# the repository's root: the folder the benchmarks and the processes they start run in
REPO = Path(__file__).resolve().parents[2]
