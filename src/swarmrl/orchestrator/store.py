"""The rollout store: uploaded files kept under names the orchestrator chooses, in any
fsspec file system (a local folder by default; S3 or GCS by URL)."""

from __future__ import annotations

import re
from pathlib import Path

import fsspec

_NAME = re.compile(r"step_[0-9]{6}/[0-9a-f]{64}\.parquet")


class RolloutStore:
    def __init__(self, url: str) -> None:
        self.url = url
        self.fs, self.root = fsspec.core.url_to_fs(url)
        self.fs.makedirs(self.root, exist_ok=True)

    @staticmethod
    def name_for(step: int, file_hash: str) -> str:
        """The stored name of a file: derived from its step and hash, never from the sender."""
        name = f"step_{step:06d}/{file_hash}.parquet"
        if not _NAME.fullmatch(name):
            raise ValueError(f"not a storable step/hash: {step}, {file_hash!r}")
        return name

    def _path(self, name: str) -> str:
        if not _NAME.fullmatch(name):
            raise ValueError(f"not a stored rollout name: {name!r}")
        return f"{self.root.rstrip('/')}/{name}"

    def put(self, local: Path, name: str) -> None:
        path = self._path(name)
        self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        self.fs.put_file(str(local), path)

    def open(self, name: str):
        return self.fs.open(self._path(name), "rb")

    def exists(self, name: str) -> bool:
        return self.fs.exists(self._path(name))

    def remove(self, name: str) -> None:
        self.fs.rm_file(self._path(name))
