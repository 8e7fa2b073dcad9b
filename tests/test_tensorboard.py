"""The trainer's TensorBoard event files, read back by the tensorboard package's own
reader (offline: files only), and `--log.backend` off by default."""

from __future__ import annotations

import math
import struct

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from swarmrl.config import load_config
from swarmrl.trainer.tensorboard import EventFileWriter, crc32c, record


def test_crc32c_matches_the_standard_check_value():
    # The CRC-32C check value of "123456789" (RFC 3720, B.4).
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"") == 0


def test_event_files_read_back_with_tensorboards_reader(tmp_path):
    writer = EventFileWriter(tmp_path / "tb")
    steps = [
        {"reward": -0.5, "grad_norm": 0.0625, "length_error": math.nan, "clip_ratio": None},
        {"reward": 0.25, "grad_norm": 0.125, "length_error": 12.0, "clip_ratio": 0.5},
        {"reward": 1.0, "grad_norm": math.inf, "length_error": 3.0, "clip_ratio": 0.0},
    ]
    for step, scalars in enumerate(steps):
        writer.add_scalars(step, scalars, prefix="train/")
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    for tag in ("reward", "grad_norm", "length_error", "clip_ratio"):
        shown = [(e.step, e.value) for e in events.Scalars(f"train/{tag}")]
        # NaN, inf and None are left out; every other value comes back (float32).
        expected = [
            (step, s[tag])
            for step, s in enumerate(steps)
            if s[tag] is not None and math.isfinite(s[tag])
        ]
        assert shown == expected, tag


def test_a_frame_carries_its_length_and_both_checksums():
    frame = record(b"payload")
    (length,) = struct.unpack("<Q", frame[:8])
    assert length == 7 and frame[12:19] == b"payload" and len(frame) == 8 + 4 + 7 + 4


def test_the_backend_is_off_unless_asked_for():
    assert load_config(None).log.backend == "off"
    cfg = load_config(None, {"log.backend": "tensorboard", "log.dir": "/tmp/tb"})
    assert (cfg.log.backend, cfg.log.dir) == ("tensorboard", "/tmp/tb")
