"""Links shared by their flows, and the relay tree that SHARDCAST versions travel down.

A server's uplink is shared equally by the downloads it is serving (processor sharing):
each flow gets min(its client's downlink, uplink / active flows), recomputed whenever a
flow starts or ends. The share a capped client leaves unused is not handed to the
others, so transfers come out a little slower than max-min fairness would make them.
Every transfer also pays a fixed `overhead` (connection set-up, discovery, hashing),
fitted from the measured fetch of a 4.27 MB checkpoint at 20 mbit (docs/architecture.md §8).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from swarmsim.events import EventQueue


@dataclass
class Flow:
    remaining: float  # bytes
    cap: float  # bytes/s: the client's downlink
    on_done: Callable[[], None]
    rate: float = 0.0


@dataclass
class Uplink:
    """A server's upload capacity, shared by the flows it serves."""

    name: str
    capacity: float  # bytes/s
    events: EventQueue
    overhead: float = 0.0
    served_bytes: float = 0.0
    flows: dict[int, Flow] = field(default_factory=dict)
    _last: float = 0.0
    _next_id: int = 0
    _token: int = 0  # invalidates a scheduled completion once the rates change

    def send(self, nbytes: float, client_cap: float, on_done: Callable[[], None]) -> None:
        """Start a transfer of `nbytes` to a client whose downlink is `client_cap`."""
        self.served_bytes += nbytes
        self.events.after(self.overhead, self._start, nbytes, client_cap, on_done)

    def _start(self, nbytes: float, client_cap: float, on_done: Callable[[], None]) -> None:
        self._advance()
        self.flows[self._next_id] = Flow(max(nbytes, 1.0), client_cap, on_done)
        self._next_id += 1
        self._reschedule()

    def _advance(self) -> None:
        now = self.events.clock.now
        dt = now - self._last
        if dt > 0:
            for f in self.flows.values():
                f.remaining -= f.rate * dt
        self._last = now

    def _reschedule(self) -> None:
        self._token += 1
        if not self.flows:
            return
        share = self.capacity / len(self.flows)
        soonest = float("inf")
        for f in self.flows.values():
            f.rate = min(f.cap, share)
            soonest = min(soonest, max(f.remaining, 0.0) / f.rate)
        self.events.after(soonest, self._complete, self._token)

    def _complete(self, token: int) -> None:
        if token != self._token:
            return
        self._advance()
        done = [k for k, f in self.flows.items() if f.remaining <= 1e-6 * max(f.cap, 1.0)]
        callbacks = [self.flows.pop(k).on_done for k in done]
        self._reschedule()
        for cb in callbacks:
            cb()


def tree_parents(relays: int, fanout: int) -> list[int]:
    """Each relay's upstream in a tree of the given fan-out: -1 is the origin, relays
    0..fanout-1 hang off it, the next fanout² off those, and so on (breadth first)."""
    if fanout < 1:
        raise ValueError("fan-out must be at least 1")
    return [-1 if i < fanout else i // fanout - 1 for i in range(relays)]


def tree_depths(parents: list[int]) -> list[int]:
    depths: list[int] = []
    for p in parents:
        depths.append(1 if p < 0 else depths[p] + 1)
    return depths
