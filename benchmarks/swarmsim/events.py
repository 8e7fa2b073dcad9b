"""The simulated clock and the event queue: time moves only from one event to the next.

Events at the same time run in the order they were scheduled (a sequence number breaks
ties), so a run is a pure function of its parameters and its seed.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any


class SimClock:
    """The simulation's time in seconds; callable, so the `Pool` reads it as its clock."""

    def __init__(self, start: float = 1_000_000_000.0) -> None:
        self.start = start
        self.now = start

    def __call__(self) -> float:
        return self.now

    @property
    def elapsed(self) -> float:
        return self.now - self.start


class EventQueue:
    """Callbacks scheduled at simulated times, run in time order (then schedule order)."""

    def __init__(self, clock: SimClock) -> None:
        self.clock = clock
        self._heap: list[tuple[float, int, Callable[..., Any], tuple]] = []
        self._seq = 0
        self.processed = 0

    def at(self, when: float, fn: Callable[..., Any], *args: Any) -> None:
        if when < self.clock.now:
            raise ValueError(f"event at {when} is before now ({self.clock.now})")
        heapq.heappush(self._heap, (when, self._seq, fn, args))
        self._seq += 1

    def after(self, delay: float, fn: Callable[..., Any], *args: Any) -> None:
        self.at(self.clock.now + max(delay, 0.0), fn, *args)

    def run(self, until: float, stop: Callable[[], bool] = lambda: False) -> None:
        """Run every event due by `until` (absolute time), or until `stop()` is true."""
        heap = self._heap
        while heap and heap[0][0] <= until and not stop():
            when, _, fn, args = heapq.heappop(heap)
            self.clock.now = when
            self.processed += 1
            fn(*args)
        if not stop():
            self.clock.now = max(self.clock.now, until)

    def __len__(self) -> int:
        return len(self._heap)
