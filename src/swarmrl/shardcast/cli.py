"""Command line for SHARDCAST: ``origin`` (serve a root), ``relay`` (mirror and serve), ``fetch``.

    swarmrl origin --root DIR [--host 127.0.0.1] [--port 8000]
    swarmrl relay  [--orchestrator URL --key FILE] --upstream URL[,URL...] --root DIR
                   [--host 127.0.0.1] [--port 8001] [--public-url URL]
    swarmrl fetch  --servers URL[,URL...] [--version N] --dest DIR

``register(subparsers)`` adds these to the main ``swarmrl`` parser; ``python -m
swarmrl.shardcast.cli`` runs them on their own. Each sets ``func`` to a callable that
takes the parsed arguments and returns an exit code.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
import threading
from pathlib import Path

from swarmrl.config import ShardcastConfig
from swarmrl.shardcast.client import MIN_RATE, FetchError, fetch
from swarmrl.shardcast.relay import Relay
from swarmrl.shardcast.store import VersionStore

# The server (aiohttp) is imported by the commands that serve: `swarmrl`'s argument
# parser registers these commands for every subcommand and should not load it. A --host
# left out is None until then, and means the server's DEFAULT_HOST (loopback).


def _urls(text: str) -> list[str]:
    return [u.strip() for u in text.split(",") if u.strip()]


def run_origin(args: argparse.Namespace) -> int:
    from swarmrl.shardcast.server import DEFAULT_HOST, serve_forever

    args.host = args.host or DEFAULT_HOST
    VersionStore(args.root)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how a user stops the server
        asyncio.run(serve_forever(args.root, args.host, args.port))
    return 0


def run_relay(args: argparse.Namespace) -> int:
    """Mirror and serve. With --orchestrator and --key the relay registers as a pool
    member (heartbeating) so workers learn its URL; without them it is a plain SHARDCAST
    mirror (a private relay tree, or a mirror of a reference origin)."""
    from swarmrl.identity import KeyFileError, load_identity
    from swarmrl.protocol import PoolRefused
    from swarmrl.protocol.membership import Membership
    from swarmrl.shardcast.server import DEFAULT_HOST, start_server

    args.host = args.host or DEFAULT_HOST
    if (args.orchestrator is None) != (args.key is None):
        print("error: give both --orchestrator and --key, or neither", file=sys.stderr)
        return 2
    identity = None
    if args.key is not None:
        try:
            identity = load_identity(args.key)
        except KeyFileError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    if identity is not None:
        from swarmrl.protocol.urls import unroutable

        # What workers will be told to fetch from: checked before anything starts.
        host = f"[{args.host}]" if ":" in args.host else args.host
        announced = args.public_url or f"http://{host}:{args.port}"
        if (why := unroutable(announced)) is not None:
            given = "--public-url" if args.public_url else f"--host {args.host}"
            print(
                f"error: {given}: workers could not fetch from {announced}: {why}; "
                "give --public-url with the address workers reach this relay at",
                file=sys.stderr,
            )
            return 2
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per heartbeat
    relay = Relay(
        _urls(args.upstream),
        args.root,
        poll_s=args.poll_s,
        grace_s=args.grace_s,
        timeout=args.timeout,
        rehash_s=args.rehash_s,
    )
    server = start_server(args.root, args.host, args.port, guard=relay.guard)
    print(
        f"relay serving {args.root} at {server.url}, mirroring {', '.join(relay.upstreams)}",
        flush=True,
    )
    member = (
        Membership(
            args.orchestrator,
            identity,
            "relay",
            member_url=args.public_url or server.url,
            # The newest version it serves: the dashboard shows how far each checkpoint got.
            policy_step=lambda: max(relay.store.listed(), default=None),
            bytes_served=lambda: server.stats.as_dict()["bytes_served"],
        )
        if identity is not None
        else None
    )
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    try:
        if member is not None:
            member.start()
        thread.join()
    except PoolRefused as exc:
        print(f"error: the orchestrator refused this relay: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    finally:
        relay.stop()
        if member is not None:
            member.stop()
        server.stop()
    return 0


def run_fetch(args: argparse.Namespace) -> int:
    try:
        result = fetch(
            _urls(args.servers),
            args.version,
            args.dest,
            concurrency=args.concurrency,
            timeout=args.timeout,
            min_rate=args.min_rate_kib * 1024 if args.min_rate_kib > 0 else None,
            wait_s=args.wait_s,
            progress=not args.quiet,
            unpack_archive=not args.archive_only,
            deltas=not args.no_deltas,
        )
    except FetchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    summary = {
        "path": str(result.path),
        "version": result.version,
        "seconds": round(result.seconds, 3),
        "bytes_by_server": result.bytes_by_server,
        "failures": len(result.failures),
        "route": result.route,
        "delta_refused": result.delta_refused,
    }
    print(json.dumps(summary), flush=True)
    return 0


def register(subparsers) -> None:
    origin = subparsers.add_parser(
        "origin", help="serve a SHARDCAST root directory (what Origin.publish writes)"
    )
    origin.add_argument(
        "--root", type=Path, required=True, help="directory holding distribution.txt and v<N>/"
    )
    origin.add_argument("--host", default=None, help="address to bind (default loopback only)")
    origin.add_argument("--port", type=int, default=8000, help="TCP port (0 picks a free one)")
    origin.set_defaults(func=run_origin)

    relay = subparsers.add_parser(
        "relay",
        help="mirror versions from upstream servers and serve them; registered with the orchestrator",
    )
    relay.add_argument(
        "--orchestrator", help="the orchestrator's URL (omit for a relay outside any pool)"
    )
    relay.add_argument("--key", type=Path, help="this relay's key file (on the allowlist as relay)")
    relay.add_argument(
        "--public-url",
        default=None,
        help="URL workers reach this relay at (default http://HOST:PORT as bound)",
    )
    relay.add_argument(
        "--upstream", required=True, help="comma-separated upstream URLs (origin or relays)"
    )
    relay.add_argument(
        "--root", type=Path, required=True, help="directory the relay mirrors into and serves"
    )
    relay.add_argument("--host", default=None, help="address to bind (default loopback only)")
    relay.add_argument("--port", type=int, default=8001, help="TCP port (0 picks a free one)")
    relay.add_argument(
        "--poll-s",
        type=float,
        default=ShardcastConfig().poll_seconds,  # the run's shardcast.poll_seconds
        help="seconds between upstream checks (default: %(default)s, the run's shardcast.poll_seconds)",
    )
    relay.add_argument(
        "--grace-s", type=float, default=300.0, help="seconds a delisted version stays on disk"
    )
    relay.add_argument(
        "--timeout", type=float, default=10.0, help="seconds without data before a request fails"
    )
    relay.add_argument(
        "--rehash-s",
        type=float,
        default=600.0,
        help="seconds between re-hashes of every served shard (changed files are always re-hashed)",
    )
    relay.set_defaults(func=run_relay)

    fetch_cmd = subparsers.add_parser(
        "fetch", help="download, verify and unpack a checkpoint version"
    )
    fetch_cmd.add_argument("--servers", required=True, help="comma-separated server URLs")
    fetch_cmd.add_argument(
        "--version", type=int, default=None, help="version (training step); default newest"
    )
    fetch_cmd.add_argument("--dest", type=Path, required=True, help="directory that receives v<N>/")
    fetch_cmd.add_argument("--concurrency", type=int, default=8, help="shards downloaded at once")
    fetch_cmd.add_argument(
        "--timeout", type=float, default=10.0, help="seconds without data before a request fails"
    )
    fetch_cmd.add_argument(
        "--min-rate-kib",
        type=float,
        default=MIN_RATE / 1024,
        help="KiB/s below which a shard download is abandoned and retried elsewhere (0: no floor)",
    )
    fetch_cmd.add_argument(
        "--wait-s", type=float, default=0.0, help="seconds to wait for the version to be listed"
    )
    fetch_cmd.add_argument("--quiet", action="store_true", help="no progress bar")
    fetch_cmd.add_argument(
        "--archive-only",
        action="store_true",
        help="keep the verified tar as v<N>.tar, do not unpack",
    )
    fetch_cmd.add_argument(
        "--no-deltas",
        action="store_true",
        help="always fetch the full shards, even when DEST holds the version a delta is from",
    )
    fetch_cmd.set_defaults(func=run_fetch)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    parser = argparse.ArgumentParser(prog="swarmrl", description=__doc__.splitlines()[0])
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
