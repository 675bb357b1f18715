"""loader.storage.trips on its own: `in_line` (the longest chain of requests each sent
after the last was answered) and a `Window`'s count, without a store (the counts against
a proxy in front of moto: test_round_trips)."""

from __future__ import annotations

import itertools
import random

from shardstream.loader.storage.trips import Window, in_line, took, trip


def _brute_in_line(spans: list[tuple[float, float]]) -> int:
    """The longest chain by trying every order of every subset (small inputs only)."""
    best = 0
    for k in range(1, len(spans) + 1):
        for chain in itertools.permutations(spans, k):
            if all(b[0] >= a[1] for a, b in itertools.pairwise(chain)):
                best = max(best, k)
    return best


def test_in_line_is_the_longest_chain_of_requests_each_after_the_last() -> None:
    assert in_line([]) == 0
    assert in_line([(0, 1), (0, 1), (0, 1)]) == 1  # sent together: one round trip
    assert in_line([(0, 1), (1, 2), (2, 3)]) == 3  # each sent when the last was answered
    assert in_line([(0, 1), (0.5, 3), (1, 2), (2, 3)]) == 3
    rng = random.Random(0)
    for _ in range(200):
        spans = []
        for _ in range(rng.randint(1, 6)):
            a = rng.randint(0, 8)
            spans.append((float(a), float(a + rng.randint(1, 4))))
        assert in_line(spans) == _brute_in_line(spans), spans


def test_a_window_sees_the_requests_made_while_it_is_open() -> None:
    with trip():
        pass  # no window open: nothing is kept
    window = Window()
    with trip():
        pass
    with trip(3):  # three sent together
        pass
    assert window.close() == (4, 2)
    with trip():
        pass
    assert window.close() == (4, 2)  # closed: later requests are not its


def test_a_request_in_flight_when_a_window_opens_is_not_its() -> None:
    """A request belongs to the windows open when it was sent: one still in flight when
    the next window opens (a listing page sent beside the look for an index and dropped,
    answered after the construction) is not one of that window's, and cannot stand in
    line before its requests (it made a saved index's start 3 in line on a loaded run)."""
    construction = Window()
    ahead = trip()
    ahead.__enter__()  # sent during the construction ...
    with trip():
        pass
    assert construction.close() == (1, 1)  # ... and not answered when it closed
    first_pass = Window()
    ahead.__exit__(None, None, None)  # answered once the pass began
    with trip():
        pass
    assert first_pass.close() == (1, 1)


def test_a_chain_ends_with_the_last_group_the_reader_took() -> None:
    """Reads ahead sent once the first groups came, and answered while the consumer was
    still making its first item, were not waited for: the chain ends with a request
    answered before the reader took its last group (a loaded machine, slow to decode the
    first item, counted a saved index's mixture 3 in line where 2 stood)."""
    window = Window()
    with trip():
        pass  # the look for the index
    with trip(2):
        pass  # the first groups ...
    took()  # ... taken
    with trip(3):
        pass  # reads ahead, answered before the first item
    assert window.close() == (6, 2)
    window = Window()  # no group taken (a construction): every request counts
    for _ in range(3):
        with trip():
            pass
    assert window.close() == (3, 3)
    took()  # no window open: nothing to note
    assert window.taken is None
