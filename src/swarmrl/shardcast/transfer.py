"""Blocking HTTP/1.1 GET for shard transfers: one connection per request, bounded buffers.

Why not aiohttp/httpx on the client side: a shard is tens of megabytes and the client
hashes and writes every byte; ``socket.recv_into`` a reused buffer, ``os.pwrite`` and
BLAKE3 all release the GIL, so a few threads move bytes at about twice the rate of an
asyncio client that allocates a ``bytes`` object per chunk (measured on loopback, see
docs/shardcast.md). The subset is small on purpose: GET, optional Range, a body with
Content-Length (the reference server and ours both send one), ``Connection: close``.
``timeout`` bounds the connect and every wait for bytes, so a server that hangs costs
at most ``timeout`` seconds per attempt; ``min_rate`` bounds the whole body, so a
server that trickles (a byte now and then, never quiet for ``timeout``) costs at most
``timeout + length / min_rate`` seconds.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from urllib.parse import urlsplit

BUFFER_SIZE = 2 << 20
_MAX_HEADER = 64 << 10


class TransferError(Exception):
    """A request that did not deliver the whole body (network error, bad status, short body)."""


class HttpStatusError(TransferError):
    def __init__(self, url: str, status: int) -> None:
        super().__init__(f"GET {url} answered HTTP {status}")
        self.status = status


def _connect(url: str, timeout: float) -> tuple[socket.socket, str]:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise TransferError(f"{url}: only http://host:port/... URLs are supported")
    port = parts.port or 80
    path = parts.path or "/"
    try:
        sock = socket.create_connection((parts.hostname, port), timeout=timeout)
    except OSError as exc:
        raise TransferError(f"GET {url}: cannot connect: {exc}") from exc
    sock.settimeout(timeout)
    host = parts.netloc
    return (
        sock,
        f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nAccept-Encoding: identity\r\n",
    )


def get_stream(
    url: str,
    sink: Callable[[memoryview], None],
    timeout: float,
    byte_range: tuple[int, int] | None = None,
    buffer: bytearray | None = None,
    min_rate: float | None = None,
) -> int:
    """GET ``url`` and pass the body to ``sink`` in buffer-sized pieces; return the body length.

    ``byte_range`` is (first, last) inclusive and requires a 206 answer. With
    ``min_rate`` (bytes per second), a body not complete ``timeout + length / min_rate``
    seconds after the request is abandoned with a ``TransferError``.
    """
    started = time.monotonic()
    deadline = None
    sock, request = _connect(url, timeout)
    buffer = buffer if buffer is not None else bytearray(BUFFER_SIZE)
    view = memoryview(buffer)
    try:
        if byte_range is not None:
            request += f"Range: bytes={byte_range[0]}-{byte_range[1]}\r\n"
        sock.sendall((request + "\r\n").encode("latin-1"))
        head = bytearray()
        while b"\r\n\r\n" not in head:
            if len(head) > _MAX_HEADER:
                raise TransferError(f"GET {url}: response header larger than {_MAX_HEADER} bytes")
            chunk = sock.recv(65536)
            if not chunk:
                raise TransferError(f"GET {url}: connection closed before the response header")
            head += chunk
        header_end = head.index(b"\r\n\r\n")
        lines = bytes(head[:header_end]).decode("latin-1").split("\r\n")
        status_parts = lines[0].split(" ", 2)
        if (
            len(status_parts) < 2
            or not status_parts[0].startswith("HTTP/")
            or not status_parts[1].isdigit()
        ):
            raise TransferError(f"GET {url}: malformed status line {lines[0]!r}")
        status = int(status_parts[1])
        wanted = 206 if byte_range is not None else 200
        if status != wanted:
            raise HttpStatusError(url, status)
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if "content-length" not in headers or not headers["content-length"].isdigit():
            raise TransferError(
                f"GET {url}: the server sent no Content-Length; shard servers must send one"
            )
        length = int(headers["content-length"])
        deadline = None if min_rate is None else started + timeout + length / min_rate

        def too_slow() -> TransferError:
            return TransferError(
                f"GET {url}: slower than {(min_rate or 0) / 1024:.0f} KiB/s ({received} of {length} bytes "
                f"in {time.monotonic() - started:.1f} s)"
            )

        body_start = bytes(head[header_end + 4 :])
        filled = min(len(body_start), length)
        view[:filled] = body_start[:filled]
        received = filled
        while received < length or filled:
            if received < length and filled < len(buffer):
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise too_slow()
                    sock.settimeout(min(timeout, left))
                n = sock.recv_into(view[filled : min(len(buffer), filled + length - received)])
                if n == 0:
                    raise TransferError(
                        f"GET {url}: connection closed after {received} of {length} body bytes"
                    )
                filled += n
                received += n
                if filled < len(buffer) and received < length:
                    continue
            sink(view[:filled])
            filled = 0
        return length
    except TimeoutError as exc:
        if deadline is not None and time.monotonic() >= deadline:
            raise too_slow() from exc
        raise TransferError(f"GET {url}: no data for {timeout} s (server hung?)") from exc
    except OSError as exc:
        raise TransferError(f"GET {url}: {exc}") from exc
    finally:
        sock.close()


def get_bytes(url: str, timeout: float, limit: int = 16 << 20) -> bytes:
    """GET a small document (distribution.txt, a manifest) into memory."""
    parts: list[bytes] = []
    total = 0

    def keep(piece: memoryview) -> None:
        nonlocal total
        total += len(piece)
        if total > limit:
            raise TransferError(f"GET {url}: body larger than {limit} bytes")
        parts.append(bytes(piece))

    get_stream(url, keep, timeout, buffer=bytearray(256 << 10))
    return b"".join(parts)
