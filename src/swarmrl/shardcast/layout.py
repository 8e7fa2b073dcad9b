"""The SHARDCAST wire layout: distribution.txt lines, shard names and the per-version manifest.

Pure functions only (docs/architecture.md §4.4). A server directory looks like this:

    distribution.txt          one line per live version: ``v<N>: <blake3 of file>|<shards>``
    data1.bin                 probe file that clients time to seed their bandwidth estimate
    v<N>/shard_00001.bin ...  consecutive byte slices of the version's file (1-based, 5 digits)
    v<N>/manifest.json        ours, optional: per-shard sizes and BLAKE3 hashes
    v<N>/delta-from-<B>/      ours, optional: v<N> as a delta against v<B> (``delta.py``)

``distribution.txt`` keeps the reference line format byte for byte so the reference
``shardcast`` 0.3.2 client can read it; everything it lacks (per-shard hashes, the shard
size, what the file is) lives in the manifest, an extra file the reference never asks for.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import pydantic_core

DISTRIBUTION_FILE = "distribution.txt"
PROBE_FILE = "data1.bin"
MANIFEST_FILE = "manifest.json"
DEFAULT_SHARD_SIZE = 50_000_000
MANIFEST_FORMAT = "swarmrl-shardcast-manifest/1"
ARCHIVE_FORMAT = "tar"

_LINE = re.compile(r"^v(\d+):\s*([0-9a-f]{64})\|(\d+)$")
_SHARD = re.compile(r"^shard_(\d{5})\.bin$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class LayoutError(ValueError):
    """A distribution file or manifest that does not follow the layout."""


@dataclass(frozen=True)
class VersionEntry:
    """One line of distribution.txt: a version, its whole-file BLAKE3 and its shard count."""

    version: int
    blake3: str
    num_shards: int


def version_dir_name(version: int) -> str:
    return f"v{version}"


def shard_name(index: int) -> str:
    """File name of the shard at 0-based ``index`` (names are 1-based on the wire)."""
    return f"shard_{index + 1:05d}.bin"


def shard_index(name: str) -> int | None:
    """0-based index for a shard file name, None for anything else."""
    match = _SHARD.match(name)
    if match is None or int(match.group(1)) == 0:
        return None
    return int(match.group(1)) - 1


def shard_count(file_size: int, shard_size: int) -> int:
    return -(-file_size // shard_size)


def shard_span(index: int, file_size: int, shard_size: int) -> tuple[int, int]:
    """(offset, length) of shard ``index`` inside the file."""
    offset = index * shard_size
    return offset, min(shard_size, file_size - offset)


def parse_distribution(text: str) -> dict[int, VersionEntry]:
    """Parse distribution.txt; raise LayoutError naming the first bad line."""
    entries: dict[int, VersionEntry] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        match = _LINE.match(line)
        if match is None:
            raise LayoutError(
                f"distribution.txt line {number} is {raw!r}; expected 'v<N>: <64 hex blake3>|<shards>'"
            )
        version, digest, shards = int(match.group(1)), match.group(2), int(match.group(3))
        if version in entries:
            raise LayoutError(f"distribution.txt line {number} repeats version v{version}")
        entries[version] = VersionEntry(version, digest, shards)
    return entries


def format_distribution(entries: list[VersionEntry] | dict[int, VersionEntry]) -> str:
    """distribution.txt text, oldest version first, exactly as the reference writes it."""
    values = entries.values() if isinstance(entries, dict) else entries
    return "".join(
        f"v{e.version}: {e.blake3}|{e.num_shards}\n"
        for e in sorted(values, key=lambda e: e.version)
    )


@dataclass(frozen=True)
class ShardInfo:
    size: int
    blake3: str


@dataclass(frozen=True)
class Manifest:
    """What ``v<N>/manifest.json`` says about a version; consistent by construction."""

    version: int
    file_size: int
    shard_size: int
    blake3: str
    shards: tuple[ShardInfo, ...]
    archive: str = ARCHIVE_FORMAT
    deltas: tuple[int, ...] = ()
    """older versions this server also has ``v<N>/delta-from-<B>/`` for"""

    def __post_init__(self) -> None:
        if self.shard_size <= 0 or self.file_size < 0:
            raise LayoutError(
                f"manifest v{self.version}: shard_size must be > 0 and file_size >= 0"
            )
        if len(self.shards) != shard_count(self.file_size, self.shard_size):
            raise LayoutError(
                f"manifest v{self.version}: {len(self.shards)} shards listed, but a {self.file_size}-byte "
                f"file in {self.shard_size}-byte shards has {shard_count(self.file_size, self.shard_size)}"
            )
        for i, shard in enumerate(self.shards):
            expected = shard_span(i, self.file_size, self.shard_size)[1]
            if shard.size != expected:
                raise LayoutError(
                    f"manifest v{self.version}: shard {i + 1} is {shard.size} bytes, expected {expected}"
                )
            if not _HEX64.match(shard.blake3):
                raise LayoutError(
                    f"manifest v{self.version}: shard {i + 1} hash is not 64 lowercase hex digits"
                )
        if not _HEX64.match(self.blake3):
            raise LayoutError(f"manifest v{self.version}: file hash is not 64 lowercase hex digits")
        if any(not 0 <= base < self.version for base in self.deltas) or len(self.deltas) > 64:
            raise LayoutError(
                f"manifest v{self.version}: deltas must name at most 64 older versions"
            )

    @property
    def entry(self) -> VersionEntry:
        return VersionEntry(self.version, self.blake3, len(self.shards))

    def to_json(self) -> str:
        fields = {
            "format": MANIFEST_FORMAT,
            "version": self.version,
            "archive": self.archive,
            "file_size": self.file_size,
            "shard_size": self.shard_size,
            "blake3": self.blake3,
            "shards": [{"size": s.size, "blake3": s.blake3} for s in self.shards],
        }
        if self.deltas:
            fields["deltas"] = list(self.deltas)
        return json.dumps(fields, indent=1)

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        try:
            # A relay is not trusted: bounded nesting (Python's C scanner recurses once per
            # bracket, and py_ecc lifts the recursion limit past the C stack).
            raw = pydantic_core.from_json(text)
            if raw.get("format") != MANIFEST_FORMAT:
                raise LayoutError(
                    f"manifest format is {raw.get('format')!r}, expected {MANIFEST_FORMAT!r}"
                )
            return cls(
                version=int(raw["version"]),
                file_size=int(raw["file_size"]),
                shard_size=int(raw["shard_size"]),
                blake3=str(raw["blake3"]),
                shards=tuple(ShardInfo(int(s["size"]), str(s["blake3"])) for s in raw["shards"]),
                archive=str(raw.get("archive", ARCHIVE_FORMAT)),
                deltas=tuple(int(b) for b in raw.get("deltas", ())),
            )
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError) as exc:
            if isinstance(exc, LayoutError):
                raise
            raise LayoutError(f"manifest is not valid: {exc}") from exc
