"""Assembly: download every shard of a version into one file and check its whole-file BLAKE3.

Shards land at their offsets in one file while ``InOrderHasher`` follows the finished
shards in file order, so only the tail is left to hash when the last one arrives. The
file is the caller's to rename or unpack only when that hash matches distribution.txt.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Callable, Sequence, Set
from pathlib import Path

import blake3

from swarmrl.shardcast.choice import ServerChooser, probe_servers
from swarmrl.shardcast.discovery import VersionSource
from swarmrl.shardcast.downloader import MIN_RATE, ShardDownloader, TransferStats
from swarmrl.shardcast.errors import FetchError, IntegrityError
from swarmrl.shardcast.layout import ShardInfo
from swarmrl.shardcast.transfer import BUFFER_SIZE


class InOrderHasher:
    """Hashes the whole file while it downloads: follows the finished shards in file order.

    Shards finish out of order; a thread reads each one back (from the page cache) as soon as
    every shard before it is done. A shard's offset is the sum of the sizes before it.
    """

    def __init__(self, path: Path, num_shards: int) -> None:
        self.path = path
        self.num_shards = num_shards
        self.sizes: dict[int, int] = {}
        self.cond = threading.Condition()
        self.hasher = blake3.blake3()
        self.failed: BaseException | None = None
        self.cancelled = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def shard_done(self, index: int, size: int) -> None:
        with self.cond:
            self.sizes[index] = size
            self.cond.notify()

    def _run(self) -> None:
        buffer = bytearray(BUFFER_SIZE)
        view = memoryview(buffer)
        offset = 0
        try:
            with open(self.path, "rb", buffering=0) as f:
                for index in range(self.num_shards):
                    with self.cond:
                        while index not in self.sizes and not self.cancelled:
                            self.cond.wait()
                        if self.cancelled:
                            return
                        size = self.sizes[index]
                    while size > 0:
                        n = os.preadv(f.fileno(), [view[: min(size, len(buffer))]], offset)
                        if n == 0:
                            raise FetchError(
                                f"{self.path} ended early while hashing shard {index + 1}"
                            )
                        self.hasher.update(view[:n])
                        offset += n
                        size -= n
        except BaseException as exc:  # noqa: BLE001 - re-raised by hexdigest() in the caller
            self.failed = exc

    def cancel(self) -> None:
        with self.cond:
            self.cancelled = True
            self.cond.notify()

    def hexdigest(self, timeout: float | None = None) -> str:
        self.thread.join(timeout)
        if self.failed is not None:
            raise self.failed
        return self.hasher.hexdigest()


def download_file(
    source: VersionSource,
    archive: Path,
    *,
    done: Set[int] = frozenset(),
    on_shard: Callable[[int, ShardInfo], None] | None = None,
    concurrency: int = 8,
    timeout: float = 10.0,
    min_rate: float | None = MIN_RATE,
    max_attempts: int = 6,
    stats: TransferStats | None = None,
    on_bytes: Callable[[int], None] | None = None,
    candidates: Sequence[str] = (),
    rng: random.Random | None = None,
    prefix: str | None = None,
) -> TransferStats:
    """Fetch every shard not in ``done`` into the single file ``archive`` and check its BLAKE3.

    ``prefix``: the shards' folder on the servers when it is not ``v<N>`` (a delta's).
    Raises ``IntegrityError`` when the whole file does not match distribution.txt, and
    ``FetchError`` when a shard cannot be fetched.
    """
    manifest = source.manifest
    if manifest is None and done:
        raise ValueError("resuming needs a manifest: without one the shard offsets are unknown")
    stats = stats or TransferStats()
    chooser = ServerChooser(list(source.servers), rng=rng)
    probe_servers(chooser, timeout)
    archive.touch()
    whole = InOrderHasher(archive, source.entry.num_shards)
    if manifest is not None:
        for index in done:
            whole.shard_done(index, manifest.shards[index].size)

    def shard_finished(index: int, info: ShardInfo) -> None:
        whole.shard_done(index, info.size)
        if on_shard is not None:
            on_shard(index, info)

    downloader = ShardDownloader(
        source,
        chooser,
        lambda index, offset: (archive, offset),
        concurrency=concurrency,
        timeout=timeout,
        min_rate=min_rate,
        max_attempts=max_attempts,
        stats=stats,
        on_shard=shard_finished,
        on_bytes=on_bytes,
        candidates=candidates,
        prefix=prefix,
    )
    try:
        results = downloader.run([i for i in range(source.entry.num_shards) if i not in done])
    except BaseException:
        whole.cancel()
        raise
    if manifest is not None:
        size = manifest.file_size
    else:
        last = source.entry.num_shards - 1
        size = (downloader.shard_size or 0) * last + results[last].size
    os.truncate(archive, size)
    digest = whole.hexdigest()
    if digest != source.entry.blake3:
        hint = (
            ""
            if manifest
            else " (the servers publish no per-shard manifest, so the bad shard cannot be told)"
        )
        raise IntegrityError(
            f"v{source.version}: the downloaded file's BLAKE3 is {digest}, distribution.txt says "
            f"{source.entry.blake3}{hint}; nothing was kept"
        )
    return stats
