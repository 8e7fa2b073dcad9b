"""Checking shard bytes already on disk against a manifest.

Two users: a resumed download re-hashes the shards a previous attempt finished, and a
relay's ``ShardGuard`` makes sure every shard it serves still holds the bytes its
manifest names. The guard hashes a shard only when it has not seen it verified in its
current state: a file's state is its inode, size, mtime and ctime, and any write, rename
or ``utime`` through the filesystem changes the ctime, so bytes changed after
verification are hashed again before they are served. Corruption that bypasses the
filesystem (failing media) is found by ``forget()``, which the relay calls every
``rehash_s`` seconds so every shard is hashed again on its next request.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from enum import Enum
from pathlib import Path

import blake3

from swarmrl.shardcast.delta import DeltaManifest, delta_dir_name
from swarmrl.shardcast.layout import MANIFEST_FILE, LayoutError, Manifest, shard_name
from swarmrl.shardcast.transfer import BUFFER_SIZE

log = logging.getLogger(__name__)


def hash_span(path: Path, offset: int = 0, size: int | None = None) -> str:
    """BLAKE3 hex of ``size`` bytes of ``path`` from ``offset`` (None: to the end).

    A file that ends early hashes what it has, which then fails the comparison.
    """
    hasher = blake3.blake3()
    buffer = bytearray(BUFFER_SIZE)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        left = os.fstat(f.fileno()).st_size - offset if size is None else size
        while left > 0:
            n = os.preadv(f.fileno(), [view[: min(left, len(buffer))]], offset)
            if n == 0:
                break
            hasher.update(view[:n])
            offset += n
            left -= n
    return hasher.hexdigest()


class ShardCheck(Enum):
    """What a server should do with a request for a shard."""

    SERVE = "serve"
    NOT_FOUND = "not found"  # not a shard of a version this server holds
    REPAIRING = "repairing"  # damaged or missing; being fetched again


FileState = tuple[int, int, int, int]  # inode, size, mtime, ctime (ns)

SETTLE_NS = 1_000_000_000
"""File times tick coarsely (a few ms), so a write in the same tick as a check leaves the
state unchanged. A state is only remembered once its ctime is this far in the past; until
then every request hashes the file again."""


def _state(path: Path) -> FileState:
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _settled(state: FileState) -> bool:
    return time.time_ns() - state[3] > SETTLE_NS


class ShardGuard:
    """Vouches for the shards under a server root before they are served; thread-safe.

    ``check`` answers whether shard ``index`` of ``v<version>`` may be served. A shard
    whose bytes disagree with ``v<version>/manifest.json`` is deleted and reported to
    ``on_damage(version, index)`` (the relay fetches it again from upstream); a missing
    shard or a missing or unreadable manifest is reported the same way (index None: the
    whole version). Until it is repaired the answer is ``REPAIRING``.
    """

    def __init__(self, root: Path, on_damage: Callable[[int, int | None], None]) -> None:
        self.root = Path(root).resolve()
        self.on_damage = on_damage
        self._verified: dict[Path, FileState] = {}
        self._manifests: dict[int, tuple[FileState, Manifest]] = {}
        self._locks: dict[Path, threading.Lock] = {}
        self._lock = threading.Lock()

    def is_trusted(self, path: Path) -> bool:
        """True when ``path`` was verified and has not changed since (one ``stat``)."""
        try:
            state = _state(path)
        except OSError:
            return False
        with self._lock:
            return self._verified.get(path) == state

    def trust(self, version: int, manifest: Manifest, subdir: str | None = None) -> None:
        """Record the shards of ``v<version>`` (or of its ``subdir``, a delta) as verified as
        they are now (the caller hashed them); shards written too recently to tell a later
        write apart are hashed on request."""
        directory = self.root / f"v{version}"
        if subdir is not None:
            directory = directory / subdir
        with self._lock:
            for index in range(len(manifest.shards)):
                path = directory / shard_name(index)
                state = _state(path)
                if _settled(state):
                    self._verified[path] = state

    def check_delta(self, version: int, base: int, index: int) -> ShardCheck:
        """Whether shard ``index`` of ``v<version>``'s delta from ``v<base>`` holds its delta
        manifest's bytes. A delta is optional (clients fall back to the full shards), so a
        damaged one is deleted, not repaired: the answer is then ``NOT_FOUND``."""
        directory = self.root / f"v{version}" / delta_dir_name(base)
        path = directory / shard_name(index)
        if self.is_trusted(path):
            return ShardCheck.SERVE
        with self._lock:
            lock = self._locks.setdefault(path, threading.Lock())
        with lock:
            if self.is_trusted(path):
                return ShardCheck.SERVE
            try:
                manifest = DeltaManifest.from_json((directory / MANIFEST_FILE).read_bytes()).file
                expected = manifest.shards[index] if index < len(manifest.shards) else None
                state = _state(path)
            except FileNotFoundError:
                return ShardCheck.NOT_FOUND
            except (OSError, LayoutError) as exc:
                log.warning(
                    "v%d: the delta from v%d is unreadable (%s); deleting it", version, base, exc
                )
                shutil.rmtree(directory, ignore_errors=True)
                return ShardCheck.NOT_FOUND
            if expected is None:
                return ShardCheck.NOT_FOUND
            digest = hash_span(path) if state[1] == expected.size else "wrong size"
            if digest != expected.blake3:
                log.warning(
                    "v%d: shard %d of the delta from v%d does not match its manifest; deleting the delta",
                    version,
                    index + 1,
                    base,
                )
                shutil.rmtree(directory, ignore_errors=True)
                return ShardCheck.NOT_FOUND
            if _settled(state) and _state(path) == state:
                with self._lock:
                    self._verified[path] = state
            return ShardCheck.SERVE

    def forget(self) -> None:
        """Distrust everything: each shard is hashed again before it is next served."""
        with self._lock:
            self._verified.clear()
            self._manifests.clear()
            self._locks.clear()  # also drops the locks of versions deleted since

    def check(self, version: int, index: int) -> ShardCheck:
        """Whether shard ``index`` of ``v<version>`` holds its manifest's bytes (blocking: may hash it)."""
        directory = self.root / f"v{version}"
        path = directory / shard_name(index)
        if self.is_trusted(path):
            return ShardCheck.SERVE
        if not directory.is_dir():
            return ShardCheck.NOT_FOUND
        with self._lock:
            lock = self._locks.setdefault(path, threading.Lock())
        with lock:  # one hash per shard however many clients ask for it at once
            if self.is_trusted(path):
                return ShardCheck.SERVE
            manifest = self.manifest(version)
            if manifest is None:
                return ShardCheck.REPAIRING
            if index >= len(manifest.shards):
                return ShardCheck.NOT_FOUND
            expected = manifest.shards[index]
            try:
                state = _state(path)
                digest = hash_span(path) if state[1] == expected.size else "wrong size"
            except FileNotFoundError:
                self.on_damage(version, index)
                return ShardCheck.REPAIRING
            if digest != expected.blake3:
                log.warning(
                    "v%d shard %d does not match its manifest (%s bytes, BLAKE3 %.16s…; expected "
                    "%d bytes, %.16s…); deleting it",
                    version,
                    index + 1,
                    state[1],
                    digest,
                    expected.size,
                    expected.blake3,
                )
                path.unlink(missing_ok=True)
                self.on_damage(version, index)
                return ShardCheck.REPAIRING
            if _settled(state) and _state(path) == state:  # unchanged while it was hashed
                with self._lock:
                    self._verified[path] = state
            return ShardCheck.SERVE

    def manifest(self, version: int) -> Manifest | None:
        """The manifest of a version this server holds; None (reported as damage when the
        version's directory exists) when it is missing or unreadable."""
        path = self.root / f"v{version}" / MANIFEST_FILE
        try:
            state = _state(path)
        except FileNotFoundError:
            if path.parent.is_dir():
                log.warning("v%d has no manifest", version)
                self.on_damage(version, None)
            return None
        with self._lock:
            cached = self._manifests.get(version)
        if cached is not None and cached[0] == state:
            return cached[1]
        try:
            manifest = Manifest.from_json(path.read_bytes())
            if manifest.version != version:
                raise LayoutError(f"it describes v{manifest.version}")
        except LayoutError as exc:
            log.warning("v%d manifest is unreadable (%s)", version, exc)
            self.on_damage(version, None)
            return None
        if _settled(state):
            with self._lock:
                self._manifests[version] = (state, manifest)
        return manifest
