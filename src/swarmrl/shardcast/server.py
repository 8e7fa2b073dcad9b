"""Serve a SHARDCAST root directory over HTTP (aiohttp, kernel sendfile, Range requests).

Only the layout's names are routed (distribution.txt, data1.bin, v<N>/shard_NNNNN.bin,
v<N>/manifest.json, and the same two under v<N>/delta-from-<B>/), so no request can reach any other file under the root or above it.
File bodies go out through aiohttp's ``FileResponse``, which uses ``loop.sendfile`` (the
kernel copies page cache to socket) and answers ``Range`` with 206. The server binds to
127.0.0.1 unless told otherwise. It counts what it serves: ``GET /stats.json`` or
``ServerHandle.stats`` give the body bytes of every completed file response.

A relay's server is given a ``ShardGuard``: a shard is served only once the guard has
seen it hold its manifest's bytes (hashed once, and again whenever the file changed);
a damaged or missing shard (or manifest) is answered ``503`` with ``Retry-After`` while
the relay fetches it again, which both our client and the reference client retry.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from swarmrl.shardcast.delta import delta_dir_name
from swarmrl.shardcast.integrity import ShardCheck, ShardGuard
from swarmrl.shardcast.layout import DISTRIBUTION_FILE, MANIFEST_FILE, PROBE_FILE, shard_index

DEFAULT_HOST = "127.0.0.1"


@dataclass
class ServerStats:
    """What a server has served since it started (completed file responses only)."""

    bytes_served: int = 0
    responses: int = 0
    shard_bytes: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, nbytes: int, is_shard: bool) -> None:
        with self.lock:
            self.bytes_served += nbytes
            self.responses += 1
            if is_shard:
                self.shard_bytes += nbytes

    def as_dict(self) -> dict[str, int]:
        with self.lock:
            return {
                "bytes_served": self.bytes_served,
                "shard_bytes": self.shard_bytes,
                "responses": self.responses,
            }


class _CountedFileResponse(web.FileResponse):
    """A FileResponse that adds its body to the server's stats once it has been sent."""

    def __init__(
        self, path: Path, stats: ServerStats, is_shard: bool, headers: dict[str, str] | None = None
    ):
        super().__init__(path, headers=headers)
        self._stats = stats
        self._is_shard = is_shard

    async def prepare(self, request: web.BaseRequest):
        writer = await super().prepare(request)  # returns after sendfile has sent the body
        if request.method == "GET" and self.status in (200, 206):
            self._stats.record(self.content_length or 0, self._is_shard)
        return writer


def make_app(root: Path, stats: ServerStats, guard: ShardGuard | None = None) -> web.Application:
    root = Path(root).resolve()

    async def send(
        request: web.Request, path: Path, is_shard: bool, headers: dict[str, str] | None = None
    ) -> web.StreamResponse:
        return _CountedFileResponse(path, stats, is_shard, headers)

    async def check(version: int, index: int, path: Path) -> None:
        """Refuse a shard the guard cannot vouch for (hashing runs off the event loop)."""
        if guard is None or guard.is_trusted(path):
            return
        loop = asyncio.get_running_loop()
        verdict = await loop.run_in_executor(None, guard.check, version, index)
        if verdict is ShardCheck.NOT_FOUND:
            raise web.HTTPNotFound()
        if verdict is ShardCheck.REPAIRING:
            raise web.HTTPServiceUnavailable(
                text=f"v{version}/{path.name} failed its integrity check; fetching it again\n",
                headers={"Retry-After": "1"},
            )

    async def distribution(request: web.Request):
        return await send(request, root / DISTRIBUTION_FILE, False, {"Cache-Control": "no-store"})

    async def probe(request: web.Request):
        return await send(request, root / PROBE_FILE, False)

    async def version_file(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        version = int(request.match_info["version"])
        index = shard_index(name)
        if index is None and name != MANIFEST_FILE:
            raise web.HTTPNotFound()
        path = root / f"v{version}" / name
        if index is not None:
            await check(version, index, path)
        elif guard is not None:
            loop = asyncio.get_running_loop()
            if await loop.run_in_executor(None, guard.manifest, version) is None:
                if not path.parent.is_dir():
                    raise web.HTTPNotFound()
                raise web.HTTPServiceUnavailable(
                    text=f"v{version}/{name} is damaged; mirroring the version again\n",
                    headers={"Retry-After": "1"},
                )
        return await send(request, path, index is not None)

    async def delta_file(request: web.Request) -> web.StreamResponse:
        """``v<N>/delta-from-<B>/``: its manifest and shards (no guard: 404 when absent)."""
        name = request.match_info["name"]
        version, base = int(request.match_info["version"]), int(request.match_info["base"])
        index = shard_index(name)
        path = root / f"v{version}" / delta_dir_name(base) / name
        if index is None and name != MANIFEST_FILE:
            raise web.HTTPNotFound()
        if index is not None and guard is not None and not guard.is_trusted(path):
            loop = asyncio.get_running_loop()
            verdict = await loop.run_in_executor(None, guard.check_delta, version, base, index)
            if verdict is not ShardCheck.SERVE:
                raise web.HTTPNotFound()
        if not path.is_file():
            raise web.HTTPNotFound()
        return await send(request, path, index is not None)

    async def stats_json(request: web.Request):
        return web.Response(text=json.dumps(stats.as_dict()), content_type="application/json")

    app = web.Application()
    app.router.add_get(f"/{DISTRIBUTION_FILE}", distribution)
    app.router.add_get(f"/{PROBE_FILE}", probe)
    app.router.add_get("/stats.json", stats_json)
    app.router.add_get(r"/v{version:\d+}/{name}", version_file)
    app.router.add_get(r"/v{version:\d+}/delta-from-{base:\d+}/{name}", delta_file)
    return app


async def serve(
    root: Path, host: str = DEFAULT_HOST, port: int = 0, guard: ShardGuard | None = None
) -> tuple[web.AppRunner, int, ServerStats]:
    """Start serving ``root`` on the running loop; return the runner, the bound port and the stats."""
    stats = ServerStats()
    runner = web.AppRunner(make_app(root, stats, guard), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=512)
    await site.start()
    bound = runner.addresses[0][1]  # the real port when port=0
    return runner, bound, stats


@dataclass
class ServerHandle:
    """A server running on its own thread and event loop; ``stop()`` ends it."""

    host: str
    port: int
    stats: ServerStats
    _loop: asyncio.AbstractEventLoop
    _runner: web.AppRunner
    _thread: threading.Thread

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


def start_server(
    root: Path, host: str = DEFAULT_HOST, port: int = 0, guard: ShardGuard | None = None
) -> ServerHandle:
    """Serve ``root`` from a background thread (port 0 picks a free port; see ``.url``)."""
    loop = asyncio.new_event_loop()
    started: dict = {}
    ready = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            started["result"] = loop.run_until_complete(serve(root, host, port, guard))
        except BaseException as exc:  # noqa: BLE001 - re-raised by start_server below
            started["error"] = exc
            ready.set()
            return
        ready.set()
        loop.run_forever()
        loop.close()

    thread = threading.Thread(target=run, name=f"shardcast-server-{port}", daemon=True)
    thread.start()
    ready.wait()
    if "error" in started:
        raise started["error"]
    runner, bound, stats = started["result"]
    return ServerHandle(host, bound, stats, loop, runner, thread)


async def serve_forever(root: Path, host: str = DEFAULT_HOST, port: int = 0) -> None:
    runner, bound, _ = await serve(root, host, port)
    print(f"serving {root} at http://{host}:{bound}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
