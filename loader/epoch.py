"""The epoch a dataset reads and what its readers did, in memory every process shares.

A DataLoader's workers hold copies of the dataset (forked, or pickled for spawn), so a
plain attribute set in the main process after they start never reaches them, and the
main process never hears what they read. A tensor in shared memory is seen by all of
them (torch passes it to workers as the same memory, for fork and spawn alike), which
gives three things:

- ``set_epoch`` reaches workers already running (``persistent_workers=True``);
- ``state_dict()`` in the main process can tell that workers did the reading, where its
  own count (nothing) would be a wrong resume position;
- a second full pass over the same epoch without ``set_epoch`` (the same order again,
  without a word) is noticed, and warned about once;
- a warning given by a worker (read amplification) is given once, not by every worker of
  every epoch.
"""

from __future__ import annotations

import warnings

import torch

__all__ = ["EpochState"]

_EPOCH, _SELECTED, _FINISHED, _WORKERS, _WARNED, _ONCE = range(6)


class EpochState:
    """The selected epoch; how often an epoch was selected (``set_epoch`` calls); the
    selection a full pass last finished under; whether DataLoader workers read the
    current epoch; whether the repeat warning was given."""

    def __init__(self) -> None:
        self._t = torch.zeros(6, dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]

    @property
    def epoch(self) -> int:
        return int(self._t[_EPOCH])

    def select(self, epoch: int) -> None:
        """``set_epoch``: another epoch forgets that workers read the previous one."""
        t = self._t
        if epoch != int(t[_EPOCH]):
            t[_WORKERS] = 0
        t[_EPOCH] = epoch
        t[_SELECTED] += 1

    def begin(self, in_worker: bool, first: bool, shuffle: bool) -> None:
        """A pass starts (`first`: in the main process or DataLoader worker 0). Warns, once
        per dataset, when a full pass already ran since the epoch was last selected: with
        `shuffle` the pass repeats that order, which is what a loop without ``set_epoch``
        does every epoch."""
        t = self._t
        if in_worker:
            t[_WORKERS] = 1
        if not (first and shuffle) or int(t[_FINISHED]) != int(t[_SELECTED]) + 1:
            return
        if not int(t[_WARNED]):
            t[_WARNED] = 1
            warnings.warn(
                f"StreamingDataset: another pass over epoch {self.epoch} without set_epoch(): "
                "it repeats the previous pass's order. Call ds.set_epoch(epoch) at the start "
                "of each epoch (as with DistributedSampler); warned once",
                UserWarning,
                stacklevel=4,
            )

    def finish(self, first: bool) -> None:
        """A pass read all its records (`first`: main process or worker 0)."""
        if first:
            self._t[_FINISHED] = int(self._t[_SELECTED]) + 1

    def once(self) -> bool:
        """True the first time it is asked, in any of the processes sharing this state
        (a warning given once per dataset, not once per worker or epoch)."""
        t = self._t
        first = not int(t[_ONCE])
        t[_ONCE] = 1
        return first

    @property
    def workers_read(self) -> bool:
        """Whether DataLoader workers read (part of) the current epoch."""
        return bool(int(self._t[_WORKERS]))
