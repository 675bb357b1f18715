"""Helpers shared by the tests: one resume check reused by every stateful iterable."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import islice
from typing import Any, Protocol


class StatefulEpochs(Protocol):
    def __iter__(self) -> Any: ...
    def set_epoch(self, epoch: int) -> None: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def take(it: Iterable[Any], k: int) -> list[Any]:
    return list(islice(iter(it), k))


def check_resume(
    make: Callable[[], StatefulEpochs],
    positions: Iterable[int],
    epoch: int = 0,
    key: Callable[[Any], Any] = lambda x: x,
) -> None:
    """Resume mid-epoch, at the start, at the end and into the next epoch.

    For each k: a fresh object yields k items, its state is saved and loaded into another
    fresh object, which must yield exactly the items the first had not yet yielded, in the
    same order; then, after set_epoch(epoch + 1), a whole new epoch.
    """
    ref = make()
    ref.set_epoch(epoch)
    full = [key(x) for x in ref]
    ref.set_epoch(epoch + 1)
    next_epoch = [key(x) for x in ref]
    for k in sorted({0, len(full), *positions}):
        first = make()
        first.set_epoch(epoch)
        head = [key(x) for x in take(first, k)]
        assert head == full[:k]
        state = first.state_dict()
        second = make()
        second.load_state_dict(state)
        second.set_epoch(epoch)  # the usual training loop calls it again: must keep the resume
        tail = [key(x) for x in second]
        assert tail == full[k:], f"resume at {k} of {len(full)}"
        second.set_epoch(epoch + 1)
        assert [key(x) for x in second] == next_epoch
