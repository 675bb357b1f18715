"""Under torchrun: all ranks build (or load) the index of each source given, one after
another, as StreamingDataset does; each rank prints a digest of the index it got (or the
error it raised), and the shard bytes it read.

A failed build leaves the process group usable: the next source builds on every rank."""

import hashlib
import json
import sys

import torch.distributed as dist

from shardstream.loader.index.shared import shared_index
from shardstream.loader.storage.retry import RetryPolicy, bytes_fetched

dist.init_process_group(backend="gloo")
options = json.loads(sys.argv[1]) or None
for source in sys.argv[2:]:
    before = bytes_fetched()
    try:
        index = shared_index(json.loads(source), options, RetryPolicy())
        doc = json.dumps(index.to_json(), sort_keys=True)
        result = {"digest": hashlib.sha256(doc.encode()).hexdigest(), "shards": len(index)}
    except Exception as e:
        result = {"error": type(e).__name__, "message": str(e)}
    result["fetched"] = bytes_fetched() - before
    print("RESULT", json.dumps(result), flush=True)
dist.destroy_process_group()
