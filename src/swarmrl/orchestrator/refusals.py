"""The registrations the pool refused, newest per address: what `swarmrl status` shows, so
an operator sees why a member did not join without reading that member's log.

Kept in memory since the orchestrator started, at most `limit` addresses: anyone with a
key can be refused, and what strangers make the pool keep must stay bounded.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from swarmrl.protocol import models as api

REFUSALS_KEPT = 50


class RecentRefusals:
    def __init__(self, limit: int = REFUSALS_KEPT) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._by_address: OrderedDict[str, api.RefusedRegistration] = OrderedDict()

    def record(self, address: str, role: str, reason: str, at: float) -> None:
        with self._lock:
            self._by_address.pop(address, None)
            self._by_address[address] = api.RefusedRegistration(
                address=address, role=role, at=at, reason=reason
            )
            while len(self._by_address) > self.limit:
                self._by_address.popitem(last=False)

    def newest_first(self) -> list[api.RefusedRegistration]:
        with self._lock:
            return list(reversed(self._by_address.values()))
