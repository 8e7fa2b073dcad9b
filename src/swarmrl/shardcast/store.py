"""A server's root directory on disk: installing versions, announcing them, retiring old ones.

Shared by the origin and the relay. The rules that make downloads safe:
- a version is built under a hidden staging name and renamed to ``v<N>`` in one step;
- ``distribution.txt`` is rewritten through a temporary file and ``os.replace``, and only
  lists versions whose directory is complete;
- a version that drops out of ``distribution.txt`` stays on disk for ``grace_s`` seconds
  (the time of delisting is kept in ``.retired.json``, so it survives restarts), and is
  deleted at the first ``prune()`` after that. A client that started a download while the
  version was listed therefore finishes unless it takes longer than the grace period.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from swarmrl.shardcast.layout import (
    DISTRIBUTION_FILE,
    PROBE_FILE,
    VersionEntry,
    format_distribution,
    parse_distribution,
    version_dir_name,
)

PROBE_SIZE = 1 << 20
RETIRED_FILE = ".retired.json"
STAGING_PREFIX = ".staging-"


def atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class VersionStore:
    """The directory a server serves; see the module docstring for the rules it keeps."""

    def __init__(self, root: Path, grace_s: float = 300.0) -> None:
        self.root = Path(root)
        self.grace_s = grace_s
        self.root.mkdir(parents=True, exist_ok=True)
        probe = self.root / PROBE_FILE
        if not probe.exists() or probe.stat().st_size != PROBE_SIZE:
            atomic_write(probe, os.urandom(PROBE_SIZE))
        if not (self.root / DISTRIBUTION_FILE).exists():
            atomic_write(self.root / DISTRIBUTION_FILE, b"")

    def listed(self) -> dict[int, VersionEntry]:
        return parse_distribution((self.root / DISTRIBUTION_FILE).read_text())

    def version_dir(self, version: int) -> Path:
        return self.root / version_dir_name(version)

    def staging_dir(self, version: int) -> Path:
        return self.root / f"{STAGING_PREFIX}{version_dir_name(version)}"

    def on_disk(self) -> set[int]:
        found = set()
        for child in self.root.iterdir():
            if child.is_dir() and child.name.startswith("v") and child.name[1:].isdigit():
                found.add(int(child.name[1:]))
        return found

    def install(self, version: int, staging: Path) -> None:
        """Move a complete staging directory into place as ``v<N>`` (not yet announced)."""
        target = self.version_dir(version)
        if target.exists():
            shutil.rmtree(target)
        os.rename(staging, target)

    def announce(self, entries: list[VersionEntry]) -> None:
        """Make ``entries`` the whole of distribution.txt; delisted versions start their grace period."""
        for entry in entries:
            if not self.version_dir(entry.version).is_dir():
                raise RuntimeError(
                    f"refusing to announce v{entry.version}: {self.version_dir(entry.version)} is missing"
                )
        atomic_write(self.root / DISTRIBUTION_FILE, format_distribution(entries).encode())
        self.prune()

    def retired(self) -> dict[int, float]:
        path = self.root / RETIRED_FILE
        if not path.exists():
            return {}
        return {int(k): float(v) for k, v in json.loads(path.read_text()).items()}

    def prune(self, now: float | None = None) -> list[int]:
        """Delete unlisted versions whose grace period is over; return the versions deleted."""
        now = time.time() if now is None else now
        listed = set(self.listed())
        retired = {v: t for v, t in self.retired().items() if v not in listed}
        deleted = []
        for version in sorted(self.on_disk() - listed):
            since = retired.setdefault(version, now)
            if now - since >= self.grace_s:
                shutil.rmtree(self.version_dir(version), ignore_errors=True)
                deleted.append(version)
        # a deleted version stays recorded: its number was announced once and must not be reused
        atomic_write(
            self.root / RETIRED_FILE,
            json.dumps({str(k): v for k, v in sorted(retired.items())}).encode(),
        )
        return deleted

    def ever_announced(self, version: int) -> bool:
        return version in self.listed() or version in self.retired()
