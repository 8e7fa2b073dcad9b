"""Resume: what a previous, interrupted download of the same version left behind.

A download writes into ``<dest>/.v<N>.partial/``: ``archive.tar`` (the version's file,
shards at their offsets), ``state.json`` (the version's hash and shard count) and
``done.log`` (one finished shard index per line). A later download of the same bytes
re-hashes each logged shard against the manifest and fetches only the rest; anything
else (other bytes under that number, no manifest to check shards against) starts over.
"""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path
from types import TracebackType

from swarmrl.shardcast.discovery import VersionSource
from swarmrl.shardcast.integrity import hash_span
from swarmrl.shardcast.layout import version_dir_name


def partial_dir(dest: Path, version: int) -> Path:
    return dest / f".{version_dir_name(version)}.partial"


def archive_path(partial: Path) -> Path:
    return partial / "archive.tar"


def done_shards(partial: Path, source: VersionSource) -> set[int]:
    """Shards a previous attempt finished and that still hash right; prepares ``partial``."""
    state_file, log_file = partial / "state.json", partial / "done.log"
    state = {"blake3": source.entry.blake3, "num_shards": source.entry.num_shards}
    if (
        not state_file.exists()
        or json.loads(state_file.read_text()) != state
        or not log_file.exists()
        or not archive_path(partial).exists()
    ):
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        state_file.write_text(json.dumps(state))
        return set()
    if source.manifest is None:
        return set()  # without per-shard hashes a leftover shard cannot be trusted: start over
    manifest = source.manifest
    logged = {int(line) for line in log_file.read_text().split() if line.isdigit()}
    return {
        index
        for index in sorted(logged)
        if index < len(manifest.shards)
        and hash_span(
            archive_path(partial), index * manifest.shard_size, manifest.shards[index].size
        )
        == manifest.shards[index].blake3
    }


class DoneLog:
    """Appends finished shard indices to ``done.log``; thread-safe, a context manager."""

    def __init__(self, partial: Path) -> None:
        self._file = open(partial / "done.log", "a")  # noqa: SIM115 - closed by __exit__
        self._lock = threading.Lock()

    def add(self, index: int) -> None:
        with self._lock:
            self._file.write(f"{index}\n")
            self._file.flush()

    def __enter__(self) -> DoneLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._file.close()
