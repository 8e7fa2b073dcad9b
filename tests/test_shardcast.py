"""SHARDCAST end to end on 127.0.0.1: origin, servers, relays (real subprocesses), client faults, interop."""

import asyncio
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import blake3
import pytest
from aiohttp import web

import swarmrl
from helpers import settled_shard_bytes, wait_for_shard_bytes
from swarmrl.shardcast.client import (
    FetchError,
    IntegrityError,
    VersionUnavailableError,
    fetch,
    latest_version,
    server_bytes,
)
from swarmrl.shardcast.layout import Manifest, parse_distribution, shard_name
from swarmrl.shardcast.origin import Origin, write_archive
from swarmrl.shardcast.relay import Relay
from swarmrl.shardcast.server import start_server
from swarmrl.shardcast.transfer import HttpStatusError, TransferError, get_bytes, get_stream

SHARD = 32 * 1024
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(
        [str(Path(swarmrl.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
    ),
}
pytestmark = pytest.mark.timeout(60)


def make_checkpoint(path: Path, seed: int = 0, size: int = 600_000) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"seed": seed}))
    (path / "model.safetensors").write_bytes(blake3.blake3(str(seed).encode()).digest(length=size))
    (path / "tokenizer").mkdir()
    (path / "tokenizer" / "tokenizer.json").write_text("{}")
    return path


def same_tree(a: Path, b: Path) -> bool:
    def files(root):
        return {p.relative_to(root): p.read_bytes() for p in root.rglob("*") if p.is_file()}

    return files(a) == files(b)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_version(url: str, version: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            listed = parse_distribution(get_bytes(f"{url}/distribution.txt", 2).decode())
        except TransferError:
            listed = {}  # not up yet
        if version in listed:
            return
        time.sleep(0.1)
    raise AssertionError(f"{url} did not list v{version} within {timeout} s")


def spawn(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, *args], env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )


def spawn_relay(upstream: str, root: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = spawn(
        [
            "-m",
            "swarmrl.shardcast.cli",
            "relay",
            "--upstream",
            upstream,
            "--root",
            str(root),
            "--port",
            str(port),
            "--poll-s",
            "0.2",
            "--timeout",
            "2",
        ]
    )
    return proc, f"http://127.0.0.1:{port}"


@pytest.fixture
def origin(tmp_path):
    """An origin with v5 published in 32 KiB shards, served on a background thread."""
    checkpoint = make_checkpoint(tmp_path / "ckpt")
    publisher = Origin(tmp_path / "origin", keep=2, shard_size=SHARD, grace_s=0)
    publisher.publish(5, checkpoint)
    server = start_server(publisher.root)
    yield publisher, server, checkpoint
    server.stop()


# ------------------------------------------------------------------------------------- origin


def test_publish_writes_shards_manifest_then_announces(tmp_path):
    checkpoint = make_checkpoint(tmp_path / "ckpt")
    publisher = Origin(tmp_path / "root", shard_size=SHARD)
    manifest = publisher.publish(12, checkpoint)
    version_dir = tmp_path / "root" / "v12"
    shards = [version_dir / shard_name(i) for i in range(len(manifest.shards))]
    joined = b"".join(p.read_bytes() for p in shards)
    assert all(p.stat().st_size == SHARD for p in shards[:-1])
    assert [blake3.blake3(p.read_bytes()).hexdigest() for p in shards] == [
        s.blake3 for s in manifest.shards
    ]
    assert blake3.blake3(joined).hexdigest() == manifest.blake3
    assert Manifest.from_json((version_dir / "manifest.json").read_text()) == manifest
    assert parse_distribution((tmp_path / "root" / "distribution.txt").read_text()) == {
        12: manifest.entry
    }
    # the file is a plain tar of the checkpoint, and the same checkpoint gives the same bytes
    archive = tmp_path / "a.tar"
    archive.write_bytes(joined)
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    assert same_tree(checkpoint, tmp_path / "unpacked")
    with open(tmp_path / "again.tar", "wb") as f:
        write_archive(checkpoint, f)
    assert (tmp_path / "again.tar").read_bytes() == joined


def test_a_failed_publish_announces_nothing(tmp_path):
    publisher = Origin(tmp_path / "root", shard_size=SHARD)
    publisher.publish(1, make_checkpoint(tmp_path / "good"))
    before = (tmp_path / "root" / "distribution.txt").read_text()
    bad = make_checkpoint(tmp_path / "bad", seed=1)
    os.symlink("/etc/passwd", bad / "zz_link")  # written after the model shards, then refused
    with pytest.raises(ValueError, match="only regular files"):
        publisher.publish(2, bad)
    assert (tmp_path / "root" / "distribution.txt").read_text() == before
    assert sorted(p.name for p in (tmp_path / "root").iterdir() if p.is_dir()) == ["v1"]


def test_versions_survive_restart_and_are_never_reused(tmp_path):
    first, second = make_checkpoint(tmp_path / "a", seed=1), make_checkpoint(tmp_path / "b", seed=2)
    Origin(tmp_path / "root", shard_size=SHARD).publish(3, first)
    restarted = Origin(tmp_path / "root", shard_size=SHARD)
    assert restarted.latest_version() == 3
    with pytest.raises(ValueError, match="never go backwards"):
        restarted.publish(2, first)
    restarted.publish(3, first)  # same step, same bytes: nothing to do
    with pytest.raises(ValueError, match="never reused"):
        restarted.publish(3, second)
    restarted.publish(4, second)
    assert sorted(restarted.store.listed()) == [3, 4]


def test_keeps_k_versions_and_deletes_old_ones_only_after_grace(tmp_path):
    publisher = Origin(tmp_path / "root", keep=2, shard_size=SHARD, grace_s=60)
    for step in (1, 2, 3):
        publisher.publish(step, make_checkpoint(tmp_path / f"c{step}", seed=step))
    assert sorted(publisher.store.listed()) == [2, 3]
    assert (tmp_path / "root" / "v1").is_dir()  # delisted, but a download that started may finish
    assert publisher.store.prune(now=time.time() + 61) == [1]
    assert not (tmp_path / "root" / "v1").exists()
    with pytest.raises(ValueError, match="never go backwards"):
        publisher.publish(1, tmp_path / "c1")


# ------------------------------------------------------------------------------------- server


def test_server_binds_loopback_serves_ranges_and_counts_bytes(origin):
    publisher, server, _ = origin
    assert server.host == "127.0.0.1"
    shard = (publisher.root / "v5" / shard_name(1)).read_bytes()
    parts = []
    get_stream(
        f"{server.url}/v5/{shard_name(1)}",
        lambda b: parts.append(bytes(b)),
        5,
        byte_range=(100, 4195),
    )
    assert b"".join(parts) == shard[100:4196]
    before = settled_shard_bytes(server.stats)
    assert json.loads(get_bytes(f"{server.url}/stats.json", 5))["shard_bytes"] == before
    assert (
        get_bytes(f"{server.url}/v5/{shard_name(0)}", 5)
        == (publisher.root / "v5" / shard_name(0)).read_bytes()
    )
    assert wait_for_shard_bytes(server.stats, before + SHARD) == before + SHARD
    for path in [
        "/v5/../.retired.json",
        "/.retired.json",
        "/v5/shard_00000.bin",
        "/v5/nope",
        "/etc/passwd",
    ]:
        with pytest.raises(HttpStatusError) as err:
            get_bytes(f"{server.url}{path}", 5)
        assert err.value.status == 404


def test_server_bytes_reads_our_stats_page_and_is_none_elsewhere(origin):
    _, server, _ = origin
    served = json.loads(get_bytes(f"{server.url}/stats.json", 5))["bytes_served"]
    assert isinstance(served, int) and server_bytes(server.url) >= served
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    assert server_bytes(f"http://127.0.0.1:{port}", timeout=1.0) is None  # nothing listens
    assert server_bytes(f"{server.url}/v5/{shard_name(0)}", timeout=1.0) is None  # no page


# ------------------------------------------------------------------------------------- client


def test_fetch_from_several_servers_verifies_and_unpacks(origin, tmp_path):
    publisher, server, checkpoint = origin
    mirror = start_server(shutil.copytree(publisher.root, tmp_path / "mirror"))
    try:
        assert latest_version([server.url, mirror.url]) == 5
        result = fetch([server.url, mirror.url], None, tmp_path / "dest", concurrency=4)
    finally:
        mirror.stop()
    assert result.path == tmp_path / "dest" / "v5" and same_tree(checkpoint, result.path)
    manifest = Manifest.from_json((publisher.root / "v5" / "manifest.json").read_text())
    assert sum(result.bytes_by_server.values()) == manifest.file_size
    assert len(result.bytes_by_server) == 2  # both servers carried shards
    assert sorted(p.name for p in (tmp_path / "dest").iterdir()) == ["v5"]  # no leftovers


def test_fetch_resumes_a_partial_download(origin, tmp_path):
    publisher, server, checkpoint = origin

    class Interrupted(BaseException):
        pass

    finished = []

    def stop_after_three(index, info):
        finished.append(index)
        if len(finished) == 3:
            raise Interrupted

    with pytest.raises(Interrupted):
        fetch([server.url], 5, tmp_path / "dest", concurrency=1, on_shard=stop_after_three)
    assert not (tmp_path / "dest" / "v5").exists()
    result = fetch([server.url], 5, tmp_path / "dest")
    manifest = Manifest.from_json((publisher.root / "v5" / "manifest.json").read_text())
    assert result.resumed_shards >= 3
    assert sum(result.bytes_by_server.values()) == manifest.file_size - sum(
        manifest.shards[i].size for i in finished
    )
    assert same_tree(checkpoint, result.path)


@pytest.mark.slow
def test_relay_killed_mid_download_client_finishes_from_the_other(origin, tmp_path):
    _publisher, server, checkpoint = origin
    relays = [spawn_relay(server.url, tmp_path / f"relay{i}") for i in range(2)]
    try:
        for _, url in relays:
            wait_for_version(url, 5)
        doomed, doomed_url = relays[0]

        lock = threading.Lock()  # shard callbacks come from several download threads
        killed_at_shard = []  # (shard that had just finished, the relay's exit code)

        def kill_relay_once_it_served(index, info):
            with lock:
                if (
                    not killed_at_shard
                    and json.loads(get_bytes(f"{doomed_url}/stats.json", 2))["shard_bytes"] > 0
                ):
                    doomed.kill()
                    killed_at_shard.append((index, doomed.wait()))

        result = fetch(
            [r[1] for r in relays],
            5,
            tmp_path / "dest",
            concurrency=2,
            timeout=2,
            on_shard=kill_relay_once_it_served,
        )
    finally:
        for proc, _ in relays:
            proc.kill()
            proc.wait()
    assert same_tree(checkpoint, result.path)
    assert len(killed_at_shard) == 1 and killed_at_shard[0][1] == -9  # killed mid-download
    assert result.bytes_by_server[doomed_url] > 0


def corrupt(path: Path, at: int = 1000) -> None:
    """Flip one byte in place (a write through the filesystem, as a faulty process would)."""
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.slow
def test_relay_repairs_a_corrupted_shard_in_its_store(tmp_path):
    """Origin and relay are real processes. Shards corrupted in the relay's store mid-run are
    refused (never served), fetched again from the origin, and served: our client and the
    reference client both finish, and the relay's store holds the origin's bytes again."""
    checkpoint = make_checkpoint(tmp_path / "ckpt")
    Origin(tmp_path / "origin", shard_size=SHARD).publish(5, checkpoint)
    port = free_port()
    origin = spawn(
        [
            "-m",
            "swarmrl.shardcast.cli",
            "origin",
            "--root",
            str(tmp_path / "origin"),
            "--port",
            str(port),
        ]
    )
    origin_url = f"http://127.0.0.1:{port}"
    relay, relay_url = spawn_relay(origin_url, tmp_path / "relay")
    held, published = tmp_path / "relay" / "v5", tmp_path / "origin" / "v5"
    try:
        wait_for_version(relay_url, 5)
        for index in (1, 3):
            corrupt(held / shard_name(index))
        result = fetch([relay_url], 5, tmp_path / "dest", concurrency=2)
        assert same_tree(checkpoint, result.path)
        # the only failed requests are the relay refusing the two damaged shards while it healed
        assert {i for i, _, _ in result.failures} == {1, 3}
        assert all("HTTP 503" in why for _, _, why in result.failures)
        for index in (1, 3):
            assert (held / shard_name(index)).read_bytes() == (
                published / shard_name(index)
            ).read_bytes()

        corrupt(held / shard_name(2))
        out = tmp_path / "ref" / "v5.tar"
        done = run_reference_client(relay_url, 5, out)
        assert done.returncode == 0, done.stderr[-2000:]
        with open(tmp_path / "ours.tar", "wb") as f:
            write_archive(checkpoint, f)
        assert out.read_bytes() == (tmp_path / "ours.tar").read_bytes()
        assert (held / shard_name(2)).read_bytes() == (published / shard_name(2)).read_bytes()
    finally:
        for proc in (relay, origin):
            proc.kill()
            proc.wait()


def test_relay_mirrors_a_version_again_when_its_manifest_is_damaged(origin, tmp_path):
    """Without a readable manifest the relay cannot vouch for any shard of the version: it
    refuses them, drops the version and mirrors it again; clients then download it."""
    _, server, checkpoint = origin
    relay = Relay([server.url], tmp_path / "relay", poll_s=0.1, timeout=2)
    assert relay.sync_once() == [5]
    relay_server = start_server(relay.store.root, guard=relay.guard)
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    manifest_file = tmp_path / "relay" / "v5" / "manifest.json"
    good_manifest = manifest_file.read_bytes()
    try:
        manifest_file.write_text("{not json")
        with pytest.raises(HttpStatusError) as refused:
            get_bytes(f"{relay_server.url}/v5/manifest.json", 5)
        assert refused.value.status == 503
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (
            manifest_file.exists() and manifest_file.read_bytes() == good_manifest
        ):
            time.sleep(0.05)
        wait_for_version(relay_server.url, 5)  # announced once the mirrored copy is in place
        result = fetch([relay_server.url], 5, tmp_path / "dest", concurrency=2)
    finally:
        relay.stop()
        thread.join(timeout=10)
        relay_server.stop()
    assert manifest_file.read_bytes() == good_manifest
    assert same_tree(checkpoint, result.path) and result.failures == []


def test_corrupted_shard_is_detected_and_fetched_elsewhere(origin, tmp_path):
    publisher, server, checkpoint = origin
    bad_root = shutil.copytree(publisher.root, tmp_path / "bad")
    target = bad_root / "v5" / shard_name(2)
    data = bytearray(target.read_bytes())
    data[1000] ^= 0xFF
    target.write_bytes(bytes(data))
    bad = start_server(bad_root)
    try:
        # With one download thread, shard i's first server is the (i+1)-th draw. Seed 183's
        # third draw is 0.0013, so shard 3 is asked first of the first-listed server (the
        # corrupt copy) unless that server's weight were below 0.13% of the total.
        result = fetch(
            [bad.url, server.url], 5, tmp_path / "dest", concurrency=1, rng=random.Random(183)
        )
    finally:
        bad.stop()
    assert same_tree(checkpoint, result.path)
    assert [(i, s) for i, s, _ in result.failures] == [(2, bad.url)]
    assert "does not match the manifest" in result.failures[0][2]


def test_version_removed_mid_download_fails_clearly_and_leaves_nothing(origin, tmp_path):
    publisher, server, _ = origin
    newer = make_checkpoint(tmp_path / "newer", seed=9)

    def remove_v5(index, info):
        if 5 in publisher.store.listed():
            publisher.publish(6, newer)
            publisher.publish(7, newer)  # keep=2, grace 0: v5 is delisted and deleted now

    with pytest.raises(VersionUnavailableError, match="v5 was removed from every server"):
        fetch([server.url], 5, tmp_path / "dest", concurrency=1, max_attempts=3, on_shard=remove_v5)
    assert list((tmp_path / "dest").iterdir()) == []


def test_hanging_server_times_out_and_another_server_is_used(origin, tmp_path):
    publisher, server, checkpoint = origin

    async def passthrough(request):
        return web.FileResponse(publisher.root / request.path.lstrip("/"))

    async def hang(request):
        await asyncio.sleep(3600)

    app = web.Application()
    app.router.add_get("/distribution.txt", passthrough)
    app.router.add_get("/data1.bin", passthrough)
    app.router.add_get("/v5/manifest.json", passthrough)
    app.router.add_get("/v5/{name}", hang)
    port = free_port()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    hanging = f"http://127.0.0.1:{port}"
    try:
        started = time.monotonic()
        result = fetch([hanging, server.url], 5, tmp_path / "dest", concurrency=4, timeout=0.5)
        elapsed = time.monotonic() - started
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
    assert same_tree(checkpoint, result.path)
    assert any(s == hanging and "no data for 0.5 s" in why for _, s, why in result.failures)
    assert result.bytes_by_server.get(hanging, 0) == 0
    assert elapsed < 15


@pytest.mark.slow
def test_trickling_server_is_cut_off_below_the_minimum_rate(origin, tmp_path):
    """A server that sends a few bytes every so often (never quiet for `timeout`) loses
    the shard at the rate floor; the download completes from the other server."""
    publisher, server, checkpoint = origin

    async def passthrough(request):
        return web.FileResponse(publisher.root / request.path.lstrip("/"))

    async def trickle(request):
        size = (publisher.root / request.path.lstrip("/")).stat().st_size
        response = web.StreamResponse(headers={"Content-Length": str(size)})
        await response.prepare(request)
        for _ in range(size // 64):
            await response.write(b"\0" * 64)  # 64 bytes per 0.1 s: 640 B/s
            await asyncio.sleep(0.1)
        return response

    app = web.Application()
    app.router.add_get("/distribution.txt", passthrough)
    app.router.add_get("/data1.bin", passthrough)
    app.router.add_get("/v5/manifest.json", passthrough)
    app.router.add_get("/v5/{name}", trickle)
    port = free_port()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    trickling = f"http://127.0.0.1:{port}"
    try:
        started = time.monotonic()
        # floor 32 KiB/s: a 32 KiB shard is given timeout + 1 s, instead of 51 s at 640 B/s
        result = fetch(
            [trickling, server.url],
            5,
            tmp_path / "dest",
            concurrency=4,
            timeout=0.5,
            min_rate=32 * 1024,
        )
        elapsed = time.monotonic() - started
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
    assert same_tree(checkpoint, result.path)
    assert any(s == trickling and "slower than 32 KiB/s" in why for _, s, why in result.failures)
    assert elapsed < 15


def test_unknown_version_is_a_clear_error(origin, tmp_path):
    _, server, _ = origin
    with pytest.raises(
        VersionUnavailableError, match=r"no server lists v99: http://127.0.0.1:\d+: lists v5"
    ):
        fetch([server.url], 99, tmp_path / "dest")
    with pytest.raises(FetchError, match="unreachable"):
        fetch([f"http://127.0.0.1:{free_port()}"], None, tmp_path / "dest", timeout=1)


def test_cli_origin_and_fetch(origin, tmp_path):
    publisher, _, checkpoint = origin
    port = free_port()
    proc = spawn(
        [
            "-m",
            "swarmrl.shardcast.cli",
            "origin",
            "--root",
            str(publisher.root),
            "--port",
            str(port),
        ]
    )
    try:
        wait_for_version(f"http://127.0.0.1:{port}", 5)
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "swarmrl.shardcast.cli",
                "fetch",
                "--servers",
                f"127.0.0.1:{port}",
                "--dest",
                str(tmp_path / "dest"),
                "--quiet",
            ],
            env=ENV,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        missing = subprocess.run(
            [
                sys.executable,
                "-m",
                "swarmrl.shardcast.cli",
                "fetch",
                "--servers",
                f"http://127.0.0.1:{port}",
                "--version",
                "4",
                "--dest",
                str(tmp_path / "dest"),
                "--quiet",
            ],
            env=ENV,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    finally:
        proc.kill()
        proc.wait()
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert summary["version"] == 5 and same_tree(checkpoint, Path(summary["path"]))
    assert missing.returncode == 1 and "no server lists v4" in missing.stderr


# ------------------------------------------------------------------------------------- interop


def run_reference_client(url: str, version: int, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from shardcast.client_node import main; sys.exit(main())",
            "--servers",
            url,
            "--version",
            f"v{version}",
            "--output-dir",
            str(out.parent),
            "--output-file",
            str(out),
        ],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=45,
        check=False,
    )


def test_reference_client_downloads_from_our_origin_and_our_relay(origin, tmp_path):
    publisher, server, checkpoint = origin
    # v6 is also published as a delta from v5 (v6/delta-from-5/): the reference client,
    # which knows only distribution.txt and the shards, must not notice it
    changed = shutil.copytree(checkpoint, tmp_path / "ckpt6")
    model = bytearray((changed / "model.safetensors").read_bytes())
    model[::1000] = bytes(len(model[::1000]))
    (changed / "model.safetensors").write_bytes(bytes(model))
    assert publisher.publish(6, changed).deltas == (5,)
    relay = Relay([server.url], tmp_path / "relay", poll_s=0.1, timeout=2)
    assert relay.sync_once() == [6, 5]
    assert (relay.store.root / "v6" / "delta-from-5" / "manifest.json").exists()
    relay_server = start_server(relay.store.root)
    try:
        for name, url, version in [
            ("origin", server.url, 5),
            ("origin", server.url, 6),
            ("relay", relay_server.url, 6),
        ]:
            out = tmp_path / f"ref-{name}" / f"v{version}.tar"
            done = run_reference_client(url, version, out)
            assert done.returncode == 0, done.stderr[-2000:]
            expected = publisher.store.listed()[version].blake3
            assert blake3.blake3(out.read_bytes()).hexdigest() == expected
    finally:
        relay_server.stop()


REFERENCE_ORIGIN = """
import sys, time
import shardcast
shardcast.initialize(data_dir=sys.argv[1], port=int(sys.argv[2]))
shardcast.broadcast(sys.argv[3], shard_size=int(sys.argv[4]))
print("ready", flush=True)
time.sleep(120)
"""


def test_our_client_and_relay_download_from_a_reference_origin(tmp_path):
    checkpoint = make_checkpoint(tmp_path / "ckpt", seed=3)
    archive = tmp_path / "checkpoint.tar"
    with open(archive, "wb") as f:
        write_archive(checkpoint, f)
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            REFERENCE_ORIGIN,
            str(tmp_path / "ref"),
            str(port),
            str(archive),
            str(SHARD),
        ],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        assert proc.stdout.readline().strip() == "ready"
        result = fetch([url], 1, tmp_path / "dest", concurrency=4)  # the reference numbers from v1
        assert same_tree(checkpoint, result.path)
        assert result.bytes_by_server[url] == archive.stat().st_size
        relay = Relay(
            [url], tmp_path / "relay", timeout=5
        )  # no manifest upstream: the relay writes one
        assert relay.sync_once() == [1]
        relay_server = start_server(relay.store.root)
        try:
            via_relay = fetch([relay_server.url], 1, tmp_path / "dest2")
        finally:
            relay_server.stop()
        assert same_tree(checkpoint, via_relay.path)
        assert (
            Manifest.from_json((tmp_path / "relay" / "v1" / "manifest.json").read_text()).file_size
            == archive.stat().st_size
        )
    finally:
        proc.kill()
        proc.wait()


def test_client_without_manifest_rejects_a_bad_whole_file(tmp_path):
    """A reference origin gives no per-shard hashes: a corrupt shard is caught by the whole-file hash."""
    publisher = Origin(tmp_path / "root", shard_size=SHARD)
    publisher.publish(1, make_checkpoint(tmp_path / "ckpt"))
    (publisher.root / "v1" / "manifest.json").unlink()
    shard = publisher.root / "v1" / shard_name(0)
    shard.write_bytes(b"x" + shard.read_bytes()[1:])
    server = start_server(publisher.root)
    try:
        with pytest.raises(IntegrityError, match="no per-shard manifest"):
            fetch([server.url], 1, tmp_path / "dest")
    finally:
        server.stop()
    assert list((tmp_path / "dest").iterdir()) == []
