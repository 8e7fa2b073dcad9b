"""The relay: mirror the versions of one or more upstream servers and serve them on.

Every ``poll_s`` seconds the relay reads the upstreams' distribution.txt (the same
discovery as the client: per version, the servers that agree on its hash). For each
version it does not hold, newest first, it downloads the shards with the client's
downloader into ``.staging-v<N>/``, checking each against the upstream manifest; then it
checks the whole file's BLAKE3 by hashing the shards in order, writes the manifest (its
own, computed on the way, when the upstream had none, e.g. a reference origin), renames
the staging directory to ``v<N>`` and announces it. Its distribution.txt lists exactly
the versions that an upstream still lists and that it holds completely. A version the
upstreams dropped is delisted at once and deleted after ``grace_s`` seconds. Shards that
survive in a staging directory after a restart are re-hashed and kept (resume).
Relays chain: a relay's upstream can be another relay.
"""

from __future__ import annotations

import logging
import shutil
import threading
from pathlib import Path

import blake3

from swarmrl.shardcast.client import (
    FetchError,
    ServerChooser,
    ShardDownloader,
    TransferStats,
    VersionSource,
    normalize_server,
    probe_servers,
    read_distributions,
    resolve_version,
)
from swarmrl.shardcast.layout import MANIFEST_FILE, Manifest, ShardInfo, VersionEntry, shard_name
from swarmrl.shardcast.store import VersionStore, atomic_write

log = logging.getLogger(__name__)


class Relay:
    """Keeps ``root`` a verified mirror of what the upstreams list (serve it with ``server``)."""

    def __init__(
        self,
        upstreams: list[str],
        root: Path,
        *,
        poll_s: float = 2.0,
        grace_s: float = 300.0,
        concurrency: int = 8,
        timeout: float = 10.0,
        max_attempts: int = 6,
    ) -> None:
        if not upstreams:
            raise ValueError("a relay needs at least one upstream server URL")
        self.upstreams = [normalize_server(u) for u in upstreams]
        self.store = VersionStore(root, grace_s=grace_s)
        self.poll_s = poll_s
        self.concurrency = concurrency
        self.timeout = timeout
        self.max_attempts = max_attempts
        self.stats = TransferStats()
        self.stopped = threading.Event()

    def upstream_listing(self) -> dict[int, VersionEntry] | None:
        """Versions any upstream lists (the entry most upstreams agree on); None if none answered."""
        listings = [
            l
            for l in read_distributions(self.upstreams, self.timeout).values()
            if isinstance(l, dict)
        ]
        if not listings:
            return None
        merged: dict[int, list[VersionEntry]] = {}
        for listing in listings:
            for version, entry in listing.items():
                merged.setdefault(version, []).append(entry)
        return {v: max(set(entries), key=entries.count) for v, entries in merged.items()}

    def sync_once(self) -> list[int]:
        """One round: mirror new versions, drop what upstream dropped; return versions added."""
        upstream = self.upstream_listing()
        if upstream is None:
            log.warning(
                "no upstream answered (%s); serving what this relay holds",
                ", ".join(self.upstreams),
            )
            return []
        held = {v: e for v, e in self.store.listed().items() if upstream.get(v) == e}
        added = []
        for version in sorted(set(upstream) - set(held), reverse=True):
            if self.stopped.is_set():
                break
            try:
                manifest = self._mirror(version)
            except FetchError as exc:
                log.warning("relay could not mirror v%d yet: %s", version, exc)
                continue
            if manifest.entry != upstream[version]:
                log.warning("v%d changed upstream while mirroring; will retry", version)
                continue
            held[version] = manifest.entry
            added.append(version)
            self.store.announce(sorted(held.values(), key=lambda e: e.version))
        self.store.announce(sorted(held.values(), key=lambda e: e.version))
        return added

    def _mirror(self, version: int) -> Manifest:
        source = resolve_version(self.upstreams, version, timeout=self.timeout)
        staging = self.store.staging_dir(version)
        staging.mkdir(exist_ok=True)
        done = self._verified_shards(staging, source)

        def target(index: int) -> tuple[Path, int]:
            return staging / shard_name(index), 0

        chooser = ServerChooser(list(source.servers))
        probe_servers(chooser, self.timeout)
        downloader = ShardDownloader(
            source,
            chooser,
            target,
            concurrency=self.concurrency,
            timeout=self.timeout,
            max_attempts=self.max_attempts,
            stats=self.stats,
        )
        downloader.run([i for i in range(source.entry.num_shards) if i not in done])
        manifest = self._check_whole(staging, source)
        atomic_write(staging / MANIFEST_FILE, manifest.to_json().encode())
        self.store.install(version, staging)
        log.info("relay now holds v%d (%d shards)", version, source.entry.num_shards)
        return manifest

    def _verified_shards(self, staging: Path, source: VersionSource) -> set[int]:
        if source.manifest is None:
            return set()
        done = set()
        for index, shard in enumerate(source.manifest.shards):
            path = staging / shard_name(index)
            if path.exists() and path.stat().st_size == shard.size:
                hasher = blake3.blake3()
                if shard.size:
                    hasher.update_mmap(str(path))
                if hasher.hexdigest() == shard.blake3:
                    done.add(index)
        return done

    def _check_whole(self, staging: Path, source: VersionSource) -> Manifest:
        """Hash the shards in order; return the manifest they prove, or raise FetchError."""
        whole = blake3.blake3()
        shards = []
        for index in range(source.entry.num_shards):
            path = staging / shard_name(index)
            hasher = blake3.blake3()
            with open(path, "rb") as f:
                while chunk := f.read(8 << 20):
                    hasher.update(chunk)
                    whole.update(chunk)
            shards.append(ShardInfo(path.stat().st_size, hasher.hexdigest()))
        if whole.hexdigest() != source.entry.blake3:
            shutil.rmtree(staging, ignore_errors=True)
            raise FetchError(
                f"v{source.version}: mirrored shards hash to {whole.hexdigest()}, upstream says {source.entry.blake3}"
            )
        if source.manifest is not None:
            return source.manifest
        return Manifest(
            source.version,
            sum(s.size for s in shards),
            shards[0].size,
            source.entry.blake3,
            tuple(shards),
        )

    def run(self) -> None:
        """Sync until ``stop()``; errors in one round are logged and retried next round."""
        while not self.stopped.is_set():
            try:
                self.sync_once()
            except Exception:
                log.exception("relay sync round failed; retrying in %.1f s", self.poll_s)
            self.stopped.wait(self.poll_s)

    def stop(self) -> None:
        self.stopped.set()
