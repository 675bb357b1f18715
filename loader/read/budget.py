"""The memory budget: a bound in bytes on the decoded data readers hold and read ahead."""

from __future__ import annotations

import threading

__all__ = ["DEFAULT_MEMORY_BUDGET", "MemoryBudget", "budget_of"]

# Measured (README): locally the cushion of decoded groups, not the budget, sets the memory
# held; over S3 with 30 ms to the first byte, 32-256 MiB read equally fast; 64 is the margin
DEFAULT_MEMORY_BUDGET = 64 << 20


class MemoryBudget:
    """A bound in bytes on the decoded data readers hold plus what they read ahead; one
    object may be shared by several readers (a mixture's streams) to bound them together.
    Thread-safe.

    A reader charges a group's estimated size when it starts reading it, its measured size
    once decoded, and refunds it when the group is let go. It reads ahead only while the
    charge fits; a group its consumer needs now is read even when it does not (the least
    memory the reading order allows), so `held` stays within `limit` plus the groups being
    waited for. `peak` is the most ever held.
    """

    def __init__(self, limit: int) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"memory_budget must be an int >= 0 (bytes), got {limit!r}")
        self.limit = limit
        self.held = 0
        self.peak = 0
        self._lock = threading.Lock()

    def charge(self, n: int, force: bool = False) -> bool:
        """Hold n more bytes if they fit (or `force`); False, holding nothing more, if not."""
        with self._lock:
            if not force and self.held + n > self.limit:
                return False
            self.held += n
            self.peak = max(self.peak, self.held)
            return True

    def refund(self, n: int) -> None:
        """Hold n fewer bytes (n < 0: more, e.g. when a group decoded larger than charged)."""
        with self._lock:
            self.held -= n
            self.peak = max(self.peak, self.held)


def budget_of(memory_budget: int | MemoryBudget | None) -> MemoryBudget:
    """A MemoryBudget from bytes (None: DEFAULT_MEMORY_BUDGET) or the shared object itself."""
    if isinstance(memory_budget, MemoryBudget):
        return memory_budget
    return MemoryBudget(DEFAULT_MEMORY_BUDGET if memory_budget is None else memory_budget)
