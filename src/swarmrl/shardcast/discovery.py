"""Discovery: which servers list which version, with which bytes, and its manifest.

The version (newest listed by any server when none is asked for) is taken from the
servers that list it with the same hash (the largest such group; a server announcing
other bytes is left out). Its ``v<N>/manifest.json`` is taken from the first agreeing
server that has one and agrees with the distribution line (ours do; the reference
origin has none).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from swarmrl.shardcast.delta import DeltaManifest, delta_dir_name
from swarmrl.shardcast.errors import VersionUnavailableError
from swarmrl.shardcast.layout import (
    DISTRIBUTION_FILE,
    MANIFEST_FILE,
    LayoutError,
    Manifest,
    VersionEntry,
    parse_distribution,
    version_dir_name,
)
from swarmrl.shardcast.transfer import HttpStatusError, TransferError, get_bytes

log = logging.getLogger(__name__)

Listing = dict[int, VersionEntry]


def normalize_server(url: str) -> str:
    url = url.strip().rstrip("/")
    return url if "://" in url else f"http://{url}"


def read_distributions(servers: list[str], timeout: float = 10.0) -> dict[str, Listing | Exception]:
    """Each server's distribution.txt, or the error that prevented reading it."""

    def read(server: str) -> tuple[str, Listing | Exception]:
        try:
            return server, parse_distribution(
                get_bytes(f"{server}/{DISTRIBUTION_FILE}", timeout).decode()
            )
        except (TransferError, LayoutError, UnicodeDecodeError) as exc:
            return server, exc

    with ThreadPoolExecutor(max_workers=max(1, len(servers))) as pool:
        return dict(pool.map(read, servers))


def latest_version(servers: list[str], timeout: float = 10.0) -> int | None:
    """The newest version any reachable server lists, or None when none lists any."""
    listings = read_distributions([normalize_server(s) for s in servers], timeout)
    versions = [v for listing in listings.values() if isinstance(listing, dict) for v in listing]
    return max(versions, default=None)


@dataclass(frozen=True)
class VersionSource:
    """A version, the servers that list it with the same bytes, and its manifest if any."""

    entry: VersionEntry
    servers: tuple[str, ...]
    manifest: Manifest | None

    @property
    def version(self) -> int:
        return self.entry.version


def _describe(listings: dict[str, Listing | Exception]) -> str:
    parts = []
    for server, listing in listings.items():
        if isinstance(listing, Exception):
            parts.append(f"{server}: unreachable ({listing})")
        else:
            parts.append(
                f"{server}: lists {', '.join(f'v{v}' for v in sorted(listing)) or 'nothing'}"
            )
    return "; ".join(parts)


def resolve_version(
    servers: list[str],
    version: int | None,
    timeout: float = 10.0,
    wait_s: float = 0.0,
    poll_s: float = 0.5,
) -> VersionSource:
    """Find ``version`` (None: the newest) on ``servers``; poll every ``poll_s`` seconds, up
    to ``wait_s`` seconds, for it."""
    servers = [normalize_server(s) for s in servers]
    deadline = time.monotonic() + wait_s
    while True:
        listings = read_distributions(servers, timeout)
        listed = {s: entries for s, entries in listings.items() if isinstance(entries, dict)}
        wanted = (
            version
            if version is not None
            else max((v for entries in listed.values() for v in entries), default=None)
        )
        holders = {s: entries[wanted] for s, entries in listed.items() if wanted in entries}
        if holders or time.monotonic() >= deadline:
            break
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
    if wanted is None or not holders:
        what = f"v{version}" if version is not None else "any version"
        raise VersionUnavailableError(f"no server lists {what}: {_describe(listings)}")
    entry, _ = Counter(holders.values()).most_common(1)[0]
    agreeing = tuple(s for s, e in holders.items() if e == entry)
    for server, other in holders.items():
        if other != entry:
            log.warning(
                "ignoring %s: it lists v%d with blake3 %s, the others %s",
                server,
                wanted,
                other.blake3,
                entry.blake3,
            )
    return VersionSource(entry, agreeing, _manifest(agreeing, entry, timeout))


def _manifest(servers: tuple[str, ...], entry: VersionEntry, timeout: float) -> Manifest | None:
    """The first manifest a server has that agrees with ``entry``; None when none has one."""
    for server in servers:
        try:
            candidate = Manifest.from_json(
                get_bytes(f"{server}/{version_dir_name(entry.version)}/{MANIFEST_FILE}", timeout)
            )
        except HttpStatusError:
            continue
        except (TransferError, LayoutError) as exc:
            log.warning("ignoring the manifest from %s: %s", server, exc)
            continue
        if candidate.entry == entry:
            return candidate
        log.warning("ignoring the manifest from %s: it does not match distribution.txt", server)
    return None


def find_delta(
    servers: tuple[str, ...], full: Manifest, base: int, timeout: float
) -> tuple[DeltaManifest, VersionSource] | None:
    """The delta of ``full``'s version from ``base`` that most of ``servers`` hold, as the
    delta file's own source; None when no server has a usable one.

    Usable: it rebuilds exactly the file ``full`` describes (version, size, hash, all
    agreeing with distribution.txt) and is smaller than it.
    """
    found: dict[DeltaManifest, list[str]] = {}
    for server in servers:
        url = f"{server}/{version_dir_name(full.version)}/{delta_dir_name(base)}/{MANIFEST_FILE}"
        try:
            candidate = DeltaManifest.from_json(get_bytes(url, timeout))
        except HttpStatusError:
            continue  # this server has no such delta (a reference relay, or none was made)
        except (TransferError, LayoutError) as exc:
            log.warning("ignoring the delta manifest from %s: %s", server, exc)
            continue
        if (
            candidate.version != full.version
            or candidate.base != base
            or candidate.result_blake3 != full.blake3
            or candidate.result_size != full.file_size
            or candidate.file.file_size >= full.file_size
        ):
            log.warning(
                "ignoring the delta manifest from %s: it does not rebuild v%d as listed "
                "or is not smaller than it",
                server,
                full.version,
            )
            continue
        found.setdefault(candidate, []).append(server)
    if not found:
        return None
    delta, holders = max(found.items(), key=lambda item: len(item[1]))
    return delta, VersionSource(delta.file.entry, tuple(holders), delta.file)


def still_listed(servers: list[str], source: VersionSource, timeout: float) -> bool:
    """Whether any server still lists ``source``'s version with the same bytes."""
    try:
        again = resolve_version(servers, source.version, timeout=timeout)
    except VersionUnavailableError:
        return False
    return again.entry == source.entry
