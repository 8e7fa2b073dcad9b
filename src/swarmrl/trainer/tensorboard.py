"""TensorBoard event files of the trainer's step metrics, written without TensorBoard.

`--log.backend tensorboard` makes the trainer append one event per metric and step to
`<run>/tensorboard/events.out.tfevents.<time>.<host>.<pid>` (or `--log.dir`), which
`tensorboard --logdir <run>/tensorboard` shows and compares across runs. The format:
TFRecord framing (a little-endian uint64 length, the masked CRC-32C of those 8 bytes,
the payload, its masked CRC-32C) around `tensorflow.Event` protobuf messages, the first
carrying `file_version: "brain.Event:2"`, each later one a step's `Summary` of
`simple_value`s. The few protobuf fields needed are encoded here by hand, so writing
needs no dependency; the tests read the files back with the tensorboard package's own
reader.
"""

from __future__ import annotations

import math
import os
import socket
import struct
import time
from collections.abc import Mapping
from pathlib import Path

_CRC_TABLE: list[int] = []
for _n in range(256):
    _c = _n
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _CRC_TABLE.append(_c)


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as TFRecord frames use it."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked(data: bytes) -> bytes:
    crc = crc32c(data)
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _bytes_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def event(wall_time: float, step: int, scalars: Mapping[str, float] | None = None) -> bytes:
    """One `Event`: wall_time (1, double), step (2, int64), then file_version (3) when
    there are no scalars, else summary (5) of Value{tag (1), simple_value (2, float)}."""
    out = _varint(1 << 3 | 1) + struct.pack("<d", wall_time) + _varint(2 << 3 | 0) + _varint(step)
    if scalars is None:
        return out + _bytes_field(3, b"brain.Event:2")
    values = b"".join(
        _bytes_field(1, _bytes_field(1, tag.encode()) + _varint(2 << 3 | 5) + struct.pack("<f", v))
        for tag, v in scalars.items()
    )
    return out + _bytes_field(5, values)


def record(payload: bytes) -> bytes:
    """One TFRecord frame around `payload`."""
    length = struct.pack("<Q", len(payload))
    return length + _masked(length) + payload + _masked(payload)


class EventFileWriter:
    """Appends step scalars to one new event file in `folder` (one file per trainer start,
    as TensorBoard's own writers do: the viewer merges a folder's files by step)."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        now = time.time()
        name = f"events.out.tfevents.{int(now)}.{socket.gethostname()}.{os.getpid()}"
        self.path = folder / name
        with open(self.path, "ab") as fh:
            fh.write(record(event(now, 0)))

    def add_scalars(self, step: int, scalars: Mapping[str, float | None], prefix: str = "") -> None:
        """One event of the finite scalars (None and NaN are left out: no point)."""
        kept = {
            prefix + tag: float(v)
            for tag, v in scalars.items()
            if v is not None and math.isfinite(float(v))
        }
        with open(self.path, "ab") as fh:
            fh.write(record(event(time.time(), step, kept)))
            fh.flush()

    def finish(self) -> None:
        """Nothing to close: every event is flushed as it is written."""
