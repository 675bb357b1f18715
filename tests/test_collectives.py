"""loader.index.collectives: the object collectives the index build makes, equal to torch's, and
returning only once the process group's thread let go of their tensors (a fork after one
could otherwise hang; see the module's docstring)."""

from __future__ import annotations

import json

from shardstream.loader.index.distributed import Failure

from .conftest import REPO, torchrun

JOB = REPO / "tests" / "dist" / "collectives_job.py"


def test_object_collectives_match_torchs_and_let_go_of_their_tensors() -> None:
    world = 3
    lines = [json.loads(out.strip().splitlines()[-1]) for out in torchrun(JOB, nproc=world)]
    objects: list[object] = [
        {"rank": r, "data": "x" * (1000 * r), "ids": list(range(r * 7))} for r in range(world)
    ]
    objects[1] = Failure("ShardError", "part-1 is cut", "on rank 1")
    for rank, line in enumerate(lines):
        assert line["rank"] == rank
        assert line["ours"] == line["torch"] == repr([objects, objects[world - 1]])
        assert line["same_object"] is (rank == world - 1)
        assert line["tensor"] == [0, 10, 20, 30, 40]
        # all_gather_object (sizes, bytes), broadcast_object twice (size, bytes), broadcast:
        # 7 collectives, and every one returned with its tensors let go
        assert len(line["held"]) == 7
        assert all(count == 0 for call in line["held"] for count in call), line["held"]
