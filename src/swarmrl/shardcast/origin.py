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
"""

from __future__ import annotations

import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import blake3

from swarmrl.shardcast.layout import (
    DEFAULT_SHARD_SIZE,
    MANIFEST_FILE,
    Manifest,
    ShardInfo,
    shard_name,
)
from swarmrl.shardcast.store import VersionStore, atomic_write

_COPY_BUFFER = 4 << 20


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


def _normalized(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    return info


def write_archive(checkpoint_dir: Path, out) -> None:
    """Write the deterministic tar of ``checkpoint_dir`` (regular files and folders) to ``out``."""
    checkpoint_dir = Path(checkpoint_dir)
    with tarfile.open(
        fileobj=out, mode="w|", format=tarfile.PAX_FORMAT, bufsize=_COPY_BUFFER
    ) as tar:
        tar.copybufsize = _COPY_BUFFER  # type: ignore[attr-defined]  # TarFile reads it; typeshed lacks it
        for path in sorted(checkpoint_dir.rglob("*")):
            if not (path.is_file() or path.is_dir()) or path.is_symlink():
                raise ValueError(f"{path}: a checkpoint may hold only regular files and folders")
            info = _normalized(
                tar.gettarinfo(str(path), arcname=path.relative_to(checkpoint_dir).as_posix())
            )
            if path.is_file():
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)


class Origin:
    """Publishes checkpoints into ``root`` (serve it with ``server.start_server``)."""

    def __init__(
        self,
        root: Path,
        keep: int = 3,
        shard_size: int = DEFAULT_SHARD_SIZE,
        grace_s: float = 300.0,
    ) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.store = VersionStore(root, grace_s=grace_s)
        self.keep = keep
        self.shard_size = shard_size
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

    def prune(self) -> list[int]:
        """Delete delisted versions whose grace period is over (publish does this too)."""
        return self.store.prune()
