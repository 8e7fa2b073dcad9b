"""Patching: get a version as a delta against an older one the client holds, and rebuild it.

The client's side of ``delta.py``. Nothing here is trusted before its hash: the held base
is packed again into its version file (the tar is reproducible) and must hash to the
delta's base; the delta's shards are checked like a version's; the rebuilt file must hash
to the distribution line. Any failure raises, and ``client.fetch`` then takes the full
shards, so a delta can cost a client time but never the right checkpoint.
"""

from __future__ import annotations

import random
from pathlib import Path

from swarmrl.shardcast.archive import write_archive
from swarmrl.shardcast.assembly import download_file
from swarmrl.shardcast.delta import DeltaError, DeltaManifest, delta_dir_name, rebuild
from swarmrl.shardcast.discovery import VersionSource, find_delta
from swarmrl.shardcast.downloader import TransferStats
from swarmrl.shardcast.integrity import hash_span
from swarmrl.shardcast.layout import version_dir_name


def held_base(dest: Path, bases: tuple[int, ...]) -> tuple[int, Path] | None:
    """The newest of ``bases`` that ``dest`` holds (unpacked ``v<B>/`` or ``v<B>.tar``)."""
    for base in sorted(bases, reverse=True):
        for held in (dest / version_dir_name(base), dest / f"{version_dir_name(base)}.tar"):
            if held.exists():
                return base, held
    return None


def base_file(held: Path, delta: DeltaManifest, work: Path) -> Path:
    """The held base as its version file, checked against the delta's base hash."""
    if held.is_dir():
        packed = work / "base.tar"
        with open(packed, "wb") as f:
            write_archive(held, f)
        held = packed
    if held.stat().st_size != delta.base_size or hash_span(held) != delta.base_blake3:
        raise DeltaError(
            f"the v{delta.base} held at {held} is not the delta's base (its bytes differ from "
            f"blake3 {delta.base_blake3[:16]}…)"
        )
    return held


def fetch_patched(
    source: VersionSource,
    base: int,
    held: Path,
    work: Path,
    *,
    stats: TransferStats,
    concurrency: int,
    timeout: float,
    min_rate: float | None,
    max_attempts: int,
    rng: random.Random | None,
) -> Path:
    """Rebuild ``source``'s file in ``work`` from the held ``v<base>`` and a delta; return it.

    Raises ``DeltaError`` (no usable delta, wrong base, a damaged or bomb frame, a rebuilt
    file that is not the listed one) or ``FetchError`` (the delta's shards could not be had).
    """
    if source.manifest is None:
        raise DeltaError(f"v{source.version} has no manifest, so no delta")
    work.mkdir(parents=True, exist_ok=True)
    found = find_delta(source.servers, source.manifest, base, timeout)
    if found is None:
        raise DeltaError(f"no server has a usable delta of v{source.version} from v{base}")
    delta, delta_source = found
    base_path = base_file(held, delta, work)
    delta_path = work / "delta.bin"
    download_file(
        delta_source,
        delta_path,
        concurrency=concurrency,
        timeout=timeout,
        min_rate=min_rate,
        max_attempts=max_attempts,
        stats=stats,
        rng=rng,
        prefix=f"{version_dir_name(source.version)}/{delta_dir_name(base)}",
    )
    archive = work / "archive.tar"
    digest = rebuild(base_path, delta_path, delta, archive)
    if digest != source.entry.blake3:
        raise DeltaError(
            f"v{source.version} rebuilt from the delta hashes to {digest}, distribution.txt "
            f"says {source.entry.blake3}"
        )
    return archive
