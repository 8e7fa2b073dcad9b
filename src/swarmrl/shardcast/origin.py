"""The origin: publish checkpoint directories as numbered versions of a SHARDCAST root.

Decisions:
- One version is one file: an uncompressed POSIX tar (PAX format) of the checkpoint
  directory, members sorted by path, owner/time fields zeroed, so the same checkpoint
  always gives the same bytes and the same BLAKE3. Any ``tar xf`` unpacks it.
- The tar is streamed straight into shard files (no second copy of the checkpoint),
  hashing every shard and the whole file on the way, under ``.staging-v<N>/``. The
  manifest is written next to the shards, the directory is renamed to ``v<N>``, and only
  then is ``distribution.txt`` rewritten (atomically) to announce it.
- Version numbers are the trainer's step numbers. A number must not go backwards and a
  number once announced is never reused for other bytes: publishing an already-listed
  version with identical bytes is a no-op, anything else is refused with an error.
  The state lives in the root itself, so a restarted origin carries on.
- The newest ``keep`` versions stay listed; older ones are delisted and deleted after
  ``grace_s`` seconds (see ``store.VersionStore``).
- With ``deltas`` (the default), a version is also published as a delta against the
  newest version listed before it (``v<N>/delta-from-<B>/``, ``delta.py``), built in the
  same staging directory, so it appears with the version in one rename. The manifest's
  ``deltas`` names it. A delta that would not be smaller than the file is not published.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import blake3

from swarmrl.shardcast.archive import write_archive
from swarmrl.shardcast.delta import (
    BLOCK_SIZE,
    DeltaManifest,
    delta_dir_name,
    encode,
    sharded_reader,
)
from swarmrl.shardcast.layout import (
    DEFAULT_SHARD_SIZE,
    MANIFEST_FILE,
    LayoutError,
    Manifest,
    ShardInfo,
    shard_name,
)
from swarmrl.shardcast.store import VersionStore, atomic_write

log = logging.getLogger(__name__)


@dataclass
class _OpenShard:
    file: BinaryIO
    hasher: blake3.blake3
    size: int = 0


class _ShardWriter:
    """A write-only file object that cuts its stream into shard files and hashes them."""

    def __init__(self, directory: Path, shard_size: int) -> None:
        self.directory = directory
        self.shard_size = shard_size
        self.file_hash = blake3.blake3(max_threads=blake3.blake3.AUTO)
        self.shards: list[ShardInfo] = []
        self.size = 0
        self._current: _OpenShard | None = None

    def write(self, data: bytes | bytearray | memoryview) -> int:
        view = memoryview(data).cast("B")
        self.file_hash.update(view)
        while len(view):
            if self._current is None:
                # stays open across write() calls until the shard is full: closed by _finish_shard
                path = self.directory / shard_name(len(self.shards))
                self._current = _OpenShard(open(path, "wb"), blake3.blake3())  # noqa: SIM115
            current = self._current
            take = min(len(view), self.shard_size - current.size)
            current.file.write(view[:take])
            current.hasher.update(view[:take])
            current.size += take
            self.size += take
            view = view[take:]
            if current.size == self.shard_size:
                self._finish_shard()
        return len(data)

    def _finish_shard(self) -> None:
        if self._current is not None:
            self._current.file.close()
            self.shards.append(ShardInfo(self._current.size, self._current.hasher.hexdigest()))
            self._current = None

    def close(self) -> None:
        self._finish_shard()


class Origin:
    """Publishes checkpoints into ``root`` (serve it with ``server.start_server``)."""

    def __init__(
        self,
        root: Path,
        keep: int = 3,
        shard_size: int = DEFAULT_SHARD_SIZE,
        grace_s: float = 300.0,
        deltas: bool = True,
        delta_block: int = BLOCK_SIZE,
    ) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.store = VersionStore(root, grace_s=grace_s)
        self.keep = keep
        self.shard_size = shard_size
        self.deltas = deltas
        self.delta_block = delta_block
        for stale in self.store.root.glob(".staging-*"):
            shutil.rmtree(stale, ignore_errors=True)

    @property
    def root(self) -> Path:
        return self.store.root

    def latest_version(self) -> int | None:
        listed = self.store.listed()
        return max(listed) if listed else None

    def publish(self, version: int, checkpoint_dir: Path) -> Manifest:
        """Publish ``checkpoint_dir`` as ``v<version>``; announce it once every shard is in place."""
        checkpoint_dir = Path(checkpoint_dir)
        if not checkpoint_dir.is_dir():
            raise FileNotFoundError(
                f"cannot publish v{version}: {checkpoint_dir} is not a directory"
            )
        listed = self.store.listed()
        newest = max([*listed, *self.store.retired()], default=-1)
        if version < newest or (version == newest and version not in listed):
            raise ValueError(
                f"cannot publish v{version} in {self.root}: v{newest} was already announced and version numbers "
                "(training steps) never go backwards; publish a newer step or start from an empty root"
            )
        staging = self.store.staging_dir(version)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        try:
            writer = _ShardWriter(staging, self.shard_size)
            write_archive(checkpoint_dir, writer)
            writer.close()
            manifest = Manifest(
                version=version,
                file_size=writer.size,
                shard_size=self.shard_size,
                blake3=writer.file_hash.hexdigest(),
                shards=tuple(writer.shards),
            )
            older = [v for v in listed if v < version]
            if self.deltas and older and version not in listed:
                base = max(older)
                if self._write_delta(staging, manifest, base) is not None:
                    manifest = dataclasses.replace(manifest, deltas=(base,))
            if version in listed:
                if listed[version] != manifest.entry:
                    raise ValueError(
                        f"cannot publish v{version} in {self.root}: it is already announced with other bytes "
                        f"(blake3 {listed[version].blake3}); a version number is never reused"
                    )
                shutil.rmtree(staging)
                return manifest
            atomic_write(staging / MANIFEST_FILE, manifest.to_json().encode())
            self.store.install(version, staging)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        entries = sorted([*listed.values(), manifest.entry], key=lambda e: e.version)[-self.keep :]
        self.store.announce(entries)
        return manifest

    def _write_delta(self, staging: Path, result: Manifest, base: int) -> DeltaManifest | None:
        """Write ``staging/delta-from-<base>/``; None (and nothing written) when the base's
        manifest is unreadable or the delta would not be smaller than the file."""
        base_dir = self.store.version_dir(base)
        try:
            base_manifest = Manifest.from_json((base_dir / MANIFEST_FILE).read_bytes())
        except (OSError, LayoutError) as exc:
            log.warning(
                "v%d is published without a delta: v%d's manifest: %s", result.version, base, exc
            )
            return None
        directory = staging / delta_dir_name(base)
        directory.mkdir()
        writer = _ShardWriter(directory, self.shard_size)
        try:
            frames = encode(
                sharded_reader(staging, result),
                result.file_size,
                sharded_reader(base_dir, base_manifest),
                base_manifest.file_size,
                writer,
                block_size=self.delta_block,
            )
        except (
            OSError
        ) as exc:  # a base shard missing from the store: no delta, the version still goes out
            log.warning("v%d is published without a delta: v%d: %s", result.version, base, exc)
            writer.close()
            shutil.rmtree(directory)
            return None
        writer.close()
        if writer.size >= result.file_size:
            shutil.rmtree(directory)
            return None
        delta = DeltaManifest(
            version=result.version,
            base=base,
            base_blake3=base_manifest.blake3,
            base_size=base_manifest.file_size,
            result_blake3=result.blake3,
            result_size=result.file_size,
            block_size=self.delta_block,
            frames=tuple(frames),
            file=Manifest(
                result.version,
                writer.size,
                self.shard_size,
                writer.file_hash.hexdigest(),
                tuple(writer.shards),
                archive="delta",
            ),
        )
        atomic_write(directory / MANIFEST_FILE, delta.to_json().encode())
        return delta

    def prune(self) -> list[int]:
        """Delete delisted versions whose grace period is over (publish does this too)."""
        return self.store.prune()
