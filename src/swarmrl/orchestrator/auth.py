"""Signed-request checks: who sent a request, proven before the pool sees it.

In order, cheapest first: the headers are well formed and name this pool (a client of
the old protocol, whose signatures named no pool, is told to upgrade); the timestamp is
inside the window; the signature over the canonical request recovers to `X-Address`. These
need no ledger, so they run on the event loop and a forged request costs no thread and
no transaction. The pool then spends the nonce (kept in the ledger for the whole
window, so neither a replay nor an orchestrator restart reopens it) and applies the
sender's rate limit, in the same transaction as the request's action
(`Pool.signed_act`).
"""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from swarmrl.identity import (
    PROTOCOL,
    OldProtocolError,
    SignatureError,
    canonical_request,
    parse_signed_headers,
    recover_signer,
)
from swarmrl.orchestrator.errors import Refusal


@dataclass(frozen=True)
class Caller:
    """A request's proven sender, its nonce (not yet spent) and what it signed (kept with
    verdicts)."""

    address: str
    nonce: str
    timestamp: int
    signed_text: str
    signature: str


class RateLimiter:
    """A token bucket per address: `rate` requests per second, bursts up to `burst`.

    Any signed request reaches it, a stranger's too, so it forgets the buckets that have
    refilled (an address idle that long is indistinguishable from a new one): what it
    keeps is bounded by the addresses active within `burst / rate` seconds, not by every
    address that ever signed a request."""

    PRUNE_FROM = 4096  # buckets kept before the first sweep for refilled ones

    def __init__(
        self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.burst = burst
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()
        self._prune_at = self.PRUNE_FROM

    def allow(self, address: str) -> bool:
        now = self.clock()
        with self._lock:
            tokens, last = self._buckets.get(address, (float(self.burst), now))
            tokens = min(self.burst, tokens + (now - last) * self.rate)
            if tokens < 1:
                self._buckets[address] = (tokens, now)
                return False
            self._buckets[address] = (tokens - 1, now)
            if len(self._buckets) > self._prune_at:
                self._forget_refilled(now)
            return True

    def __len__(self) -> int:
        return len(self._buckets)

    def _forget_refilled(self, now: float) -> None:
        """Drop every bucket that is full again; sweep next at twice what is left, so the
        sweeps cost O(1) per request on average."""
        self._buckets = {
            a: (t, last)
            for a, (t, last) in self._buckets.items()
            if t + (now - last) * self.rate < self.burst
        }
        self._prune_at = max(self.PRUNE_FROM, 2 * len(self._buckets))


def pool_id(secret: bytes, run_id: str | None) -> str:
    """The id every request to this pool signs: from the orchestrator's secret (so it
    survives restarts) and the run id (so one secret serving two runs makes two pools)."""
    text = f"swarmrl pool id\n{run_id or ''}".encode()
    return hmac.new(secret, text, hashlib.sha256).hexdigest()[:32]


class RequestVerifier:
    def __init__(self, window: float, pool: str) -> None:
        self.window = window
        self.pool = pool

    def verify(self, method: str, path_with_query: str, headers, body_sha256: str) -> Caller:
        try:
            signed = parse_signed_headers(headers)
        except OldProtocolError as exc:
            raise Refusal(426, "old_protocol", str(exc)) from None
        except SignatureError as exc:
            raise Refusal(401, "bad_signature", str(exc)) from None
        if signed.pool != self.pool:
            # The signature would not recover anyway (the text names the pool): say why.
            raise Refusal(
                401,
                "wrong_pool",
                f"signed for pool {signed.pool}; this orchestrator serves pool {self.pool} "
                f"({PROTOCOL}, GET /v1/signing): check the orchestrator URL",
            )
        skew = signed.timestamp - time.time()
        if abs(skew) > self.window:
            raise Refusal(
                401,
                "stale_timestamp",
                f"timestamp {signed.timestamp} is {skew:+.0f} s from the orchestrator's clock "
                f"(window ±{self.window:.0f} s): check the sender's clock",
            )
        try:
            text = canonical_request(
                self.pool, method, path_with_query, body_sha256, signed.timestamp, signed.nonce
            )
            signer = recover_signer(text, signed.signature)
        except SignatureError as exc:
            raise Refusal(401, "bad_signature", str(exc)) from None
        if signer != signed.address:
            raise Refusal(
                401,
                "bad_signature",
                f"signature is not {signed.address}'s (it recovers to another key)",
            )
        return Caller(
            address=signed.address,
            nonce=signed.nonce,
            timestamp=signed.timestamp,
            signed_text=text,
            signature="0x" + signed.signature.hex(),
        )
