"""The pool's lock and its signed act: each request one ledger transaction under one lock.

The orchestrator is a single process, and serializing the writes keeps "issue only what
the step needs" and "each assignment returned once" true on SQLite and PostgreSQL
alike. A signed request's nonce is spent, and its sender's rate applied, in the same
transaction as its act (`signed_act`). A refused act raises `Refusal` with the HTTP
status and a one-line reason, and changes nothing but the spent nonce.

`Pool` holds the lock, the config, the secret, the store and the heartbeat view; each
concern's rules are functions over a session in their own module: `membership`
(nonces, registration, heartbeats), `assignments` (issuing and lapsing work), `uploads`,
`training` (the trainer's side), `validation`, `accounts` (money), `status` and `board`
(the dashboard's figures).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from sqlalchemy.orm import Session

from swarmrl.ledger import Ledger
from swarmrl.orchestrator import (
    accounts,
    assignments,
    board,
    membership,
    status,
    training,
    uploads,
    validation,
)
from swarmrl.orchestrator.arrivals import MAX_WAIT_SECONDS, Arrivals
from swarmrl.orchestrator.auth import Caller, RateLimiter
from swarmrl.orchestrator.config import OrchestratorConfig
from swarmrl.orchestrator.errors import Refusal, Replayed
from swarmrl.orchestrator.refusals import RecentRefusals
from swarmrl.orchestrator.store import RolloutStore
from swarmrl.orchestrator.uploads import UploadedFile
from swarmrl.protocol import models as api
from swarmrl.protocol import recipe


class Pool:
    def __init__(
        self,
        config: OrchestratorConfig,
        ledger: Ledger,
        store: RolloutStore,
        secret: bytes,
        allowlist: dict[str, set[str]],
        clock: Callable[[], float] = time.time,
        limiter: RateLimiter | None = None,
        joins: RateLimiter | None = None,
    ) -> None:
        self.config = config
        self.ledger = ledger
        self.store = store
        self.secret = secret
        self.allowlist = allowlist
        self.clock = clock
        self.limiter = limiter
        self.joins = joins  # one bucket ("join") for registrations of new addresses
        self._lock = threading.Lock()
        self.arrivals = Arrivals()  # what a validator's long poll waits for (arrivals.py)
        self._view: api.HeartbeatResponse | None = None  # what heartbeats answer; None = rebuild
        self.recipe = recipe.of_pool(config)
        self.refusals = RecentRefusals()

    @contextlib.contextmanager
    def signed_act(self, caller: Caller) -> Iterator[Session]:
        """The one locked transaction of a signed request's act, its nonce spent first in
        it (a replay is refused before anything else), then the sender's rate applied.

        A member's (or the owner's) request refused, or failing, after its nonce still
        spends the nonce, in a transaction of its own: no signed request is ever acted on
        twice. A stranger's refused request writes nothing, so strangers cannot fill the
        ledger; once the key registers, its requests signed before its registration's
        timestamp are refused, so what it sent as a stranger is not served later (the
        same second excepted: timestamps are whole seconds)."""
        with self._lock:
            # Checked again under the lock, on the sweep's clock: a request that waited
            # here past the window might find its first use's nonce swept already.
            if caller.timestamp < self.clock() - self.config.timestamp_window:
                raise Refusal(
                    401,
                    "stale_timestamp",
                    f"timestamp {caller.timestamp} left the ±{self.config.timestamp_window:.0f} s "
                    "window while the request waited; send it again",
                )
            try:
                with self.ledger.session() as s:
                    c = s.connection()
                    membership.spend_nonce(c, caller)
                    registered = membership.registered_at(c, caller.address)
                    if registered is not None and caller.timestamp < registered:
                        raise Refusal(
                            401,
                            "stale_timestamp",
                            f"signed at {caller.timestamp}, before {caller.address} registered "
                            f"(its registration was signed at {registered}): sign it anew",
                        )
                    if self.limiter is not None and not self.limiter.allow(caller.address):
                        raise Refusal(
                            429,
                            "rate_limited",
                            f"{caller.address} is over its rate limit; slow down",
                        )
                    yield s
            except Replayed:
                raise
            except BaseException:
                with self.ledger.engine.begin() as c:
                    known = caller.address == self.config.owner
                    if known or membership.is_member(c, caller.address):
                        membership.spend_nonce(c, caller)
                raise

    def _rates(self) -> accounts.Rates:
        return accounts.Rates.of(self.config.pay_per_sample, self.config.pay_per_token)

    # -- members and the pool owner -----------------------------------------------------

    def register(self, caller: Caller, req: api.RegisterRequest) -> api.Member:
        """Join (or rejoin); a refusal is also kept for the status (`refusals.py`)."""
        try:
            now = self.clock()
            with self.signed_act(caller) as s:
                if (
                    self.joins is not None
                    and not membership.is_member(s.connection(), caller.address)
                    and not self.joins.allow("join")
                ):
                    raise Refusal(
                        429,
                        "rate_limited",
                        f"the pool registers at most {self.config.join_rate_per_second:g} new "
                        "members a second; try again shortly",
                    )
                joined = membership.register(
                    s,
                    caller,
                    req,
                    config=self.config,
                    allowlist=self.allowlist,
                    pool_recipe=self.recipe,
                    now=now,
                )
                if req.role == "validator":
                    validation.release_leases(s, caller.address)
                self._view = None
                return joined
        except Replayed:
            raise
        except Refusal as exc:
            self.refusals.record(caller.address, req.role, exc.detail, self.clock())
            raise

    def fund(self, caller: Caller, req: api.FundRequest) -> api.Account:
        with self.signed_act(caller) as s:
            return accounts.fund_by_owner(s, self.config.owner, caller.address, req, self.clock())

    def heartbeat(self, caller: Caller, req: api.HeartbeatRequest) -> api.HeartbeatResponse:
        """The hottest path: two single-row statements, and the pool view from memory
        (rebuilt whenever what it shows may have changed)."""
        now = self.clock()
        with self.signed_act(caller) as s:
            if membership.beat(s, caller.address, req.policy_step, now, req.bytes_served):
                self._view = None  # a relay back to health changes the relay list
            if self._view is None:
                self._view = membership.pool_view(s, self.config)
            return self._view

    def sweep(self) -> None:
        """Mark members by missed heartbeats, lapse overdue assignments and the open
        assignments of dead workers (they become needed again), forget expired nonces."""
        now = self.clock()
        with self._lock, self.ledger.session() as s:
            if membership.mark_by_heartbeats(s, self.config, now):
                self._view = None
            assignments.lapse_overdue(s, now)
            membership.forget_nonces(s, before=now - self.config.timestamp_window - 1)

    # -- workers ------------------------------------------------------------------------

    def request_assignment(
        self, caller: Caller, req: api.AssignmentRequest
    ) -> api.AssignmentResponse:
        now = self.clock()
        with self.signed_act(caller) as s:
            return assignments.request_assignment(
                s, caller.address, req, config=self.config, secret=self.secret, now=now
            )

    def check_upload_target(self, caller: Caller, assignment_id: int) -> None:
        """Before any byte is read (the upload's signed act; `accept_upload` finishes it):
        the sender is a worker holding this open assignment, within its deadline (a late
        one lapses now, and is refused once that is recorded)."""
        now = self.clock()
        with self.signed_act(caller) as s:
            late = uploads.check_target(s, caller.address, assignment_id, now)
        if late is not None:
            raise late

    def accept_upload(
        self, worker: str, assignment_id: int, upload: UploadedFile
    ) -> api.SubmissionInfo:
        """Check a streamed-in file against its assignment, store it, record the
        submission; a file refused for what it holds (`bad_file`) lapses its assignment."""
        try:
            # Parsed and measured before the lock is taken; the bounds need no lock.
            with self.ledger.session() as s:
                limits = uploads.bounds(s, assignment_id, self.config)
            parsed = uploads.parse(upload, limits)
            with self._lock, self.ledger.session() as s:
                recorded = uploads.record(
                    s,
                    worker,
                    assignment_id,
                    upload,
                    parsed,
                    config=self.config,
                    secret=self.secret,
                    store=self.store,
                    now=self.clock(),
                )
            self.arrivals.notify()  # committed: a waiting validator may look again
            return recorded
        except Refusal as refused:
            if refused.code == "bad_file":
                with self._lock, self.ledger.session() as s:
                    uploads.refused_file(s, worker, assignment_id, self.clock())
            raise

    # -- the trainer --------------------------------------------------------------------

    def submissions_for_step(self, caller: Caller, step: int) -> api.SubmissionList:
        with self.signed_act(caller) as s:
            return training.submissions_for_step(s, caller.address, step)

    def stored_file(self, caller: Caller, file_hash: str) -> tuple[str, int]:
        """(stored name, size) of a submission, for the trainer and validators only."""
        with self.signed_act(caller) as s:
            return uploads.stored_file(s, caller.address, file_hash)

    def mark_trained(self, caller: Caller, req: api.MarkTrainedRequest) -> int:
        now = self.clock()
        with self.signed_act(caller) as s:
            return training.mark_trained(s, caller.address, req, now)

    def report_progress(self, caller: Caller, step: int, req: api.ProgressReport) -> api.StepStatus:
        now = self.clock()
        with self.signed_act(caller) as s:
            return training.report_progress(
                s, caller.address, step, req, config=self.config, now=now
            )

    def report_metrics(self, caller: Caller, req: api.MetricsReport) -> None:
        now = self.clock()
        with self.signed_act(caller) as s:
            training.record_metrics(s, caller.address, req, now)

    def announce_checkpoint(
        self, caller: Caller, req: api.CheckpointAnnouncement
    ) -> api.HeartbeatResponse:
        now = self.clock()
        with self.signed_act(caller) as s:
            training.announce_checkpoint(s, caller.address, req, rates=self._rates(), now=now)
            self._view = None
            view = membership.pool_view(s, self.config)
        if req.final:
            self.arrivals.close()  # a validator's long poll is answered now
        return view

    # -- validators ---------------------------------------------------------------------

    def submission_of(self, caller: Caller, file_hash: str) -> api.ValidationTask:
        """A submission with its assignment and seed (`validation.submission_of`)."""
        with self.signed_act(caller) as s:
            return validation.submission_of(s, caller.address, file_hash, self.allowlist)

    def next_for_validation(self, caller: Caller, wait: float = 0.0) -> api.ValidationTask:
        """The next file to judge; with none, held up to `wait` seconds for an upload
        (arrivals.py), looking again after each, outside the lock."""

        def look(s: Session) -> api.ValidationTask:
            return validation.next_for_validation(
                s,
                caller.address,
                lease_seconds=self.config.validation_lease_seconds,
                now=self.clock(),
            )

        seen = self.arrivals.count
        with self.signed_act(caller) as s:
            task = look(s)
        deadline = time.monotonic() + min(wait, MAX_WAIT_SECONDS)
        while task.submission is None and (left := deadline - time.monotonic()) > 0:
            if not self.arrivals.wait_past(seen, left):
                break
            seen = self.arrivals.count
            # The request's nonce is spent; the validator's role is checked again inside.
            with self._lock, self.ledger.session() as s:
                task = look(s)
        return task

    def record_verdict(
        self, caller: Caller, req: api.VerdictRequest, *, body: str
    ) -> api.VerdictResponse:
        now = self.clock()
        with self.signed_act(caller) as s:
            return validation.record_verdict(
                s,
                caller,
                req,
                body=body,
                rates=self._rates(),
                slash_fraction=self.config.slash_fraction,
                now=now,
            )

    # -- status -------------------------------------------------------------------------

    def status(self) -> api.PoolStatus:
        """Read without the lock: one session's consistent view (`status.py`)."""
        with self.ledger.session() as s:
            return self._status(s)

    def dashboard(self) -> board.Dashboard:
        """The status and the dashboard's figures, from one session (`board.py`)."""
        with self.ledger.session() as s:
            return board.dashboard(s, self._status(s), self.clock())

    def _status(self, s: Session) -> api.PoolStatus:
        return status.pool_status(
            s,
            view=membership.pool_view(s, self.config),
            steps=[
                status.step_status(s, row, assignments.usable(s, row.step))
                for row in status.newest_steps(s)
            ],
            recipe=self.recipe,
            rates=self._rates(),
            refusals=self.refusals.newest_first(),
        )
