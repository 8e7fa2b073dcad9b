"""Staying a member of the pool: register once, then heartbeat from a background thread.

Workers and relays keep a `Membership` for their whole life. It registers (retrying
while the orchestrator cannot be reached, and while a worker's balance is short of the
stake it must lock: its owner may fund it after it started), then heartbeats at the interval the
orchestrator's answers ask for (twice as often while it holds work, see `HOLDING_BEATS`),
counted from its newest beat, whichever thread sent it. It keeps the newest answer: the
step, the async bound, the newest checkpoint, the relays, the origin, and whether the run
is finished. A member the orchestrator declared dead (missed heartbeats) registers again;
trouble reaching it is logged and retried with a doubling delay, never fatal, because an
orchestrator restarting must not take the pool down with it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import httpx

from swarmrl.backoff import backoff_delay
from swarmrl.identity import Identity
from swarmrl.protocol import models as api
from swarmrl.protocol.client import PoolClient, PoolRefused

log = logging.getLogger("swarmrl.membership")

# Transport trouble (`PoolUnreachable` is a ConnectionError) and the orchestrator's own
# failures are worth retrying; a 4xx is an answer about this member, not retried blindly.
RETRYABLE = (httpx.TransportError, ConnectionError)

# Beats per heartbeat interval while the member holds work (`busy()`). The orchestrator
# re-issues the share of a holder silent for half an interval plus a little slack
# (`orchestrator/speculation.py`), so a holder whose link is cut stalls the pool for less
# than one interval; members without work beat once per interval.
HOLDING_BEATS = 2


def retryable(exc: Exception) -> bool:
    """Whether the request may succeed if sent again later (unreachable, a 5xx, or 429:
    over a rate limit, such as the pool's rate of new members)."""
    return isinstance(exc, RETRYABLE) or (
        isinstance(exc, PoolRefused) and (exc.status >= 500 or exc.status == 429)
    )


def unfunded(exc: Exception) -> bool:
    """Whether a worker's registration was refused for want of the stake it must lock:
    it may be funded any time (`swarmrl pool fund`; `swarmrl run` funds its workers while
    they start), so registering again later can succeed."""
    return isinstance(exc, PoolRefused) and exc.code == "stake_short"


def ejected(exc: Exception) -> bool:
    """Whether the pool ejected this member (a rejected file slashed it): every further
    request is refused, so the member should stop rather than retry or restart."""
    return isinstance(exc, PoolRefused) and exc.code == "ejected"


class Membership:
    """Registration and the heartbeat thread of one member; `view()` is the newest answer.

    `policy_step()` is read before each heartbeat (the newest checkpoint the member holds),
    and `bytes_served()` (a SHARDCAST server's count of what it served, or None);
    `busy()` says whether it holds work (then it beats `HOLDING_BEATS` times per interval;
    call `nudge()` when that changes). It has its own HTTP client, so callers may use
    theirs from other threads meanwhile.
    """

    def __init__(
        self,
        url: str,
        identity: Identity,
        role: api.Role,
        *,
        member_url: str | None = None,
        policy_step: Callable[[], int | None] = lambda: None,
        bytes_served: Callable[[], int | None] = lambda: None,
        busy: Callable[[], bool] = lambda: False,
        recipe: api.Recipe | None = None,
        retry_base: float = 0.5,
        retry_cap: float = 30.0,
    ) -> None:
        self.client = PoolClient(url, identity)
        self.role = role
        self.member_url = member_url
        self.policy_step = policy_step
        self.bytes_served = bytes_served
        self.busy = busy
        self.recipe = recipe  # sent with each registration: a mismatch is refused
        self.retry_base = retry_base
        self.retry_cap = retry_cap
        self._lock = threading.Lock()  # one request at a time on this client
        self._view: api.HeartbeatResponse | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()  # stop() or nudge(): look at the schedule again
        self._last_beat = time.monotonic()
        self._thread: threading.Thread | None = None
        self._failures = 0

    @property
    def address(self) -> str:
        return self.client.address

    def start(self) -> api.HeartbeatResponse:
        """Register and take the first heartbeat (retrying until the orchestrator answers,
        and while a worker waits to be funded), then heartbeat in the background. A refused
        registration raises `PoolRefused`."""
        while True:
            try:
                self._register()
                view = self.beat()
                break
            except Exception as exc:
                if self._stop.is_set():
                    raise
                if unfunded(exc):
                    self._trouble("waiting to be funded by the pool's owner", exc)
                elif retryable(exc):
                    self._trouble("cannot reach the orchestrator to register", exc)
                else:
                    raise
        self._thread = threading.Thread(
            target=self._run, name=f"swarmrl-{self.role}-heartbeat", daemon=True
        )
        self._thread.start()
        return view

    def view(self) -> api.HeartbeatResponse | None:
        return self._view

    def beat(self) -> api.HeartbeatResponse:
        """One heartbeat now; a member declared dead registers again first."""
        with self._lock:
            try:
                view = self.client.heartbeat(self.policy_step(), self.bytes_served())
            except PoolRefused as exc:
                # Declared dead after missed heartbeats, or a ledger that never knew it.
                if exc.code not in ("dead", "not_registered"):
                    raise
                log.warning("%s; registering again", exc.detail)
                self._register_locked()
                view = self.client.heartbeat(self.policy_step(), self.bytes_served())
            self._view = view
            self._failures = 0
            self._last_beat = time.monotonic()
            return view

    def nudge(self) -> None:
        """Re-plan the next beat now (`busy()` changed)."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.client.close()

    def _register(self) -> None:
        with self._lock:
            self._register_locked()

    def _register_locked(self) -> None:
        member = self.client.register(self.role, url=self.member_url, recipe=self.recipe)
        log.info("registered with %s as %s %s", self.client.url, member.role, member.address)

    def _run(self) -> None:
        retry_at = None  # after a failed beat: when to try again
        while not self._stop.is_set():
            due = retry_at if retry_at is not None else self._last_beat + self._interval()
            wait = due - time.monotonic()
            if wait > 0:
                self._wake.wait(wait)
                self._wake.clear()
                continue  # stopped, nudged or due: look again
            try:
                self.beat()
                retry_at = None
            except Exception as exc:  # noqa: BLE001 - a heartbeat thread must not die
                if ejected(exc):
                    # Every further beat is refused: the member's own loop stops on its
                    # next request, so the thread says it once and ends.
                    log.error("heartbeat refused, stopping the heartbeats: %s", exc)
                    return
                retry_at = time.monotonic() + self._trouble("heartbeat failed", exc)

    def _interval(self) -> float:
        if self._view is None:
            return self.retry_base
        return self._view.heartbeat_seconds / (HOLDING_BEATS if self.busy() else 1)

    def _trouble(self, what: str, exc: Exception) -> float:
        self._failures += 1
        delay = backoff_delay(self._failures, self.retry_base, self.retry_cap)
        log.warning("%s (%s); retry %d in %.1f s", what, exc, self._failures, delay)
        if self._thread is None:  # still starting: the caller's loop waits here
            self._stop.wait(delay)
        return delay
