"""Shard transfers: fetch a set of shards of one version from several servers at once.

Shards are fetched by ``concurrency`` threads. For each shard a server is drawn by the
``ServerChooser``; a failed or corrupt shard is retried on a server that has not failed
it yet, up to ``max_attempts`` times, with exponential backoff, and the retry overwrites
the bytes that failed. With a manifest each shard is checked against its own BLAKE3 as it
arrives; without one (a reference origin) only sizes can be checked here and the caller
checks the whole file. A server that stops sending for ``timeout`` seconds, or sends a
shard slower than ``min_rate`` bytes/s on average, fails that shard. Bytes go straight
from the socket buffer to their place on disk: memory use is ``concurrency`` × 2 MiB
whatever the file size.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import blake3

from swarmrl.shardcast.choice import ServerChooser
from swarmrl.shardcast.discovery import VersionSource, read_distributions
from swarmrl.shardcast.errors import FetchError
from swarmrl.shardcast.layout import ShardInfo, shard_name, version_dir_name
from swarmrl.shardcast.transfer import BUFFER_SIZE, TransferError, get_stream

log = logging.getLogger(__name__)

MIN_RATE = 64 * 1024
"""Default floor (bytes/s) for one shard from one server: a shard still incomplete
``timeout + size / MIN_RATE`` seconds after its request is abandoned and retried on
another server, so a server that trickles bytes cannot hold a shard forever."""


@dataclass
class TransferStats:
    """Per-server byte counts and failures of one download; filled in as it runs."""

    bytes_by_server: Counter[str] = field(default_factory=Counter)
    failures: list[tuple[int, str, str]] = field(default_factory=list)
    """(shard index, server, reason) for every failed attempt."""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add_bytes(self, server: str, n: int) -> None:
        with self.lock:
            self.bytes_by_server[server] += n

    def add_failure(self, index: int, server: str, reason: str) -> None:
        with self.lock:
            self.failures.append((index, server, reason))


class _ShardSink:
    """Takes one attempt's body piece by piece: writes it in place, hashes and counts it."""

    def __init__(
        self,
        fd: int,
        offset: int,
        expected: int | None,
        server: str,
        stats: TransferStats,
        on_bytes: Callable[[int], None] | None,
    ) -> None:
        self.fd = fd
        self.offset = offset
        self.expected = expected
        self.server = server
        self.stats = stats
        self.on_bytes = on_bytes
        self.hasher = blake3.blake3()
        self.written = 0

    def __call__(self, piece: memoryview) -> None:
        if self.expected is not None and self.written + len(piece) > self.expected:
            raise TransferError(f"shard is longer than the expected {self.expected} bytes")
        os.pwrite(self.fd, piece, self.offset + self.written)
        self.hasher.update(piece)
        self.written += len(piece)
        self.stats.add_bytes(self.server, len(piece))
        if self.on_bytes is not None:
            self.on_bytes(len(piece))


ShardTarget = Callable[[int, int], tuple[Path, int]]
"""Where a shard goes: (index, offset of the shard in the version's file) -> (file, position
to write it at). One file for the whole version writes at the offset; one file per shard at 0."""


class ShardDownloader:
    """Downloads a set of shards of one version concurrently into their targets."""

    def __init__(
        self,
        source: VersionSource,
        chooser: ServerChooser,
        target: ShardTarget,
        *,
        concurrency: int = 8,
        timeout: float = 10.0,
        min_rate: float | None = MIN_RATE,
        max_attempts: int = 6,
        backoff_s: float = 0.1,
        stats: TransferStats | None = None,
        on_shard: Callable[[int, ShardInfo], None] | None = None,
        on_bytes: Callable[[int], None] | None = None,
        candidates: Sequence[str] = (),
        refresh_s: float = 2.0,
        prefix: str | None = None,
    ) -> None:
        self.source = source
        # the folder the shards are under on each server: v<N>, or a delta's under it
        self.prefix = prefix or version_dir_name(source.version)
        self.candidates = [c for c in candidates if c not in source.servers]
        self.refresh_s = refresh_s
        self.chooser = chooser
        self.target = target
        self.concurrency = concurrency
        self.timeout = timeout
        self.min_rate = min_rate
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.stats = stats or TransferStats()
        self.on_shard = on_shard
        self.on_bytes = on_bytes
        self.stop = threading.Event()
        # Without a manifest every shard but the last has the size of the first: learned
        # from shard 1, which is then fetched alone before the others.
        self.shard_size: int | None = source.manifest.shard_size if source.manifest else None

    def expected_size(self, index: int) -> int | None:
        if self.source.manifest is not None:
            return self.source.manifest.shards[index].size
        return self.shard_size if index < self.source.entry.num_shards - 1 else None

    def run(self, indices: list[int]) -> dict[int, ShardInfo]:
        """Fetch ``indices``; return what each shard turned out to be, or raise FetchError."""
        results: dict[int, ShardInfo] = {}
        if not indices:
            return results
        if self.shard_size is None:
            if 0 not in indices:
                raise ValueError(
                    "without a manifest the shard size must be known before fetching later shards"
                )
            results[0] = self._fetch_shard(0)
            self.shard_size = results[0].size
            indices = [i for i in indices if i != 0]
        queue = list(indices)
        lock = threading.Lock()
        errors: list[BaseException] = []

        def worker() -> None:
            buffer = bytearray(BUFFER_SIZE)
            while not self.stop.is_set():
                with lock:
                    if not queue:
                        return
                    index = queue.pop(0)
                try:
                    info = self._fetch_shard(index, buffer)
                except BaseException as exc:  # noqa: BLE001 - re-raised by run() below
                    errors.append(exc)
                    self.stop.set()
                    return
                with lock:
                    results[index] = info

        workers = [
            threading.Thread(target=worker, daemon=True)
            for _ in range(min(self.concurrency, len(indices)))
        ]
        finished = threading.Event()
        watcher = threading.Thread(target=self._watch_candidates, args=(finished,), daemon=True)
        if self.candidates:
            watcher.start()
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        finished.set()
        if errors:
            raise errors[0]
        return results

    def _watch_candidates(self, finished: threading.Event) -> None:
        """Add servers (e.g. relays still mirroring) once they list the same version, so load spreads."""
        while not finished.wait(self.refresh_s):
            waiting = [c for c in self.candidates if c not in self.chooser.servers()]
            if not waiting:
                return
            for server, listing in read_distributions(waiting, self.timeout).items():
                if (
                    isinstance(listing, dict)
                    and listing.get(self.source.version) == self.source.entry
                ):
                    log.info("%s now lists v%d; adding it", server, self.source.version)
                    self.chooser.add(server)

    def _fetch_shard(self, index: int, buffer: bytearray | None = None) -> ShardInfo:
        buffer = buffer if buffer is not None else bytearray(BUFFER_SIZE)
        expected = self.expected_size(index)
        wanted_hash = self.source.manifest.shards[index].blake3 if self.source.manifest else None
        path, offset = self.target(index, index * (self.shard_size or 0))
        name = f"{self.prefix}/{shard_name(index)}"
        tried: set[str] = set()
        reasons: list[str] = []
        for attempt in range(self.max_attempts):
            if self.stop.is_set():
                raise FetchError("stopped because another shard failed")
            server = self.chooser.pick(avoid=tried)
            tried.add(server)
            if tried >= self.chooser.servers():
                tried.clear()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
            sink = _ShardSink(fd, offset, expected, server, self.stats, self.on_bytes)
            start = time.perf_counter()
            try:
                get_stream(
                    f"{server}/{name}", sink, self.timeout, buffer=buffer, min_rate=self.min_rate
                )
                self._check(index, sink.written, expected, sink.hasher.hexdigest(), wanted_hash)
            except TransferError as exc:
                reason = str(exc)
                reasons.append(f"{server}: {reason}")
                self.stats.add_failure(index, server, reason)
                self.chooser.record(server, False)
                log.info(
                    "shard %d from %s failed (attempt %d): %s",
                    index + 1,
                    server,
                    attempt + 1,
                    reason,
                )
                if self.on_bytes is not None and sink.written:
                    self.on_bytes(-sink.written)
                time.sleep(min(self.backoff_s * 2**attempt, 2.0))
                continue
            finally:
                os.close(fd)
            elapsed = max(time.perf_counter() - start, 1e-6)
            self.chooser.record(server, True, sink.written / elapsed)
            info = ShardInfo(sink.written, sink.hasher.hexdigest())
            if self.on_shard is not None:
                self.on_shard(index, info)
            return info
        raise FetchError(
            f"shard {index + 1} of v{self.source.version} failed {self.max_attempts} times: "
            + "; ".join(reasons)
        )

    def _check(
        self, index: int, written: int, expected: int | None, digest: str, wanted: str | None
    ) -> None:
        """Raise TransferError when a received shard is not what the version says it is."""
        if expected is not None and written != expected:
            raise TransferError(f"shard is {written} bytes, expected {expected}")
        if self.shard_size is not None and expected is None and written > self.shard_size:
            raise TransferError(
                f"last shard is {written} bytes, larger than the shard size {self.shard_size}"
            )
        if wanted is not None and digest != wanted:
            raise TransferError(
                f"BLAKE3 {digest[:16]}… does not match the manifest's {wanted[:16]}…"
            )
