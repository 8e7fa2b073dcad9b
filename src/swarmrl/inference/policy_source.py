"""A worker's policies: announced checkpoints fetched through SHARDCAST, checked, loaded.

Fetching runs beside generation. On a slow link a checkpoint takes a large share of a
step to arrive, and a worker that stopped generating to fetch it would lose that share
of its work every step. So the worker hands the fetch to one background thread
(``Prefetch``) and keeps generating with the policy it holds, as far as the
orchestrator's async bound lets it; it swaps the new policy in between assignments,
once the bytes are in and checked. Loading (a few hundredths of a second for the
embedded model) stays on the worker's own thread, like everything that touches the
model. Only a worker with no policy yet waits for the fetch.
"""

from __future__ import annotations

import logging
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from pathlib import Path

from swarmrl.checkpoints import load_policy
from swarmrl.protocol import models as api
from swarmrl.shardcast.client import FetchError, FetchResult, fetch, resolve_version

log = logging.getLogger("swarmrl.worker")

# A checkpoint is announced a moment before the relays have mirrored it. The background
# fetch looks for it this long, this often (a relay checks its upstream every 0.2 s by
# default), so the worker starts fetching as soon as a relay lists it rather than at
# its next look between assignments.
LISTING_WAIT_SECONDS = 5.0
LISTING_POLL_SECONDS = 0.2


class PolicySource:
    """Fetches announced checkpoints through SHARDCAST into the worker's policy cache."""

    def __init__(self, cache: Path, timeout: float = 10.0, deltas: bool = True) -> None:
        self.cache = cache
        self.timeout = timeout
        self.deltas = deltas
        self.bytes_by_server: dict[str, int] = {}
        # policies fetched by route: "delta" (rebuilt from the one held) or "full"
        self.fetches: dict[str, int] = {}

    def fetch(
        self, servers: list[str], checkpoint: api.CheckpointInfo, wait_s: float = 0.0
    ) -> FetchResult:
        """Fetch and verify the announced checkpoint (safe off the worker's thread: it
        touches only the cache); raises FetchError when the servers do not hold it (after
        ``wait_s`` seconds of looking, every ``LISTING_POLL_SECONDS``) or hold other bytes
        than the orchestrator announced."""
        if not servers:
            raise FetchError("the orchestrator names no relay and no origin to fetch from")
        listed = resolve_version(
            servers, checkpoint.step, self.timeout, wait_s, LISTING_POLL_SECONDS
        ).entry.blake3
        if listed != checkpoint.blake3:
            raise FetchError(
                f"checkpoint {checkpoint.step} is listed with BLAKE3 {listed} on "
                f"{', '.join(servers)}, but the orchestrator announced {checkpoint.blake3}"
            )
        return fetch(servers, checkpoint.step, self.cache, timeout=self.timeout, deltas=self.deltas)

    def open(self, result: FetchResult):
        """Count a finished fetch and load its policy: (model, tokenizer)."""
        for server, n in result.bytes_by_server.items():
            self.bytes_by_server[server] = self.bytes_by_server.get(server, 0) + n
        self.fetches[result.route] = self.fetches.get(result.route, 0) + 1
        log.info(
            "fetched policy %d by %s: %d bytes in %.2f s%s",
            result.version,
            result.route,
            result.bytes_fetched,
            result.seconds,
            f" (delta refused: {result.delta_refused})" if result.delta_refused else "",
        )
        policy = load_policy(result.path)
        # Older downloads are no longer needed once the newer policy is loaded; the
        # newest stays, the base of the next delta.
        for old in self.cache.glob("v*"):
            if old != result.path and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
        return policy

    def load(self, servers: list[str], checkpoint: api.CheckpointInfo):
        """Fetch, verify and load the announced checkpoint, all on this thread."""
        return self.open(self.fetch(servers, checkpoint))


class Prefetch:
    """At most one ``PolicySource.fetch`` running on a background thread."""

    def __init__(self, source: PolicySource) -> None:
        self.source = source
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="policy-fetch")
        self._future: Future[FetchResult] | None = None
        self.checkpoint: api.CheckpointInfo | None = None  # the one being fetched

    @property
    def busy(self) -> bool:
        """A fetch was started and not yet taken."""
        return self._future is not None

    @property
    def ready(self) -> bool:
        return self._future is not None and self._future.done()

    def start(self, servers: list[str], checkpoint: api.CheckpointInfo) -> None:
        if self._future is not None:
            raise RuntimeError(f"policy {self.checkpoint} is still being fetched")
        self.checkpoint = checkpoint
        self._future = self._pool.submit(
            self.source.fetch, servers, checkpoint, LISTING_WAIT_SECONDS
        )

    def wait(self, timeout: float | None = None) -> None:
        """Until the fetch in flight is done, at most ``timeout`` seconds (none: return)."""
        if self._future is not None:
            wait_for([self._future], timeout=timeout)

    def pause(self, seconds: float) -> None:
        """Sleep ``seconds``, or less if the policy being fetched arrives first: it may be
        what the pool is waiting for."""
        if self._future is not None:
            wait_for([self._future], timeout=seconds)
        else:
            time.sleep(seconds)

    def take(self) -> FetchResult:
        """The finished fetch's result, or the exception it raised; the slot is free again."""
        future = self._future
        if future is None or not future.done():
            raise RuntimeError("no finished policy fetch to take")
        self._future = None
        return future.result()

    def close(self) -> None:
        """Stop taking fetches; one in flight ends on its own timeouts."""
        self._pool.shutdown(wait=False, cancel_futures=True)
