"""Delta checkpoints: version n + 1 as the difference to version n, and its rebuild.

Decisions (measured in docs/shardcast.md, ``benchmarks/bench_delta.py``):
- The delta is taken over the version *file* (the deterministic tar), not per tensor:
  two checkpoints of one model have the same members, sizes and safetensors headers, so
  their tars line up byte for byte and tensor data sits at the same 8-aligned offsets.
  Whatever differs (a tensor, a changed json) is covered, and the rebuilt file is
  checked by one hash: the distribution line's.
- Encoding ``xor4-zstd``: the file is cut into blocks of ``block_size`` (4 MiB); each
  block is XORed with the base's bytes at the same offset (zeros past the base's end),
  the XOR's bytes are regrouped by their place in each 4-byte word (all first bytes,
  then all second bytes, ...), and the result is compressed as one zstd frame. An Adam
  step changes the low mantissa bits of every float and rarely the sign and exponent,
  so the XOR's high bytes are nearly all zero; grouped, zstd squeezes them to almost
  nothing, while the low bytes stay incompressible. Blocks make decoding bounded and
  streamable.
- Hostile input: every frame decompresses at most to its block's known length (one byte
  more is a bomb and is refused), with a bounded zstd window, so the work is
  proportional to the result's size whatever the delta claims; the rebuilt file must
  hash to the distribution line before anything uses it.

The delta file is described as a ``Manifest`` of its own (shards and their BLAKE3), so it
is downloaded and checked exactly like a version's file.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import blake3
import numpy as np
import pydantic_core
import zstandard

from swarmrl.shardcast.layout import LayoutError, Manifest, ShardInfo, shard_count, shard_name

DELTA_FORMAT = "swarmrl-shardcast-delta/1"
ENCODING = "xor4-zstd"
BLOCK_SIZE = 4 << 20
ZSTD_LEVEL = 3
MAX_WINDOW = 8 << 20
"""A frame may not ask for a larger zstd window than this (ours need at most the block)."""

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class DeltaError(ValueError):
    """A delta that cannot be used: wrong base, damaged, a bomb, or not ours."""


def delta_dir_name(base: int) -> str:
    return f"delta-from-{base}"


def frame_bound(length: int) -> int:
    """The largest honest frame for a block of ``length`` bytes (zstd's compress bound)."""
    return length + (length >> 8) + 512


@dataclass(frozen=True)
class DeltaManifest:
    """``v<N>/delta-from-<B>/manifest.json``: what the delta rebuilds from what."""

    version: int
    base: int
    base_blake3: str
    base_size: int
    result_blake3: str
    result_size: int
    block_size: int
    frames: tuple[int, ...]
    """compressed size of each block's frame, in file order"""
    file: Manifest
    """the delta file itself: its size, shards and BLAKE3"""
    encoding: str = ENCODING

    def __post_init__(self) -> None:
        where = f"delta v{self.base} -> v{self.version}"
        if self.encoding != ENCODING:
            raise LayoutError(
                f"{where}: encoding {self.encoding!r}, this client knows {ENCODING!r}"
            )
        if not 0 <= self.base < self.version:
            raise LayoutError(f"{where}: the base must be an older version")
        if self.block_size <= 0 or self.base_size < 0 or self.result_size < 0:
            raise LayoutError(f"{where}: sizes must be positive")
        if len(self.frames) != shard_count(self.result_size, self.block_size):
            raise LayoutError(
                f"{where}: {len(self.frames)} frames for {shard_count(self.result_size, self.block_size)} blocks"
            )
        for i, size in enumerate(self.frames):
            length = min(self.block_size, self.result_size - i * self.block_size)
            if not 0 < size <= frame_bound(length):
                raise LayoutError(
                    f"{where}: frame {i + 1} is {size} bytes for a {length}-byte block"
                )
        if sum(self.frames) != self.file.file_size:
            raise LayoutError(
                f"{where}: the frames add up to {sum(self.frames)} bytes, the file has {self.file.file_size}"
            )
        if self.file.version != self.version:
            raise LayoutError(f"{where}: its file describes v{self.file.version}")
        for digest in (self.base_blake3, self.result_blake3):
            if not _HEX64.match(digest):
                raise LayoutError(f"{where}: a hash is not 64 lowercase hex digits")

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": DELTA_FORMAT,
                "encoding": self.encoding,
                "version": self.version,
                "base": self.base,
                "base_blake3": self.base_blake3,
                "base_size": self.base_size,
                "result_blake3": self.result_blake3,
                "result_size": self.result_size,
                "block_size": self.block_size,
                "frames": list(self.frames),
                "file": json.loads(self.file.to_json()),
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> DeltaManifest:
        try:
            raw = pydantic_core.from_json(text)
            if raw.get("format") != DELTA_FORMAT:
                raise LayoutError(
                    f"delta manifest format is {raw.get('format')!r}, expected {DELTA_FORMAT!r}"
                )
            file = raw["file"]
            return cls(
                version=int(raw["version"]),
                base=int(raw["base"]),
                base_blake3=str(raw["base_blake3"]),
                base_size=int(raw["base_size"]),
                result_blake3=str(raw["result_blake3"]),
                result_size=int(raw["result_size"]),
                block_size=int(raw["block_size"]),
                frames=tuple(int(f) for f in raw["frames"]),
                file=Manifest(
                    version=int(file["version"]),
                    file_size=int(file["file_size"]),
                    shard_size=int(file["shard_size"]),
                    blake3=str(file["blake3"]),
                    shards=tuple(
                        ShardInfo(int(s["size"]), str(s["blake3"])) for s in file["shards"]
                    ),
                    archive="delta",
                ),
                encoding=str(raw.get("encoding")),
            )
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            if isinstance(exc, LayoutError):
                raise
            raise LayoutError(f"delta manifest is not valid: {exc}") from exc


def _xor(data: bytes | memoryview | np.ndarray, base: bytes | memoryview) -> np.ndarray:
    """``data`` XOR ``base`` (``base`` zero-padded or cut to ``data``'s length)."""
    out = (data if isinstance(data, np.ndarray) else np.frombuffer(data, dtype=np.uint8)).copy()
    n = min(len(out), len(base))
    out[:n] ^= np.frombuffer(base, dtype=np.uint8, count=n)
    return out


def _group_bytes(x: np.ndarray) -> bytes:
    """Regroup by place in each 4-byte word (the tail that is not a whole word stays last)."""
    whole = len(x) // 4 * 4
    return x[:whole].reshape(-1, 4).T.tobytes() + x[whole:].tobytes()


def _ungroup_bytes(data: bytes) -> np.ndarray:
    x = np.frombuffer(data, dtype=np.uint8)
    whole = len(x) // 4 * 4
    out = np.empty(len(x), dtype=np.uint8)
    out[:whole] = x[:whole].reshape(4, -1).T.reshape(-1)
    out[whole:] = x[whole:]
    return out


def encode_block(
    block: bytes | memoryview, base: bytes | memoryview, level: int = ZSTD_LEVEL
) -> bytes:
    """One block of the result as a zstd frame of its grouped XOR with the base."""
    cctx = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return cctx.compress(_group_bytes(_xor(block, base)))


def decode_block(frame: bytes, base: bytes | memoryview, length: int) -> bytes:
    """The ``length`` result bytes a frame encodes; DeltaError for a damaged frame or a bomb.

    Never decompresses more than ``length + 1`` bytes, whatever the frame says.
    """
    dctx = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW)
    try:
        with dctx.stream_reader(io.BytesIO(frame), read_across_frames=False) as reader:
            grouped = reader.read(length)
            more = reader.read(1) if len(grouped) == length else b""
    except zstandard.ZstdError as exc:
        raise DeltaError(f"a delta frame does not decompress: {exc}") from exc
    if len(grouped) != length or more:
        what = "more than" if more else f"{len(grouped)} bytes, not"
        raise DeltaError(f"a delta frame decompresses to {what} its block's {length} bytes")
    return _xor(_ungroup_bytes(grouped), base).tobytes()


class Sink(Protocol):
    def write(self, data: bytes, /) -> int: ...


Reader = Callable[[int, int], bytes]
"""Reads (offset, length) of a file; returns fewer bytes only at its end."""


def encode(
    read_result: Reader,
    result_size: int,
    read_base: Reader,
    base_size: int,
    out: Sink,
    block_size: int = BLOCK_SIZE,
    level: int = ZSTD_LEVEL,
) -> list[int]:
    """Write the delta of a result file against a base file to ``out``; return the frame sizes."""
    frames = []
    for offset in range(0, result_size, block_size):
        length = min(block_size, result_size - offset)
        block = read_result(offset, length)
        base = read_base(offset, max(0, min(length, base_size - offset)))
        frame = encode_block(block, base, level)
        out.write(frame)
        frames.append(len(frame))
    return frames


def file_reader(path: Path) -> Reader:
    f = open(path, "rb")  # noqa: SIM115 - the reader lives as long as the caller holds it

    def read(offset: int, length: int) -> bytes:
        f.seek(offset)
        return f.read(length)

    return read


def sharded_reader(directory: Path, manifest: Manifest) -> Reader:
    """Reads a version's file from its shard files in ``directory``."""

    def read(offset: int, length: int) -> bytes:
        parts = []
        end = min(offset + length, manifest.file_size)
        while offset < end:
            index = offset // manifest.shard_size
            within = offset - index * manifest.shard_size
            take = min(end - offset, manifest.shards[index].size - within)
            with open(directory / shard_name(index), "rb") as f:
                f.seek(within)
                parts.append(f.read(take))
            offset += take
        return b"".join(parts)

    return read


def rebuild(base: Path, delta: Path, manifest: DeltaManifest, out: Path) -> str:
    """Write the result of ``delta`` applied to ``base`` into ``out``; return its BLAKE3 hex.

    Raises DeltaError when the base is not the delta's base, or a frame is damaged or a
    bomb. Memory is a few blocks; work is bounded by the result's size.
    """
    if base.stat().st_size != manifest.base_size:
        raise DeltaError(
            f"the base v{manifest.base} here is {base.stat().st_size} bytes, the delta expects {manifest.base_size}"
        )
    if delta.stat().st_size != manifest.file.file_size:
        raise DeltaError(
            f"the delta file is {delta.stat().st_size} bytes, its manifest says {manifest.file.file_size}"
        )
    return rebuild_from(file_reader(base), file_reader(delta), manifest, out)


def rebuild_from(read_base: Reader, read_delta: Reader, manifest: DeltaManifest, out: Path) -> str:
    """``rebuild`` from readers (e.g. ``sharded_reader`` over a relay's shard files) whose
    sizes the caller has checked: the base's ``base_size``, the delta's ``file.file_size``."""
    hasher = blake3.blake3()
    delta_at = 0
    with open(out, "wb") as o:
        for i, frame_size in enumerate(manifest.frames):
            offset = i * manifest.block_size
            length = min(manifest.block_size, manifest.result_size - offset)
            block = decode_block(
                read_delta(delta_at, frame_size),
                read_base(offset, max(0, min(length, manifest.base_size - offset))),
                length,
            )
            delta_at += frame_size
            o.write(block)
            hasher.update(block)
    return hasher.hexdigest()
