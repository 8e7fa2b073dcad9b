"""Server choice: which server to ask for the next shard.

Each shard is drawn from the servers with probability ∝ success_rate × bandwidth (the
paper's and the reference's rule). Both are moving averages (α = 0.3),
started from timing ``data1.bin``; after every update each server's success rate heals
by ``heal`` so a server that failed is drawn again later.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Set
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from swarmrl.shardcast.layout import PROBE_FILE
from swarmrl.shardcast.transfer import HttpStatusError, TransferError, get_stream

log = logging.getLogger(__name__)

ALPHA = 0.3
HEAL = 0.02


@dataclass
class ServerScore:
    success_rate: float = 1.0
    bandwidth: float = 1.0  # bytes per second, moving average


class ServerChooser:
    """Draws a server with probability ∝ success_rate × bandwidth; thread-safe.

    ``rng`` makes the draws reproducible (tests pass a seeded ``random.Random``).
    """

    def __init__(
        self,
        servers: list[str],
        alpha: float = ALPHA,
        heal: float = HEAL,
        rng: random.Random | None = None,
    ):
        self.scores = {s: ServerScore() for s in servers}
        self.alpha = alpha
        self.heal = heal
        self.rng = rng or random.Random()
        self.lock = threading.Lock()

    def set_estimate(self, server: str, bandwidth: float | None, ok: bool) -> None:
        """Set the starting estimate of a server (None bandwidth: keep the current one)."""
        with self.lock:
            score = self.scores[server]
            score.success_rate = 1.0 if ok else 0.0
            if bandwidth is not None:
                score.bandwidth = bandwidth

    def record(self, server: str, ok: bool, bandwidth: float | None = None) -> None:
        with self.lock:
            score = self.scores[server]
            score.success_rate = self.alpha * float(ok) + (1 - self.alpha) * score.success_rate
            if ok and bandwidth is not None:
                score.bandwidth = self.alpha * bandwidth + (1 - self.alpha) * score.bandwidth
            for other in self.scores.values():
                other.success_rate = min(1.0, other.success_rate + self.heal)

    def add(self, server: str) -> None:
        """A server that started listing the version mid-download; it starts at the mean bandwidth."""
        with self.lock:
            if server not in self.scores:
                mean = sum(c.bandwidth for c in self.scores.values()) / max(1, len(self.scores))
                self.scores[server] = ServerScore(1.0, mean)

    def servers(self) -> set[str]:
        with self.lock:
            return set(self.scores)

    def weights(self) -> dict[str, float]:
        with self.lock:
            return {s: c.success_rate * c.bandwidth for s, c in self.scores.items()}

    def pick(self, avoid: Set[str] = frozenset()) -> str:
        weights = self.weights()
        candidates = [s for s in weights if s not in avoid] or list(weights)
        w = [weights[s] for s in candidates]
        if sum(w) <= 0:
            return self.rng.choice(candidates)
        return self.rng.choices(candidates, weights=w, k=1)[0]


def probe_servers(chooser: ServerChooser, timeout: float) -> None:
    """Start each server's bandwidth estimate by timing ``data1.bin`` (in parallel). With a
    single server there is nothing to choose, so nothing is downloaded."""
    if len(chooser.scores) < 2:
        return

    def probe(server: str) -> tuple[str, float | None, bool]:
        start = time.perf_counter()
        try:
            size = get_stream(
                f"{server}/{PROBE_FILE}", lambda _: None, timeout, buffer=bytearray(256 << 10)
            )
        except HttpStatusError:
            return server, None, True  # alive, just no probe file (the reference origin has none)
        except TransferError as exc:
            log.warning("server %s failed its probe: %s", server, exc)
            return server, None, False
        return server, size / max(time.perf_counter() - start, 1e-6), True

    with ThreadPoolExecutor(max_workers=len(chooser.scores)) as pool:
        results = list(pool.map(probe, list(chooser.scores)))
    known = [bw for _, bw, _ in results if bw is not None]
    default = sum(known) / len(known) if known else 1.0
    for server, bandwidth, ok in results:
        chooser.set_estimate(server, bandwidth if bandwidth is not None else default, ok)
