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
Relays chain: a relay's upstream can be another relay. The deltas the upstream manifest
lists (``v<N>/delta-from-<B>/``) are mirrored the same way, before the version is
installed; one that cannot be had is left out of the relay's manifest, and the version
goes out with its full shards only. A relay that holds the base of a delta fetches only
the delta and rebuilds the shards from it (each checked against the upstream manifest,
the whole file against the distribution line), and fetches the shards when that fails.

The relay does not trust its own store: its ``guard`` (serve it with
``start_server(root, guard=relay.guard)``) checks every shard against the manifest
before it is served, once per state of the file and again every ``rehash_s`` seconds.
A shard that fails is deleted and fetched again from upstream at once (``heal``); a
version whose manifest is missing or unreadable is dropped and mirrored again. Clients
get ``503`` for that shard meanwhile and retry, so one corrupted file costs a retry,
not the swarm's progress. A damaged delta shard is not repaired: the guard deletes the
delta (it is optional) and clients take the full shards.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Literal

import blake3

from swarmrl.shardcast.choice import ServerChooser, probe_servers
from swarmrl.shardcast.delta import (
    DeltaError,
    DeltaManifest,
    delta_dir_name,
    rebuild_from,
    sharded_reader,
)
from swarmrl.shardcast.discovery import (
    VersionSource,
    find_delta,
    normalize_server,
    read_distributions,
    resolve_version,
)
from swarmrl.shardcast.downloader import ShardDownloader, ShardTarget, TransferStats
from swarmrl.shardcast.errors import FetchError
from swarmrl.shardcast.integrity import ShardGuard, hash_span
from swarmrl.shardcast.layout import (
    MANIFEST_FILE,
    LayoutError,
    Manifest,
    ShardInfo,
    VersionEntry,
    shard_name,
    version_dir_name,
)
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
        rehash_s: float = 600.0,
    ) -> None:
        if not upstreams:
            raise ValueError("a relay needs at least one upstream server URL")
        self.upstreams = [normalize_server(u) for u in upstreams]
        self.store = VersionStore(root, grace_s=grace_s)
        self.poll_s = poll_s
        self.concurrency = concurrency
        self.timeout = timeout
        self.max_attempts = max_attempts
        self.rehash_s = rehash_s
        self.stats = TransferStats()
        self.guard = ShardGuard(self.store.root, self.report_damage)
        self._damaged: set[tuple[int, int | None]] = set()
        self._damage_lock = threading.Lock()
        self._wake = threading.Event()
        self.stopped = threading.Event()
        # never (not heard yet) -> awaited (said so) -> up <-> down
        self._upstream: Literal["never", "awaited", "up", "down"] = "never"

    def upstream_listing(self) -> dict[int, VersionEntry] | None:
        """Versions any upstream lists (the entry most upstreams agree on); None if none answered."""
        listings = [
            listing
            for listing in read_distributions(self.upstreams, self.timeout).values()
            if isinstance(listing, dict)
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
            # A relay started before its upstream waits for it quietly; one that lost its
            # upstream says so once per outage, not on every poll.
            if self._upstream == "never":
                log.info("waiting for an upstream to answer (%s)", ", ".join(self.upstreams))
                self._upstream = "awaited"
            elif self._upstream == "up":
                log.warning(
                    "no upstream answered (%s); serving what this relay holds",
                    ", ".join(self.upstreams),
                )
                self._upstream = "down"
            return []
        if self._upstream == "down":
            log.info("an upstream answers again")
        self._upstream = "up"
        held = {
            v: e
            for v, e in self.store.listed().items()
            if upstream.get(v) == e and self.store.version_dir(v).is_dir()
        }
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

    def _downloader(
        self, source: VersionSource, target: ShardTarget, prefix: str | None = None
    ) -> ShardDownloader:
        chooser = ServerChooser(list(source.servers))
        probe_servers(chooser, self.timeout)
        return ShardDownloader(
            source,
            chooser,
            target,
            concurrency=self.concurrency,
            timeout=self.timeout,
            max_attempts=self.max_attempts,
            stats=self.stats,
            prefix=prefix,
        )

    def _mirror(self, version: int) -> Manifest:
        source = resolve_version(self.upstreams, version, timeout=self.timeout)
        staging = self.store.staging_dir(version)
        staging.mkdir(exist_ok=True)
        done = self._verified_shards(staging, source)
        missing = [i for i in range(source.entry.num_shards) if i not in done]
        # Holding a base the upstream has a delta from, the relay fetches only the delta
        # and rebuilds the shards from it: on a slow link that is what the worker saves too.
        patched, rebuilt = self._patch(staging, source) if missing else (None, False)
        if not rebuilt:
            self._downloader(source, lambda index, _: (staging / shard_name(index), 0)).run(missing)
        manifest = self._check_whole(staging, source)
        deltas = [patched] if patched else []
        deltas += [
            d
            for d in (
                self._mirror_delta(staging, source, manifest, b)
                for b in manifest.deltas
                if not patched or b != patched.base
            )
            if d
        ]
        manifest = dataclasses.replace(manifest, deltas=tuple(d.base for d in deltas))
        atomic_write(staging / MANIFEST_FILE, manifest.to_json().encode())
        self.store.install(version, staging)
        self.guard.trust(version, manifest)
        for delta in deltas:
            self.guard.trust(version, delta.file, delta_dir_name(delta.base))
        log.info("relay now holds v%d (%d shards)", version, source.entry.num_shards)
        return manifest

    def _patch(self, staging: Path, source: VersionSource) -> tuple[DeltaManifest | None, bool]:
        """Build ``source``'s shards in ``staging`` from a held base and the upstream's delta
        from it. Returns the delta mirrored (kept: it is served on, and checked against its
        own hashes) and whether the shards were rebuilt; a rebuild that is not the listed
        file leaves nothing behind but verified shards."""
        if source.manifest is None:
            return None, False
        listed = self.store.listed()
        for base in sorted(source.manifest.deltas, reverse=True):
            base_dir = self.store.version_dir(base)
            if base not in listed or not base_dir.is_dir():
                continue
            try:
                base_manifest = Manifest.from_json((base_dir / MANIFEST_FILE).read_bytes())
            except (OSError, LayoutError):
                continue
            delta = self._mirror_delta(staging, source, source.manifest, base)
            if delta is None:
                return None, False
            if (base_manifest.blake3, base_manifest.file_size) != (
                delta.base_blake3,
                delta.base_size,
            ):
                log.warning("v%d: the held v%d is not its delta's base", source.version, base)
                return delta, False
            try:
                self._rebuild_shards(staging, source.manifest, base_dir, base_manifest, delta)
            except (DeltaError, OSError) as exc:
                log.warning(
                    "v%d: rebuilding from the delta failed (%s); fetching its shards",
                    source.version,
                    exc,
                )
                return delta, False
            log.info("relay rebuilt v%d from its delta against v%d", source.version, base)
            return delta, True
        return None, False

    def _rebuild_shards(
        self,
        staging: Path,
        manifest: Manifest,
        base_dir: Path,
        base_manifest: Manifest,
        delta: DeltaManifest,
    ) -> None:
        """Rebuild the file into ``staging`` and cut it into the shards ``manifest`` names,
        keeping each only when it hashes as listed (raises DeltaError for a wrong file)."""
        work = staging / ".rebuilt.tar"
        try:
            digest = rebuild_from(
                sharded_reader(base_dir, base_manifest),
                sharded_reader(staging / delta_dir_name(delta.base), delta.file),
                delta,
                work,
            )
            if digest != manifest.blake3:
                raise DeltaError(
                    f"the rebuilt file hashes to {digest}, upstream says {manifest.blake3}"
                )
            with open(work, "rb") as f:
                for index, shard in enumerate(manifest.shards):
                    tmp = staging / f".{shard_name(index)}.rebuilt"
                    hasher = blake3.blake3()
                    with open(tmp, "wb") as out:
                        left = shard.size
                        while left and (chunk := f.read(min(left, 8 << 20))):
                            hasher.update(chunk)
                            out.write(chunk)
                            left -= len(chunk)
                    if hasher.hexdigest() != shard.blake3:
                        tmp.unlink()
                        raise DeltaError(f"rebuilt shard {index + 1} does not hash as listed")
                    os.replace(tmp, staging / shard_name(index))
        finally:
            work.unlink(missing_ok=True)

    def _mirror_delta(
        self, staging: Path, source: VersionSource, manifest: Manifest, base: int
    ) -> DeltaManifest | None:
        """Mirror ``v<N>/delta-from-<base>/`` into ``staging``; None (nothing kept) when the
        upstreams have no usable one or it cannot be fetched: the version goes out without it."""
        directory = staging / delta_dir_name(base)
        try:
            found = find_delta(source.servers, manifest, base, self.timeout)
            if found is None:
                log.info("v%d: no upstream has a usable delta from v%d", source.version, base)
                return None
            delta, delta_source = found
            directory.mkdir(exist_ok=True)
            self._downloader(
                delta_source,
                lambda index, _: (directory / shard_name(index), 0),
                prefix=f"{version_dir_name(source.version)}/{delta_dir_name(base)}",
            ).run(list(range(delta_source.entry.num_shards)))
            whole = blake3.blake3()
            for index in range(delta_source.entry.num_shards):
                with open(directory / shard_name(index), "rb") as f:
                    while chunk := f.read(8 << 20):
                        whole.update(chunk)
            if whole.hexdigest() != delta.file.blake3:
                raise FetchError(
                    f"the delta's shards hash to {whole.hexdigest()}, not {delta.file.blake3}"
                )
            atomic_write(directory / MANIFEST_FILE, delta.to_json().encode())
            return delta
        except (FetchError, OSError, LayoutError) as exc:
            log.warning("v%d goes out without its delta from v%d: %s", source.version, base, exc)
            shutil.rmtree(directory, ignore_errors=True)
            return None

    def _verified_shards(self, staging: Path, source: VersionSource) -> set[int]:
        if source.manifest is None:
            return set()
        return {
            index
            for index, shard in enumerate(source.manifest.shards)
            if (staging / shard_name(index)).exists()
            and (staging / shard_name(index)).stat().st_size == shard.size
            and hash_span(staging / shard_name(index)) == shard.blake3
        }

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

    # ------------------------------------------------------------------------- self-healing

    def report_damage(self, version: int, index: int | None) -> None:
        """Called by the guard: shard ``index`` (None: the whole version) must be fetched again."""
        with self._damage_lock:
            if (version, index) in self._damaged:
                return
            self._damaged.add((version, index))
        what = f"shard {index + 1}" if index is not None else "the manifest"
        log.warning("v%d: %s failed its integrity check; fetching it again", version, what)
        self._wake.set()

    def heal(self) -> None:
        """Fetch again what the guard reported damaged; what cannot be fetched now is retried.

        A report stays pending until its repair is done, so clients asking for the shard
        meanwhile do not queue it twice.
        """
        with self._damage_lock:
            damaged = sorted(self._damaged, key=lambda d: (d[0], -1 if d[1] is None else d[1]))
        for version, index in damaged:
            try:
                if index is None:
                    self._drop(version)
                else:
                    self._repair_shard(version, index)
            except (FetchError, OSError, LayoutError) as exc:
                log.warning("could not repair v%d yet (retrying next round): %s", version, exc)
                continue
            with self._damage_lock:
                self._damaged.discard((version, index))

    def _repair_shard(self, version: int, index: int) -> None:
        directory = self.store.version_dir(version)
        try:
            manifest = Manifest.from_json((directory / MANIFEST_FILE).read_bytes())
        except (OSError, LayoutError):
            self._drop(version)
            return
        listing = self.upstream_listing()
        if listing is None:
            raise FetchError(f"no upstream answered ({', '.join(self.upstreams)})")
        if listing.get(version) != manifest.entry:
            # retired or replaced upstream: this copy cannot be healed and is on its way out
            self._drop(version)
            return
        upstream = resolve_version(self.upstreams, version, timeout=self.timeout)
        # Checked against the manifest this relay proved when it mirrored the version.
        source = VersionSource(upstream.entry, upstream.servers, manifest)
        repair = directory / f".repair-{shard_name(index)}"
        repair.unlink(missing_ok=True)
        try:
            self._downloader(source, lambda _index, _offset: (repair, 0)).run([index])
            os.replace(repair, directory / shard_name(index))
        finally:
            repair.unlink(missing_ok=True)
        log.warning("v%d: shard %d fetched again from upstream", version, index + 1)

    def _drop(self, version: int) -> None:
        """Delist and delete a version; the next sync mirrors it again if upstream lists it."""
        listed = self.store.listed()
        listed.pop(version, None)
        self.store.announce(sorted(listed.values(), key=lambda e: e.version))
        shutil.rmtree(self.store.version_dir(version), ignore_errors=True)
        with self._damage_lock:
            self._damaged = {d for d in self._damaged if d[0] != version}
        log.warning("v%d dropped; it is mirrored again from upstream", version)

    def run(self) -> None:
        """Heal and sync until ``stop()``; errors in one round are logged and retried next round."""
        next_rehash = time.monotonic() + self.rehash_s
        while not self.stopped.is_set():
            self._wake.clear()
            try:
                self.heal()
                self.sync_once()
            except Exception:
                log.exception("relay sync round failed; retrying in %.1f s", self.poll_s)
            if time.monotonic() >= next_rehash:
                self.guard.forget()
                next_rehash = time.monotonic() + self.rehash_s
            self._wake.wait(self.poll_s)

    def stop(self) -> None:
        self.stopped.set()
        self._wake.set()
