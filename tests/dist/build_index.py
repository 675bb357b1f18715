"""Under torchrun: all ranks build the index of each source given, one after another; each
rank prints a digest of the index it got (or the error it raised), and the bytes it read.

A failed build leaves the process group usable: the next source builds on every rank."""

import hashlib
import json
import sys

import torch.distributed as dist

from loader.distributed_index import build_distributed
from loader.retry import bytes_fetched

dist.init_process_group(backend="gloo")
options = json.loads(sys.argv[1]) or None
for source in sys.argv[2:]:
    before = bytes_fetched()
    try:
        index = build_distributed(json.loads(source), options)
        doc = json.dumps(index.to_json(), sort_keys=True)
        result = {"digest": hashlib.sha256(doc.encode()).hexdigest(), "shards": len(index)}
    except Exception as e:
        result = {"error": type(e).__name__, "message": str(e)}
    result["fetched"] = bytes_fetched() - before
    print("RESULT", json.dumps(result), flush=True)
dist.destroy_process_group()
