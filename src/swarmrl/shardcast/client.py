"""The client: download a version from several servers at once, verify it, unpack it.

How ``fetch`` goes (docs/architecture.md §4.4), one module per step:
1. ``discovery``: read ``distribution.txt`` from every server and settle which version,
   which servers hold the same bytes, and its manifest (per-shard BLAKE3) if a server
   has one (ours do; the reference origin does not).
2. ``resume``: a previous attempt's finished shards are re-hashed and kept.
3. ``assembly`` with ``downloader`` and ``choice``: the other shards are fetched by
   ``concurrency`` threads from servers drawn ∝ success_rate × bandwidth, each checked on
   arrival, straight into ``<dest>/.v<N>.partial/archive.tar``; the whole file's BLAKE3
   is checked against distribution.txt.
4. ``unpack``: the tar is extracted into a temporary directory and renamed to
   ``<dest>/v<N>`` (or kept as ``<dest>/v<N>.tar``).
With ``deltas`` (the default), a client that holds an older version the manifest offers a
delta from (``v<B>/`` or ``v<B>.tar`` under ``dest``) first tries ``patch``: the delta's
shards, then the rebuilt file checked against distribution.txt. Anything wrong with that
(no delta on any server, a base that is not the delta's, a damaged delta, a bomb) is
logged, recorded in ``FetchResult.delta_refused``, and the full shards are fetched as
without deltas.
If a version cannot be completed the error says which shards failed where; if the
servers stopped listing it meanwhile, ``VersionUnavailableError`` says so and the
partial download is deleted (it cannot be resumed).
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal

from swarmrl.shardcast.assembly import download_file
from swarmrl.shardcast.delta import DeltaError
from swarmrl.shardcast.discovery import (
    VersionSource,
    latest_version,
    normalize_server,
    resolve_version,
    still_listed,
)
from swarmrl.shardcast.downloader import MIN_RATE, TransferStats
from swarmrl.shardcast.errors import FetchError, IntegrityError, VersionUnavailableError
from swarmrl.shardcast.layout import LayoutError, ShardInfo, version_dir_name
from swarmrl.shardcast.patch import fetch_patched, held_base
from swarmrl.shardcast.resume import DoneLog, archive_path, done_shards, partial_dir
from swarmrl.shardcast.unpack import unpack

log = logging.getLogger(__name__)

__all__ = [
    "MIN_RATE",
    "FetchError",
    "FetchResult",
    "IntegrityError",
    "VersionUnavailableError",
    "fetch",
    "latest_version",
    "resolve_version",
]


@dataclass
class FetchResult:
    path: Path
    version: int
    bytes_by_server: dict[str, int]
    failures: list[tuple[int, str, str]]
    """(shard index, server, reason) for every failed attempt."""
    seconds: float
    resumed_shards: int = 0
    route: Literal["delta", "full", "held"] = "full"
    """how the file came: rebuilt from a delta, from the full shards, or already here"""
    delta_base: int | None = None
    """the version the delta was taken against (route "delta")"""
    delta_refused: str | None = None
    """why a delta that was tried was not used (the full shards were fetched instead)"""

    @property
    def bytes_fetched(self) -> int:
        return sum(self.bytes_by_server.values())


def fetch(
    servers: list[str],
    version: int | None,
    dest: Path,
    *,
    concurrency: int = 8,
    timeout: float = 10.0,
    min_rate: float | None = MIN_RATE,
    max_attempts: int = 6,
    wait_s: float = 0.0,
    progress: bool = False,
    unpack_archive: bool = True,
    on_shard: Callable[[int, ShardInfo], None] | None = None,
    rng: random.Random | None = None,
    deltas: bool = True,
) -> FetchResult:
    """Download, verify and unpack ``version`` (None: the newest listed) into ``dest/v<N>``.

    ``rng`` draws the server of each shard (pass a seeded one for reproducible choices).
    See the module docstring for the steps and the errors.
    """
    started = time.perf_counter()
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    source = resolve_version(servers, version, timeout=timeout, wait_s=wait_s)
    final = dest / version_dir_name(source.version)
    if not unpack_archive:
        final = final.with_suffix(".tar")
    if final.exists():
        return FetchResult(
            final, source.version, {}, [], time.perf_counter() - started, route="held"
        )
    stats = TransferStats()
    offered = source.manifest.deltas if deltas and source.manifest is not None else ()
    held = held_base(dest, offered)
    refused = None
    if held is not None:
        work = dest / f".{version_dir_name(source.version)}.delta"
        shutil.rmtree(work, ignore_errors=True)
        try:
            rebuilt = fetch_patched(
                source,
                held[0],
                held[1],
                work,
                stats=stats,
                concurrency=concurrency,
                timeout=timeout,
                min_rate=min_rate,
                max_attempts=max_attempts,
                rng=rng,
            )
            if unpack_archive:
                unpack(rebuilt, final)
            else:
                os.rename(rebuilt, final)
            shutil.rmtree(work, ignore_errors=True)
            return FetchResult(
                final,
                source.version,
                dict(stats.bytes_by_server),
                list(stats.failures),
                time.perf_counter() - started,
                route="delta",
                delta_base=held[0],
            )
        except (DeltaError, FetchError, LayoutError, OSError) as exc:
            refused = str(exc)
            log.warning(
                "v%d: the delta from v%d was not used (%s); fetching the full shards",
                source.version,
                held[0],
                refused,
            )
            shutil.rmtree(work, ignore_errors=True)
    partial = partial_dir(dest, source.version)
    archive = archive_path(partial)
    done = done_shards(partial, source)
    try:
        with DoneLog(partial) as done_log, _progress_bar(source, done, progress) as bar:

            def record(index: int, info: ShardInfo) -> None:
                done_log.add(index)
                if on_shard is not None:
                    on_shard(index, info)

            download_file(
                source,
                archive,
                done=done,
                on_shard=record,
                concurrency=concurrency,
                timeout=timeout,
                min_rate=min_rate,
                max_attempts=max_attempts,
                stats=stats,
                on_bytes=bar.advance,
                candidates=[normalize_server(s) for s in servers],
                rng=rng,
            )
        if unpack_archive:
            unpack(archive, final)
        else:
            os.rename(archive, final)
        shutil.rmtree(partial)
    except FetchError as exc:
        if not still_listed(servers, source, timeout):
            shutil.rmtree(partial, ignore_errors=True)
            raise VersionUnavailableError(
                f"v{source.version} was removed from every server while it was downloading "
                f"(no server lists it any more); the partial download was deleted, {final} was "
                f"not created. Fetch a newer version. Last error: {exc}"
            ) from exc
        if isinstance(exc, IntegrityError):
            shutil.rmtree(partial, ignore_errors=True)
        raise
    return FetchResult(
        final,
        source.version,
        dict(stats.bytes_by_server),
        list(stats.failures),
        time.perf_counter() - started,
        resumed_shards=len(done),
        delta_refused=refused,
    )


class _NoProgress:
    def __enter__(self) -> _NoProgress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    def advance(self, n: int) -> None:
        return None


class _RichProgress:
    def __init__(self, source: VersionSource, done: set[int]) -> None:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        manifest = source.manifest
        self.progress = Progress(
            f"v{source.version}",
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
        )
        already = sum(manifest.shards[i].size for i in done) if manifest else 0
        total = manifest.file_size if manifest else None
        self.task = self.progress.add_task("download", total=total, completed=already)

    def __enter__(self) -> _RichProgress:
        self.progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.progress.stop()

    def advance(self, n: int) -> None:
        self.progress.advance(self.task, n)


def _progress_bar(
    source: VersionSource, done: set[int], enabled: bool
) -> _NoProgress | _RichProgress:
    return _RichProgress(source, done) if enabled else _NoProgress()


def server_bytes(url: str, timeout: float = 5.0) -> int | None:
    """What a SHARDCAST server of ours says it has served (`/stats.json`), or None where
    it does not answer so (a reference server has no such page).

    Asked with the standard library: the trainer asks at every heartbeat, and an httpx
    call of its own builds a TLS context each time (tens of milliseconds of CPU)."""
    import urllib.request  # here, not with the module: the CLI's parser must not load it

    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/stats.json", timeout=timeout) as answer:
            value = json.loads(answer.read(4096))["bytes_served"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
