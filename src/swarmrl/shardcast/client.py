"""The client: download a version from several servers at once, verify it, unpack it.

How a download goes (docs/architecture.md §4.4):
1. Read ``distribution.txt`` from every server. The version (newest listed by any server
   when none is asked for) is taken from the servers that list it with the same hash
   (the largest such group; a relay announcing other bytes is left out).
2. Fetch ``v<N>/manifest.json`` when a server has one (ours do; the reference origin
   does not). It must agree with the distribution line. With it, every shard is checked
   against its own BLAKE3 as it arrives; without it, only the whole file can be checked.
3. Shards are fetched by ``concurrency`` threads. For each shard a server is drawn with
   probability ∝ success_rate × bandwidth; both are moving averages (α = 0.3) seeded by
   timing ``data1.bin``, and after every update each server's success rate heals by
   ``heal`` so a server that failed is tried again later. A failed or corrupt shard is
   retried on a server that has not failed it yet, up to ``max_attempts`` times, with
   exponential backoff; bytes that failed their check are overwritten by the retry and
   the file is never renamed into place unless its whole-file BLAKE3 matches. A server
   that stops sending for ``timeout`` seconds, or sends a shard slower than
   ``min_rate`` bytes/s on average (``MIN_RATE`` by default), fails that shard.
4. Bytes go straight from the socket buffer to their offset in ``<dest>/.v<N>.partial/
   archive.tar`` (memory use is ``concurrency`` × 2 MiB whatever the file size); a log of
   finished shards lets a later call resume. At the end the whole file is hashed, the tar
   is unpacked into a temporary directory and renamed to ``<dest>/v<N>``.
5. If a version cannot be completed the error says which shards failed where; if the
   servers stopped listing it meanwhile, ``VersionUnavailableError`` says so and the
   partial download is deleted (it cannot be resumed).
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import tarfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import blake3

from swarmrl.shardcast.layout import (
    DISTRIBUTION_FILE,
    MANIFEST_FILE,
    PROBE_FILE,
    LayoutError,
    Manifest,
    ShardInfo,
    VersionEntry,
    parse_distribution,
    shard_name,
    version_dir_name,
)
from swarmrl.shardcast.transfer import (
    BUFFER_SIZE,
    HttpStatusError,
    TransferError,
    get_bytes,
    get_stream,
)

log = logging.getLogger(__name__)

ALPHA = 0.3
HEAL = 0.02
MIN_RATE = 64 * 1024
"""Default floor (bytes/s) for one shard from one server: a shard still incomplete
``timeout + size / MIN_RATE`` seconds after its request is abandoned and retried on
another server, so a server that trickles bytes cannot hold a shard forever."""


class FetchError(RuntimeError):
    """A version could not be downloaded and verified."""


class VersionUnavailableError(FetchError):
    """No server lists the requested version (any more)."""


class IntegrityError(FetchError):
    """The assembled file's BLAKE3 does not match distribution.txt."""


def normalize_server(url: str) -> str:
    url = url.strip().rstrip("/")
    return url if "://" in url else f"http://{url}"


# ---------------------------------------------------------------------------- server choice


@dataclass
class ServerScore:
    success_rate: float = 1.0
    bandwidth: float = 1.0  # bytes per second, moving average


class ServerChooser:
    """Draws a server with probability ∝ success_rate × bandwidth; thread-safe."""

    def __init__(
        self,
        servers: list[str],
        alpha: float = ALPHA,
        heal: float = HEAL,
        rng: random.Random | None = None,
    ):
        self.scores = {s: ServerScore() for s in servers}
        self.alpha = alpha
        self.heal = heal
        self.rng = rng or random.Random()
        self.lock = threading.Lock()

    def seed(self, server: str, bandwidth: float | None, ok: bool) -> None:
        """Set the starting estimate (None bandwidth: unknown, use the mean of the known ones)."""
        with self.lock:
            score = self.scores[server]
            score.success_rate = 1.0 if ok else 0.0
            if bandwidth is not None:
                score.bandwidth = bandwidth

    def record(self, server: str, ok: bool, bandwidth: float | None = None) -> None:
        with self.lock:
            score = self.scores[server]
            score.success_rate = self.alpha * float(ok) + (1 - self.alpha) * score.success_rate
            if ok and bandwidth is not None:
                score.bandwidth = self.alpha * bandwidth + (1 - self.alpha) * score.bandwidth
            for other in self.scores.values():
                other.success_rate = min(1.0, other.success_rate + self.heal)

    def add(self, server: str) -> None:
        """A server that started listing the version mid-download; it starts at the mean bandwidth."""
        with self.lock:
            if server not in self.scores:
                mean = sum(c.bandwidth for c in self.scores.values()) / max(1, len(self.scores))
                self.scores[server] = ServerScore(1.0, mean)

    def servers(self) -> set[str]:
        with self.lock:
            return set(self.scores)

    def weights(self) -> dict[str, float]:
        with self.lock:
            return {s: c.success_rate * c.bandwidth for s, c in self.scores.items()}

    def pick(self, avoid: set[str] = frozenset()) -> str:
        weights = self.weights()
        candidates = [s for s in weights if s not in avoid] or list(weights)
        w = [weights[s] for s in candidates]
        if sum(w) <= 0:
            return self.rng.choice(candidates)
        return self.rng.choices(candidates, weights=w, k=1)[0]


def probe_servers(chooser: ServerChooser, timeout: float) -> None:
    """Seed each server's bandwidth by timing ``data1.bin`` (in parallel). With a single
    server there is nothing to choose, so nothing is downloaded."""
    if len(chooser.scores) < 2:
        return

    def probe(server: str) -> tuple[str, float | None, bool]:
        start = time.perf_counter()
        try:
            size = get_stream(
                f"{server}/{PROBE_FILE}", lambda _: None, timeout, buffer=bytearray(256 << 10)
            )
        except HttpStatusError:
            return server, None, True  # alive, just no probe file (the reference origin has none)
        except TransferError as exc:
            log.warning("server %s failed its probe: %s", server, exc)
            return server, None, False
        return server, size / max(time.perf_counter() - start, 1e-6), True

    with ThreadPoolExecutor(max_workers=len(chooser.scores)) as pool:
        results = list(pool.map(probe, list(chooser.scores)))
    known = [bw for _, bw, _ in results if bw is not None]
    default = sum(known) / len(known) if known else 1.0
    for server, bandwidth, ok in results:
        chooser.seed(server, bandwidth if bandwidth is not None else default, ok)


# ---------------------------------------------------------------------------- discovery


def read_distributions(
    servers: list[str], timeout: float = 10.0
) -> dict[str, dict[int, VersionEntry] | Exception]:
    """Each server's distribution.txt, or the error that prevented reading it."""

    def read(server: str):
        try:
            return server, parse_distribution(
                get_bytes(f"{server}/{DISTRIBUTION_FILE}", timeout).decode()
            )
        except (TransferError, LayoutError, UnicodeDecodeError) as exc:
            return server, exc

    with ThreadPoolExecutor(max_workers=max(1, len(servers))) as pool:
        return dict(pool.map(read, servers))


def latest_version(servers: list[str], timeout: float = 10.0) -> int | None:
    """The newest version any reachable server lists, or None when none lists any."""
    listings = read_distributions([normalize_server(s) for s in servers], timeout)
    versions = [v for listing in listings.values() if isinstance(listing, dict) for v in listing]
    return max(versions, default=None)


@dataclass(frozen=True)
class VersionSource:
    """A version, the servers that list it with the same bytes, and its manifest if any."""

    entry: VersionEntry
    servers: tuple[str, ...]
    manifest: Manifest | None

    @property
    def version(self) -> int:
        return self.entry.version


def _describe(listings: dict) -> str:
    parts = []
    for server, listing in listings.items():
        if isinstance(listing, Exception):
            parts.append(f"{server}: unreachable ({listing})")
        else:
            parts.append(
                f"{server}: lists {', '.join(f'v{v}' for v in sorted(listing)) or 'nothing'}"
            )
    return "; ".join(parts)


def resolve_version(
    servers: list[str], version: int | None, timeout: float = 10.0, wait_s: float = 0.0
) -> VersionSource:
    """Find ``version`` (None: the newest) on ``servers``; poll up to ``wait_s`` seconds for it."""
    servers = [normalize_server(s) for s in servers]
    deadline = time.monotonic() + wait_s
    while True:
        listings = read_distributions(servers, timeout)
        listed = {s: l for s, l in listings.items() if isinstance(l, dict)}
        wanted = (
            version
            if version is not None
            else max((v for l in listed.values() for v in l), default=None)
        )
        holders = {s: l[wanted] for s, l in listed.items() if wanted is not None and wanted in l}
        if holders or time.monotonic() >= deadline:
            break
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    if not holders:
        what = f"v{version}" if version is not None else "any version"
        raise VersionUnavailableError(f"no server lists {what}: {_describe(listings)}")
    groups = Counter(holders.values())
    entry, _ = groups.most_common(1)[0]
    agreeing = tuple(s for s, e in holders.items() if e == entry)
    for server, other in holders.items():
        if other != entry:
            log.warning(
                "ignoring %s: it lists v%d with blake3 %s, the others %s",
                server,
                wanted,
                other.blake3,
                entry.blake3,
            )
    manifest = None
    for server in agreeing:
        try:
            candidate = Manifest.from_json(
                get_bytes(f"{server}/{version_dir_name(wanted)}/{MANIFEST_FILE}", timeout)
            )
        except HttpStatusError:
            continue
        except (TransferError, LayoutError) as exc:
            log.warning("ignoring the manifest from %s: %s", server, exc)
            continue
        if candidate.entry == entry:
            manifest = candidate
            break
        log.warning("ignoring the manifest from %s: it does not match distribution.txt", server)
    return VersionSource(entry, agreeing, manifest)


# ---------------------------------------------------------------------------- shard transfers


@dataclass
class TransferStats:
    """Per-server byte counts and failures of one download; filled in as it runs."""

    bytes_by_server: Counter = field(default_factory=Counter)
    failures: list[tuple[int, str, str]] = field(
        default_factory=list
    )  # (shard index, server, reason)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add_bytes(self, server: str, n: int) -> None:
        with self.lock:
            self.bytes_by_server[server] += n

    def add_failure(self, index: int, server: str, reason: str) -> None:
        with self.lock:
            self.failures.append((index, server, reason))


# Where shard i goes: (file, offset of the shard in that file).
ShardTarget = Callable[[int], tuple[Path, int]]


class ShardDownloader:
    """Downloads a set of shards of one version concurrently into their targets."""

    def __init__(
        self,
        source: VersionSource,
        chooser: ServerChooser,
        target: ShardTarget,
        *,
        concurrency: int = 8,
        timeout: float = 10.0,
        min_rate: float | None = MIN_RATE,
        max_attempts: int = 6,
        backoff_s: float = 0.1,
        stats: TransferStats | None = None,
        on_shard: Callable[[int, ShardInfo], None] | None = None,
        on_bytes: Callable[[int], None] | None = None,
        candidates: list[str] = (),
        refresh_s: float = 2.0,
    ) -> None:
        self.source = source
        self.candidates = [c for c in candidates if c not in source.servers]
        self.refresh_s = refresh_s
        self.chooser = chooser
        self.target = target
        self.concurrency = concurrency
        self.timeout = timeout
        self.min_rate = min_rate
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.stats = stats or TransferStats()
        self.on_shard = on_shard
        self.on_bytes = on_bytes
        self.stop = threading.Event()
        # Without a manifest every shard but the last has the size of the first.
        self.shard_size: int | None = source.manifest.shard_size if source.manifest else None
        self.last_size: int | None = source.manifest.shards[-1].size if source.manifest else None

    def expected_size(self, index: int) -> int | None:
        if self.source.manifest is not None:
            return self.source.manifest.shards[index].size
        return self.shard_size if index < self.source.entry.num_shards - 1 else None

    def run(self, indices: list[int]) -> dict[int, ShardInfo]:
        """Fetch ``indices``; return what each shard turned out to be, or raise FetchError."""
        results: dict[int, ShardInfo] = {}
        if not indices:
            return results
        if self.source.manifest is None and self.shard_size is None:
            first = 0 if 0 in indices else None
            if first is None:
                raise ValueError(
                    "without a manifest the shard size must be known before fetching later shards"
                )
            results[0] = self._fetch_shard(0)
            n = self.source.entry.num_shards
            self.shard_size = results[0].size
            if n == 1:
                self.last_size = results[0].size
            indices = [i for i in indices if i != 0]
        queue = list(indices)
        lock = threading.Lock()
        errors: list[BaseException] = []

        def worker() -> None:
            buffer = bytearray(BUFFER_SIZE)
            while not self.stop.is_set():
                with lock:
                    if not queue:
                        return
                    index = queue.pop(0)
                try:
                    info = self._fetch_shard(index, buffer)
                except BaseException as exc:  # noqa: BLE001 - handed to the caller below
                    errors.append(exc)
                    self.stop.set()
                    return
                with lock:
                    results[index] = info

        threads = [
            threading.Thread(target=worker, daemon=True)
            for _ in range(min(self.concurrency, len(indices)))
        ]
        finished = threading.Event()
        if self.candidates:
            threads.append(
                threading.Thread(target=self._watch_candidates, args=(finished,), daemon=True)
            )
        for t in threads:
            t.start()
        for t in threads[: min(self.concurrency, len(indices))]:
            t.join()
        finished.set()
        if errors:
            raise errors[0]
        return results

    def _watch_candidates(self, finished: threading.Event) -> None:
        """Add servers (e.g. relays still mirroring) once they list the same version, so load spreads."""
        while not finished.wait(self.refresh_s):
            waiting = [c for c in self.candidates if c not in self.chooser.servers()]
            if not waiting:
                return
            for server, listing in read_distributions(waiting, self.timeout).items():
                if (
                    isinstance(listing, dict)
                    and listing.get(self.source.version) == self.source.entry
                ):
                    log.info("%s now lists v%d; adding it", server, self.source.version)
                    self.chooser.add(server)

    def _fetch_shard(self, index: int, buffer: bytearray | None = None) -> ShardInfo:
        buffer = buffer if buffer is not None else bytearray(BUFFER_SIZE)
        expected = self.expected_size(index)
        wanted_hash = self.source.manifest.shards[index].blake3 if self.source.manifest else None
        path, offset = self.target(index)
        name = f"{version_dir_name(self.source.version)}/{shard_name(index)}"
        tried: set[str] = set()
        reasons: list[str] = []
        for attempt in range(self.max_attempts):
            if self.stop.is_set():
                raise FetchError("stopped because another shard failed")
            server = self.chooser.pick(avoid=tried)
            tried.add(server)
            if tried >= self.chooser.servers():
                tried.clear()
            hasher = blake3.blake3()
            written = 0
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)

            def sink(piece: memoryview) -> None:
                nonlocal written
                if expected is not None and written + len(piece) > expected:
                    raise TransferError(f"shard is longer than the expected {expected} bytes")
                os.pwrite(fd, piece, offset + written)
                hasher.update(piece)
                written += len(piece)
                self.stats.add_bytes(server, len(piece))
                if self.on_bytes is not None:
                    self.on_bytes(len(piece))

            start = time.perf_counter()
            try:
                get_stream(
                    f"{server}/{name}", sink, self.timeout, buffer=buffer, min_rate=self.min_rate
                )
                if expected is not None and written != expected:
                    raise TransferError(f"shard is {written} bytes, expected {expected}")
                if (
                    self.shard_size is not None
                    and self.expected_size(index) is None
                    and written > self.shard_size
                ):
                    raise TransferError(
                        f"last shard is {written} bytes, larger than the shard size {self.shard_size}"
                    )
                digest = hasher.hexdigest()
                if wanted_hash is not None and digest != wanted_hash:
                    raise TransferError(
                        f"BLAKE3 {digest[:16]}… does not match the manifest's {wanted_hash[:16]}…"
                    )
            except TransferError as exc:
                reason = str(exc)
                reasons.append(f"{server}: {reason}")
                self.stats.add_failure(index, server, reason)
                self.chooser.record(server, False)
                log.info(
                    "shard %d from %s failed (attempt %d): %s",
                    index + 1,
                    server,
                    attempt + 1,
                    reason,
                )
                if self.on_bytes is not None and written:
                    self.on_bytes(-written)
                time.sleep(min(self.backoff_s * 2**attempt, 2.0))
                continue
            finally:
                os.close(fd)
            elapsed = max(time.perf_counter() - start, 1e-6)
            self.chooser.record(server, True, written / elapsed)
            info = ShardInfo(written, digest)
            if self.on_shard is not None:
                self.on_shard(index, info)
            return info
        raise FetchError(
            f"shard {index + 1} of v{self.source.version} failed {self.max_attempts} times: "
            + "; ".join(reasons)
        )


# ---------------------------------------------------------------------------- whole downloads


@dataclass
class FetchResult:
    path: Path
    version: int
    bytes_by_server: dict[str, int]
    failures: list[tuple[int, str, str]]
    seconds: float
    resumed_shards: int = 0


class InOrderHasher:
    """Hashes the whole file while it downloads: follows the finished shards in file order.

    Shards finish out of order; a thread reads each one back (from the page cache) as soon as
    every shard before it is done, so only the tail is left to hash when the last one lands.
    """

    def __init__(self, path: Path, num_shards: int) -> None:
        self.path = path
        self.num_shards = num_shards
        self.spans: dict[int, tuple[int, int]] = {}
        self.cond = threading.Condition()
        self.hasher = blake3.blake3()
        self.failed: BaseException | None = None
        self.cancelled = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def shard_done(self, index: int, offset: int, size: int) -> None:
        with self.cond:
            self.spans[index] = (offset, size)
            self.cond.notify()

    def _run(self) -> None:
        buffer = bytearray(BUFFER_SIZE)
        view = memoryview(buffer)
        try:
            with open(self.path, "rb", buffering=0) as f:
                for index in range(self.num_shards):
                    with self.cond:
                        while index not in self.spans and not self.cancelled:
                            self.cond.wait()
                        if self.cancelled:
                            return
                        offset, size = self.spans[index]
                    while size > 0:
                        n = os.preadv(f.fileno(), [view[: min(size, len(buffer))]], offset)
                        if n == 0:
                            raise FetchError(
                                f"{self.path} ended early while hashing shard {index + 1}"
                            )
                        self.hasher.update(view[:n])
                        offset += n
                        size -= n
        except BaseException as exc:  # noqa: BLE001 - reported by hexdigest()
            self.failed = exc

    def cancel(self) -> None:
        with self.cond:
            self.cancelled = True
            self.cond.notify()

    def hexdigest(self, timeout: float | None = None) -> str:
        self.thread.join(timeout)
        if self.failed is not None:
            raise self.failed
        return self.hasher.hexdigest()


def _partial_dir(dest: Path, entry: VersionEntry) -> Path:
    return dest / f".{version_dir_name(entry.version)}.partial"


def _done_shards(partial: Path, source: VersionSource, archive: Path) -> set[int]:
    """Shards a previous attempt finished; with a manifest each is re-hashed before it counts."""
    state_file, log_file = partial / "state.json", partial / "done.log"
    state = {"blake3": source.entry.blake3, "num_shards": source.entry.num_shards}
    if (
        not state_file.exists()
        or json.loads(state_file.read_text()) != state
        or not log_file.exists()
    ):
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        state_file.write_text(json.dumps(state))
        return set()
    done = {int(line) for line in log_file.read_text().split() if line.isdigit()}
    if source.manifest is None:
        return set()  # without per-shard hashes a leftover shard cannot be trusted: start over
    verified = set()
    with open(archive, "rb") as f:
        for index in sorted(done):
            shard = source.manifest.shards[index]
            f.seek(index * source.manifest.shard_size)
            hasher, left = blake3.blake3(), shard.size
            while left > 0 and (chunk := f.read(min(left, BUFFER_SIZE))):
                hasher.update(chunk)
                left -= len(chunk)
            if hasher.hexdigest() == shard.blake3:
                verified.add(index)
    return verified


def download_file(
    source: VersionSource,
    archive: Path,
    *,
    done: set[int] = frozenset(),
    on_shard: Callable[[int, ShardInfo], None] | None = None,
    concurrency: int = 8,
    timeout: float = 10.0,
    min_rate: float | None = MIN_RATE,
    max_attempts: int = 6,
    stats: TransferStats | None = None,
    on_bytes: Callable[[int], None] | None = None,
    candidates: list[str] = (),
) -> TransferStats:
    """Fetch every shard not in ``done`` into the single file ``archive`` and check its BLAKE3."""
    stats = stats or TransferStats()
    chooser = ServerChooser(list(source.servers))
    probe_servers(chooser, timeout)

    def target(index: int) -> tuple[Path, int]:
        # without a manifest shard 1 is fetched alone first and fixes the shard size
        return archive, 0 if index == 0 else index * downloader.shard_size

    downloader = ShardDownloader(
        source,
        chooser,
        target,
        concurrency=concurrency,
        timeout=timeout,
        min_rate=min_rate,
        max_attempts=max_attempts,
        stats=stats,
        on_shard=on_shard,
        on_bytes=on_bytes,
        candidates=candidates,
    )
    if source.manifest is None and done:
        raise ValueError("resuming needs a manifest: without one the shard offsets are unknown")
    if not archive.exists():
        archive.touch()
    whole = InOrderHasher(archive, source.entry.num_shards)
    for index in done:
        whole.shard_done(
            index, index * source.manifest.shard_size, source.manifest.shards[index].size
        )

    def shard_finished(index: int, info: ShardInfo) -> None:
        whole.shard_done(index, target(index)[1], info.size)
        if on_shard is not None:
            on_shard(index, info)

    downloader.on_shard = shard_finished
    try:
        results = downloader.run([i for i in range(source.entry.num_shards) if i not in done])
    except BaseException:
        whole.cancel()
        raise
    if source.manifest is not None:
        size = source.manifest.file_size
    else:
        last = source.entry.num_shards - 1
        size = (
            downloader.shard_size * last + results[last].size
            if last in results
            else os.path.getsize(archive)
        )
    os.truncate(archive, size)
    digest = whole.hexdigest()
    if digest != source.entry.blake3:
        hint = (
            ""
            if source.manifest
            else " (the servers publish no per-shard manifest, so the bad shard cannot be told)"
        )
        raise IntegrityError(
            f"v{source.version}: the downloaded file's BLAKE3 is {digest}, distribution.txt says "
            f"{source.entry.blake3}{hint}; nothing was kept"
        )
    return stats


def unpack(archive: Path, target: Path) -> Path:
    """Extract a version's tar into ``target`` atomically (temporary name, then rename)."""
    tmp = target.with_name(f".{target.name}.unpack-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(archive, mode="r:", copybufsize=BUFFER_SIZE) as tar:
        tar.extractall(tmp, filter="data")
    os.rename(tmp, target)
    return target


def fetch(
    servers: list[str],
    version: int | None,
    dest: Path,
    *,
    concurrency: int = 8,
    timeout: float = 10.0,
    min_rate: float | None = MIN_RATE,
    max_attempts: int = 6,
    wait_s: float = 0.0,
    progress: bool = False,
    unpack_archive: bool = True,
    on_shard: Callable[[int, ShardInfo], None] | None = None,
) -> FetchResult:
    """Download, verify and unpack a version into ``dest/v<N>``; see the module docstring."""
    started = time.perf_counter()
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    source = resolve_version(servers, version, timeout=timeout, wait_s=wait_s)
    final = dest / version_dir_name(source.version)
    if not unpack_archive:
        final = final.with_suffix(".tar")
    if final.exists():
        return FetchResult(final, source.version, {}, [], time.perf_counter() - started)
    partial = _partial_dir(dest, source.entry)
    archive = partial / "archive.tar"
    done = _done_shards(partial, source, archive)
    done_log = open(partial / "done.log", "a")
    log_lock = threading.Lock()

    def record(index: int, info: ShardInfo) -> None:
        with log_lock:
            done_log.write(f"{index}\n")
            done_log.flush()
        if on_shard is not None:
            on_shard(index, info)

    stats = TransferStats()
    bar = _progress_bar(source, done, progress)
    try:
        with bar:
            download_file(
                source,
                archive,
                done=done,
                on_shard=record,
                concurrency=concurrency,
                timeout=timeout,
                min_rate=min_rate,
                max_attempts=max_attempts,
                stats=stats,
                on_bytes=bar.advance,
                candidates=[normalize_server(s) for s in servers],
            )
        done_log.close()
        if unpack_archive:
            unpack(archive, final)
        else:
            os.rename(archive, final)
        shutil.rmtree(partial)
    except FetchError as exc:
        done_log.close()
        still = resolve_or_none(servers, source, timeout)
        if still is None:
            shutil.rmtree(partial, ignore_errors=True)
            raise VersionUnavailableError(
                f"v{source.version} was removed from every server while it was downloading "
                f"(no server lists it any more); the partial download was deleted, {final} was not created. "
                f"Fetch a newer version. Last error: {exc}"
            ) from exc
        if isinstance(exc, IntegrityError):
            shutil.rmtree(partial, ignore_errors=True)
        raise
    except BaseException:
        done_log.close()
        raise
    return FetchResult(
        final,
        source.version,
        dict(stats.bytes_by_server),
        list(stats.failures),
        time.perf_counter() - started,
        resumed_shards=len(done),
    )


def resolve_or_none(
    servers: list[str], source: VersionSource, timeout: float
) -> VersionSource | None:
    try:
        again = resolve_version(servers, source.version, timeout=timeout)
    except VersionUnavailableError:
        return None
    return again if again.entry == source.entry else None


def fetch_version(servers: list[str], version: int | None, dest: Path, **options) -> Path:
    """Download, verify and unpack ``version`` (None: the newest listed) into ``dest/v<N>``; return that dir."""
    return fetch(servers, version, dest, **options).path


class _NoProgress:
    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    def advance(self, n: int) -> None:
        return None


class _RichProgress:
    def __init__(self, source: VersionSource, done: set[int]) -> None:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        total = source.manifest.file_size if source.manifest else None
        self.progress = Progress(
            f"v{source.version}",
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
        )
        already = sum(source.manifest.shards[i].size for i in done) if source.manifest else 0
        self.task = self.progress.add_task("download", total=total, completed=already)

    def __enter__(self):
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def advance(self, n: int) -> None:
        self.progress.advance(self.task, n)


def _progress_bar(source: VersionSource, done: set[int], enabled: bool):
    return _RichProgress(source, done) if enabled else _NoProgress()
