"""The version file: a deterministic, uncompressed POSIX tar of a checkpoint directory.

Members sorted by path, owner and time fields zeroed, so the same checkpoint always gives
the same bytes and the same BLAKE3: the origin streams it into shards, and a client packs
a version it holds again to use it as a delta's base.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

_COPY_BUFFER = 4 << 20


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
