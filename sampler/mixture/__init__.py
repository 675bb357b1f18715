"""Mixture planning: a weighted mixture of sharded streams, planned per rank and worker.

- `sampler`: `MixtureSampler` (and `MixturePart`, `PassPiece`, `stream_seed`).
- `args`: a mixture's arguments, checked (names, shard sizes, weights, seeds).
- `schedule`: an epoch's per-stream counts and the stratified schedule.
- `passes`: where a rank stands in one stream: passes, their cuts over ranks, cursors.
- `read`: what a part of an epoch reads (pass pieces), streams merged by the schedule.
- `state`: a mixture sampler's state (stream cursors) as JSON integers, and back.

``from shardstream.sampler.mixture import MixtureSampler`` works as it did when this was one
module; the sampler's names are imported when first used (PEP 562), so planning alone
never imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_names

if TYPE_CHECKING:
    from .sampler import MixturePart, MixtureSampler, PassPiece, stream_seed

__all__ = ["MixturePart", "MixtureSampler", "PassPiece", "stream_seed"]

__getattr__, __dir__ = lazy_names(__name__, dict.fromkeys(__all__, ".sampler"), globals())
