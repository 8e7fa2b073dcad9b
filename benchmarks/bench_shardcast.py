"""SHARDCAST on loopback: our client vs the reference client vs one plain stream; a relay tree's origin load.

    python benchmarks/bench_shardcast.py                  # 1 GB version, 50 MB shards (the issue's setting)
    python benchmarks/bench_shardcast.py --size-mb 100    # quick run

Every figure is a ratio measured side by side in one run (docs/architecture.md §5), each repeat
running the three downloads back to back in rotating order against the same origin
server (a separate process), with ``os.sync()`` before each so earlier writes do not
slow the next one. Reported per ratio: the median over repeats.

- reference: ``shardcast.ClientNode.download_version`` (wget per shard, reassemble, hash)
- ours: ``swarmrl.shardcast.client.fetch(..., unpack_archive=False)`` (download, per-shard
  and whole-file BLAKE3, the verified tar in place; unpacking is timed separately)
- plain: one connection at a time fetching the shards in order into one file, no hashing,
  with the same socket loop our client uses: the single-stream limit of this machine
- tree: an origin, ``--relays`` relay processes mirroring it, ``--clients`` ``swarmrl fetch``
  processes pulling from the relays at once; origin bytes served vs clients × file size.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import swarmrl
from swarmrl.shardcast.client import fetch
from swarmrl.shardcast.layout import shard_name
from swarmrl.shardcast.origin import Origin
from swarmrl.shardcast.transfer import get_bytes, get_stream
from swarmrl.shardcast.unpack import unpack

ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(
        [str(Path(swarmrl.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
    ),
}
CLI = [sys.executable, "-m", "swarmrl.shardcast.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(args: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [*CLI, *args, "--port", str(port)],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            get_bytes(f"{url}/distribution.txt", 1)
            return proc, url
        except Exception:  # noqa: BLE001 - not listening yet
            time.sleep(0.05)
    raise RuntimeError(f"server {args} did not come up")


def shard_bytes(url: str) -> int:
    return json.loads(get_bytes(f"{url}/stats.json", 5))["shard_bytes"]


def plain_download(url: str, version: int, num_shards: int, out: Path) -> None:
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    offset = 0
    try:
        for i in range(num_shards):

            def sink(piece: memoryview) -> None:
                nonlocal offset
                os.pwrite(fd, piece, offset)
                offset += len(piece)

            get_stream(f"{url}/v{version}/{shard_name(i)}", sink, 30)
    finally:
        os.close(fd)


def reference_download(url: str, version: int, out: Path) -> None:
    from shardcast import ClientNode

    if ClientNode([url], str(out.parent)).download_version(f"v{version}", str(out)) is None:
        raise RuntimeError("the reference client failed")


def timed(fn, out_dir: Path) -> float:
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    os.sync()
    start = time.perf_counter()
    fn(out_dir)
    elapsed = time.perf_counter() - start
    shutil.rmtree(out_dir, ignore_errors=True)
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--size-mb", type=float, default=1000, help="version size in MB (10^6 bytes)"
    )
    parser.add_argument(
        "--shard-mb", type=float, default=50, help="shard size in MB (reference default 50)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="side-by-side repeats")
    parser.add_argument("--relays", type=int, default=2)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument(
        "--workdir", type=Path, default=None, help="scratch directory (default: a temp dir)"
    )
    args = parser.parse_args()
    os.environ["SHARDCAST_LOG_LEVEL"] = (
        "WARNING"  # read by the reference package when it is imported
    )

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_shardcast_"))
    size, shard = int(args.size_mb * 1e6), int(args.shard_mb * 1e6)
    checkpoint = work / "checkpoint"
    checkpoint.mkdir(parents=True)
    with open(checkpoint / "model.safetensors", "wb") as f:
        left = size - 20_000  # the tar adds headers and padding
        while left > 0:
            f.write(os.urandom(min(left, 16 << 20)))
            left -= 16 << 20
    (checkpoint / "config.json").write_text("{}")
    start = time.perf_counter()
    manifest = Origin(work / "origin", shard_size=shard).publish(1, checkpoint)
    publish_s = time.perf_counter() - start
    file_size = manifest.file_size
    results: dict = {
        "file_bytes": file_size,
        "shard_bytes": shard,
        "num_shards": len(manifest.shards),
        "publish_s": round(publish_s, 3),
    }
    print(
        f"version: {file_size / 1e6:.0f} MB in {len(manifest.shards)} shards; published in {publish_s:.2f} s",
        flush=True,
    )

    origin, url = serve(["origin", "--root", str(work / "origin")])
    try:
        runs = {
            "plain": lambda d: plain_download(url, 1, len(manifest.shards), d / "plain.bin"),
            "ours": lambda d: fetch([url], 1, d, unpack_archive=False),
            "reference": lambda d: reference_download(url, 1, d / "ref.bin"),
        }
        times: dict[str, list[float]] = {k: [] for k in runs}
        names = list(runs)
        for r in range(args.repeats):
            for name in names[r % 3 :] + names[: r % 3]:
                times[name].append(timed(runs[name], work / "out"))
            print("  repeat", r + 1, {k: round(v[-1], 3) for k, v in times.items()}, flush=True)
        vs_ref = statistics.median(
            ref / ours for ref, ours in zip(times["reference"], times["ours"], strict=True)
        )
        vs_plain = statistics.median(
            plain / ours for plain, ours in zip(times["plain"], times["ours"], strict=True)
        )
        results.update(
            {
                "seconds": {k: [round(x, 3) for x in v] for k, v in times.items()},
                "MB_per_s_median": {
                    k: round(file_size / statistics.median(v) / 1e6) for k, v in times.items()
                },
                "ours_speedup_vs_reference": round(vs_ref, 2),
                "ours_throughput_vs_plain_single_stream": round(vs_plain, 2),
            }
        )
        out = work / "unpack"
        fetch([url], 1, out, unpack_archive=False)
        os.sync()
        start = time.perf_counter()
        unpack(out / "v1.tar", out / "v1")
        results["unpack_s"] = round(time.perf_counter() - start, 3)
        shutil.rmtree(out)

        before = shard_bytes(url)
        relays = [
            serve(
                ["relay", "--upstream", url, "--root", str(work / f"relay{i}"), "--poll-s", "0.5"]
            )
            for i in range(args.relays)
        ]
        relay_urls = ",".join(u for _, u in relays)
        start = time.perf_counter()
        clients = [
            subprocess.Popen(
                [
                    *CLI,
                    "fetch",
                    "--servers",
                    relay_urls,
                    "--version",
                    "1",
                    "--dest",
                    str(work / f"client{i}"),
                    "--wait-s",
                    "600",
                    "--quiet",
                    "--archive-only",
                ],
                env=ENV,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i in range(args.clients)
        ]
        outputs = [c.communicate() for c in clients]
        tree_s = time.perf_counter() - start
        for (_out_text, err_text), c in zip(outputs, clients, strict=True):
            if c.returncode != 0:
                raise RuntimeError(f"a tree client failed: {err_text[-2000:]}")
        origin_bytes = shard_bytes(url) - before
        relay_bytes = [shard_bytes(u) for _, u in relays]
        for proc, _ in relays:
            proc.kill()
        results["tree"] = {
            "relays": args.relays,
            "clients": args.clients,
            "seconds": round(tree_s, 2),
            "origin_shard_bytes": origin_bytes,
            "relay_shard_bytes": relay_bytes,
            "origin_bytes_over_file": round(origin_bytes / file_size, 3),
            "clients_times_file": args.clients * file_size,
        }
    finally:
        origin.kill()
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(results, indent=1))
    ok = (
        results["ours_speedup_vs_reference"] >= 2
        and results["ours_throughput_vs_plain_single_stream"] >= 0.7
        and results["tree"]["origin_bytes_over_file"] <= 2.5
    )
    print("targets (>=2x reference, >=0.7x plain, origin <=2.5x file):", "met" if ok else "NOT met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
