"""Delta checkpoints in SHARDCAST on 127.0.0.1: publish, mirror, rebuild, and every fallback.

Checkpoints are real safetensors files whose float32 weights move by an Adam-sized step
(every weight by about lr), published by a real origin, served over HTTP, mirrored by a
real relay; the client must end with the right checkpoint whatever the delta is.
"""

import contextlib
import json
import shutil
import time
import tracemalloc
from pathlib import Path

import blake3
import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

from helpers import settled_shard_bytes, wait_for_shard_bytes
from swarmrl.shardcast.client import fetch
from swarmrl.shardcast.delta import DeltaError, DeltaManifest, decode_block, encode_block
from swarmrl.shardcast.layout import LayoutError, Manifest, ShardInfo, shard_name
from swarmrl.shardcast.origin import Origin
from swarmrl.shardcast.relay import Relay
from swarmrl.shardcast.server import start_server

SHARD = 32 * 1024
BLOCK = 64 * 1024
pytestmark = pytest.mark.timeout(60)


def weights(step: int, n: int = 150_000) -> np.ndarray:
    """The weights after ``step`` Adam-like steps: every weight moves by about 1e-4."""
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.02, n).astype(np.float32)
    for s in range(step):
        w -= 1e-4 * np.sign(np.random.default_rng(s + 1).normal(size=n)).astype(np.float32)
    return w


def checkpoint(path: Path, step: int) -> Path:
    path.mkdir(parents=True)
    save_file({"w": weights(step)}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({"hidden": 8}))
    return path


def tree(root: Path) -> dict:
    return {p.relative_to(root): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def published(tmp_path):
    """An origin with v1 and v2 (v2 also as a delta from v1), served; the checkpoints."""
    origin = Origin(tmp_path / "origin", shard_size=SHARD, delta_block=BLOCK)
    ckpts = {v: checkpoint(tmp_path / f"ckpt{v}", v) for v in (1, 2)}
    for v, path in ckpts.items():
        origin.publish(v, path)
    server = start_server(origin.root)
    yield origin, server, ckpts
    server.stop()


def holding_v1(server_url: str, dest: Path) -> Path:
    assert fetch([server_url], 1, dest).route == "full"  # nothing held yet: no delta to use
    return dest


def delta_dir(root: Path) -> Path:
    return root / "v2" / "delta-from-1"


def test_delta_is_published_with_its_version_and_rebuilds_it_bit_for_bit(published, tmp_path):
    origin, server, ckpts = published
    full = Manifest.from_json((origin.root / "v2" / "manifest.json").read_text())
    delta = DeltaManifest.from_json((delta_dir(origin.root) / "manifest.json").read_text())
    assert (
        full.deltas == (2 - 1,)
        and Manifest.from_json((origin.root / "v1" / "manifest.json").read_text()).deltas == ()
    )
    assert (delta.base, delta.result_blake3, delta.result_size) == (1, full.blake3, full.file_size)
    assert len(delta.frames) > 1 and delta.file.file_size < 0.8 * full.file_size
    # distribution.txt keeps the reference format: one line per version, nothing about deltas
    first = Manifest.from_json((origin.root / "v1" / "manifest.json").read_text())
    assert (origin.root / "distribution.txt").read_text().splitlines() == [
        f"v1: {first.blake3}|{len(first.shards)}",
        f"v2: {full.blake3}|{len(full.shards)}",
    ]

    dest = holding_v1(server.url, tmp_path / "dest")
    result = fetch([server.url], 2, dest)
    assert (result.route, result.delta_base, result.delta_refused) == ("delta", 1, None)
    assert tree(result.path) == tree(ckpts[2])
    assert result.bytes_fetched == delta.file.file_size < full.file_size
    assert sorted(p.name for p in dest.iterdir()) == ["v1", "v2"]  # no leftovers
    # archive-only, the base held as v1.tar: the rebuilt file is the full shards' very file
    tars = tmp_path / "tars"
    fetch([server.url], 1, tars, unpack_archive=False)
    rebuilt = fetch([server.url], 2, tars, unpack_archive=False)
    assert rebuilt.route == "delta"
    assert blake3.blake3(rebuilt.path.read_bytes()).hexdigest() == full.blake3
    # a held v1.tar with other bytes is refused as a base, not trusted
    rebuilt.path.unlink()
    (tars / "v1.tar").write_bytes(b"not v1")
    again = fetch([server.url], 2, tars, unpack_archive=False)
    assert again.route == "full" and "not the delta's base" in (again.delta_refused or "")
    assert blake3.blake3(again.path.read_bytes()).hexdigest() == full.blake3
    assert sorted(p.name for p in tars.iterdir()) == ["v1.tar", "v2.tar"]


def test_a_relay_mirrors_deltas_and_serves_them(published, tmp_path):
    origin, server, ckpts = published
    relay = Relay([server.url], tmp_path / "relay", timeout=2)
    assert sorted(relay.sync_once()) == [1, 2]
    mirrored = delta_dir(tmp_path / "relay")
    assert (mirrored / "manifest.json").read_bytes() == (
        delta_dir(origin.root) / "manifest.json"
    ).read_bytes()
    assert Manifest.from_json((tmp_path / "relay" / "v2" / "manifest.json").read_text()).deltas == (
        1,
    )
    served = start_server(relay.store.root, guard=relay.guard)
    try:
        dest = holding_v1(served.url, tmp_path / "dest")
        before = settled_shard_bytes(served.stats)
        result = fetch([served.url], 2, dest)
        assert result.route == "delta" and tree(result.path) == tree(ckpts[2])
        expected = before + result.bytes_fetched
        assert wait_for_shard_bytes(served.stats, expected) == expected
        # a delta shard damaged in the relay's store is never served: the relay drops the
        # delta (it is optional) and the client takes the full shards
        shutil.rmtree(dest / "v2")
        shard = mirrored / shard_name(0)
        data = bytearray(shard.read_bytes())
        data[100] ^= 0xFF
        shard.write_bytes(bytes(data))
        result = fetch([served.url], 2, dest, max_attempts=2)
        assert result.route == "full" and tree(result.path) == tree(ckpts[2])
        assert not mirrored.exists()
    finally:
        served.stop()


def test_a_relay_whose_upstream_has_no_delta_mirrors_the_full_shards_only(published, tmp_path):
    origin, server, _ = published
    shutil.rmtree(delta_dir(origin.root))
    relay = Relay([server.url], tmp_path / "relay", timeout=2)
    assert sorted(relay.sync_once()) == [1, 2]
    assert not delta_dir(tmp_path / "relay").exists()
    assert (
        Manifest.from_json((tmp_path / "relay" / "v2" / "manifest.json").read_text()).deltas == ()
    )


@pytest.fixture
def relay_holding_v1(tmp_path):
    """An origin serving v1 and a relay that mirrored it; the origin publishes v2 next."""
    origin = Origin(tmp_path / "origin", shard_size=SHARD, delta_block=BLOCK)
    ckpts = {v: checkpoint(tmp_path / f"ckpt{v}", v) for v in (1, 2)}
    origin.publish(1, ckpts[1])
    server = start_server(origin.root)
    relay = Relay([server.url], tmp_path / "relay", timeout=2)
    assert relay.sync_once() == [1]
    origin.publish(2, ckpts[2])
    yield origin, server, relay, ckpts
    server.stop()


def delta_size(root: Path) -> int:
    return DeltaManifest.from_json((delta_dir(root) / "manifest.json").read_text()).file.file_size


def test_a_relay_holding_the_base_fetches_only_the_delta(relay_holding_v1, tmp_path):
    origin, server, relay, ckpts = relay_holding_v1
    before = settled_shard_bytes(server.stats)
    assert relay.sync_once() == [2]
    # the relay's link carried the delta only, not the full shards as well
    expected = before + delta_size(origin.root)
    assert wait_for_shard_bytes(server.stats, expected) == expected
    for index in range(
        len(Manifest.from_json((origin.root / "v2" / "manifest.json").read_text()).shards)
    ):
        name = f"v2/{shard_name(index)}"
        assert (relay.store.root / name).read_bytes() == (origin.root / name).read_bytes()
    assert (relay.store.root / "v2" / "manifest.json").read_bytes() == (
        origin.root / "v2" / "manifest.json"
    ).read_bytes()
    assert (
        sorted(p.name for p in (relay.store.root / "v2").iterdir() if p.name.startswith(".")) == []
    )
    served = start_server(relay.store.root, guard=relay.guard)
    try:
        dest = holding_v1(served.url, tmp_path / "dest")
        result = fetch([served.url], 2, dest)
        assert result.route == "delta" and tree(result.path) == tree(ckpts[2])
        shutil.rmtree(dest)
        assert tree(fetch([served.url], 2, tmp_path / "fresh").path) == tree(ckpts[2])
    finally:
        served.stop()


def test_a_relay_whose_held_base_is_damaged_fetches_the_full_shards(relay_holding_v1):
    origin, server, relay, _ = relay_holding_v1
    shard = relay.store.root / "v1" / shard_name(3)
    data = bytearray(shard.read_bytes())
    data[5] ^= 0x10
    shard.write_bytes(bytes(data))
    before = settled_shard_bytes(server.stats)
    assert relay.sync_once() == [2]
    full = Manifest.from_json((origin.root / "v2" / "manifest.json").read_text()).file_size
    # the delta (kept, though the rebuild from the damaged base failed its hash), then
    # the full shards
    expected = before + full + delta_size(origin.root)
    assert wait_for_shard_bytes(server.stats, expected) == expected
    assert Manifest.from_json((relay.store.root / "v2" / "manifest.json").read_text()).deltas == (
        1,
    )
    for index in range(
        len(Manifest.from_json((origin.root / "v2" / "manifest.json").read_text()).shards)
    ):
        name = f"v2/{shard_name(index)}"
        assert (relay.store.root / name).read_bytes() == (origin.root / name).read_bytes()


def corrupt_delta_shard(root: Path) -> None:
    shard = delta_dir(root) / shard_name(0)
    data = bytearray(shard.read_bytes())
    data[10] ^= 0x01
    shard.write_bytes(bytes(data))


def strip_deltas(root: Path) -> None:
    """What a server that serves only full shards holds (a relay that never mirrors them)."""
    shutil.rmtree(delta_dir(root))


def wrong_base_delta(root: Path, tmp_path: Path) -> None:
    """The delta of a v2 against some other v1 (an origin that published other bytes)."""
    other = Origin(tmp_path / "other", shard_size=SHARD, delta_block=BLOCK)
    (tmp_path / "other-ck").mkdir()
    odd = weights(1)
    odd[::7] += 1e-3
    save_file({"w": odd}, str(tmp_path / "other-ck" / "model.safetensors"))
    (tmp_path / "other-ck" / "config.json").write_text(json.dumps({"hidden": 8}))
    other.publish(1, tmp_path / "other-ck")
    other.publish(2, checkpoint(tmp_path / "other-ck2", 2))
    shutil.rmtree(delta_dir(root))
    shutil.copytree(delta_dir(other.root), delta_dir(root))


@pytest.mark.parametrize("damage", ["corrupt shard", "full shards only", "wrong base"])
def test_fetch_falls_back_to_the_full_shards(published, tmp_path, damage):
    origin, server, ckpts = published
    dest = holding_v1(server.url, tmp_path / "dest")
    if damage == "corrupt shard":
        corrupt_delta_shard(origin.root)
    elif damage == "full shards only":
        strip_deltas(origin.root)
    else:
        wrong_base_delta(origin.root, tmp_path)
    result = fetch([server.url], 2, dest, max_attempts=2)
    assert result.route == "full" and tree(result.path) == tree(ckpts[2])
    reason = {
        "corrupt shard": "does not match the manifest",
        "full shards only": "no server has a usable delta",
        "wrong base": "not the delta's base",
    }[damage]
    assert reason in (result.delta_refused or "")
    assert not (dest / ".v2.delta").exists()


def test_missing_or_altered_base_takes_the_full_shards(published, tmp_path):
    _, server, ckpts = published
    nothing = fetch([server.url], 2, tmp_path / "empty")
    assert (nothing.route, nothing.delta_refused) == ("full", None)  # no base: no delta tried
    dest = holding_v1(server.url, tmp_path / "dest")
    (dest / "v1" / "config.json").write_text("{}")  # the held v1 is not the v1 published
    result = fetch([server.url], 2, dest)
    assert result.route == "full" and "not the delta's base" in (result.delta_refused or "")
    assert tree(result.path) == tree(ckpts[2])
    off = fetch([server.url], 2, holding_v1(server.url, tmp_path / "off"), deltas=False)
    assert (off.route, off.delta_refused) == ("full", None)


def bomb_frame(size: int) -> bytes:
    """A small zstd frame that decompresses to ``size`` zero bytes."""
    compressor = zstandard.ZstdCompressor(level=1).compressobj()
    chunk = bytes(16 << 20)
    parts = [compressor.compress(chunk) for _ in range(size // len(chunk))]
    return b"".join([*parts, compressor.flush()])


def test_a_delta_bomb_is_refused_after_at_most_its_block(tmp_path):
    frame = bomb_frame(256 << 20)
    assert len(frame) < 64 << 10
    tracemalloc.start()
    started = time.perf_counter()
    with pytest.raises(DeltaError, match="more than its block's"):
        decode_block(frame, b"", BLOCK)
    seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert seconds < 0.5 and peak < 4 * BLOCK
    with pytest.raises(DeltaError, match="decompress"):
        decode_block(b"\x28\xb5\x2f\xfd" + bytes(20), b"", BLOCK)
    honest = encode_block(b"a" * 1000, b"b" * 900)
    assert decode_block(honest, b"b" * 900, 1000) == b"a" * 1000
    with pytest.raises(DeltaError, match="not its block's"):
        decode_block(honest, b"b" * 900, 1001)


def test_a_delta_bomb_on_the_wire_costs_the_client_one_block(published, tmp_path):
    """A server publishes an honest-looking delta (hashes all right) whose frame is a bomb."""
    origin, server, ckpts = published
    dest = holding_v1(server.url, tmp_path / "dest")
    directory = delta_dir(origin.root)
    honest = DeltaManifest.from_json((directory / "manifest.json").read_text())
    frames = [bomb_frame(64 << 20), *[bytes(16)] * (len(honest.frames) - 1)]
    body = b"".join(frames)
    for old in directory.glob("shard_*.bin"):
        old.unlink()
    (directory / shard_name(0)).write_bytes(body)
    digest = blake3.blake3(body).hexdigest()
    bomb = DeltaManifest(
        **{
            **honest.__dict__,
            "frames": tuple(len(f) for f in frames),
            "file": Manifest(2, len(body), len(body), digest, (ShardInfo(len(body), digest),)),
        }
    )
    (directory / "manifest.json").write_text(bomb.to_json())
    started = time.perf_counter()
    result = fetch([server.url], 2, dest)
    assert time.perf_counter() - started < 5
    assert result.route == "full" and tree(result.path) == tree(ckpts[2])
    assert "more than its block's" in (result.delta_refused or "")


@pytest.mark.slow
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    target=st.sampled_from(["manifest", "shard"]),
    edits=st.lists(
        st.tuples(st.integers(min_value=0, max_value=1 << 20), st.integers(1, 255)),
        min_size=1,
        max_size=4,
    ),
    cut=st.one_of(st.none(), st.integers(min_value=0, max_value=1 << 20)),
)
def test_a_mutated_delta_never_costs_the_right_checkpoint(published, tmp_path, target, edits, cut):
    origin, server, ckpts = published
    directory = delta_dir(origin.root)
    path = directory / ("manifest.json" if target == "manifest" else shard_name(0))
    honest = path.read_bytes()
    data = bytearray(honest)
    for at, flip in edits:
        data[at % len(data)] ^= flip
    if cut is not None:
        data = data[: cut % (len(data) + 1)]
    held = tmp_path / "held"
    if not held.exists():
        holding_v1(server.url, held)
    dest = tmp_path / f"dest-{time.monotonic_ns()}"
    shutil.copytree(held / "v1", dest / "v1")
    path.write_bytes(bytes(data))
    try:
        result = fetch([server.url], 2, dest, max_attempts=1)
    finally:
        path.write_bytes(honest)
    assert tree(result.path) == tree(ckpts[2])
    assert result.route in ("delta", "full")
    if result.route == "full":
        assert result.delta_refused
    shutil.rmtree(dest)


def test_a_base_missing_from_the_origin_store_costs_only_the_delta(tmp_path):
    origin = Origin(tmp_path / "origin", shard_size=SHARD, delta_block=BLOCK)
    origin.publish(1, checkpoint(tmp_path / "c1", 1))
    (origin.root / "v1" / shard_name(3)).unlink()
    manifest = origin.publish(2, checkpoint(tmp_path / "c2", 2))
    assert manifest.deltas == () and not delta_dir(origin.root).exists()
    assert 2 in origin.store.listed()
    unlisted = Origin(tmp_path / "plain", shard_size=SHARD, deltas=False)
    unlisted.publish(1, tmp_path / "c1")
    assert unlisted.publish(2, tmp_path / "c2").deltas == ()


def test_a_frame_that_asks_for_a_huge_window_is_refused():
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=27)
    stream = zstandard.ZstdCompressor(compression_params=params).compressobj()  # size unknown:
    frame = stream.compress(bytes(2 * BLOCK)) + stream.flush()  # the header keeps the window
    assert zstandard.get_frame_parameters(frame).window_size == 1 << 27
    with pytest.raises(DeltaError, match="too much memory"):
        decode_block(frame, b"", 2 * BLOCK)


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=300),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=8),
            lambda inner: (
                st.lists(inner, max_size=4)
                | st.dictionaries(st.text(max_size=12), inner, max_size=6)
            ),
            max_leaves=20,
        ).map(lambda v: json.dumps(v).encode()),
    )
)
def test_delta_manifest_parser_refuses_anything_malformed_with_a_layout_error(data):
    """Hostile bytes from a relay: parsed, or refused with the one clear error, never a crash."""
    with contextlib.suppress(LayoutError):
        DeltaManifest.from_json(data)


def test_swarmrl_fetch_says_which_way_the_file_came(published, tmp_path, capsys):
    from swarmrl.shardcast.cli import main

    _, server, ckpts = published
    dest = holding_v1(server.url, tmp_path / "dest")
    args = ["fetch", "--servers", server.url, "--version", "2", "--quiet"]
    assert main([*args, "--dest", str(dest)]) == 0
    assert json.loads(capsys.readouterr().out)["route"] == "delta"
    off = holding_v1(server.url, tmp_path / "off")
    assert main([*args, "--dest", str(off), "--no-deltas"]) == 0
    assert json.loads(capsys.readouterr().out)["route"] == "full"
    assert tree(dest / "v2") == tree(off / "v2") == tree(ckpts[2])


def test_a_bf16_broadcast_copy_rounds_every_weight_and_loads_in_fp32(tmp_path, warm_model_dir):
    import torch
    from safetensors.torch import load_file

    from swarmrl.checkpoints import load_policy, write_rounded_copy

    rounded = write_rounded_copy(warm_model_dir, tmp_path / "v0")
    original = load_file(warm_model_dir / "model.safetensors")
    copied = load_file(rounded / "model.safetensors")
    assert copied.keys() == original.keys()
    for key, tensor in original.items():
        assert copied[key].dtype == torch.bfloat16
        assert torch.equal(copied[key], tensor.to(torch.bfloat16)), key
    assert json.loads((rounded / "config.json").read_text())["dtype"] == "bfloat16"
    # Every other file (the tokenizer's) comes across unchanged.
    others = {p.name for p in warm_model_dir.iterdir()} - {"model.safetensors", "config.json"}
    for name in others:
        assert (rounded / name).read_bytes() == (warm_model_dir / name).read_bytes(), name
    # Readers compute in fp32 from the rounded values.
    model, _ = load_policy(rounded)
    for name, param in model.named_parameters():
        assert param.dtype == torch.float32
        want = original.get(name, original.get(name.replace("lm_head", "model.embed_tokens")))
        if want is not None:
            assert torch.equal(param, want.to(torch.bfloat16).float()), name
    # No half-written copy is left behind, and an existing one is replaced whole.
    write_rounded_copy(warm_model_dir, tmp_path / "v0")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v0"]


def test_bf16_broadcast_deltas_are_far_smaller_than_fp32_ones(tmp_path):
    """An Adam-sized step moves every fp32 weight, but few of them across a bf16 rounding
    boundary: the rounded copies' delta is a fraction of the fp32 delta."""
    import torch
    from safetensors.torch import save_file as save_torch

    from swarmrl.checkpoints import write_rounded_copy

    sizes = {}
    for precision in ("fp32", "bf16"):
        origin = Origin(tmp_path / f"origin-{precision}", shard_size=SHARD, delta_block=BLOCK)
        for v in (1, 2):
            path = tmp_path / f"{precision}-ckpt{v}"
            path.mkdir()
            save_torch({"w": torch.from_numpy(weights(v))}, str(path / "model.safetensors"))
            (path / "config.json").write_text(json.dumps({"hidden": 8}))
            if precision == "bf16":
                path = write_rounded_copy(path, tmp_path / f"bf16-rounded{v}")
            origin.publish(v, path)
        delta = origin.root / "v2" / "delta-from-1"
        sizes[precision] = sum(p.stat().st_size for p in delta.iterdir())
    assert 0 < sizes["bf16"] < 0.25 * sizes["fp32"], sizes
