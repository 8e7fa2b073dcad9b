"""What a validator's long poll waits for: a count of the pool's uploads, and a bound on
how many requests may wait for it at once.

A validator that finds nothing to judge may ask the orchestrator to hold its request up
to `MAX_WAIT_SECONDS` (`POST /v1/validation/next?wait=S`): the request waits here, off
the pool's lock, until the count moves past what it saw before it looked, then looks
again. A file chosen for validation is listed to the trainer only after its verdict, so
the time a verdict takes to start is time a step may wait for; a poll every half second
cost a quarter second of it on average. Each waiting request holds a server thread, so
at most `max_waiters` wait; the others are answered at once, as without a wait. Once the
run's last checkpoint is announced nothing waits (`close`): validators hear the run is
over as fast as before.
"""

from __future__ import annotations

import threading

MAX_WAIT_SECONDS = 10.0  # the longest a request may ask to be held
MAX_WAITERS = 8  # requests held at once (each holds one of the server's threads)


class Arrivals:
    def __init__(self, max_waiters: int = MAX_WAITERS) -> None:
        self._news = threading.Condition()
        self._count = 0
        self._waiting = 0
        self._closed = False
        self.max_waiters = max_waiters

    @property
    def count(self) -> int:
        """Read before looking: a wait then ends at once if news came meanwhile."""
        with self._news:
            return self._count

    def notify(self) -> None:
        with self._news:
            self._count += 1
            self._news.notify_all()

    def close(self) -> None:
        """The run is over: the waiting requests are answered now, and none waits again."""
        with self._news:
            self._closed = True
            self._news.notify_all()

    def wait_past(self, seen: int, timeout: float) -> bool:
        """Wait until the count is past `seen` (True), or `timeout` seconds (False);
        False at once when closed or `max_waiters` requests are waiting already."""
        with self._news:
            if self._closed:
                return False
            if self._count != seen:
                return True
            if self._waiting >= self.max_waiters:
                return False
            self._waiting += 1
            try:
                self._news.wait_for(lambda: self._count != seen or self._closed, timeout)
                return self._count != seen and not self._closed
            finally:
                self._waiting -= 1
