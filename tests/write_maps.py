"""Functions of a batch for write_shards' tests, at a module's top level so the writer's
spawned processes import them (as a user's `--map MODULE:FUNCTION`)."""

from __future__ import annotations

import os
import signal
from typing import Any

__all__ = ["KILL_AT", "char_tokens", "kill_at", "words"]

KILL_AT = "SHARDSTREAM_TEST_KILL_AT"  # the record id at which kill_at kills its process


def words(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """A record a word (any number of rows out), dropping documents that say 'skip'."""
    out: dict[str, list[Any]] = {"doc": [], "word": [], "position": []}
    for doc, text in zip(batch["id"], batch["text"]):
        if "skip" in text:
            continue
        for i, word in enumerate(text.split()):
            out["doc"].append(doc)
            out["word"].append(word)
            out["position"].append(i)
    return out


def char_tokens(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """A character tokenizer: each document's code points, then 0 (the end)."""
    return {"input_ids": [[ord(c) % 1000 + 1 for c in t] + [0] for t in batch["text"]]}


def kill_at(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """The batch as it is; SIGKILL to this process when it holds record id $KILL_AT."""
    at = os.environ.get(KILL_AT)
    if at is not None and int(at) in batch["id"]:
        os.kill(os.getpid(), signal.SIGKILL)
    return batch
