"""Run the seed document's three DistributedSampler examples against our drop-in.

The examples in scripts/seed_examples/ are byte-for-byte those of the seed document. To run
them "against our drop-in" this script changes exactly one line at load time,

    from torch.utils.data.distributed import DistributedSampler
 -> from shardstream.sampler import DistributedSampler

and, on a machine without CUDA, the examples' backend='nccl' becomes backend='gloo'.
Examples 1 and 2 call init_process_group, so they run under torchrun with 2 processes.

    python scripts/seed_examples.py                    # all three, ours, 2 ranks
    python scripts/seed_examples.py --impl torch       # the same with torch's class
    torchrun --nproc_per_node=2 scripts/seed_examples.py --example 1   # one, in place
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent / "seed_examples"
EXAMPLES = {
    1: HERE / "example1_distributed.py",
    2: HERE / "example2_set_epoch.py",
    3: HERE / "example3_drop_last.py",
}
NEEDS_PROCESS_GROUP = {1, 2}
TORCH_IMPORT = "from torch.utils.data.distributed import DistributedSampler"
OUR_IMPORT = "from shardstream.sampler import DistributedSampler"


def example_source(number: int, impl: str) -> str:
    """The example's code with the import (and, without CUDA, the backend) swapped."""
    import torch

    source = EXAMPLES[number].read_text(encoding="utf-8")
    if TORCH_IMPORT not in source:
        raise SystemExit(f"{EXAMPLES[number]} no longer imports DistributedSampler from torch")
    if impl == "shardstream":
        source = source.replace(TORCH_IMPORT, OUR_IMPORT)
    if not torch.cuda.is_available():
        source = source.replace("backend='nccl'", "backend='gloo'")
    return source


def run_in_process(number: int, impl: str) -> None:
    import torch.distributed as dist

    code = compile(example_source(number, impl), str(EXAMPLES[number]), "exec")
    exec(code, {"__name__": "__main__", "__file__": str(EXAMPLES[number])})
    sys.stdout.flush()
    if dist.is_initialized():
        dist.destroy_process_group()


def run_all(impl: str, nproc: int) -> int:
    for number, path in EXAMPLES.items():
        print(f"=== example {number}: {path.name} ({impl})", flush=True)
        cmd = [sys.executable, __file__, "--example", str(number), "--impl", impl]
        if number in NEEDS_PROCESS_GROUP:
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc_per_node={nproc}",
                *cmd[1:],
            ]
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        code = subprocess.call(cmd, env=env)
        if code != 0:
            print(f"example {number} failed with exit code {code}", file=sys.stderr)
            return code
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--example", type=int, choices=sorted(EXAMPLES))
    parser.add_argument("--impl", choices=["shardstream", "torch"], default="shardstream")
    parser.add_argument("--nproc", type=int, default=2, help="ranks for examples 1 and 2")
    args = parser.parse_args()
    if args.example is None:
        return run_all(args.impl, args.nproc)
    run_in_process(args.example, args.impl)
    return 0


if __name__ == "__main__":
    sys.exit(main())
