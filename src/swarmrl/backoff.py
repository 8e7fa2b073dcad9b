"""Retry delays that double with each failure: restarts of a process, a worker's policy loads."""

from __future__ import annotations


def backoff_delay(failures: int, base: float, cap: float) -> float:
    """Delay before retry number `failures` (1 = the first): base, 2·base, 4·base, … ≤ cap."""
    return min(cap, base * 2 ** max(0, failures - 1))
