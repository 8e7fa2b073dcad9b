"""Unpacking: turn a verified version file (a tar) into the checkpoint directory, atomically."""

from __future__ import annotations

import os
import shutil
import tarfile
from pathlib import Path

from swarmrl.shardcast.transfer import BUFFER_SIZE


def unpack(archive: Path, target: Path) -> Path:
    """Extract a version's tar into ``target`` (a temporary sibling, then one rename)."""
    tmp = target.with_name(f".{target.name}.unpack-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.TarFile(archive, mode="r", copybufsize=BUFFER_SIZE) as tar:
        tar.extractall(tmp, filter="data")
    os.rename(tmp, target)
    return target
